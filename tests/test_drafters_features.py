"""The target's features as gpt2.GPT2Model keeps them and drafters/features.true_features reads them.

The state after ln_f of every cache slot is written by the forward pass that writes the slot's keys and values, so it
must equal a fresh forward's wherever the cache holds tokens: after extensions and rollbacks, in a laid-out engine, in
a token tree's scratch slots and after keep_tree_path. true_features reads those rows and feeds the target only what
its cache lacks, so that EAGLE's proposals cost the target no forward of their own.
"""

import numpy as np
import pytest

import engine
import gpt2
import sampling
from conftest import bundled_pair_after
from drafters.eagle import EagleDraft, init_fuse, init_head
from drafters.features import true_features, true_states
from gpt2_cases import random_params
from speedup.stats import SpeculativeStats

HPARAMS = {"n_vocab": 40, "n_ctx": 32, "n_embd": 16, "n_head": 2, "n_layer": 2}
PARAMS = random_params(HPARAMS, 0)
TOKENS = np.random.default_rng(0).integers(0, HPARAMS["n_vocab"], 20)
HIDDEN_STATES = gpt2.hidden_states  # the reference, beside record_forwards' counting wrapper


def fresh_features(tokens):  # -> [n, n_embd]: one forward without a cache
    return HIDDEN_STATES(np.asarray(tokens), **PARAMS, n_head=HPARAMS["n_head"], cache=None, start=0)[0][-1]


def fresh_states(tokens, taps):  # -> [len(taps) + 1, n, n_embd]: the tapped streams and the features, uncached
    return np.stack(HIDDEN_STATES(np.asarray(tokens), **PARAMS, n_head=HPARAMS["n_head"], cache=None, start=0,
                                  taps=taps)[0])


def assert_close(got, expected):  # cached against uncached: the same ops in other shapes, float32 rounding apart
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def record_forwards(monkeypatch):  # -> the list of (start, tokens fed, with a cache) of every hidden_states call
    calls = []
    monkeypatch.setattr(gpt2, "hidden_states", lambda inputs, *args, **kwargs: calls.append(
        (kwargs["start"], len(inputs), kwargs["cache"] is not None)) or HIDDEN_STATES(inputs, *args, **kwargs))
    return calls


@pytest.mark.parametrize("layout", ["plain", "panels"])
def test_the_kept_features_are_a_fresh_forwards_wherever_the_cache_holds_tokens(layout):
    """Extend, roll back into the middle, roll back to a shared prefix, extend again: the features of the slots the
    cache holds are the fresh forward's, and the logits are those features through the unembedding."""
    model = engine.fast_model(PARAMS, HPARAMS, layout=layout)
    other = TOKENS.copy()
    other[9:] = (other[9:] + 1) % HPARAMS["n_vocab"]
    for x in (TOKENS[:6], TOKENS[:11], other[:15], other[:9], TOKENS[:20]):
        logits = model.logits(x, n_last=2)
        assert model.features.shape == (HPARAMS["n_ctx"], HPARAMS["n_embd"]) and model.features.dtype == np.float32
        assert np.array_equal(model.cached_tokens, x)
        assert_close(model.features[:len(x)], fresh_features(x))
        assert_close(logits, model.features[len(x) - 2:len(x)] @ PARAMS["wte"].T)


def test_a_trees_features_wait_in_scratch_slots_and_the_kept_path_moves_them():
    model = gpt2.GPT2Model(PARAMS, HPARAMS)
    x, tokens, parents = TOKENS[:5], np.array([9, 2, 6, 5]), np.array([-1, 0, -1, 1])
    paths = {0: [0], 1: [0, 1], 2: [2], 3: [0, 1, 3]}  # each node's path down from the root
    model.logits(x[:3])  # the tree call then feeds x[3:] as a chain beside the nodes
    model.tree_logits(x, tokens, parents)
    assert_close(model.features[:len(x)], fresh_features(x))
    for node, path in paths.items():
        assert_close(model.features[len(x) + node], fresh_features(np.append(x, tokens[path]))[-1])
    model.keep_tree_path(paths[3])
    assert np.array_equal(model.cached_tokens, np.append(x, tokens[paths[3]]))
    assert_close(model.features[:len(model.cached_tokens)], fresh_features(model.cached_tokens))


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_tapped_target_keeps_the_streams_after_its_taps_beside_the_features(backend):
    """tap((1,)): every call that feeds the cache (chains, rollbacks, a tree and its kept path) writes the residual
    stream after block 1 of each slot beside its features, as a fresh forward computes them."""
    if backend == "jax":
        pytest.importorskip("jax")
        from jax_backend.gpt2_jax import JaxGPT2Model
    model = gpt2.GPT2Model(PARAMS, HPARAMS) if backend == "numpy" else JaxGPT2Model(PARAMS, HPARAMS)
    model.logits(TOKENS[:4])
    model.tap((1,))
    assert model.taps == (1,) and len(model.cached_tokens) == 0  # tapping forgets the cache
    other = TOKENS.copy()
    other[9:] = (other[9:] + 1) % HPARAMS["n_vocab"]
    for x in (TOKENS[:6], TOKENS[:11], other[:15], other[:9]):
        model.logits(x, n_last=2)
        assert model.states.shape == (2, HPARAMS["n_ctx"], HPARAMS["n_embd"])
        assert_close(true_states(model, x), fresh_states(x, (1,)))
        assert_close(true_features(model, x[:-1], start=3), fresh_features(x[:-1])[3:])
    x, tokens, parents = TOKENS[:5], np.array([9, 2, 6, 5]), np.array([-1, 0, -1, 1])
    model.tree_logits(x, tokens, parents)
    model.keep_tree_path([0, 1])
    kept = np.concatenate([x, tokens[[0, 1]]])
    assert_close(true_states(model, kept), fresh_states(kept, (1,)))
    untapped = gpt2.GPT2Model(PARAMS, HPARAMS, use_cache=False)
    untapped.tap((1,))
    assert_close(true_states(untapped, TOKENS[:7], start=2), fresh_states(TOKENS[:7], (1,))[:, 2:])


def test_true_features_reads_the_kept_rows_and_feeds_only_what_the_cache_lacks(monkeypatch):
    forwards = record_forwards(monkeypatch)
    model = gpt2.GPT2Model(PARAMS, HPARAMS)
    prompt = TOKENS[:9]
    features = true_features(model, prompt[:-1])  # a prompt the target has not read: fed through its cache
    assert forwards == [(0, 8, True)] and np.array_equal(model.cached_tokens, prompt[:-1])
    assert_close(features, fresh_features(prompt[:-1]))
    assert not np.shares_memory(features, model.features)  # a copy: the target's next calls overwrite its rows
    drafts = TOKENS[9:12]
    model.logits(np.append(prompt, drafts), n_last=len(drafts) + 1)  # the verification resumes after the prefix
    assert forwards[1:] == [(8, 4, True)]
    assert_close(true_features(model, TOKENS[:11]), fresh_features(TOKENS[:11]))  # two drafts kept: no forward
    assert len(forwards) == 2
    corrected = np.append(TOKENS[:10], (TOKENS[10] + 1) % HPARAMS["n_vocab"])  # a rejected draft's slot is refed
    assert_close(true_features(model, corrected), fresh_features(corrected))
    assert forwards[2:] == [(10, 1, True)]


def test_without_a_cache_there_are_no_kept_features_and_a_separate_forward_computes_them():
    model = gpt2.GPT2Model(PARAMS, HPARAMS, use_cache=False)
    assert model.features is None
    model.logits(TOKENS[:7])
    assert model.features is None
    np.testing.assert_array_equal(true_features(model, TOKENS[:7]), fresh_features(TOKENS[:7]))


@pytest.mark.parametrize("temperature", [0, 1])
def test_eagle_costs_the_target_one_forward_per_loop_and_the_prompt_once(monkeypatch, temperature):
    """No recompute: each loop's verification is the target's only forward, besides the prompt's read in the first
    proposal, and each verification feeds just x's last token and the drafts."""
    tokens, _, target = bundled_pair_after("def mean(values):\n    total = 0\n    for")
    head = init_head(target.hparams, np.random.default_rng(0))
    forwards, stats = record_forwards(monkeypatch), SpeculativeStats()
    sampling.speculative_sampling(tokens, EagleDraft(target, head), target, 16, 4, 0, temperature=temperature,
                                  stats=stats)
    assert stats.drafted > 0 and len(forwards) == stats.loops + 1
    assert forwards[0] == (0, len(tokens) - 1, True)  # the prompt but its last token, fed for its features
    assert all(cached for _, _, cached in forwards)  # no separate forward without the cache
    assert sum(n_fed for _, n_fed, _ in forwards[1:]) == stats.drafted + stats.loops


# ------------------------------------------------------------------ the JAX model keeps them on its device


def test_the_jax_model_keeps_a_fresh_forwards_features_through_every_call_that_feeds_its_cache():
    """Its blocks (padded to buckets, rolled back), draft() and the device loops of sampling_jax write the features
    of the slots they feed, as gpt2.GPT2Model's forward does (its trees: tests/test_tree_attention.py)."""
    jax = pytest.importorskip("jax")
    from jax_backend import gpt2_jax, sampling_jax

    model = gpt2_jax.JaxGPT2Model(PARAMS, HPARAMS)
    assert model.features.shape == (HPARAMS["n_ctx"], HPARAMS["n_embd"]) and model.features.dtype == jax.numpy.float32
    other = TOKENS.copy()
    other[9:] = (other[9:] + 1) % HPARAMS["n_vocab"]
    for x in (TOKENS[:6], TOKENS[:11], other[:15], other[:9]):
        model.logits(x, n_last=2)
        assert_close(true_features(model, x), fresh_features(x))
    model.draft(TOKENS[:9], 4, [0.5] * 4)
    assert_close(true_features(model, model.cached_tokens), fresh_features(model.cached_tokens))
    for decoder, models in (("autoregressive_sampling", [model]), ("speculative_sampling",
                                                                   [gpt2_jax.JaxGPT2Model(PARAMS, HPARAMS), model])):
        model.reset()
        getattr(sampling_jax, decoder)(TOKENS[:5], *models, 12, **({"K": 3} if len(models) == 2 else {}),
                                       rng=np.random.default_rng(0), stats=SpeculativeStats())
        assert_close(true_features(model, model.cached_tokens), fresh_features(model.cached_tokens))


@pytest.mark.parametrize("taps", [(), (1,)])
def test_eagle_drafts_from_a_jax_target_what_it_drafts_from_a_numpy_one(taps):
    pytest.importorskip("jax")
    from jax_backend import gpt2_jax

    head, x, settings = init_head(HPARAMS, np.random.default_rng(1)), TOKENS[:12], sampling.SamplingSettings()
    if taps:  # a head that fuses the stream after block 1 (EAGLE-3), its matrix non-zero
        head = init_fuse(head, taps)
        head["fuse"]["1"]["w"] = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    proposals = [EagleDraft(target, head).propose(x, 3, settings, np.random.default_rng(2), SpeculativeStats())
                 for target in (gpt2.GPT2Model(PARAMS, HPARAMS), gpt2_jax.JaxGPT2Model(PARAMS, HPARAMS))]
    assert np.array_equal(proposals[0][0], proposals[1][0])
    assert_close(proposals[1][1], proposals[0][1])
