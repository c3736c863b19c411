"""What several test files share: the table models and their exact laws, random GPT-2 pairs, a tiny GPT-2 for the
exact oracle and the greedy check of a drafter made from the target, the tiny model folders main.py runs on, a
random EAGLE-3 head in the trainer's format, and the packed corpus the trainers read. No test file imports another
test file; the fixtures built from these (models_dir, packed) live in conftest.py."""

import copy
import json
import math
import os
import shutil
import subprocess
import sys
from itertools import product

import numpy as np
import pytest

import gpt2
import sampling
import utils
from classroom import lossless
from classroom.lossless import chi_square_test
from conftest import REPO
from encoder import EOT, bytes_to_unicode
from speedup.stats import SpeculativeStats

# ---- table models: the next token depends on the previous one ------------------------------------------------

NEVER = -np.inf  # a logit of probability zero

# next-token logits given the previous token (rows) over a vocabulary of 4 tokens; both tables have
# zeros, some where the other has mass: q-only tokens come only from resampling or the bonus token
TARGET_TABLE = [[1.0, 0.5, NEVER, -0.5],
                [NEVER, 0.2, 1.5, 0.0],
                [0.3, NEVER, 0.3, 1.0],
                [2.0, 0.0, -1.0, NEVER]]
DRAFT_TABLE = [[0.0, 1.5, 0.5, NEVER],
               [0.5, NEVER, 1.0, 0.8],
               [1.0, 0.2, NEVER, 0.0],
               [NEVER, 1.0, 0.5, 0.2]]
PROMPT = [2, 0]
N_TOKENS = 3


class TableModel:
    """A project-contract model: logits of the next token depend on the previous token."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float32)
        self.n_vocab, self.n_ctx = self.table.shape[1], 64

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab]
        return self.table[np.asarray(x)[-n_last:]]


class TableCallable:
    """jaymody/speculative-sampling's model contract: probabilities for every position of x."""

    def __init__(self, table):
        self.probs = sampling.softmax(np.asarray(table, dtype=np.float32))

    def __call__(self, x):  # [n_seq] -> [n_seq, n_vocab]
        return self.probs[np.asarray(x)]


def exact_joint(table, settings, prompt=PROMPT, n_tokens=N_TOKENS):
    """P(first n_tokens generated tokens) under the processed target, flattened in product order."""
    q = sampling.logits_to_probs(np.asarray(table, dtype=np.float32), settings).astype(np.float64)
    n_vocab = q.shape[1]
    joint = []
    for tokens in product(range(n_vocab), repeat=n_tokens):
        previous = [prompt[-1], *tokens[:-1]]
        joint.append(math.prod(q[prev, token] for prev, token in zip(previous, tokens)))
    return np.array(joint)


def table_problem(draft_table, target_table, settings, *, prompt=PROMPT, N=N_TOKENS, K=2, cached=True):
    """The tables as a lossless.Problem for classroom/exact_law's oracle: a context table that ignores the token
    two back, models of the project's contract with a cache (cached) or plain callables, the first N tokens' law."""
    def context(table):  # [n_vocab, n_vocab] -> [n_vocab (two back), n_vocab (previous), n_vocab]
        table = np.asarray(table, dtype=np.float32)
        return lossless.ContextTable(np.broadcast_to(table, (len(table), *table.shape)))

    return lossless.Problem(f"tables, prompt {list(prompt)}, K={K}, {settings}", context(draft_table),
                            context(target_table), tuple(prompt), N, K, settings, cached, n_samples=1, n_joint=N)


def autoregressive(x, draft_model, target_model, N, K, rng, **settings):  # the oracle's signature; ignores the draft
    return sampling.autoregressive_sampling(x, target_model, N, rng, **settings)


def chi_square_p_value(counts, expected_probs):
    """Pearson's test of counts against probabilities (lossless.py's, which pools cells expected below 5)."""
    return chi_square_test(counts, expected_probs)[2]


def assert_follows(counts, joint):
    impossible = joint == 0
    assert impossible.any() and counts[impossible].sum() == 0, "a sequence of probability zero was generated"
    p_value = chi_square_p_value(counts[~impossible], joint[~impossible])
    assert p_value > 1e-3, f"chi-square p-value {p_value:.2e}: the samples do not follow the target"


# ---- random GPT-2 pairs ---------------------------------------------------------------------------------------

HPARAMS = {"n_vocab": 96, "n_ctx": 64, "n_embd": 32, "n_head": 4, "n_layer": 2}


def scaled_params(hparams, seed, scale=10.0):
    """A random GPT-2 whose blocks matter (weights scale x GPT-2's init), so greedy text varies, without ties."""
    params = gpt2.init_params(hparams, np.random.default_rng(seed))
    for block in params["blocks"]:
        for layer in [*block["attn"].values(), *block["mlp"].values()]:
            layer["w"] *= scale
    return params


def random_target():
    return scaled_params(HPARAMS, seed=0)


def perturbed(params, noise, seed):
    """A draft that mostly agrees with the target: its weights plus noise of `noise` times their spread."""
    rng = np.random.default_rng(seed)
    perturb = lambda w: (w + noise * w.std() * rng.standard_normal(w.shape)).astype(np.float32)
    return _map_arrays(perturb, copy.deepcopy(params))


def _map_arrays(f, tree):
    if isinstance(tree, dict):
        return {key: _map_arrays(f, value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_map_arrays(f, value) for value in tree]
    return f(tree)


# ---- a tiny random GPT-2 for the exact oracle (a drafter made from the target) ---------------------------------

TINY = dict(n_vocab=4, n_ctx=12, n_embd=8, n_head=2, n_layer=2)  # small enough for the exact oracle


class TinyGPT2Context:
    """The target's next-token logits for the oracle's reference law: gpt2.gpt2's full recompute, no cache."""

    n_vocab = TINY["n_vocab"]

    def __init__(self, params):
        self.params = params

    def logits_at(self, tokens, positions):  # -> [len(positions), n_vocab]
        return gpt2.gpt2(np.asarray(tokens), **self.params, n_head=TINY["n_head"])[positions]


class GPT2Problem(lossless.Problem):
    """A lossless.Problem on a tiny GPT-2: `target` a TinyGPT2Context, `draft` a function of the cached target model
    -> the drafter, built afresh for each problem."""

    def models(self):
        target = gpt2.GPT2Model(self.target.params, TINY)
        return self.draft(target), target


def assert_greedy_equals_autoregressive(tokens, drafter, target, N=16, K=4):
    """A drafter keeps greedy decoding exact: speculative sampling's tokens are autoregressive decoding's, and it did
    draft, one step per draft."""
    target.reset()
    expected = sampling.autoregressive_sampling(tokens, target, N, 0, temperature=0)
    target.reset()
    stats = SpeculativeStats()
    got = sampling.speculative_sampling(tokens, drafter, target, N, K, 0, temperature=0, stats=stats)
    np.testing.assert_array_equal(got, expected)
    assert stats.drafted > 0 and stats.draft_calls == stats.drafted


def count_reused_rows(monkeypatch):  # -> a list that gets the rows each target call started at the exit (0: none)
    """Spy on drafters.early_exit.ExitDraft.reuse: how many of the rows the target fed entered it at the exit layer."""
    from drafters.early_exit import ExitDraft
    from kvcache.contract import common_prefix_length

    reused, reuse = [], ExitDraft.reuse

    def counted(drafted, tokens, start):
        kept = reuse(drafted, tokens, start)
        reused.append(common_prefix_length(drafted.tokens, tokens) if kept else 0)
        return kept

    monkeypatch.setattr(ExitDraft, "reuse", counted)
    return reused


# ---- main.py on tiny model folders ------------------------------------------------------------------------------

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
OTHER_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("o", "n")]  # same size, another vocabulary
N_VOCAB = 256 + len(MERGES) + 1  # byte tokens, merges, <|endoftext|>
TARGET = {"n_vocab": N_VOCAB, "n_ctx": 64, "n_embd": 32, "n_head": 4, "n_layer": 2}
SMALL = {"n_vocab": N_VOCAB, "n_ctx": 64, "n_embd": 16, "n_head": 2, "n_layer": 1}
MODELS = ["--draft_model_size", "draft", "--target_model_size", "target"]
PAIR = [*MODELS, "--prompt", "the"]  # a second --prompt would make a batch of two: use MODELS for other prompts


def write_vocabulary(model_dir, merges):
    tokens = list(bytes_to_unicode().values()) + [first + second for first, second in merges] + [EOT]
    (model_dir / "encoder.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}))
    (model_dir / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def write_model(model_dir, hparams, params, merges=MERGES):
    """An OpenAI-style model folder: hparams.json, checkpoint, model.ckpt.*, encoder.json, vocab.bpe."""
    utils.save_gpt2_checkpoint(params, hparams, str(model_dir))
    write_vocabulary(model_dir, merges)


def write_models_dir(root):  # -> root, holding target, draft, other-vocabulary, corrupt and no-checkpoint
    """conftest's models_dir fixture: a tiny pair, a model of another vocabulary, and two broken folders."""
    target = scaled_params(TARGET, seed=0)
    write_model(root / "target", TARGET, target)
    write_model(root / "draft", TARGET, perturbed(target, 0.05, seed=1))  # a draft that often agrees
    write_model(root / "other-vocabulary", SMALL, scaled_params(SMALL, seed=2), merges=OTHER_MERGES)
    shutil.copytree(root / "target", root / "corrupt")
    data = root / "corrupt" / "model.ckpt.data-00000-of-00001"
    corrupted = bytearray(data.read_bytes())
    corrupted[len(corrupted) // 2] ^= 0xFF
    data.write_bytes(bytes(corrupted))
    (root / "no-checkpoint").mkdir()
    for name in ["hparams.json", "encoder.json", "vocab.bpe"]:
        shutil.copy(root / "target" / name, root / "no-checkpoint" / name)
    return root


def run_main(*args, models_dir=None, cwd=REPO, env=None):
    """main.py in a subprocess without network access (downloads go to a proxy that refuses them)."""
    offline = {name: "http://127.0.0.1:9" for name in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"]}
    env = {**os.environ, **offline, "NO_PROXY": "", "no_proxy": "", **(env or {})}
    flags = ["--models_dir", str(models_dir)] if models_dir else []
    return subprocess.run([sys.executable, str(REPO / "main.py"), *flags, *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def assert_short_error(result, message):
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ")
    assert 1 <= len(result.stderr.strip().splitlines()) <= 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""


# ---- a random EAGLE-3 head, as the trainer writes one ----------------------------------------------------------

BUNDLED_DRAFT_VOCABULARY = json.loads((REPO / "models" / "teach-eagle-vocabulary.json").read_text())["ids"]


def write_eagle3_head(folder, hparams, vocabulary, seed=0, **info):  # -> (the head's arrays, its head.json)
    """A random EAGLE-3 head on a target of `hparams`, drafting over `vocabulary` (sorted target ids), written to
    folder as tools/train_heads.py eagle3 writes one: its kind's init and info (d2t, layers), and a training log of
    one run of 3 steps; info: head.json's entries to replace."""
    from drafters.heads import save_head
    from tools import train_eagle3  # imported here: it imports JAX

    kind = train_eagle3.Eagle3(hparams, vocabulary)
    head = kind.init(hparams, np.random.default_rng(seed), None)
    recipe = {"drafter": "eagle3", "steps": 3, "batch_size": 2, "seq_len": 8, "lr": 1e-3, "warmup": 100, "seed": seed,
              "target": "teach-target", "validation_tokens": 200_000}
    training = {"recipe": recipe, "evals": [], "steps_done": 3, "minutes": 0.5}
    written = {"drafter": "eagle3", "target": "teach-target", "target_hparams": hparams,
               **kind.info(head, None, None), "training": training, **info}
    save_head(folder, head, written)
    return head, written


# ---- a packed corpus and a tiny trained pair ----------------------------------------------------------------

VOCABULARY = REPO / "models" / "teach-target"  # the bundled pair's 4096-token vocabulary
HELD_OUT = REPO / "tests" / "fixtures" / "heldout_sample.txt"


def pack_sample_corpus(root):  # -> (corpus_dir, pack_dir, record)
    """conftest's packed fixture: a corpus of two splits packed with the bundled vocabulary."""
    from tools import pack_corpus

    corpus = root / "corpus"
    corpus.mkdir()
    sample = HELD_OUT.read_text(encoding="utf-8")
    (corpus / "train.txt").write_text(sample + EOT + "def f(x):\n    return x * 2\n", encoding="utf-8")
    (corpus / "heldout.txt").write_text(sample[:3000] + EOT + "caf\u00e9 \u2713\n", encoding="utf-8")
    record = pack_corpus.pack_corpus(corpus, VOCABULARY, root / "pack")
    return corpus, root / "pack", record


def train_tiny_pair(pack_dir, out_dir):
    """One step of tools/train_pair.py on the packed tokens: a 2 x 32 target and a 1 x 16 draft in out_dir."""
    from tools import train_pair

    train_pair.main(corpus_dir=out_dir / "no-corpus", bpe_dir=pack_dir, out_dir=out_dir, steps=1, batch_size=2,
                    seq_len=32, warmup=1, eval_every=1, target_shape=(32, 2, 4), draft_shape=(16, 1, 2),
                    tokens=pack_dir / "tokens.npz", state_dir=out_dir / "state")


def tiny_training_setup(tmp_path, hparams, copies=1):  # -> (models_dir, corpus_dir) for tools/train_heads.py
    """models_dir holding a random teach-target of hparams with the bundled pair's vocabulary files; corpus_dir
    holding a train.txt of `copies` copies of the README."""
    models_dir, corpus_dir = tmp_path / "models", tmp_path / "corpus"
    utils.save_gpt2_checkpoint(gpt2.init_params(hparams, np.random.default_rng(0)), hparams,
                               models_dir / "teach-target")
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(REPO / "models" / "teach-target" / name, models_dir / "teach-target" / name)
    corpus_dir.mkdir()
    (corpus_dir / "train.txt").write_text((REPO / "README.md").read_text() * copies)
    return models_dir, corpus_dir


def stop_training_at(monkeypatch, stop_step, run):
    """run() stopped as by Ctrl-C when it asks train_pair for step stop_step's learning rate, the schedule restored
    after: a run that saves its state, interrupted half way."""
    from tools import train_pair  # JAX: imported by the training tests only

    learning_rate = train_pair.learning_rate

    def stopping(step, *args):
        if step == stop_step:
            raise KeyboardInterrupt
        return learning_rate(step, *args)

    monkeypatch.setattr(train_pair, "learning_rate", stopping)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(train_pair, "learning_rate", learning_rate)


def assert_a_stopped_run_resumes_to(whole, monkeypatch, run, steps=4):
    """run() (-> a head and its info) stopped at step 3, then run again: it resumes to `whole`, the head an
    uninterrupted run of `steps` steps writes."""
    from drafters.heads import flatten

    stop_training_at(monkeypatch, 3, run)
    resumed, info = run()
    assert info["training"]["steps_done"] == steps
    for name, array in flatten(whole).items():
        np.testing.assert_allclose(flatten(resumed)[name], array, atol=1e-6)


# ---- the committed prompt splits the benches read --------------------------------------------------------------


def split_prompts(split, n, prompt_tokens):  # -> [[token]]: n open prompts of bench/prompts/{split}.json, spread
    """What a bench on the split reads, cut here from the committed file without the benches' loader: the open
    prompts at i * 64 // n (bench/heldout.spread), their first prompt_tokens tokens."""
    content = json.loads((REPO / "bench" / "prompts" / f"{split}.json").read_text())
    available = content["categories"]["open"]
    return [available[i * len(available) // n]["tokens"][:prompt_tokens] for i in range(n)]


def as_lists(prompts):  # -> [[token]] of any sequences of token ids
    return [np.asarray(prompt).tolist() for prompt in prompts]
