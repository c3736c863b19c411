"""drafters/early_exit.py and gpt2.hidden_states: the target's features tapped, and its early exit as an exact draft.

The tap must equal a forward pass written out by hand; the early exit must keep every decoder exact (greedy
tokens identical to autoregressive decoding, the exact oracle's law equal to the target's) while it writes into
the target's own KV cache, and leave that cache as the target alone would have it.
"""

import functools

import numpy as np
import pytest

import gpt2
import sampling
from classroom import exact_law, lossless
from conftest import bundled_pair_after
from drafters.early_exit import EarlyExit
from gpt2_cases import CONFIGS, random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, assert_greedy_equals_autoregressive
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling

THREE_LAYERS = CONFIGS[2]  # n_layer 3: taps after one and two blocks
N_HEAD = THREE_LAYERS["n_head"]
PROMPT = "def mean(values):\n    total = 0\n    for"


def manual_forward(tokens, params, n_head):  # -> the residual stream after each block, then ln_f's output
    x = params["wte"][tokens] + params["wpe"][np.arange(len(tokens))]
    states = []
    for block in params["blocks"]:
        x, _ = gpt2.transformer_block(x, **block, n_head=n_head)
        states.append(x)
    return states, gpt2.layer_norm(x, **params["ln_f"])


def test_hidden_states_are_the_residual_stream_and_the_final_state_of_a_manual_forward():
    params, tokens = random_params(THREE_LAYERS, 0), np.array([3, 1, 4, 1, 5, 9, 2, 6])
    residual, final = manual_forward(tokens, params, N_HEAD)
    for cache in (None, gpt2.empty_cache(THREE_LAYERS)):
        states, _ = gpt2.hidden_states(tokens, **params, n_head=N_HEAD, cache=cache, start=0, taps=(1, 2))
        assert len(states) == 3 and all(state.dtype == np.float32 for state in states)
        np.testing.assert_array_equal(states[0], residual[0])
        np.testing.assert_array_equal(states[1], residual[1])
        np.testing.assert_array_equal(states[2], final)
        np.testing.assert_array_equal(states[2] @ params["wte"].T, gpt2.gpt2(tokens, **params, n_head=N_HEAD))
    untapped, _ = gpt2.hidden_states(tokens, **params, n_head=N_HEAD, cache=None, start=0)
    assert len(untapped) == 1 and np.array_equal(untapped[0], final)


@pytest.mark.slow  # importing JAX takes seconds
def test_hidden_states_on_jax_equal_numpy():
    jnp = pytest.importorskip("jax.numpy")
    params, tokens = random_params(THREE_LAYERS, 1), np.array([2, 7, 1, 8, 2, 8])
    expected, _ = gpt2.hidden_states(tokens, **params, n_head=N_HEAD, cache=None, start=0, taps=(2,))
    as_jax = lambda tree: {key: as_jax(value) if isinstance(value, dict) else jnp.asarray(value)
                           for key, value in tree.items()}
    on_jax = {**as_jax({key: params[key] for key in ("wte", "wpe", "ln_f")}),
              "blocks": list(map(as_jax, params["blocks"]))}
    states, _ = gpt2.hidden_states(jnp.asarray(tokens), **on_jax, n_head=N_HEAD, cache=None, start=0, taps=(2,))
    for state, reference in zip(states, expected):
        assert state.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(state), reference, rtol=1e-4, atol=1e-5 * np.abs(reference).max())


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target in the plain layout)
    tokens, _, target = bundled_pair_after(PROMPT)
    return tokens, target


def test_the_exit_reads_the_tapped_residual_stream_through_ln_f_and_the_unembedding(bundled):
    tokens, target = bundled
    target.reset()
    states, _ = gpt2.hidden_states(np.array(tokens), **target.params, n_head=target.hparams["n_head"], cache=None,
                                   start=0, taps=(2,))
    expected = gpt2.layer_norm(states[0], **target.params["ln_f"]) @ target.params["wte"].T
    np.testing.assert_allclose(EarlyExit(target, 2).logits(tokens, n_last=len(tokens)), expected, rtol=1e-4,
                               atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("exit_layer", [2, 4])
def test_greedy_tokens_equal_autoregressive_decoding(bundled, exit_layer):
    tokens, target = bundled
    assert_greedy_equals_autoregressive(tokens, EarlyExit(target, exit_layer), target)


def caches_equal(a, b, n):  # the first n slots of every layer's keys and values
    return all(np.array_equal(x[:, :n], y[:, :n]) for layer_a, layer_b in zip(a, b) for x, y in zip(layer_a, layer_b))


def test_sharing_the_cache_changes_neither_the_tokens_nor_the_targets_cache(bundled):
    """At temperature 1, one seed: the exit writing into the target's cache gives the tokens and the target cache of
    an exit with a cache of its own, bit for bit; and that cache is a fresh target's for the final sequence."""
    tokens, target = bundled
    own_copy = gpt2.GPT2Model(target.params, target.hparams)  # the same weights, a second cache: the naive way
    separate = gpt2.GPT2Model(target.params, target.hparams)
    runs = {}
    for name, model, exit_of in (("shared", target, target), ("separate", separate, own_copy)):
        for m in (model, exit_of):
            m.reset()
        runs[name] = sampling.speculative_sampling(tokens, EarlyExit(exit_of, 3), model, 16, 4, 7, temperature=1.0)
    np.testing.assert_array_equal(runs["shared"], runs["separate"])
    n = len(target.cached_tokens)
    assert n >= len(runs["shared"]) - 1 and np.array_equal(target.cached_tokens, runs["shared"][:n])
    assert np.array_equal(separate.cached_tokens, target.cached_tokens)
    assert caches_equal(target.cache, separate.cache, n)
    fresh = gpt2.GPT2Model(target.params, target.hparams)
    fresh.logits(target.cached_tokens)
    for (keys, values), (fresh_keys, fresh_values) in zip(target.cache, fresh.cache):
        for ours, theirs in ((keys, fresh_keys), (values, fresh_values)):  # one call of n rows against many calls
            np.testing.assert_allclose(ours[:, :n], theirs[:, :n], rtol=1e-4, atol=1e-5 * np.abs(theirs[:, :n]).max())


def test_a_draft_of_no_tokens_touches_nothing_and_p_is_the_rules(bundled):
    tokens, target = bundled
    target.reset()
    target.logits(tokens)
    cached = target.cached_tokens
    drafts, p = EarlyExit(target, 2).propose(tokens, 0, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    assert drafts.shape == (0,) and p.shape == (0, target.n_vocab) and target.cached_tokens is cached
    settings = sampling.SamplingSettings(0.8, top_k=40)
    drafts, p = EarlyExit(target, 2).propose(tokens, 3, settings, np.random.default_rng(0), SpeculativeStats())
    assert p.dtype == np.float32 and len(drafts) == 3
    reference = gpt2.GPT2Model(target.params, target.hparams)
    for t in range(3):  # each p is logits_to_probs of the exit's logits after the prompt and the drafts before it
        sequence = np.concatenate([tokens, drafts[:t]])
        exit_logits = EarlyExit(reference, 2).logits(sequence)
        np.testing.assert_allclose(p[t], sampling.logits_to_probs(exit_logits, settings)[0], atol=1e-6)
        assert p[t][drafts[t]] > 0 and np.count_nonzero(p[t]) <= 40


# ---- the exact oracle on a tiny random GPT-2 --------------------------------------------------------


def early_exit_problems(drafter=functools.partial(EarlyExit, exit_layer=1)):
    context = TinyGPT2Context(random_params(TINY, 3))
    return [GPT2Problem("tiny GPT-2, exit 1 of 2, K=2, N=3", drafter, context, (1, 2), 3, 2,
                        sampling.SamplingSettings(), True, 0),
            GPT2Problem("tiny GPT-2, exit 1 of 2, K=2, N=3, temperature 0.7, top-k 3, top-p 0.9", drafter, context,
                        (3, 0), 3, 2, sampling.SamplingSettings(0.7, 3, 0.9), True, 0),
            GPT2Problem("tiny GPT-2, exit 1 of 2, K=3, N=4, greedy", drafter, context, (2, 2), 4, 3, sampling.GREEDY,
                        True, 0, n_joint=4)]


@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, block_speculative_sampling])
def test_the_exact_oracle_passes_the_early_exit_on_a_tiny_gpt2(decoder):
    check = exact_law.check_exact(decoder, problems=early_exit_problems())
    assert check.passed, check.report
    assert all(result.paths > 1 for result in check.results[:2])  # the draws did branch


class UntemperedExit(EarlyExit):
    """A bug to catch: drafts drawn from the tempered p, but p reported at temperature 1."""

    def propose(self, x, K, settings, rng, stats):
        drafts, _ = super().propose(x, K, settings, rng, stats)
        sequences = [np.concatenate([x, drafts[:t]]) for t in range(len(drafts))]
        untempered = [sampling.logits_to_probs(self.logits(sequence))[0] for sequence in sequences]
        return drafts, np.array(untempered, dtype=np.float32).reshape(len(drafts), self.n_vocab)


def test_the_exact_oracle_fails_an_exit_whose_p_is_not_the_one_drawn_from():
    check = exact_law.check_exact(sampling.speculative_sampling,
                                  problems=early_exit_problems(functools.partial(UntemperedExit, exit_layer=1))[1:2])
    assert not check.passed and check.max_tv > 1e-3, check.report


def test_bad_exit_layers_and_targets_are_refused(bundled):
    _, target = bundled
    for exit_layer in (0, 8, 2.0, "2", True):
        with pytest.raises(ValueError, match=r"--exit_layer must be an integer in \[1, 7\] \(the target has 8"):
            EarlyExit(target, exit_layer)
    with pytest.raises(ValueError, match="use_cache=True"):
        EarlyExit(gpt2.GPT2Model(target.params, target.hparams, use_cache=False), 2)
    with pytest.raises(ValueError, match="gpt2.GPT2Model"):
        EarlyExit(lossless.CachedTableModel(lossless.random_context_table(4, 0)), 1)
