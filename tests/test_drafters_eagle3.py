"""drafters/eagle3.py: EAGLE-3's draft (three tapped layers fused, one draft layer, a readout of its own over a
reduced vocabulary), untrained, as an exact chain and tree drafter.

The head's p must be its formula read by hand (fc over the tapped streams, the midlayer beside the next token's
embedding, norm and lm_head over the draft vocabulary mapped by d2t; later steps reading the midlayer's own output),
zero outside the vocabulary; its cache must give what a fresh head gives after a rollback; every decoder must stay
exact: greedy tokens identical to autoregressive decoding, the exact oracle's law equal to the target's at
temperature 1. Bad heads are refused in one line, and a saved head drafts as it did.
"""

import functools

import numpy as np
import pytest

import engine
import gpt2
import sampling
from classroom import exact_law
from conftest import bundled_pair_after
from drafters import eagle3
from drafters.eagle3 import Eagle3Draft, d2t_vocabulary, default_layers, init_head, vocabulary_d2t
from drafters.heads import load_head, save_head
from gpt2_cases import random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, assert_greedy_equals_autoregressive
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling
from verifiers.tree import tree_speculative_sampling

PROMPT = "def mean(values):\n    total = 0\n    for"
DYNAMIC = functools.partial(tree_speculative_sampling, drafts="dynamic", n_drafts=2)
TINY_LAYERS = (1, 2)  # the tiny target has 2 blocks: no three distinct taps
TINY_VOCABULARY = [0, 2]  # leaves out tokens 1 and 3, which the tiny target gives probability > 0 everywhere


def random_head(hparams, seed, size, n_taps=3):  # fc and lm_head ten times GPT-2's init: p far from uniform
    head = init_head(hparams, np.random.default_rng(seed), size, n_taps)
    head["fc"]["w"] *= 10
    head["lm_head"]["w"] *= 10
    return head


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target, a random head, d2t of every 4th id)
    tokens, _, target = bundled_pair_after(PROMPT)
    vocabulary = np.arange(0, target.n_vocab, 4)
    return np.array(tokens), target, random_head(target.hparams, 0, len(vocabulary)), vocabulary_d2t(vocabulary)


def tiny_drafter(target, n_nodes=4):
    return Eagle3Draft(target, random_head(TINY, 5, len(TINY_VOCABULARY), 2), n_nodes,
                       vocabulary_d2t(TINY_VOCABULARY), TINY_LAYERS)


def by_hand(target, head, d2t, layers, x, drafts=()):  # -> [len(drafts) + 1, n_vocab]: logits after x, each draft
    """g_j = fc over the streams after `layers` at x[:-1]; pairs (g_j, x_{j+1}), then (the midlayer's last output,
    the next draft), all recomputed without a cache; read out by norm and lm_head, spread over the target's ids."""
    params, n_head = target.params, target.hparams["n_head"]
    *residuals, _ = gpt2.hidden_states(x[:-1], **params, n_head=n_head, cache=None, start=0, taps=layers)[0]
    reads, tokens, logits = np.concatenate(residuals, axis=-1) @ head["fc"]["w"], x[1:], []
    midlayer = head["midlayer"]
    for t in range(len(drafts) + 1):
        inputs = np.concatenate([reads, params["wte"][tokens]], axis=-1) @ midlayer["fc"]["w"] + midlayer["fc"]["b"]
        hidden, _ = gpt2.transformer_block(inputs, **midlayer["block"], n_head=n_head)  # causal: no cache needed
        row = np.full(target.n_vocab, -np.inf, np.float32)
        row[d2t_vocabulary(d2t)] = gpt2.layer_norm(hidden[-1], **head["norm"]) @ head["lm_head"]["w"]
        logits.append(row)
        reads, tokens = np.concatenate([reads, hidden[-1:]]), np.append(tokens, drafts[t:t + 1])
    return np.array(logits)


def test_the_reference_taps_and_the_heads_shapes():
    assert default_layers(8) == (2, 4, 5) and default_layers(32) == (2, 16, 29)
    with pytest.raises(ValueError, match="a target of 2 blocks has no three distinct taps"):
        default_layers(2)
    head = init_head({"n_embd": 8, "n_head": 2}, np.random.default_rng(0), 5)
    assert head["fc"]["w"].shape == (24, 8) and "b" not in head["fc"] and head["lm_head"]["w"].shape == (8, 5)
    assert head["midlayer"]["fc"]["w"].shape == (16, 8)
    assert all(array.dtype == np.float32 for array in (head["fc"]["w"], head["lm_head"]["w"], head["norm"]["g"]))
    ids = np.array([0, 3, 4, 9])
    assert vocabulary_d2t(ids).tolist() == [0, 2, 2, 6] and d2t_vocabulary(vocabulary_d2t(ids)).tolist() == ids.tolist()


@pytest.mark.parametrize("settings", [sampling.SamplingSettings(0.8, top_k=40), sampling.SamplingSettings()])
def test_p_is_the_heads_formula_zero_outside_and_the_cache_survives_a_rollback(bundled, settings):
    tokens, target, head, d2t = bundled
    drafter = Eagle3Draft(target, head, 4, d2t)
    assert target.taps == (2, 4, 5)
    drafts, p = drafter.propose(tokens, 3, settings, np.random.default_rng(0), SpeculativeStats())
    assert p.dtype == np.float32 and p.shape == (3, target.n_vocab)
    np.testing.assert_allclose(p, sampling.logits_to_probs(by_hand(target, head, d2t, (2, 4, 5), tokens, drafts[:2]),
                                                           settings), atol=1e-5)
    np.testing.assert_allclose(p.sum(axis=1), 1, atol=1e-5)
    assert not np.delete(p, d2t_vocabulary(d2t), axis=1).any() and all(p[t][drafts[t]] > 0 for t in range(3))
    rolled_back = np.concatenate([tokens, drafts[:1], [7]])  # one draft kept, then the target's correction
    _, p_cached = drafter.propose(rolled_back, 2, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    _, p_fresh = Eagle3Draft(target, head, 4, d2t).propose(rolled_back, 2, sampling.GREEDY, np.random.default_rng(0),
                                                           SpeculativeStats())
    np.testing.assert_array_equal(p_cached, p_fresh)


@pytest.mark.parametrize("layout", ["plain", "panels"])
def test_greedy_tokens_equal_autoregressive_decoding_on_the_bundled_target(bundled, layout):
    """The head's chain (speculative_sampling, and the tree verifier with one child a node) and EAGLE-2's tree grown
    by it, on the plain target and one laid out in panels (as main.py builds it)."""
    tokens, target, head, d2t = bundled
    target = target if layout == "plain" else engine.fast_model(target.params, target.hparams, layout=layout)
    assert_greedy_equals_autoregressive(tokens, Eagle3Draft(target, head, 4, d2t), target)
    target.reset()
    expected = sampling.autoregressive_sampling(tokens, target, 12, temperature=0)
    for n_drafts, nodes_per_loop in ((1, 1), (3, 2)):  # one child a node is a chain; three make a tree
        target.reset()
        stats = SpeculativeStats()
        got = tree_speculative_sampling(tokens, Eagle3Draft(target, head, 6, d2t), target, 12, 3, 0, drafts="dynamic",
                                        n_drafts=n_drafts, temperature=0, stats=stats)
        np.testing.assert_array_equal(got, expected)
        assert stats.drafted >= nodes_per_loop * stats.loops


def test_the_tree_chooses_no_token_outside_the_vocabulary_even_when_asked_for_more_children():
    drafter = tiny_drafter(gpt2.GPT2Model(random_params(TINY, 3), TINY), n_nodes=20)
    tree = drafter.draft_tree([1, 2, 3], 2, 3, sampling.SamplingSettings(), SpeculativeStats())
    assert len(tree.tokens) == 2 + 2 * 2 and set(tree.tokens) == set(TINY_VOCABULARY)


@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, block_speculative_sampling, DYNAMIC])
def test_the_exact_oracle_passes_at_temperature_1_with_tokens_outside_the_vocabulary(decoder):
    problem = GPT2Problem("tiny GPT-2, EAGLE-3 head over ids 0 and 2, K=2, N=3", tiny_drafter,
                          TinyGPT2Context(random_params(TINY, 3)), (1, 2), 3, 2, sampling.SamplingSettings(), True, 0)
    check = exact_law.check_exact(decoder, problems=[problem])
    assert check.passed, check.report
    assert check.results[0].paths > 1  # the draws did branch


def test_greedy_tokens_equal_autoregressive_decoding_on_a_tiny_gpt2():
    target = gpt2.GPT2Model(random_params(TINY, 3), TINY)
    for prompt in ([1, 2], [0, 3, 3, 1]):
        N = TINY["n_ctx"] - len(prompt)
        expected = sampling.autoregressive_sampling(prompt, target, N, temperature=0)
        assert not np.isin(expected, TINY_VOCABULARY).all()  # the target writes tokens the draft cannot propose
        target.reset()
        got = sampling.speculative_sampling(prompt, tiny_drafter(target), target, N, 3, 0, temperature=0)
        np.testing.assert_array_equal(got, expected)


def test_bad_heads_are_refused_in_one_line(bundled):
    _, target, head, d2t = bundled
    with pytest.raises(ValueError, match=r"^the head: fc.w must be \[768, 384\] for 2 taps .* got \[1152, 384\]$"):
        Eagle3Draft(target, head, 4, d2t, layers=(2, 4))
    with pytest.raises(ValueError, match=r"^the head: lm_head.w must be \[384, 3\] .* got \[384, 1024\]$"):
        Eagle3Draft(target, head, 4, vocabulary_d2t([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^d2t must map the draft ids to increasing target ids in \[0, \d+\)$"):
        Eagle3Draft(target, head, 4, np.array([5, -1]))
    with pytest.raises(ValueError, match=r"^the head's layers must be increasing blocks 1\.\.8, got \[2, 4, 9\]$"):
        Eagle3Draft(target, head, 4, d2t, layers=(2, 4, 9))


def test_a_saved_head_drafts_as_it_did(bundled, tmp_path):
    """drafters/heads.py keeps the arrays (in float16) and head.json the d2t and layers the drafter needs."""
    tokens, target, head, d2t = bundled
    info = {"drafter": "eagle3", "target": "teach-target", "target_hparams": target.hparams, "d2t": d2t.tolist(),
            "layers": [2, 4, 5]}
    save_head(tmp_path / "teach-eagle3", head, info)
    loaded, info = load_head(tmp_path / "teach-eagle3", drafter="eagle3")
    drafter = Eagle3Draft(target, loaded, 4, info["d2t"], info["layers"])
    assert drafter.layers == (2, 4, 5) and drafter.eagle3["lm_head"]["w"].dtype == np.float32
    np.testing.assert_array_equal(drafter.vocabulary, d2t_vocabulary(d2t))
    assert eagle3.draft_logits(np.zeros((1, 384), np.float32), drafter.eagle3).shape == (1, len(d2t))
    assert_greedy_equals_autoregressive(tokens, drafter, target, N=8)
