"""drafters/eagle.py: EAGLE's draft head, untrained, as an exact chain drafter.

The head's p must be its formula read by hand (the target's features beside the next tokens, fc, one block, the
target's unembedding; with EAGLE-3's fusion, lower layers' residual streams added to the features first), its cache
must give what a fresh head gives after a rollback, and every decoder must stay exact with it: greedy tokens identical
to autoregressive decoding, the exact oracle's law equal to the target's, even with the pairing wired wrong (which
costs acceptance only).
"""

import functools

import numpy as np
import pytest

import engine
import gpt2
import sampling
from classroom import exact_law, lossless
from conftest import bundled_pair_after
from drafters.eagle import EagleDraft, head_forward, init_fuse, init_head
from gpt2_cases import random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, assert_greedy_equals_autoregressive
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling

PROMPT = "def mean(values):\n    total = 0\n    for"


def random_head(hparams, seed):  # weights ten times GPT-2's init, so that the head's p is far from uniform
    head = init_head(hparams, np.random.default_rng(seed))
    head["fc"]["w"] = 10 * head["fc"]["w"]
    return head


def fused_head(hparams, seed, taps):  # random_head fusing the residual streams after `taps`, its matrices non-zero
    head = init_fuse(random_head(hparams, seed), taps)
    rng = np.random.default_rng(seed + 1)
    for fuse in head["fuse"].values():
        fuse["w"] = (0.1 * rng.standard_normal(fuse["w"].shape)).astype(np.float32)
    return head


def by_hand(target, head, x, drafts=()):  # -> [len(drafts) + 1, n_vocab]: the head's logits after x, then each draft
    """Pairs (f_j, x_{j+1}) from the target's true features (plus, for a fused head, each tapped residual stream
    normed by the next block's ln_1 times its fuse matrix), then (the head's last prediction, the next draft), all
    recomputed without a cache."""
    params, n_head, taps = target.params, target.hparams["n_head"], sorted(int(l) for l in head.get("fuse", {}))
    *residuals, features = gpt2.hidden_states(x[:-1], **params, n_head=n_head, cache=None, start=0, taps=taps)[0]
    for layer, residual in zip(taps, residuals):  # f_0..f_{n-2}, each with what the head fuses beside it
        normed = gpt2.layer_norm(residual, **params["blocks"][layer]["ln_1"])
        features = features + normed @ head["fuse"][str(layer)]["w"]
    tokens, logits = x[1:], []
    for t in range(len(drafts) + 1):
        inputs = np.concatenate([features, params["wte"][tokens]], axis=-1) @ head["fc"]["w"] + head["fc"]["b"]
        predicted, _ = gpt2.transformer_block(inputs, **head["block"], n_head=n_head)  # causal: no cache needed
        logits.append(predicted[-1] @ params["wte"].T)
        features, tokens = np.concatenate([features, predicted[-1:]]), np.append(tokens, drafts[t:t + 1])
    return np.array(logits)


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target in the plain layout, a random head for it)
    tokens, _, target = bundled_pair_after(PROMPT)
    return np.array(tokens), target, random_head(target.hparams, 0)


def test_init_head_nests_like_a_block_and_reads_twice_the_width():
    head = init_head(TINY, np.random.default_rng(0))
    assert head["fc"]["w"].shape == (16, 8) and head["fc"]["b"].shape == (8,)
    block = gpt2.init_params(TINY, np.random.default_rng(0))["blocks"][0]
    shapes = lambda tree: {k: shapes(v) if isinstance(v, dict) else v.shape for k, v in tree.items()}
    assert shapes(head["block"]) == shapes(block)
    assert all(leaf.dtype == np.float32 for leaf in [head["fc"]["w"], head["block"]["attn"]["c_attn"]["w"]])


def test_head_forward_in_pieces_through_its_cache_equals_one_call():
    rng = np.random.default_rng(1)
    head, wte = random_head(TINY, 1), rng.standard_normal((4, 8)).astype(np.float32)
    features, tokens = rng.standard_normal((6, 8)).astype(np.float32), np.array([3, 1, 0, 2, 2, 1])
    whole = head_forward(features, tokens, head, wte, 2, None, 0)
    cache = gpt2.empty_cache({**TINY, "n_layer": 1})[0]
    pieces = [head_forward(features[a:b], tokens[a:b], head, wte, 2, cache, a) for a, b in [(0, 3), (3, 4), (4, 6)]]
    assert whole.shape == (6, 8) and whole.dtype == np.float32
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("taps", [(), (2, 5)])
def test_p_is_the_heads_formula_and_the_cache_survives_a_rollback(bundled, taps):
    tokens, target, head = bundled
    head = fused_head(target.hparams, 0, taps) if taps else head
    drafter, settings = EagleDraft(target, head), sampling.SamplingSettings(0.8, top_k=40)
    drafts, p = drafter.propose(tokens, 3, settings, np.random.default_rng(0), SpeculativeStats())
    assert p.dtype == np.float32 and p.shape == (3, target.n_vocab) and np.count_nonzero(p[0]) <= 40
    expected = sampling.logits_to_probs(by_hand(target, head, tokens, drafts[:2]), settings)  # step t after t drafts
    np.testing.assert_allclose(p, expected, atol=1e-5)
    assert all(p[t][drafts[t]] > 0 for t in range(3))
    rolled_back = np.concatenate([tokens, drafts[:1], [7]])  # one draft kept, then the target's correction
    _, p_cached = drafter.propose(rolled_back, 2, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    _, p_fresh = EagleDraft(target, head).propose(rolled_back, 2, sampling.GREEDY, np.random.default_rng(0),
                                                  SpeculativeStats())
    np.testing.assert_array_equal(p_cached, p_fresh)  # greedy one-hots: the same argmax after the rollback
    np.testing.assert_array_equal(p_cached[:1], sampling.logits_to_probs(by_hand(target, head, rolled_back),
                                                                         sampling.GREEDY))


@pytest.mark.parametrize("layout, taps", [("plain", ()), ("panels", ()), ("panels", (1, 4))])
def test_greedy_tokens_equal_autoregressive_decoding(bundled, layout, taps):
    """The plain target, and one whose weights and unembedding are laid out in panels (engine.fast_model, as main.py
    builds it): the head reads the features (and a fused head the tapped streams) and multiplies the unembedding
    through either."""
    tokens, target, head = bundled
    head = fused_head(target.hparams, 0, taps) if taps else head
    if layout != "plain":
        target = engine.fast_model(target.params, target.hparams, layout=layout)
    assert_greedy_equals_autoregressive(tokens, EagleDraft(target, head), target)


def test_no_drafts_for_K_0_or_a_prompt_of_one_token(bundled):
    tokens, target, head = bundled
    for x, K in ((tokens, 0), (tokens[:1], 4)):
        drafts, p = EagleDraft(target, head).propose(x, K, sampling.GREEDY, np.random.default_rng(0),
                                                     SpeculativeStats())
        assert drafts.shape == (0,) and p.shape == (0, target.n_vocab)


# ---- the exact oracle on a tiny random GPT-2 --------------------------------------------------------


class OffByOne(EagleDraft):
    """A wiring bug to plant: feature f_j beside token x_j instead of x_{j+1}."""

    def paired_tokens(self, x):
        return x[:-1]


def eagle_problems(drafter, head=None):
    drafter = functools.partial(drafter, head=random_head(TINY, 5) if head is None else head)
    context = TinyGPT2Context(random_params(TINY, 3))
    return [GPT2Problem("tiny GPT-2, EAGLE head, K=2, N=3", drafter, context, (1, 2), 3, 2,
                        sampling.SamplingSettings(), True, 0),
            GPT2Problem("tiny GPT-2, EAGLE head, K=3, N=4, greedy", drafter, context, (2, 2), 4, 3, sampling.GREEDY,
                        True, 0, n_joint=4)]


@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, block_speculative_sampling])
@pytest.mark.parametrize("drafter", [EagleDraft, OffByOne])
def test_the_exact_oracle_passes_the_head_wired_right_or_wrong(drafter, decoder):
    """The lesson of the planted bug: an off-by-one pairing is exact (the oracle cannot see it); it only costs
    acceptance, so only a measurement of acceptance after training would catch it."""
    check = exact_law.check_exact(decoder, problems=eagle_problems(drafter))
    assert check.passed, check.report
    assert check.results[0].paths > 1  # the draws did branch


def test_the_exact_oracle_passes_a_head_that_fuses_a_lower_layer():
    check = exact_law.check_exact(sampling.speculative_sampling,
                                  problems=eagle_problems(EagleDraft, fused_head(TINY, 5, (1,))))
    assert check.passed, check.report


def test_a_zero_fusion_drafts_as_the_head_without_it_and_taps_the_target_once(bundled):
    tokens, target, head = bundled
    target.tap(())  # the target is shared by this file's tests, and drafters add to its taps (features.tap_also)
    proposals = [EagleDraft(target, each).propose(tokens, 3, sampling.SamplingSettings(), np.random.default_rng(0),
                                                  SpeculativeStats()) for each in (head, init_fuse(head, (3,)))]
    assert target.taps == (3,) and target.states.shape == (2, target.n_ctx, target.hparams["n_embd"])
    np.testing.assert_array_equal(proposals[0][0], proposals[1][0])
    np.testing.assert_allclose(proposals[0][1], proposals[1][1], atol=1e-6)
    EagleDraft(target, head)  # a head that fuses nothing reads the features alone: the target stays tapped
    assert target.taps == (3,)


def test_the_planted_bug_does_change_the_drafts():
    target = gpt2.GPT2Model(random_params(TINY, 3), TINY)
    x, settings = np.array([1, 2, 0, 3]), sampling.SamplingSettings()
    _, right = EagleDraft(target, random_head(TINY, 5)).propose(x, 2, settings, np.random.default_rng(0), SpeculativeStats())
    _, wrong = OffByOne(target, random_head(TINY, 5)).propose(x, 2, settings, np.random.default_rng(0), SpeculativeStats())
    assert np.abs(right - wrong).max() > 1e-3


def test_bad_targets_and_heads_are_refused(bundled):
    _, target, head = bundled
    with pytest.raises(ValueError, match="gpt2.GPT2Model"):
        EagleDraft(lossless.CachedTableModel(lossless.random_context_table(4, 0)), head)
    with pytest.raises(ValueError, match=r"the head: fc.w must be \[768, 384\] for a target of n_embd 384, got \[128, 64\]"):
        EagleDraft(target, init_head({"n_embd": 64}, np.random.default_rng(0)))
    for taps in [(0,), (8,)]:
        with pytest.raises(ValueError, match=r"blocks 1..8, and the last one's stream is f itself"):
            EagleDraft(target, init_fuse(head, taps))
