"""Speculative sampling samples from the target exactly.

Two kinds of evidence:
- At temperature 0 the decoders are deterministic: speculative sampling and greedy assisted
  generation must give exactly the autoregressive tokens, on random-weight GPT-2 pairs.
- At temperature > 0, on toy models whose next-token distributions are tables (with zeros in both p
  and q), the empirical joint distribution of the first three generated tokens must pass a
  chi-square test against the exact target distribution, at a fixed seed. The same test must reject
  a deliberately wrong resampling rule, so it has teeth.
"""

import math

import numpy as np
import pytest

import gpt2
import sampling
from classroom.lossless import chi2_sf
from helpers import DRAFT_TABLE, HPARAMS, N_TOKENS, PROMPT, TARGET_TABLE, TableCallable, TableModel, assert_follows, \
    chi_square_p_value, exact_joint, perturbed, random_target
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


# ---- the table models of tests/helpers.py ---------------------------------------------------

N_SAMPLES = 20_000


def empirical_counts(decode, n_vocab, n_samples=N_SAMPLES, seed=0):
    """Counts of the first N_TOKENS generated tokens over n_samples runs of decode(rng) -> sequence."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(n_vocab**N_TOKENS, dtype=np.int64)
    for _ in range(n_samples):
        generated = decode(rng)[len(PROMPT):]
        assert len(generated) == N_TOKENS
        counts[np.ravel_multi_index(tuple(generated), (n_vocab,) * N_TOKENS)] += 1
    return counts


SETTINGS_VARIANTS = {
    "plain": {},
    "temperature": {"temperature": 0.6},
    "temperature, top-k and top-p": {"temperature": 1.7, "top_k": 3, "top_p": 0.8},
}


@pytest.mark.parametrize("name", SETTINGS_VARIANTS)
def test_speculative_sampling_follows_the_target(name):
    kwargs = SETTINGS_VARIANTS[name]
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    counts = empirical_counts(lambda rng: sampling.speculative_sampling(PROMPT, draft, target, N_TOKENS, 2, rng,
                                                                        **kwargs), 4)
    assert_follows(counts, exact_joint(TARGET_TABLE, sampling.SamplingSettings(**kwargs)))


def test_seed_contract_callables_with_one_draft_per_loop_follow_the_target():
    draft, target = TableCallable(DRAFT_TABLE), TableCallable(TARGET_TABLE)
    counts = empirical_counts(lambda rng: sampling.speculative_sampling(PROMPT, draft, target, N_TOKENS, 1, rng), 4)
    assert_follows(counts, exact_joint(TARGET_TABLE, sampling.SamplingSettings()))


def test_autoregressive_sampling_follows_the_model():
    target = TableModel(TARGET_TABLE)
    counts = empirical_counts(lambda rng: sampling.autoregressive_sampling(PROMPT, target, N_TOKENS, rng, top_p=0.9), 4)
    assert_follows(counts, exact_joint(TARGET_TABLE, sampling.SamplingSettings(top_p=0.9)))


def test_resampling_from_q_instead_of_max_fn_is_caught(monkeypatch):
    # the wrong rule: after a rejection, sample from q itself rather than from max_fn(q - p)
    monkeypatch.setattr(sampling, "max_fn", lambda x, fallback: fallback)
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    counts = empirical_counts(lambda rng: sampling.speculative_sampling(PROMPT, draft, target, N_TOKENS, 2, rng), 4)
    joint = exact_joint(TARGET_TABLE, sampling.SamplingSettings())
    assert counts[joint == 0].sum() == 0  # the wrong rule still only samples possible tokens...
    assert chi_square_p_value(counts[joint > 0], joint[joint > 0]) < 1e-9  # ...at the wrong frequencies


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
