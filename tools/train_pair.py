"""Train the bundled teaching pair: a GPT-2-shaped target and a tiny draft distilled from it.

Both models are gpt2.py's own forward pass run by jax.numpy (one source of model math). They train
together: each step updates the target on next-token cross-entropy and the draft on the KL divergence
from the target's current next-token distribution (distillation), so the draft learns to agree with
the target rather than with the data. The result is written in OpenAI's release layout
(TensorBundle V2 checkpoint, hparams.json, encoder.json, vocab.bpe) and loads through the same code
as OpenAI's GPT-2.

    python tools/build_corpus.py && python tools/train_bpe.py        # corpus and vocabulary in build/
    python tools/train_pair.py --steps 1500                          # about an hour on 2 CPU cores
    python tools/train_pair.py --tokens build/pack/tokens.npz --bpe_dir build/pack ...   # a packed corpus
                                                                     # (tools/pack_corpus.py), no text needed

The recipe scales: raise --steps, --batch_size and the shapes on an accelerator.

On a CPU the run takes hours, so it survives interruptions: every --save_minutes it saves its whole state
(both models, the optimiser's moments, the step, the data sampler) atomically to --state_dir, outside the
checkout, and a second run of the same command resumes from it. With --init_from models it starts from
the committed float16 pair instead of random weights (a warm start, when the saved state is lost). Pause
it for a benchmark with `kill -STOP <pid>` and let it go on with `kill -CONT <pid>`.

    nohup python tools/train_pair.py --tokens build/pack/tokens.npz --bpe_dir build/pack --init_from models \
        --state_dir ~/.cache/speculative-kit/train_pair --steps 1500 > ~/.cache/speculative-kit/train_pair.log 2>&1 &
"""

import io
import json
import math
import os
import pickle
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import gpt2
from encoder import get_encoder_from_dir
from checkpoints.atomic import write_atomically
from tools.pack_corpus import load_packed_tokens
import utils

def load_tokens(corpus_file, encoder, cache_file, vocabulary_file=None):
    """The corpus as one array of token ids, each document followed by <|endoftext|>; cached on disk (beside the
    vocabulary it was encoded with, unless vocabulary_file names it), and encoded again when the corpus or that
    vocabulary is newer."""
    sources = (corpus_file, vocabulary_file or cache_file.parent / "encoder.json")
    if cache_file.exists() and cache_file.stat().st_mtime > max(path.stat().st_mtime for path in sources):
        return np.load(cache_file)
    ids = encoder.encode(corpus_file.read_text(encoding="utf-8"), allow_eot=True) + [encoder.eot_token]
    tokens = np.asarray(ids, dtype=np.uint16)
    array_file = io.BytesIO()
    np.save(array_file, tokens)
    write_atomically(cache_file, array_file.getvalue())  # a new file: one hard-linked beside it keeps its tokens
    return tokens


def load_splits(corpus_dir, bpe_dir, encoder, tokens=None):
    """(train, held-out) token arrays: from a tools/pack_corpus.py file when `tokens` names one, else
    encoded from the corpus text (and cached beside the vocabulary)."""
    if tokens:
        return load_packed_tokens(tokens, bpe_dir)
    return (load_tokens(corpus_dir / "train.txt", encoder, bpe_dir / "train_tokens.npy"),
            load_tokens(corpus_dir / "heldout.txt", encoder, bpe_dir / "heldout_tokens.npy"))


def span_length(seq_len, rng, longest=128):  # 32 to `longest` tokens, fewer in short windows
    return int(rng.integers(min(32, (seq_len + 1) // 4), min(longest, (seq_len + 1) // 2) + 1))


def batches(tokens, batch_size, seq_len, rng, repeat_share=0.0, random_share=0.0, n_vocab=None, twice_share=0.0):
    """Endless random windows of seq_len + 1 tokens: [batch_size, seq_len + 1].

    A share of the windows (repeat_share) gets one of its own spans (32-128 tokens, fewer in short windows)
    written again later in the window, as code and reference text repeat names and lines: next-token prediction on the second
    copy rewards copying, which makes induction heads (two attention layers composing) form early. A share of the windows
    (random_share) is instead a sequence of uniformly random tokens (ids below n_vocab, 32-128 of them) written over and
    over: after its first period only copying predicts it, with no n-gram statistics to fall back on, the synthetic task
    of Olsson et al. (2022, "In-context Learning and Induction Heads"). A share of the windows (twice_share) ends
    in one of its spans (32 tokens, fewer in short windows, to half the window) written twice in a row, the second
    copy running to the window's end, as in a prompt that repeats a function: where repeat_share's copies stop
    after at most 128 tokens and the window's own text resumes, these reward trusting a copy to its end."""
    while True:
        starts = rng.integers(0, len(tokens) - seq_len - 1, batch_size)
        windows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32)
        for row in np.flatnonzero(rng.random(batch_size) < repeat_share):
            window = windows[row]  # a view: indexing with the mask itself would edit a copy
            length = span_length(seq_len, rng)
            source = int(rng.integers(0, seq_len + 2 - 2 * length))
            copy_to = int(rng.integers(source + length, seq_len + 2 - length))
            window[copy_to:copy_to + length] = window[source:source + length]
        if random_share:  # without it, no draw: the sampler stays the one of runs made before random_share
            for row in np.flatnonzero(rng.random(batch_size) < random_share):
                period = span_length(seq_len, rng)
                windows[row] = np.resize(rng.integers(0, n_vocab, period), seq_len + 1)
        if twice_share:  # likewise
            for row in np.flatnonzero(rng.random(batch_size) < twice_share):
                length = span_length(seq_len, rng, longest=seq_len)  # up to half the window
                windows[row, -length:] = windows[row, -2 * length:-length]
        yield windows


def batched_logits(params, n_head, inputs):  # [batch, seq] -> [batch, seq, n_vocab]
    return jax.vmap(lambda seq: gpt2.gpt2(seq, **params, n_head=n_head))(inputs)


def cross_entropy(logits, targets):  # mean negative log-likelihood of targets, in nats
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def distillation_kl(teacher_logits, student_logits):  # mean KL(teacher || student) over positions
    teacher = jax.nn.log_softmax(teacher_logits)
    student = jax.nn.log_softmax(student_logits)
    return jnp.mean(jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1))


def adamw_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)  # JAX arrays are immutable: m and v may share them
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adamw_update(params, grads, state, lr, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, clip=1.0):
    """AdamW with global-norm gradient clipping; weight decay only on matrices, as nanoGPT does."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, clip / (norm + 1e-6)), grads)
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state["v"], grads)
    correction = jnp.sqrt(1 - beta2**t) / (1 - beta1**t)

    def update(p, m, v):
        decay = weight_decay * p if p.ndim == 2 else 0.0
        return p - lr * (correction * m / (jnp.sqrt(v) + eps) + decay)

    return jax.tree.map(update, params, m, v), {"m": m, "v": v, "t": t}


def learning_rate(step, steps, peak, warmup):
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def make_train_step(target_heads, draft_heads):
    def losses(params, batch):
        inputs, targets = batch[:, :-1], batch[:, 1:]
        target_logits = batched_logits(params["target"], target_heads, inputs)
        draft_logits = batched_logits(params["draft"], draft_heads, inputs)
        target_loss = cross_entropy(target_logits, targets)
        draft_loss = distillation_kl(jax.lax.stop_gradient(target_logits), draft_logits)
        return target_loss + draft_loss, (target_loss, draft_loss)

    @jax.jit
    def train_step(params, opt_state, batch, lr):
        grads, (target_loss, draft_loss) = jax.grad(losses, has_aux=True)(params, batch)
        params, opt_state = adamw_update(params, grads, opt_state, lr)
        return params, opt_state, target_loss, draft_loss

    return train_step


def make_evaluate(target_heads, draft_heads):
    @jax.jit
    def evaluate(params, batch):
        """Held-out cross-entropy of both models, how often their argmaxes agree (greedy acceptance), and how
        often each one's argmax is right on the second half of a window that repeats its first half (copying)."""
        inputs, targets = batch[:, :-1], batch[:, 1:]
        target_logits = batched_logits(params["target"], target_heads, inputs)
        draft_logits = batched_logits(params["draft"], draft_heads, inputs)
        agreement = jnp.mean(jnp.argmax(target_logits, -1) == jnp.argmax(draft_logits, -1))
        half = inputs.shape[1] // 2
        repeated = jnp.concatenate([inputs[:, :half], inputs[:, :half]], axis=1)
        copied = [jnp.mean(jnp.argmax(batched_logits(params[role], heads, repeated)[:, half:-1], -1) == repeated[:, half + 1:])
                  for role, heads in (("target", target_heads), ("draft", draft_heads))]
        return (cross_entropy(target_logits, targets), cross_entropy(draft_logits, targets), agreement, *copied)

    return evaluate


def held_out_metrics(evaluate, params, tokens, seq_len, n_windows=64, batch_size=16):
    """Mean metrics over fixed, non-overlapping held-out windows (the same ones on every run)."""
    n_windows = min(n_windows, (len(tokens) - 1) // seq_len)
    windows = np.stack([tokens[i * seq_len:(i + 1) * seq_len + 1] for i in range(n_windows)]).astype(np.int32)
    sums = 0
    for start in range(0, n_windows - batch_size + 1, batch_size):
        sums += np.array([float(v) for v in evaluate(params, windows[start:start + batch_size])])
    target_ce, draft_ce, agreement, target_copy, draft_copy = sums / (n_windows // batch_size)
    return {"target_loss": target_ce, "target_perplexity": math.exp(target_ce), "draft_loss": draft_ce,
            "draft_perplexity": math.exp(draft_ce), "argmax_agreement": agreement,
            "target_copy_accuracy": target_copy, "draft_copy_accuracy": draft_copy}


def write_model(out_dir, params, hparams, bpe_dir):
    """A model folder in OpenAI's release layout (float16 weights), written beside the destination and
    renamed into place, so an interrupted run never leaves a half-written model."""
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    utils.save_gpt2_checkpoint(params, hparams, tmp_dir, dtype=np.float16)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copyfile(bpe_dir / name, tmp_dir / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)


def write_pair(out_dir, params, hparams, bpe_dir, names, log):
    for role, name in names.items():
        write_model(out_dir / name, params[role], hparams[role], bpe_dir)
    write_atomically(out_dir / "training_log.json", (json.dumps(log, indent=2) + "\n").encode())


def write_stage_evaluation(models_dir, name, params, hparams, bpe_dir, log, stage, evaluation):
    """For a stage run after train_pair (distill_draft, unlikelihood_target) on a pair folder: the model it trains
    rewritten in place, and the evaluation added to its stage's record in the folder's training log."""
    stage["evals"].append(evaluation)
    stage["minutes"] = evaluation["minutes"]
    write_model(models_dir / name, params, hparams, bpe_dir)
    write_atomically(models_dir / "training_log.json", (json.dumps(log, indent=2) + "\n").encode())
    print("held-out", json.dumps(evaluation), flush=True)


def save_state(state_dir, state):
    """The whole training state (numpy arrays, the sampler's state, the log) in one file, replaced atomically."""
    state_dir.mkdir(parents=True, exist_ok=True)
    host = {**state, **{key: jax.tree.map(np.asarray, state[key]) for key in ("params", "opt_state")}}  # plain numpy
    write_atomically(state_dir / "state.pkl", pickle.dumps(host, protocol=pickle.HIGHEST_PROTOCOL))


def load_state(state_dir, recipe):
    """The saved state of a run with this very recipe, or None when there is none; a different recipe is an error,
    since resuming it would silently mix two runs."""
    path = state_dir / "state.pkl"
    if not path.exists():
        return None
    with open(path, "rb") as file:
        state = pickle.load(file)
    if state["log"]["recipe"] != recipe:
        changed = sorted(k for k in recipe if state["log"]["recipe"].get(k) != recipe[k])
        raise SystemExit(f"train_pair: {path} holds a run with another recipe ({', '.join(changed)} differ); "
                         "give another --state_dir or delete it")
    return state


def warm_start(init_from, names, encoder):
    """(params, hparams) of a pair folder (the committed float16 pair), to continue training from it."""
    params, hparams = {}, {}
    for role, name in names.items():
        model_encoder, hparams[role], params[role] = utils.load_encoder_hparams_and_params(name, init_from)
        if model_encoder.encoder != encoder.encoder:
            raise SystemExit(f"train_pair: {Path(init_from) / name} has another vocabulary than --bpe_dir")
    return params, hparams


def main(corpus_dir="build/corpus", bpe_dir="build/bpe4096", out_dir="models", steps=1500, batch_size=16,
         seq_len=256, lr=1e-3, warmup=100, seed=0, eval_every=250,
         target_shape=(256, 12, 8), draft_shape=(128, 1, 4), target_name="teach-target", draft_name="teach-draft",
         tokens=None, repeat_share=0.0, random_share=0.0, twice_share=0.0, init_from=None,
         state_dir="~/.cache/speculative-kit/train_pair", save_minutes=5.0):
    """Train the pair for `steps` steps; shapes are (n_embd, n_layer, n_head); n_ctx is seq_len.
    tokens: a tokens.npz from tools/pack_corpus.py, read instead of corpus_dir (its vocabulary must be bpe_dir's).
    repeat_share: the share of training windows that repeat one of their spans, random_share the share that repeat
    a sequence of random tokens, twice_share the share that end in a span written twice (see batches).
    init_from: a folder holding target_name and draft_name to start from (their shapes and n_ctx replace the
    shapes and seq_len given). state_dir: where the run saves its state every save_minutes and resumes from."""
    corpus_dir, bpe_dir, out_dir, state_dir = Path(corpus_dir), Path(bpe_dir), Path(out_dir), Path(state_dir).expanduser()
    encoder = get_encoder_from_dir(bpe_dir)
    train, held_out = load_splits(corpus_dir, bpe_dir, encoder, tokens)
    print(f"train tokens {len(train):,}, held-out tokens {len(held_out):,}, vocabulary {encoder.n_vocab}", flush=True)

    def hparams_for(shape):
        n_embd, n_layer, n_head = shape
        return {"n_vocab": encoder.n_vocab, "n_ctx": seq_len, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer}

    names = {"target": target_name, "draft": draft_name}
    if init_from:
        initial_params, hparams = warm_start(init_from, names, encoder)
        seq_len = hparams["target"]["n_ctx"]
    else:
        hparams = {"target": hparams_for(target_shape), "draft": hparams_for(draft_shape)}
    recipe = {"steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "warmup": warmup,
              "seed": seed, "hparams": hparams, "tokens": str(tokens) if tokens else None,
              "repeat_share": repeat_share, "random_share": random_share,
              **({"twice_share": twice_share} if twice_share else {}),  # runs before it resume unchanged
              "init_from": str(init_from) if init_from else None}
    state = load_state(state_dir, recipe)
    if state is None:
        rng = np.random.default_rng(seed)
        if not init_from:
            initial_params = {name: gpt2.init_params(hp, rng) for name, hp in hparams.items()}
        params = jax.tree.map(jnp.asarray, initial_params)
        log = {"recipe": recipe, "jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "evals": [],
               "train_tokens": int(len(train)), "held_out_tokens": int(len(held_out)), "steps_done": 0, "minutes": 0.0}
        state = {"params": params, "opt_state": adamw_init(params), "log": log, "rng": rng.bit_generator.state}
    else:
        print(f"resuming {state_dir / 'state.pkl'} at step {state['log']['steps_done']}", flush=True)
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
    params, opt_state, log = jax.tree.map(jnp.asarray, state["params"]), state["opt_state"], state["log"]
    train_step = make_train_step(hparams["target"]["n_head"], hparams["draft"]["n_head"])
    evaluate = make_evaluate(hparams["target"]["n_head"], hparams["draft"]["n_head"])

    def save():  # the sampler's state is saved with the step it will serve next, so a resumed run sees the same data
        save_state(state_dir, {"params": params, "opt_state": opt_state, "log": log, "rng": rng.bit_generator.state})

    started, minutes_before, last_save = time.perf_counter(), log["minutes"], time.perf_counter()
    data = batches(train, batch_size, seq_len, rng, repeat_share, random_share, encoder.n_vocab, twice_share)
    for step in range(log["steps_done"], steps):
        batch = next(data)
        params, opt_state, target_loss, draft_loss = train_step(
            params, opt_state, batch, learning_rate(step, steps, lr, warmup))
        log.update(steps_done=step + 1, tokens_seen=(step + 1) * batch_size * seq_len,
                   minutes=minutes_before + (time.perf_counter() - started) / 60)
        if step % 50 == 0 or step == steps - 1:
            target_loss, draft_loss = float(target_loss), float(draft_loss)  # waits for the step to finish
            print(f"step {step:5d}  target {target_loss:.3f}  draft KL {draft_loss:.3f}  {log['minutes']:.1f} min", flush=True)
        if (step + 1) % eval_every == 0 or step == steps - 1:
            metrics = held_out_metrics(evaluate, params, held_out, seq_len)
            metrics.update(step=step + 1, minutes=log["minutes"])
            log["evals"].append(metrics)
            write_pair(out_dir, params, hparams, bpe_dir, names, log)  # a usable pair at every evaluation
            print("held-out", json.dumps({k: round(v, 4) for k, v in metrics.items()}), flush=True)
        if time.perf_counter() - last_save > 60 * save_minutes or step == steps - 1:
            save()
            last_save = time.perf_counter()

    print(f"wrote {out_dir / target_name} and {out_dir / draft_name} after {log['minutes']:.1f} min", flush=True)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
