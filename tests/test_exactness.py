"""Speculative sampling samples from the target exactly.

Two kinds of evidence:
- At temperature 0 the decoders are deterministic: speculative sampling and greedy assisted
  generation must give exactly the autoregressive tokens, on random-weight GPT-2 pairs.
- At temperature > 0, on toy models whose next-token distributions are tables (with zeros in both p
  and q), the exact law of the first three generated tokens (classroom/exact_law.py, every choice of
  the random numbers run) must be the target's, through both model contracts. The same oracle must
  fail a deliberately wrong resampling rule, so it has teeth; and once, a chi-square test of 2,000
  runs agrees with the oracle on both.
"""

import math

import numpy as np
import pytest

import gpt2
import sampling
from classroom.lossless import chi2_sf
from classroom import exact_law
from helpers import DRAFT_TABLE, HPARAMS, N_TOKENS, PROMPT, TARGET_TABLE, TableModel, autoregressive, \
    chi_square_p_value, exact_joint, perturbed, random_target, table_problem
from speedup.stats import SpeculativeStats

# ---- the chi-square test lives in lossless.py (no scipy at run time); its survival function is checked here


def chi2_sf_closed_form(x, df):
    """The textbook closed forms: even df as a finite Poisson sum, odd df through erfc."""
    half = x / 2
    if df % 2 == 0:
        return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(df // 2))
    terms = sum(half ** (i + 0.5) / math.gamma(i + 1.5) for i in range(df // 2))
    return math.erfc(math.sqrt(half)) + math.exp(-half) * terms


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 25, 40, 63])
def test_chi2_sf_matches_closed_forms(df):
    for x in [0.01, 0.5, 1.0, df - 1.5, df, df + 3.0, 2.0 * df + 10, 4.0 * df + 40]:
        if x > 0:
            assert chi2_sf(x, df) == pytest.approx(chi2_sf_closed_form(x, df), rel=1e-9, abs=1e-300)


def test_chi2_sf_matches_table_critical_values():
    # 95th and 99.9th percentiles from standard chi-square tables
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, rel=1e-3)
    assert chi2_sf(18.307, 10) == pytest.approx(0.05, rel=1e-3)
    assert chi2_sf(124.342, 100) == pytest.approx(0.05, rel=1e-3)
    assert chi2_sf(29.588, 10) == pytest.approx(0.001, rel=1e-3)


# ---- the exact law on the table models of tests/helpers.py --------------------------------------------------


def exact_check(decoder, settings, **problem):  # -> exact_law.ExactCheck on one problem of the tables
    return exact_law.check_exact(decoder, problems=[table_problem(DRAFT_TABLE, TARGET_TABLE, settings, **problem)])


def assert_exact(check):
    assert check.passed and check.max_tv <= exact_law.TV_TOLERANCE, check.report
    assert not any(result.impossible for result in check.results), check.report


SETTINGS_VARIANTS = {
    "plain": {},
    "temperature": {"temperature": 0.6},
    "temperature, top-k and top-p": {"temperature": 1.7, "top_k": 3, "top_p": 0.8},
}


@pytest.mark.parametrize("name", SETTINGS_VARIANTS)
def test_speculative_sampling_follows_the_target(name):
    settings = sampling.SamplingSettings(**SETTINGS_VARIANTS[name])
    assert_exact(exact_check(sampling.speculative_sampling, settings))  # its exact law is the target's


def test_seed_contract_callables_with_one_draft_per_loop_follow_the_target():
    assert_exact(exact_check(sampling.speculative_sampling, sampling.SamplingSettings(), K=1, cached=False))


def test_autoregressive_sampling_follows_the_model():
    assert_exact(exact_check(autoregressive, sampling.SamplingSettings(top_p=0.9)))


def resample_from_q(monkeypatch):
    """The wrong rule: after a rejection, sample from q itself rather than from max_fn(q - p)."""
    monkeypatch.setattr(sampling, "max_fn", lambda x, fallback: fallback)


def test_resampling_from_q_instead_of_max_fn_is_caught(monkeypatch):
    resample_from_q(monkeypatch)
    check = exact_check(sampling.speculative_sampling, sampling.SamplingSettings())
    assert not any(result.impossible for result in check.results)  # the wrong rule samples only possible tokens...
    assert not check.passed and check.max_tv > 0.2, check.report  # ...at the wrong frequencies (total variation 0.231)


# ---- the chi-square and the oracle agree ---------------------------------------------------------------------

N_SAMPLES = 2_000  # the wrong rule moves the law by 0.23 in total variation: 2,000 runs show it (p < 1e-20)


def empirical_counts(decode, n_vocab, n_samples=N_SAMPLES, seed=0):
    """Counts of the first N_TOKENS generated tokens over n_samples runs of decode(rng) -> sequence."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(n_vocab**N_TOKENS, dtype=np.int64)
    for _ in range(n_samples):
        generated = decode(rng)[len(PROMPT):]
        assert len(generated) == N_TOKENS
        counts[np.ravel_multi_index(tuple(generated), (n_vocab,) * N_TOKENS)] += 1
    return counts


def chi_square_verdict():  # -> (samples pass the chi-square test, the oracle passes) for today's sampling.py
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    counts = empirical_counts(lambda rng: sampling.speculative_sampling(PROMPT, draft, target, N_TOKENS, 2, rng), 4)
    joint = exact_joint(TARGET_TABLE, sampling.SamplingSettings())
    p_value = chi_square_p_value(counts[joint > 0], joint[joint > 0])
    return counts[joint == 0].sum() == 0 and p_value > 1e-3, p_value


def test_the_chi_square_and_the_oracle_agree_on_the_reference_and_on_a_loud_bug(monkeypatch):
    """One statistical cross-check of the oracle: both pass speculative_sampling, both fail the wrong rule."""
    passes, p_value = chi_square_verdict()
    assert passes and exact_check(sampling.speculative_sampling, sampling.SamplingSettings()).passed, p_value
    resample_from_q(monkeypatch)
    passes, p_value = chi_square_verdict()
    assert not passes and p_value < 1e-9
    assert not exact_check(sampling.speculative_sampling, sampling.SamplingSettings()).passed


# ---- temperature 0: exactly the autoregressive tokens ------------------------------------------

PROMPTS = [[1, 2, 3], [50], [7, 7, 7, 7, 80, 1]]
N_GREEDY = 30


@pytest.fixture(scope="module")
def greedy_pairs():
    """(draft, target) parameter pairs: a close draft, and an unrelated smaller one sharing the vocabulary."""
    target = random_target()
    small_hparams = {**HPARAMS, "n_embd": 16, "n_layer": 1}
    small = gpt2.init_params(small_hparams, np.random.default_rng(5))
    return target, [(perturbed(target, 0.05, 1), HPARAMS), (small, small_hparams)]


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_speculative_and_assisted_equal_autoregressive(greedy_pairs, use_cache):
    target_params, drafts = greedy_pairs
    target = gpt2.GPT2Model(target_params, HPARAMS, use_cache=use_cache)
    accepted = rejected = 0
    for prompt in PROMPTS:
        expected = sampling.autoregressive_sampling(prompt, target, N_GREEDY, np.random.default_rng(0), temperature=0)
        assert len(set(expected[len(prompt):].tolist())) > 5  # a varied continuation, not one token repeated
        for draft_params, draft_hparams in drafts:
            draft = gpt2.GPT2Model(draft_params, draft_hparams, use_cache=use_cache)
            for K in range(1, 9):
                stats = SpeculativeStats()
                tokens = sampling.speculative_sampling(prompt, draft, target, N_GREEDY, K, np.random.default_rng(K),
                                                       temperature=0, stats=stats)
                np.testing.assert_array_equal(tokens, expected, err_msg=f"K={K}, prompt {prompt}")
                accepted, rejected = accepted + stats.accepted, rejected + stats.drafted - stats.accepted
            assisted = sampling.greedy_assisted_generation(prompt, draft, target, N_GREEDY)
            np.testing.assert_array_equal(assisted, expected, err_msg=f"assisted, prompt {prompt}")
    assert accepted > 100 and rejected > 100  # both branches of the rejection rule were exercised
