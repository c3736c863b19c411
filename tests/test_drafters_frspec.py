"""drafters/frspec.py: FR-Spec's frequency-ranked draft vocabulary on EAGLE's head (untrained), chain and EAGLE-2
tree.

The vocabulary must be the most frequent ids; the head's p must be zero outside it, sum to 1, and be the full head's p
conditioned on it; the tree must choose no token outside it; and every decoder must stay exact although the draft
can never propose some of the target's tokens: greedy tokens identical to autoregressive decoding, the exact
oracle's law equal to the target's at temperature 1. Bad vocabularies are refused in one line.
"""

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
import gpt2
import sampling
from classroom import exact_law
from conftest import bundled_pair_after
from drafters.eagle import EagleDraft, init_head
from drafters.frspec import ReducedVocabularyEagle, check_vocabulary, coverage, draft_vocabulary, load_vocabulary
from gpt2_cases import random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, assert_greedy_equals_autoregressive, split_prompts
from speedup.stats import SpeculativeStats
from tools import draft_vocabulary as tool
from verifiers.block import block_speculative_sampling
from verifiers.tree import tree_speculative_sampling

PROMPT = "def mean(values):\n    total = 0\n    for"
DYNAMIC = functools.partial(tree_speculative_sampling, drafts="dynamic", n_drafts=2)
REPO = Path(__file__).parents[1]
COMMITTED = REPO / "models" / "teach-eagle-vocabulary.json"
TINY_VOCABULARY = [0, 2]  # leaves out tokens 1 and 3, which the tiny target gives probability > 0 everywhere


def random_head(hparams, seed):  # weights ten times GPT-2's init, so that the head's p is far from uniform
    head = init_head(hparams, np.random.default_rng(seed))
    head["fc"]["w"] = 10 * head["fc"]["w"]
    return head


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target, a random head, every 4th id as the vocabulary)
    tokens, _, target = bundled_pair_after(PROMPT)
    return np.array(tokens), target, random_head(target.hparams, 0), np.arange(0, target.n_vocab, 4)


def tiny_target():
    return gpt2.GPT2Model(random_params(TINY, 3), TINY)


def test_the_vocabulary_is_the_most_frequent_ids_sorted_ties_to_the_lowest_id():
    counts = np.array([5, 0, 9, 5, 1, 5])
    assert draft_vocabulary(counts, 1).tolist() == [2]
    assert draft_vocabulary(counts, 3).tolist() == [0, 2, 3]  # 0 and 3 win the tie at 5 over 5
    assert draft_vocabulary(counts, 6).tolist() == list(range(6))
    assert coverage(counts, draft_vocabulary(counts, 3)) == pytest.approx(19 / 25)


def test_the_readout_multiplies_the_vocabularys_columns_only_and_is_minus_inf_outside(bundled):
    _, target, head, vocabulary = bundled
    drafter = ReducedVocabularyEagle(target, head, 4, vocabulary)
    assert drafter.vocabulary_unembedding.shape == (target.hparams["n_embd"], len(vocabulary))
    predicted = np.random.default_rng(0).standard_normal((3, target.hparams["n_embd"])).astype(np.float32)
    logits = drafter.readout(predicted)
    assert logits.shape == (3, target.n_vocab) and logits.dtype == np.float32
    np.testing.assert_allclose(logits[:, vocabulary], (predicted @ target.params["wte"].T)[:, vocabulary], rtol=1e-5,
                               atol=1e-4)
    assert np.isneginf(np.delete(logits, vocabulary, axis=1)).all()


@pytest.mark.parametrize("settings", [sampling.SamplingSettings(), sampling.SamplingSettings(0.8, top_k=40, top_p=0.9),
                                      sampling.GREEDY])
def test_p_sums_to_1_and_is_zero_outside_the_vocabulary(bundled, settings):
    tokens, target, head, vocabulary = bundled
    drafter = ReducedVocabularyEagle(target, head, 4, vocabulary)
    drafts, p = drafter.propose(tokens, 4, settings, np.random.default_rng(0), SpeculativeStats())
    assert p.shape == (4, target.n_vocab) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=1), 1, atol=1e-5)
    assert not np.delete(p, vocabulary, axis=1).any() and np.isin(drafts, vocabulary).all()
    assert all(p[t][drafts[t]] > 0 for t in range(4))  # each draft drawn from exactly its p


def test_at_temperature_1_p_is_the_full_heads_p_conditioned_on_the_vocabulary(bundled):
    tokens, target, head, vocabulary = bundled
    settings, stats = sampling.SamplingSettings(), SpeculativeStats()
    _, reduced = ReducedVocabularyEagle(target, head, 4, vocabulary).propose(tokens, 1, settings, 0, stats)
    _, full = EagleDraft(target, head).propose(tokens, 1, settings, 0, stats)
    np.testing.assert_allclose(reduced[0, vocabulary], full[0, vocabulary] / full[0, vocabulary].sum(), rtol=1e-4,
                               atol=1e-7)


def test_the_tree_chooses_no_token_outside_the_vocabulary_even_when_asked_for_more_children():
    """n_drafts 3 over a vocabulary of 2: each node gets at most 2 children, both inside."""
    drafter = ReducedVocabularyEagle(tiny_target(), random_head(TINY, 5), 20, TINY_VOCABULARY)
    tree = drafter.draft_tree([1, 2, 3], 2, 3, sampling.SamplingSettings(), SpeculativeStats())
    assert len(tree.tokens) == 2 + 2 * 2 and set(tree.tokens) == set(TINY_VOCABULARY)  # both depth-1 nodes expanded
    assert max(len(children) for children in tree.candidates.values()) == 2


@pytest.mark.parametrize("layout", ["plain", "panels"])
def test_greedy_chain_tokens_equal_autoregressive_decoding_on_the_bundled_target(bundled, layout):
    """The plain target, and one laid out in panels (as main.py builds it): the reduced readout slices the plain wte
    whatever layout the target multiplies its own unembedding in."""
    tokens, target, head, vocabulary = bundled
    if layout != "plain":
        target = engine.fast_model(target.params, target.hparams, layout=layout)
    assert_greedy_equals_autoregressive(tokens, ReducedVocabularyEagle(target, head, 4, vocabulary), target)


def test_greedy_tree_tokens_equal_autoregressive_decoding_on_the_bundled_target(bundled):
    tokens, target, head, vocabulary = bundled
    expected = sampling.autoregressive_sampling(tokens, target, 12, temperature=0)
    target.reset()
    stats = SpeculativeStats()
    got = DYNAMIC(tokens, ReducedVocabularyEagle(target, head, 6, vocabulary), target, 12, 3, 0, temperature=0,
                  stats=stats)
    np.testing.assert_array_equal(got, expected)
    assert stats.drafted > stats.loops


@pytest.mark.parametrize("decoder", ["chain", "tree"])
def test_greedy_tokens_equal_autoregressive_decoding_on_a_tiny_gpt2(decoder):
    target, head = tiny_target(), random_head(TINY, 5)
    for prompt in ([1, 2], [0, 3, 3, 1]):
        N = TINY["n_ctx"] - len(prompt)
        expected = sampling.autoregressive_sampling(prompt, target, N, temperature=0)
        assert not np.isin(expected, TINY_VOCABULARY).all()  # the target writes tokens the draft cannot propose
        target.reset()
        drafter = ReducedVocabularyEagle(target, head, 4, TINY_VOCABULARY)
        if decoder == "chain":
            got = sampling.speculative_sampling(prompt, drafter, target, N, 3, 0, temperature=0)
        else:
            got = DYNAMIC(prompt, drafter, target, N, 3, 0, temperature=0)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, block_speculative_sampling, DYNAMIC])
def test_the_exact_oracle_passes_at_temperature_1_with_tokens_outside_the_vocabulary(decoder):
    """p = 0 on tokens 1 and 3, which the target gives mass everywhere: they come from the residual, exactly."""
    drafter = functools.partial(ReducedVocabularyEagle, head=random_head(TINY, 5), n_nodes=4,
                                vocabulary=TINY_VOCABULARY)
    problem = GPT2Problem("tiny GPT-2, EAGLE head over ids 0 and 2, K=2, N=3", drafter,
                          TinyGPT2Context(random_params(TINY, 3)), (1, 2), 3, 2, sampling.SamplingSettings(), True, 0)
    check = exact_law.check_exact(decoder, problems=[problem])
    assert check.passed, check.report
    assert check.results[0].paths > 1  # the draws did branch


@pytest.mark.parametrize("vocabulary, message", [
    ([], r"a draft vocabulary must be a non-empty list of token ids, got \[\]"),
    ([0, 1.5], r"a draft vocabulary must be a non-empty list of token ids, got \[0\.0, 1\.5\]"),
    ([[0, 1]], r"a draft vocabulary must be a non-empty list of token ids, got \[\[0, 1\]\]"),
    ([0, 4], r"a draft vocabulary's ids must lie in 0\.\.3, got 0\.\.4"),
    ([-1, 2], r"a draft vocabulary's ids must lie in 0\.\.3, got -1\.\.2"),
    ([2, 0, 2], r"a draft vocabulary must list each id once: id 2 is listed 2 times")])
def test_a_bad_vocabulary_is_refused_in_one_line(vocabulary, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ReducedVocabularyEagle(tiny_target(), random_head(TINY, 5), 4, vocabulary)
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_vocabulary(vocabulary, TINY["n_vocab"])


@pytest.mark.parametrize("counts, size, message", [
    ([3, 1], 0, r"the draft vocabulary's size must be an integer in 1\.\.2, got 0"),
    ([3, 1], 3, r"the draft vocabulary's size must be an integer in 1\.\.2, got 3"),
    ([3, 1], 1.0, r"the draft vocabulary's size must be an integer in 1\.\.2, got 1\.0"),
    ([3, -1], 1, r"token_counts must be a non-empty 1-D array of counts >= 0, one per token id"),
    ([], 1, r"token_counts must be a non-empty 1-D array of counts >= 0, one per token id")])
def test_bad_counts_and_sizes_are_refused_in_one_line(counts, size, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        draft_vocabulary(counts, size)


def test_the_tool_writes_the_most_frequent_ids_and_their_coverage(tmp_path):
    tokens = np.array([7, 7, 7, 1, 1, 4, 4, 4, 4, 0], dtype=np.uint16)
    np.save(tmp_path / "tokens.npy", tokens)
    out = tmp_path / "vocabulary.json"
    tool.main(["--size", "2", "--tokens", str(tmp_path / "tokens.npy"), "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["ids"] == [4, 7] and written["coverage"] == pytest.approx(0.7) and written["counted_tokens"] == 10
    assert load_vocabulary(out).tolist() == [4, 7]
    with pytest.raises(SystemExit, match="size must be an integer in 1..4096, got 5000"):
        tool.main(["--size", "5000", "--tokens", str(tmp_path / "tokens.npy"), "--out", str(out)])
    with pytest.raises(ValueError, match=r"^no draft vocabulary at .*missing\.json: write it with python "
                                         r"tools/draft_vocabulary\.py$"):
        load_vocabulary(tmp_path / "missing.json")
    for text in ("not json", '{"size": 2}', '{"ids": ["a"]}'):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match=r"^.*bad\.json is not a draft vocabulary: a JSON object whose \"ids\" "
                                             r"lists token ids$"):
            load_vocabulary(tmp_path / "bad.json")


def test_the_committed_vocabulary_fits_the_bundled_target(bundled):
    _, target, _, _ = bundled
    written = json.loads(COMMITTED.read_text())
    ids = check_vocabulary(load_vocabulary(COMMITTED), target.n_vocab)
    assert written["size"] == len(ids) == 1024 and written["n_vocab"] == target.n_vocab
    assert ids.tolist() == written["ids"] and 0.5 < written["coverage"] < 1


def test_the_bench_measures_every_size_and_checks_the_tokens(tmp_path):
    """bench/frspec_vocabulary.py on the committed head, a few steps of everything: the full vocabulary covers every
    token, a smaller one no more, and the speculative tokens were checked against autoregressive decoding inside.
    The size is chosen on the development split, the rows and the coverage are the test split's."""
    np.save(tmp_path / "tokens.npy", np.random.default_rng(0).integers(0, 4096, 20_000).astype(np.uint16))
    command = [sys.executable, str(REPO / "bench" / "frspec_vocabulary.py"), "--tokens", str(tmp_path / "tokens.npy"),
               "--sizes", "4096,256", "--repeats", "1", "--n_prompts", "1", "--n_tokens", "6",
               "--coverage_prompts", "2", "--prompt_tokens", "32"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout)
    rows = result["by_vocabulary"]
    assert [(row["drafter"], row["size"]) for row in rows] == [("EagleTree", 4096), ("ReducedVocabularyEagle", 4096),
                                                               ("ReducedVocabularyEagle", 256)]
    assert all(rows[i][key] == 1 for i in (0, 1) for key in ("training_coverage", "greedy_next_token_coverage"))
    assert 0 < rows[2]["greedy_next_token_coverage"] < 1 and rows[2]["readout_us"]["median"] > 0
    assert "family" in result["machine"] and result["head"]["steps_done"] > 0 and result["training_tokens"] == 20_000
    choice = result["choice"]
    assert choice["split"] == "dev" and {row["split"] for row in choice["by_vocabulary"]} == {"dev"}
    assert result["split"] == "test" and {row["split"] for row in rows} == {"test"}
    best = max(choice["by_vocabulary"], key=lambda row: row["expected_speedup"])
    assert result["chosen"] == {"drafter": best["drafter"], "size": best["size"]}
    assert result["prompts"]["dev"]["split"] == "dev" and result["prompts"]["test"]["split"] == "test"
    coverage = result["coverage_prompts"]
    assert coverage["split"] == "test" and coverage["ids"] == ["open-00", "open-32"] and coverage["tokens"] == 64
    # the coverage of the text is over the test prompts' own tokens, as cut from the committed file
    text = np.concatenate(split_prompts("test", 2, 32))
    small = set(draft_vocabulary(np.bincount(np.load(tmp_path / "tokens.npy"), minlength=4096), 256).tolist())
    assert rows[2]["heldout_text_coverage"] == pytest.approx(np.mean([token in small for token in text]))