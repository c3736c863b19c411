"""drafters/kangaroo.py: Kangaroo's adapter on the early exit, its own KV cache, and its confidence stop.

An adapter fresh from init_adapter must give EarlyExit's p bit for bit; a trained-looking one (random nonzero
weights) must give, through its caches and after any rollback, what a full recompute gives, including after a loop
that accepted every draft (the adapter never fed the last one); every decoder must stay exact, with and without the
early stop; and the same adapter_forward must run on jax.numpy, as the trainer calls it.
"""

import functools

import numpy as np
import pytest

import engine
import gpt2
import sampling
from classroom import exact_law, lossless
from conftest import bundled_pair_after
from drafters.early_exit import EarlyExit
from drafters.kangaroo import CONFIDENCE_THRESHOLD, AdaptedEarlyExit, adapter_forward, init_adapter
from drafters.load import load_drafter
from gpt2_cases import random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, assert_greedy_equals_autoregressive, count_reused_rows
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling

PROMPT = "def mean(values):\n    total = 0\n    for"
EXIT_LAYER = 2


def random_adapter(hparams, ln_f, seed, scale=10.0):  # an adapter that changes the exit: c_proj nonzero, all scaled
    rng = np.random.default_rng(seed)
    adapter = init_adapter(hparams, rng, ln_f)
    adapter["attn"]["c_proj"]["w"] = (0.02 * rng.standard_normal(adapter["attn"]["c_proj"]["w"].shape)).astype(
        np.float32)
    for dense in adapter["attn"].values():
        dense["w"] *= scale
    return adapter


def by_hand(target, adapter, x, exit_layer=EXIT_LAYER):  # -> the adapted exit's logits after x [n_vocab], no cache
    params, n_head = target.params, target.hparams["n_head"]
    states, _ = gpt2.hidden_states(x, **params, n_head=n_head, cache=None, start=0, taps=(exit_layer,))
    return (adapter_forward(states[0], adapter, n_head, None, 0) @ params["wte"].T)[-1]


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target in the plain layout, a random adapter for it)
    tokens, _, target = bundled_pair_after(PROMPT)
    return np.array(tokens), target, random_adapter(target.hparams, target.params["ln_f"], 0)


def test_init_adapter_nests_like_a_blocks_parts_and_copies_the_targets_final_norm():
    ln_f = {"g": np.full(8, 2.0, np.float32), "b": np.full(8, 0.5, np.float32)}
    adapter = init_adapter(TINY, np.random.default_rng(0), ln_f)
    block = gpt2.init_params(TINY, np.random.default_rng(0))["blocks"][0]
    shapes = lambda tree: {k: shapes(v) if isinstance(v, dict) else v.shape for k, v in tree.items()}
    assert shapes(adapter) == {"ln_1": shapes(block["ln_1"]), "attn": shapes(block["attn"]), "ln_f": shapes(ln_f)}
    assert not adapter["attn"]["c_proj"]["w"].any() and not adapter["attn"]["c_proj"]["b"].any()
    assert adapter["attn"]["c_attn"]["w"].any() and adapter["attn"]["c_attn"]["w"].dtype == np.float32
    np.testing.assert_array_equal(adapter["ln_f"]["g"], ln_f["g"])
    adapter["ln_f"]["g"] += 1  # training the adapter's norm
    assert (ln_f["g"] == 2.0).all()  # leaves the target's alone


def test_a_fresh_adapter_gives_the_early_exits_p_bit_for_bit(bundled):
    tokens, target, _ = bundled
    adapter = init_adapter(target.hparams, np.random.default_rng(1), target.params["ln_f"])
    settings, runs = sampling.SamplingSettings(0.8, top_k=40), []
    for drafter in (EarlyExit(target, EXIT_LAYER), AdaptedEarlyExit(target, adapter, EXIT_LAYER, 0)):
        target.reset()
        logits = drafter.logits(tokens, n_last=len(tokens))
        runs.append((logits, *drafter.propose(tokens, 3, settings, np.random.default_rng(0), SpeculativeStats())))
    for exits, adapted in zip(*runs):  # logits, drafts, p
        np.testing.assert_array_equal(adapted, exits)


def test_adapter_forward_through_its_cache_after_a_rollback_equals_a_fresh_forward():
    rng = np.random.default_rng(2)
    adapter = random_adapter(TINY, gpt2.init_params(TINY, rng)["ln_f"], 2)
    h, other = rng.standard_normal((2, 6, 8)).astype(np.float32)
    whole = adapter_forward(h, adapter, 2, None, 0)
    cache = gpt2.empty_cache({**TINY, "n_layer": 1})[0]
    pieces = [adapter_forward(h[a:b], adapter, 2, cache, a) for a, b in [(0, 3), (3, 4), (4, 6)]]
    assert whole.shape == (6, 8) and whole.dtype == np.float32 and np.abs(whole - h).max() > 0.1
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=1e-5, atol=1e-5)
    rewritten = np.concatenate([h[:3], other[3:]])  # back to slot 3, then other states: slots 3.. are rewritten
    np.testing.assert_allclose(adapter_forward(rewritten[3:], adapter, 2, cache, 3),
                               adapter_forward(rewritten, adapter, 2, None, 0)[3:], rtol=1e-5, atol=1e-5)


class TrustsTheTarget(AdaptedEarlyExit):
    """A bug to plant: resume by the target's record alone, as EarlyExit does, trusting adapter slots never written."""

    def resume_position(self, x, n_last):
        return EarlyExit.resume_position(self, x, n_last)


def draft_verify_then_draft(drafter, target, tokens, keep):  # -> p of 2 drafts after tokens, the kept, a correction
    """One loop by hand: 3 drafts, the target scores them all, then drafts after keep(drafts) + token 7."""
    target.reset()
    drafter.reset()
    settings = sampling.SamplingSettings(0.8)
    drafts, _ = drafter.propose(tokens, 3, settings, np.random.default_rng(0), SpeculativeStats())
    target.logits(np.concatenate([tokens, drafts]), n_last=4)
    x = np.concatenate([tokens, keep(drafts), [7]])
    drafts, p = drafter.propose(x, 2, settings, np.random.default_rng(1), SpeculativeStats())
    expected = [sampling.logits_to_probs(by_hand(target, drafter.adapter, np.append(x, drafts[:t])), settings)
                for t in range(2)]
    return p, np.array(expected)


@pytest.mark.parametrize("keep", [lambda d: d[:1], lambda d: d], ids=["one draft kept", "every draft kept"])
def test_the_drafts_p_after_a_rollback_is_a_full_recomputes(bundled, keep):
    tokens, target, adapter = bundled
    p, expected = draft_verify_then_draft(AdaptedEarlyExit(target, adapter, EXIT_LAYER, 0), target, tokens, keep)
    np.testing.assert_allclose(p, expected, atol=1e-5)


def test_the_planted_bug_reads_the_slot_the_adapter_never_wrote(bundled):
    tokens, target, adapter = bundled
    p, expected = draft_verify_then_draft(TrustsTheTarget(target, adapter, EXIT_LAYER, 0), target, tokens, lambda d: d)
    assert np.abs(p - expected).max() > 1e-3


@pytest.mark.parametrize("layout, confidence_threshold", [("plain", 0.0), ("plain", 0.5), ("panels", 0.0)])
def test_greedy_tokens_equal_autoregressive_decoding(bundled, layout, confidence_threshold):
    """The plain target, and one laid out in panels (engine.fast_model, as main.py builds it): the adapted state is
    read out through either unembedding."""
    tokens, target, adapter = bundled
    if layout != "plain":
        target = engine.fast_model(target.params, target.hparams, layout=layout)
    assert_greedy_equals_autoregressive(tokens, AdaptedEarlyExit(target, adapter, EXIT_LAYER, confidence_threshold),
                                        target)


def test_the_chain_stops_after_the_first_draft_whose_confidence_falls_below_the_threshold(bundled):
    tokens, target, adapter = bundled
    K, never_stops = 5, AdaptedEarlyExit(target, adapter, EXIT_LAYER, 0)
    all_drafts, _ = never_stops.propose(tokens, K, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    confidence = [gpt2.softmax(by_hand(target, adapter, np.append(tokens, all_drafts[:t]))).max() for t in range(K)]
    assert len(all_drafts) == K
    for threshold in (1.0, np.median(confidence), min(confidence) / 2):  # NumPy floats too
        expected = next((t + 1 for t, c in enumerate(confidence) if c < threshold), K)
        stats = SpeculativeStats()
        drafts, p = AdaptedEarlyExit(target, adapter, EXIT_LAYER, threshold).propose(
            tokens, K, sampling.GREEDY, np.random.default_rng(0), stats)
        np.testing.assert_array_equal(drafts, all_drafts[:expected])
        assert p.shape == (expected, target.n_vocab) and stats.draft_calls == expected


# ---- the exact oracle on a tiny random GPT-2 --------------------------------------------------------


def kangaroo_problems(confidence_threshold):
    params = random_params(TINY, 3)
    drafter = functools.partial(AdaptedEarlyExit, adapter=random_adapter(TINY, params["ln_f"], 5), exit_layer=1,
                                confidence_threshold=confidence_threshold)
    context, name = TinyGPT2Context(params), f"tiny GPT-2, adapted exit 1 of 2, threshold {confidence_threshold}"
    return [GPT2Problem(f"{name}, K=2, N=3", drafter, context, (1, 2), 3, 2, sampling.SamplingSettings(), True, 0),
            GPT2Problem(f"{name}, K=3, N=4, greedy", drafter, context, (2, 2), 4, 3, sampling.GREEDY, True, 0,
                        n_joint=4)]


@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, block_speculative_sampling])
@pytest.mark.parametrize("confidence_threshold", [0.0, 0.6])
def test_the_exact_oracle_passes_the_adapted_exit_on_a_tiny_gpt2(monkeypatch, decoder, confidence_threshold):
    reused = count_reused_rows(monkeypatch)
    check = exact_law.check_exact(decoder, problems=kangaroo_problems(confidence_threshold))
    assert check.passed, check.report
    assert max(reused) > 0  # the verifications did start at the exit
    assert check.results[0].paths > 1  # the draws did branch


def test_the_tiny_problems_threshold_does_stop_chains():
    params = random_params(TINY, 3)
    drafter = AdaptedEarlyExit(gpt2.GPT2Model(params, TINY), random_adapter(TINY, params["ln_f"], 5), 1, 0.6)
    lengths = {len(drafter.propose(np.array(x), 3, sampling.SamplingSettings(), np.random.default_rng(seed),
                                   SpeculativeStats())[0]) for x in ([1, 2], [2, 2], [0, 3]) for seed in range(4)}
    assert min(lengths) < 3


# ---- the trainer's path: jax.numpy --------------------------------------------------------------------


@pytest.mark.slow  # importing JAX takes seconds
def test_adapter_forward_on_jax_equals_numpy_one_sequence_and_under_vmap():
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(4)
    adapter = random_adapter(TINY, gpt2.init_params(TINY, rng)["ln_f"], 4)
    h = rng.standard_normal((3, 6, 8)).astype(np.float32)  # a batch of three sequences
    expected = np.array([adapter_forward(sequence, adapter, 2, None, 0) for sequence in h])
    on_jax = jax.tree_util.tree_map(jax.numpy.asarray, adapter)
    one = adapter_forward(jax.numpy.asarray(h[0]), on_jax, 2, None, 0)
    batched = jax.vmap(lambda sequence: adapter_forward(sequence, on_jax, 2, None, 0))(jax.numpy.asarray(h))
    assert one.dtype == batched.dtype == jax.numpy.float32
    np.testing.assert_allclose(np.asarray(one), expected[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(batched), expected, rtol=1e-4, atol=1e-5)


# ---- bad inputs ---------------------------------------------------------------------------------------


def test_adapters_that_do_not_fit_the_target_and_bad_thresholds_are_refused(bundled):
    _, target, adapter = bundled
    narrow = init_adapter({"n_embd": 64}, np.random.default_rng(0), {"g": np.ones(64), "b": np.zeros(64)})
    message = r"^the adapter: ln_1.g must be \[384\] for a target of n_embd 384, got \[64\]$"
    with pytest.raises(ValueError, match=message):
        AdaptedEarlyExit(target, narrow, EXIT_LAYER)
    with pytest.raises(ValueError, match=r"^the adapter: no ln_f.g \(it nests as its init function builds it\)$"):
        AdaptedEarlyExit(target, {key: adapter[key] for key in ("ln_1", "attn")}, EXIT_LAYER)
    with pytest.raises(ValueError, match=r"^the adapter: ln_f.g must be \[8\] for a target of n_embd 8, got \[9\]$"):
        init_adapter(TINY, np.random.default_rng(0), {"g": np.ones(9), "b": np.zeros(9)})
    for threshold in (-0.1, 1.5, True, "0.5", None):
        with pytest.raises(ValueError, match=r"^the confidence threshold must be a number in \[0, 1\], got "):
            AdaptedEarlyExit(target, adapter, EXIT_LAYER, threshold)
    with pytest.raises(ValueError, match="--exit_layer must be an integer"):
        AdaptedEarlyExit(target, adapter, 8)
    with pytest.raises(ValueError, match="gpt2.GPT2Model"):
        AdaptedEarlyExit(lossless.CachedTableModel(lossless.random_context_table(4, 0)), adapter, 1)


def test_load_drafter_passes_the_confidence_threshold_kangaroos_code_stops_at_by_default(bundled):
    _, target, _ = bundled
    assert load_drafter("kangaroo", target).confidence_threshold == CONFIDENCE_THRESHOLD == 0.6
    assert load_drafter("kangaroo", target, confidence_threshold=0).confidence_threshold == 0.0
    with pytest.raises(ValueError, match=r"^the confidence threshold must be a number in \[0, 1\], got 2$"):
        load_drafter("kangaroo", target, confidence_threshold=2)
