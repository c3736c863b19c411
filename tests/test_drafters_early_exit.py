"""drafters/early_exit.py and gpt2.hidden_states: the target's features tapped, and its early exit as an exact draft.

The tap must equal a forward pass written out by hand; the early exit must keep every decoder exact (greedy
tokens identical to autoregressive decoding, the exact oracle's law equal to the target's) while it writes into
the target's own KV cache, and leave that cache as the target alone would have it.
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
from gpt2_cases import CONFIGS, random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, count_reused_rows
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


PROMPTS = (PROMPT, "import numpy as np\n\n\ndef", "The quick brown fox jumps over the")


@pytest.mark.parametrize("exit_layer", [1, 2])
def test_greedy_tokens_equal_autoregressive_decoding_with_rejections_and_full_acceptances(monkeypatch, exit_layer):
    """Several prompts, K 2: every loop's verification reuses the rows the draft fed, after rejections (which roll the
    target back past drafts whose first layers it holds) and after loops that accepted every draft. The target is laid
    out in panels, as main.py builds it (and fast enough for three prompts)."""
    reused, origins, loops = count_reused_rows(monkeypatch), [], 0
    for prompt in PROMPTS:
        tokens, _, plain = bundled_pair_after(prompt)
        target = engine.fast_model(plain.params, plain.hparams, layout="panels")
        expected = sampling.autoregressive_sampling(tokens, target, 24, 0, temperature=0)
        target.reset()
        stats = SpeculativeStats()
        got = sampling.speculative_sampling(tokens, EarlyExit(target, exit_layer), target, 24, 2, 0, temperature=0,
                                            stats=stats)
        np.testing.assert_array_equal(got, expected)
        origins, loops = origins + stats.origins, loops + stats.loops
    assert origins.count("corrected") > 0 and origins.count("bonus") > 0
    assert min(reused) >= 1  # every verification reused at least x's last token, which the draft fed
    assert len(reused) >= loops - len(PROMPTS)  # every loop that drafted (a run's last may have no room to)


def count_block_rows(monkeypatch):  # -> a list that gets the rows of every transformer block run
    rows, block = [], gpt2.transformer_block

    def counted(x, *args, **kwargs):
        rows.append(len(x))
        return block(x, *args, **kwargs)

    monkeypatch.setattr(gpt2, "transformer_block", counted)
    return rows


def kangaroo_on(target):
    from drafters.kangaroo import AdaptedEarlyExit, init_adapter

    adapter = init_adapter(target.hparams, np.random.default_rng(0), target.params["ln_f"])
    adapter["attn"]["c_proj"]["w"] += 0.5 * adapter["attn"]["c_attn"]["w"][:, :target.hparams["n_embd"]]  # nonzero
    return lambda exit_layer: AdaptedEarlyExit(target, adapter, exit_layer, confidence_threshold=0)


@pytest.mark.parametrize("exit_layer", [1, 2])
@pytest.mark.parametrize("drafter", ["early exit", "Kangaroo"])
def test_the_verification_starts_at_the_exit_and_its_logits_are_a_full_forwards(bundled, monkeypatch, exit_layer,
                                                                                drafter):
    """K drafts after the prompt: the target's rows run only the blocks after the exit, the draft having fed them all
    (the prompt's last token, all of the prompt where Kangaroo's adapter has not read it yet, and the K drafts, the
    last by feed_last, as Kangaroo's code does); its logits, cache and features are a fresh target's. Then a rejection
    (one draft kept, another token after it), and the same again."""
    tokens, target = bundled
    make = functools.partial(EarlyExit, target) if drafter == "early exit" else kangaroo_on(target)
    K, n_layer = 4, target.hparams["n_layer"]
    draft, fresh, x = make(exit_layer), gpt2.GPT2Model(target.params, target.hparams), np.array(tokens)
    target.reset()
    target.logits(x)
    for _ in range(2):
        drafts, _ = draft.propose(x, K, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
        x_draft, rows = np.append(x, drafts), count_block_rows(monkeypatch)
        n_fed = len(x_draft) - target.exit_draft.start  # K + 1, or more where the draft fed from further back
        logits = target.logits(x_draft, K + 1)
        monkeypatch.undo()
        assert sum(rows) == n_fed * (n_layer - exit_layer) < n_fed * n_layer
        fresh.reset()
        expected = fresh.logits(x_draft, K + 1)
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
        n = len(x_draft)
        np.testing.assert_allclose(target.features[:n], fresh.features[:n], rtol=1e-4, atol=1e-4)
        assert_caches_close(target.cache, fresh.cache, n)
        x = np.append(x_draft[:len(x) + 1], (drafts[1] + 1) % target.n_vocab)  # the second draft rejected


def test_a_call_that_does_not_follow_the_draft_reuses_nothing(bundled, monkeypatch):
    tokens, target = bundled
    reused, draft = count_reused_rows(monkeypatch), EarlyExit(target, 2)
    target.reset()
    target.logits(tokens)
    drafts, _ = draft.propose(tokens, 3, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    other = np.append(tokens[:-1], (tokens[-1] + 1) % target.n_vocab)  # the draft fed tokens[-1] first
    fresh = gpt2.GPT2Model(target.params, target.hparams)
    np.testing.assert_allclose(target.logits(other, 2), fresh.logits(other, 2), rtol=1e-4, atol=1e-4)
    assert reused == [0] and target.exit_draft is None  # and what the draft described is forgotten
    draft.propose(tokens, 3, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    draft.exit_logits(np.array(tokens[:1]), 0)  # fed out of turn, not after a resume: the record is dropped
    assert target.exit_draft is None
    draft.propose(tokens, 3, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    target.tree_logits(tokens, drafts[:2], [-1, 0])  # the tree's rows rewrite the slots the draft fed
    assert target.exit_draft is None
    target.tap((1,))  # a tapped block the reuse would skip: nothing is reused, the tap is written
    target.logits(tokens)
    draft.propose(tokens, 3, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    target.logits(np.append(tokens, drafts), 4)
    states, _ = gpt2.hidden_states(np.append(tokens, drafts), **target.params, n_head=target.hparams["n_head"],
                                   cache=None, start=0, taps=(1,))
    np.testing.assert_allclose(target.states[0, :len(tokens) + 3], states[0], rtol=1e-4, atol=1e-4)
    assert reused[1:] == [0]
    target.tap(())


def assert_caches_close(ours, theirs, n):  # the first n slots of every layer's keys and values, to float32 rounding
    for layer_a, layer_b in zip(ours, theirs):
        for a, b in zip(layer_a, layer_b):  # rows fed in other batches round differently
            np.testing.assert_allclose(a[:, :n], b[:, :n], rtol=1e-4, atol=1e-5 * np.abs(b[:, :n]).max())


def test_sharing_and_reusing_the_cache_changes_neither_the_tokens_nor_the_targets_cache(bundled):
    """At temperature 1, one seed: the exit writing into the target's cache, which the verification reuses, gives the
    tokens of an exit with a cache of its own, whose target recomputes everything; both targets' caches are a fresh
    target's for the final sequence."""
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
    fresh = gpt2.GPT2Model(target.params, target.hparams)
    fresh.logits(target.cached_tokens)
    for cache in (target.cache, separate.cache):
        assert_caches_close(cache, fresh.cache, n)


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
def test_the_exact_oracle_passes_the_early_exit_on_a_tiny_gpt2(monkeypatch, decoder):
    reused = count_reused_rows(monkeypatch)
    check = exact_law.check_exact(decoder, problems=early_exit_problems())
    assert check.passed, check.report
    assert max(reused) > 0  # the verifications did start at the exit
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
