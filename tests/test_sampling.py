"""sampling.py's parts: logits processing (against Hugging Face's warpers), sample, max_fn, the speedup
formula, input checks, the model contracts, caches and statistics."""

import warnings

import numpy as np
import pytest

import gpt2
import sampling
from classroom import exact_law
from speedup.stats import SpeculativeStats, expected_speedup, expected_tokens_per_loop
from kvcache import contract
from helpers import HPARAMS, TableCallable, TableModel, DRAFT_TABLE, TARGET_TABLE, perturbed, random_target

# ---- logits -> probabilities -------------------------------------------------------------------


def test_probabilities_are_float32_and_normalised():
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    for settings in [sampling.SamplingSettings(), sampling.SamplingSettings(0.7, 10, 0.9), sampling.GREEDY]:
        probs = sampling.logits_to_probs(logits, settings)
        assert probs.dtype == np.float32 and probs.shape == (3, 50)
        np.testing.assert_allclose(probs.sum(axis=-1), 1, rtol=1e-6)
        np.testing.assert_array_equal(sampling.logits_to_probs(logits[1], settings), probs[1])  # 1-D works too


def test_temperature_zero_is_one_hot_at_the_lowest_argmax():
    probs = sampling.logits_to_probs(np.array([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0]], np.float32),
                                     sampling.GREEDY)
    np.testing.assert_array_equal(probs, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_tiny_temperature_is_nearly_greedy_and_never_nan():
    logits = np.array([1.0, 3.0, 3.0, -2.0, -np.inf], np.float32)
    for temperature in [1e-3, 1e-30, 1e-45, 1e-320]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            probs = sampling.logits_to_probs(logits, sampling.SamplingSettings(temperature=temperature))
        np.testing.assert_array_equal(probs, [0, 0.5, 0.5, 0, 0])


def test_top_k_keeps_the_k_highest_and_their_ties():
    logits = np.log(np.array([0.1, 0.4, 0.2, 0.2, 0.1], np.float32))
    top_2 = sampling.logits_to_probs(logits, sampling.SamplingSettings(top_k=2))
    np.testing.assert_allclose(top_2, [0, 0.5, 0.25, 0.25, 0], rtol=1e-6)  # tokens 2 and 3 tie for second: both stay


def test_top_p_keeps_the_smallest_nucleus_with_ties_by_id():
    logits = np.log(np.array([0.2, 0.5, 0.3], np.float32))
    nucleus = lambda top_p: sampling.logits_to_probs(logits, sampling.SamplingSettings(top_p=top_p))
    np.testing.assert_array_equal(nucleus(0.45), [0, 1, 0])
    np.testing.assert_allclose(nucleus(0.75), [0, 0.625, 0.375], rtol=1e-6)
    np.testing.assert_allclose(nucleus(0.9), [0.2, 0.5, 0.3], rtol=1e-6)
    uniform = sampling.logits_to_probs(np.zeros(4, np.float32), sampling.SamplingSettings(top_p=0.3))
    np.testing.assert_array_equal(uniform, [0.5, 0.5, 0, 0])  # four equal tokens: the lowest ids fill the nucleus


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 7, 1.0), (1.0, 0, 0.8),
                                                       (1.3, 12, 0.9), (0.5, 3, 0.5), (2.0, 40, 0.95)])
def test_processing_matches_hugging_face(temperature, top_k, top_p):
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = (3 * np.random.default_rng(1).standard_normal((6, 64))).astype(np.float32)
    warpers = [TemperatureLogitsWarper(temperature)]  # Hugging Face's order: temperature, top-k, top-p
    warpers += [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p < 1 else []
    scores = torch.from_numpy(logits)
    for warper in warpers:
        scores = warper(None, scores)
    expected = torch.softmax(scores, dim=-1).numpy()
    probs = sampling.logits_to_probs(logits, sampling.SamplingSettings(temperature, top_k, top_p))
    np.testing.assert_array_equal(probs == 0, expected == 0)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kwargs, message", [({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")},
                         "temperature"), ({"temperature": float("inf")}, "temperature"), ({"temperature": "1"},
                         "temperature"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"top_k": True}, "top_k"),
                         ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": float("nan")}, "top_p")])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sampling.SamplingSettings(**kwargs)


def test_settings_apply_to_seed_callables_through_log_probabilities():
    table = np.array(TARGET_TABLE, np.float32)
    x = [0, 1, 2, 3]
    for settings in [sampling.SamplingSettings(0.5, 3, 0.8), sampling.GREEDY]:
        from_probs = sampling.next_token_probs(TableCallable(TARGET_TABLE), x, 2, settings)
        from_logits = sampling.next_token_probs(TableModel(TARGET_TABLE), x, 2, settings)
        np.testing.assert_allclose(from_probs, from_logits, rtol=1e-5, atol=1e-7)
    given = sampling.next_token_probs(TableCallable(TARGET_TABLE), x, 4, sampling.SamplingSettings())
    np.testing.assert_array_equal(given, sampling.softmax(table)[x])  # default settings: used as given


# ---- sample and max_fn --------------------------------------------------------------------------


class FixedUniforms:
    """A stand-in for a Generator whose random() returns chosen numbers."""

    def __init__(self, values):
        self.values = iter(values)

    def random(self):
        return next(self.values)


def test_sample_never_draws_a_token_of_probability_zero():
    probs = np.array([0, 0.5, 0, 0.5, 0], np.float32)
    extremes = [0.0, 0.25, 0.5 - 1e-12, 0.5, 0.75, 1 - 2**-53]
    tokens = [sampling.sample(probs, FixedUniforms([u])) for u in extremes]
    assert tokens == [1, 1, 1, 3, 3, 3]
    short = np.array([0.3, 0.2, 0.0], np.float32)  # sums to 0.5, as a rounded or unnormalised row may
    assert sampling.sample(short, FixedUniforms([1 - 2**-53])) == 1


def test_sample_frequencies_follow_probs():
    """The exact law of one draw (classroom/exact_law.py runs every interval of the uniform): probs, normalised."""
    probs = np.array([0.1, 0.0, 0.6, 0.3], np.float32)
    drawn = exact_law.enumerate_paths(lambda rng: int(sampling.sample(probs, rng)))
    assert 1 not in drawn.support  # never the token of probability zero
    assert drawn.law == {token: weight for token, weight in enumerate(exact_law.exact_distribution(probs)) if weight}
    np.testing.assert_allclose([float(drawn.law.get(token, 0)) for token in range(4)], probs, rtol=1e-7)


def test_sample_inverts_the_cdf_summed_in_float64_token_after_token():
    """Seeded runs rely on which token each uniform gives: the one whose float64 cumulative mass, summed in order,
    first exceeds u times the total. Uniforms at and just around every step of that CDF give it."""
    probs = np.random.default_rng(1).dirichlet(np.full(4096, 0.05)).astype(np.float32)
    cdf = np.cumsum(probs, dtype=np.float64)  # the reference sums
    steps = cdf[:-1] / cdf[-1]
    uniforms = np.concatenate([steps, np.nextafter(steps, 0), np.nextafter(steps, 1)])
    uniforms = uniforms[uniforms < 1]
    drawn = [sampling.sample(probs, FixedUniforms([u])) for u in uniforms]
    assert drawn == np.searchsorted(cdf, uniforms * cdf[-1], side="right").tolist()


def test_a_one_hot_row_gives_its_token_and_uses_one_uniform_as_any_row_does():
    """Temperature 0's one-hot rows skip the CDF; the token and the uniforms left are what the CDF would give."""
    one_hot = sampling.one_hot(np.array(2999), 4096)
    for u in [0.0, 0.5, 1 - 2**-53]:
        assert sampling.sample(one_hot, FixedUniforms([u])) == 2999
    rng, same_seed = np.random.default_rng(7), np.random.default_rng(7)
    sampling.sample(one_hot, rng)
    sampling.sample(np.full(4096, 1 / 4096, np.float32), same_seed)
    assert rng.random() == same_seed.random()


def test_max_fn_normalises_the_positive_part_and_falls_back_without_dividing_by_zero():
    np.testing.assert_allclose(sampling.max_fn(np.array([0.5, -0.2, 0.1], np.float32)), [5 / 6, 0, 1 / 6], rtol=1e-6)
    q = np.array([0.25, 0.75], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 RuntimeWarning
        assert sampling.max_fn(q - q, fallback=q) is q
        assert sampling.max_fn(np.array([-1e-9, 0.0], np.float32), fallback=q) is q
    with pytest.raises(ValueError, match="no entry is positive"):
        sampling.max_fn(np.zeros(3, np.float32))


# ---- the speedup formula -----------------------------------------------------------------------


def test_expected_speedup_formula():
    assert expected_speedup(0.0, 0.1, 4) == pytest.approx(1 / 1.4)
    assert expected_speedup(1.0, 0.1, 4) == pytest.approx(5 / 1.4)
    assert expected_speedup(0.8, 0.05, 4) == pytest.approx((1 + 0.8 + 0.64 + 0.512 + 0.4096) / 1.2)
    assert expected_tokens_per_loop(0.5, 3) == pytest.approx(1.875)
    # a verification costing v decode steps replaces the idealised 1 in the loop's cost K c + v
    assert expected_speedup(0.8, 0.05, 4, v=2.0) == pytest.approx((1 + 0.8 + 0.64 + 0.512 + 0.4096) / 2.2)
    assert expected_speedup(0.0, 0.0, 0, v=1.0) == 1.0  # no drafts: a plain step
    for bad in [(1.2, 0.1, 4), (0.5, -0.1, 4), (0.5, 0.1, -1), (0.5, 0.1, 4, 0.0)]:
        with pytest.raises(ValueError):
            expected_speedup(*bad)


# ---- decoders: contracts, caches, statistics ---------------------------------------------------


@pytest.fixture(scope="module")
def pair_params():
    target = random_target()
    return perturbed(target, 0.3, 1), target  # a draft that agrees often, but not always


class Spy:
    """Wraps a project model and records every call; with `reference`, checks each answer against it."""

    def __init__(self, model, reference=None):
        self.model, self.reference = model, reference
        self.n_vocab, self.n_ctx = model.n_vocab, model.n_ctx
        self.calls, self.calls_after_rollback, self.previous = [], 0, np.zeros(0, np.int64)

    def logits(self, x, n_last=1):
        x = np.asarray(x)
        self.calls.append((len(x), n_last))
        if contract.common_prefix_length(self.previous, x) < len(self.previous):  # x drops tokens we fed before
            self.calls_after_rollback += 1
        self.previous = x
        logits = self.model.logits(x, n_last)
        if self.reference is not None:
            np.testing.assert_allclose(logits, self.reference.logits(x, n_last), rtol=1e-5, atol=1e-4)
        return logits


def test_cached_target_is_called_once_per_loop_and_rolls_back_exactly(pair_params):
    draft_params, target_params = pair_params
    target = Spy(gpt2.GPT2Model(target_params, HPARAMS), reference=gpt2.GPT2Model(target_params, HPARAMS, use_cache=False))
    draft = Spy(gpt2.GPT2Model(draft_params, HPARAMS))
    stats = SpeculativeStats()
    prompt, N, K = [5, 6, 7], 40, 4
    # at temperature 0.2 the draft's p and the target's q differ enough for rejections in most loops
    out = sampling.speculative_sampling(prompt, draft, target, N, K, np.random.default_rng(0), temperature=0.2,
                                        stats=stats)
    assert len(out) == len(prompt) + N and out.dtype == np.int64
    assert len(target.calls) == stats.target_calls == stats.loops
    assert len(draft.calls) == stats.draft_calls == stats.drafted
    T = len(prompt) + N
    assert all(n_last == min(K, T - length + n_last - 2) + 1 for length, n_last in target.calls)  # K_n + 1
    assert max(length for length, _ in target.calls) <= T - 1  # nothing scored past T
    assert 0 < stats.accepted < stats.drafted and target.calls_after_rollback > 5  # rejections happened
    assert stats.generated == N and stats.tokens_per_target_call == N / stats.target_calls
    origins = {origin: stats.origins.count(origin) for origin in ["accepted", "corrected", "bonus", "target"]}
    assert origins["accepted"] == stats.accepted and sum(origins.values()) == N
    # each loop ends with one target token; a last loop with no room for drafts is a plain step
    assert origins["corrected"] + origins["bonus"] + origins["target"] == stats.loops and origins["target"] <= 1
    assert stats.draft_seconds > 0 and stats.target_seconds > 0
    assert stats.cost_ratio is None and stats.expected_speedup is None  # no decode step to measure c against
    stats.decode_step_seconds = 0.5 * stats.verify_seconds  # as if a decode step cost half a verification
    assert stats.cost_ratio == pytest.approx(stats.draft_seconds / stats.draft_calls / stats.decode_step_seconds)
    assert stats.verify_steps == pytest.approx(2.0)
    mean_K = stats.drafted / stats.loops
    assert stats.expected_speedup == pytest.approx(
        expected_speedup(stats.acceptance_rate, stats.cost_ratio, mean_K, v=2.0))
    assert stats.expected_speedup_one_step == pytest.approx(
        expected_speedup(stats.acceptance_rate, stats.cost_ratio, mean_K))


def test_cached_target_is_called_once_per_loop_in_assisted_generation_too(pair_params):
    draft_params, target_params = pair_params
    target = Spy(gpt2.GPT2Model(target_params, HPARAMS), reference=gpt2.GPT2Model(target_params, HPARAMS, use_cache=False))
    draft = Spy(gpt2.GPT2Model(draft_params, HPARAMS))
    stats = SpeculativeStats()
    sampling.greedy_assisted_generation([5, 6, 7], draft, target, 40, stats=stats)
    assert len(target.calls) == stats.target_calls == stats.loops and len(draft.calls) == stats.drafted
    assert 0 < stats.accepted < stats.drafted and target.calls_after_rollback > 0


class ConstantModel:
    """Next-token distribution `probs` after any context (the project's contract, with logits)."""

    def __init__(self, probs):
        with np.errstate(divide="ignore"):  # log(0) = -inf: an impossible token
            self.log_probs = np.log(np.asarray(probs, dtype=np.float32))
        self.n_vocab, self.n_ctx = len(probs), 10**6

    def logits(self, x, n_last=1):
        return np.tile(self.log_probs, (n_last, 1))


@pytest.mark.parametrize("K", [1, 4, 8])
def test_acceptance_rate_estimates_alpha_whatever_K(K):
    # q = (0.5, 0.5, 0), p = (0.2, 0.2, 0.6): alpha = sum(min(p, q)) = 0.4 for every draft
    stats = SpeculativeStats()
    sampling.speculative_sampling([0], ConstantModel([0.2, 0.2, 0.6]), ConstantModel([0.5, 0.5, 0.0]), 4000, K,
                                  np.random.default_rng(0), stats=stats)
    assert stats.acceptance_rate == pytest.approx(0.4, abs=0.03)
    assert stats.accepted + stats.rejected < stats.drafted or K == 1  # unjudged drafts are not counted against it
    assert stats.tokens_per_target_call == pytest.approx(expected_tokens_per_loop(0.4, K), rel=0.05)


def test_identical_draft_and_target_accept_everything_at_any_settings(pair_params):
    _, target_params = pair_params  # p and q go through the same processing, so q / p is exactly 1
    for kwargs in [{}, {"temperature": 0.7, "top_k": 9, "top_p": 0.8}, {"temperature": 0}]:
        stats = SpeculativeStats()
        sampling.speculative_sampling([1], gpt2.GPT2Model(target_params, HPARAMS), gpt2.GPT2Model(target_params, HPARAMS),
                                      30, 3, np.random.default_rng(0), stats=stats, **kwargs)
        assert stats.acceptance_rate == 1.0 and stats.origins.count("corrected") == 0


@pytest.mark.parametrize("N, K", [(0, 3), (1, 3), (2, 1), (7, 3), (8, 3), (9, 3), (13, 8)])
def test_exactly_N_tokens_for_any_N_and_K(N, K):
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    for decode in [lambda: sampling.speculative_sampling([0, 1], draft, target, N, K, np.random.default_rng(0)),
                   lambda: sampling.autoregressive_sampling([0, 1], target, N, np.random.default_rng(0)),
                   lambda: sampling.greedy_assisted_generation([0, 1], draft, target, N, K)]:
        out = decode()
        assert len(out) == 2 + N and list(out[:2]) == [0, 1]


def test_a_sequence_filling_the_context_exactly_is_allowed_and_one_more_token_is_not(pair_params):
    draft_params, target_params = pair_params
    draft, target = gpt2.GPT2Model(draft_params, HPARAMS), gpt2.GPT2Model(target_params, HPARAMS)
    prompt = [3] * 10
    out = sampling.speculative_sampling(prompt, draft, target, HPARAMS["n_ctx"] - 10, 8, np.random.default_rng(0))
    assert len(out) == HPARAMS["n_ctx"]
    with pytest.raises(ValueError, match="exceed the model's context"):
        sampling.speculative_sampling(prompt, draft, target, HPARAMS["n_ctx"] - 9, 8, np.random.default_rng(0))


def test_the_same_seed_gives_the_same_tokens_and_another_seed_others():
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    run = lambda seed: sampling.speculative_sampling([0], draft, target, 40, 3, np.random.default_rng(seed))
    np.testing.assert_array_equal(run(7), run(7))
    assert not np.array_equal(run(7), run(8))
    run_ar = lambda seed: sampling.autoregressive_sampling([0], target, 40, np.random.default_rng(seed))
    np.testing.assert_array_equal(run_ar(7), run_ar(7))


def test_rng_may_be_an_int_seed_or_none_as_numpy_default_rng_takes_it():
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    speculative = lambda rng: sampling.speculative_sampling([0], draft, target, 40, 3, rng)
    autoregressive = lambda rng: sampling.autoregressive_sampling([0], target, 40, rng)
    for decode in (speculative, autoregressive):
        np.testing.assert_array_equal(decode(7), decode(np.random.default_rng(7)))  # a seed is default_rng(seed)
        np.testing.assert_array_equal(decode(np.int64(7)), decode(7))
        assert len(decode(None)) == 41  # fresh entropy
    probs = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    assert sampling.sample(probs, 5) == sampling.sample(probs, np.random.default_rng(5))
    for bad in ("7", 1.5, -1, True):
        with pytest.raises(ValueError, match="rng"):
            speculative(bad)


def test_printing_stats_shows_the_counters_not_every_tokens_origin():
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    stats = SpeculativeStats()
    sampling.speculative_sampling([0], draft, target, 60, 3, 0, stats=stats)
    shown = repr(stats)
    assert len(stats.origins) == 60 and "origins" not in shown and len(shown) < 300
    for name in ["loops", "target_calls", "drafted", "accepted", "rejected", "generated"]:
        assert f"{name}={getattr(stats, name)}" in shown
    assert f"acceptance_rate={stats.acceptance_rate:.3f}" in shown


def test_seed_contract_callables_work_with_every_decoder():
    draft, target = TableCallable(DRAFT_TABLE), TableCallable(TARGET_TABLE)
    project_draft, project_target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    for seed in range(5):  # the same numbers drawn in the same order: the same tokens as project models
        np.testing.assert_array_equal(
            sampling.speculative_sampling([0], draft, target, 20, 3, np.random.default_rng(seed), top_p=0.9),
            sampling.speculative_sampling([0], project_draft, project_target, 20, 3, np.random.default_rng(seed),
                                          top_p=0.9))
    greedy = sampling.autoregressive_sampling([0], project_target, 20, temperature=0)
    np.testing.assert_array_equal(sampling.greedy_assisted_generation([0], draft, target, 20), greedy)
    np.testing.assert_array_equal(sampling.autoregressive_sampling([0], target, 20, temperature=0), greedy)


class Lookahead:
    """A project-contract toy whose next token is always prev + 1 (mod n_vocab), or prev + 2 for the draft."""

    def __init__(self, step, n_vocab=16):
        self.step, self.n_vocab, self.n_ctx = step, n_vocab, 256
        self.n_last = []

    def logits(self, x, n_last=1):
        self.n_last.append(n_last)
        return 10 * np.eye(self.n_vocab, dtype=np.float32)[(np.asarray(x)[-n_last:] + self.step) % self.n_vocab]


def test_assisted_generation_follows_hugging_faces_schedule_for_K():
    agreeing = Lookahead(1)
    sampling.greedy_assisted_generation([0], Lookahead(1), agreeing, 5 + 1 + 7 + 1 + 9 + 1 + 3)
    assert agreeing.n_last == [6, 8, 10, 3]  # K = 5, 7, 9 (+ 2 after each full acceptance), then 2 to end at T
    disagreeing, stats = Lookahead(1), SpeculativeStats()
    out = sampling.greedy_assisted_generation([0], Lookahead(2), disagreeing, 8, stats=stats)
    assert disagreeing.n_last == [6, 5, 4, 3, 2, 2, 2, 1]  # K = 5, 4, 3, 2, 1, 1, 1: - 1, never below 1
    assert list(out) == list(range(9)) and stats.accepted == 0 and stats.origins.count("corrected") == 7


class FusedDraft(TableModel):
    """A toy with the JAX model's `draft` method: K tokens drawn by inverse CDF from given uniforms."""

    def __init__(self, table, settings):
        super().__init__(table)
        self.settings, self.fused_calls = settings, 0

    def draft(self, x, n_draft, uniforms, temperature, top_k, top_p):
        assert (temperature, top_k, top_p) == (self.settings.temperature, self.settings.top_k, self.settings.top_p)
        assert np.all(np.asarray(uniforms, np.float32) < 1)
        self.fused_calls += 1
        tokens, p = list(x), []
        for uniform in uniforms:
            p.append(sampling.logits_to_probs(self.logits(tokens), self.settings)[0])
            tokens.append(sampling.sample(p[-1], FixedUniforms([uniform])))
        return np.array(tokens[len(x):]), np.array(p)


def test_a_fused_draft_method_gives_the_same_tokens_from_the_same_seed():
    settings = sampling.SamplingSettings(0.9, 3, 0.95)
    fused, stats = FusedDraft(DRAFT_TABLE, settings), SpeculativeStats()
    kwargs = {"temperature": 0.9, "top_k": 3, "top_p": 0.95}
    for seed in range(5):
        with_fused = sampling.speculative_sampling([0], fused, TableModel(TARGET_TABLE), 25, 4,
                                                   np.random.default_rng(seed), stats=stats, **kwargs)
        one_by_one = sampling.speculative_sampling([0], TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE), 25, 4,
                                                   np.random.default_rng(seed), **kwargs)
        np.testing.assert_array_equal(with_fused, one_by_one)
    assert stats.loops - 5 <= fused.fused_calls <= stats.loops  # one call per loop that drafts anything
    assert stats.draft_calls == stats.drafted


@pytest.mark.parametrize("call, message", [
    (lambda d, t: sampling.speculative_sampling([1], d, t, 5, 0), "K must be"),
    (lambda d, t: sampling.speculative_sampling([1], d, t, 5, 2.5), "K must be"),
    (lambda d, t: sampling.greedy_assisted_generation([1], d, t, 5, K=-1), "K must be"),
    (lambda d, t: sampling.speculative_sampling([], d, t, 5, 2), "non-empty"),
    (lambda d, t: sampling.speculative_sampling([[1, 2]], d, t, 5, 2), "1-D"),
    (lambda d, t: sampling.autoregressive_sampling([1.5], t, 5), "token ids"),
    (lambda d, t: sampling.autoregressive_sampling([1], t, -1), "N must be"),
    (lambda d, t: sampling.autoregressive_sampling([4], t, 3), r"token ids must lie in \[0, 4\)"),
    (lambda d, t: sampling.speculative_sampling([1], TableModel(np.zeros((5, 5))), t, 3, 2), "share a vocabulary"),
    (lambda d, t: sampling.autoregressive_sampling([1], t, 3, temperature=-1), "temperature"),
])
def test_bad_decoder_inputs_are_refused_before_any_model_call(call, message):
    draft, target = Spy(TableModel(DRAFT_TABLE)), Spy(TableModel(TARGET_TABLE))
    with pytest.raises(ValueError, match=message):
        call(draft, target)
    assert draft.calls == target.calls == []


class ShortProposer:
    """A draft with `propose`: loop i proposes lengths[i % len(lengths)] tokens (at most K) of a draft table."""

    def __init__(self, table, lengths):
        self.model, self.lengths, self.n_vocab, self.calls = TableModel(table), lengths, len(table), 0

    def propose(self, x, K, settings, rng, stats):
        K_n = min(K, self.lengths[self.calls % len(self.lengths)])
        self.calls += 1
        return sampling.draw_drafts(self.model, x, K_n, settings, rng, stats)


def test_a_draft_may_propose_fewer_than_K_tokens_or_none():
    draft, target = ShortProposer(DRAFT_TABLE, [0, 2, 4, 1]), TableModel(TARGET_TABLE)
    stats = SpeculativeStats()
    out = sampling.speculative_sampling([0, 1], draft, target, 60, 4, np.random.default_rng(0), stats=stats)
    assert len(out) == 62 and stats.generated == 60
    assert stats.drafted == stats.draft_calls < 4 * stats.loops  # the loops judged what was proposed
    assert stats.origins.count("target") > 0  # a loop with no drafts is a plain step of the target
    assert stats.origins.count("corrected") + stats.origins.count("bonus") + stats.origins.count("target") == stats.loops
    greedy = sampling.autoregressive_sampling([0, 1], target, 60, temperature=0)
    for decoder in (lambda: sampling.speculative_sampling([0, 1], draft, target, 60, 4, temperature=0),
                    lambda: sampling.greedy_assisted_generation([0, 1], draft, target, 60, K=4)):
        np.testing.assert_array_equal(decoder(), greedy)
