"""Several drafts by recursive rejection sampling (verifiers/multi_draft.py): one draft is Algorithm 2 token for
token, greedy decoding is exact, the law is q (exactly on a toy, by sampling on classroom/lossless's problems),
and the counters add up."""

import functools
from fractions import Fraction

import numpy as np
import pytest

import sampling
from classroom import lossless
from conftest import bundled_pair_after
from speedup.stats import SpeculativeStats
from verifiers.multi_draft import (draw_distinct_drafts, multi_draft_speculative_sampling, next_residual,
                                   without)

TARGET, DRAFT = lossless.random_context_table(4, 1), lossless.random_context_table(4, 2)
MODEL_KINDS = [lossless.TableCallable, lossless.CachedTableModel]


def with_n_drafts(n_drafts, replacement):
    """multi_draft with sampling.speculative_sampling's signature: n_drafts and replacement bound by keyword."""
    return functools.partial(multi_draft_speculative_sampling, n_drafts=n_drafts, replacement=replacement)


@pytest.fixture(scope="module")
def bundled_pair():
    return bundled_pair_after("def mean(values):\n    total = 0\n    for")


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("replacement", [True, False])
def test_one_draft_is_speculative_sampling_token_for_token(kind, replacement):
    for seed in range(12):
        for temperature, top_p in [(1.0, 1.0), (0.7, 0.9)]:
            expected_stats, stats = SpeculativeStats(), SpeculativeStats()
            expected = sampling.speculative_sampling([2, 0], kind(DRAFT), kind(TARGET), 9, 3, seed,
                                                     temperature=temperature, top_p=top_p, stats=expected_stats)
            got = multi_draft_speculative_sampling([2, 0], kind(DRAFT), kind(TARGET), 9, 3, seed, n_drafts=1,
                                                   replacement=replacement, temperature=temperature, top_p=top_p,
                                                   stats=stats)
            assert got.tolist() == expected.tolist()
            assert stats.origins == expected_stats.origins and stats.drafted == expected_stats.drafted
            assert (stats.loops, stats.target_calls) == (expected_stats.loops, expected_stats.target_calls)


@pytest.mark.parametrize("replacement", [True, False])
def test_greedy_equals_autoregressive_on_tables(replacement):
    for kind in MODEL_KINDS:
        for n_drafts in (1, 2, 3):
            for prompt, K in [((2, 0), 1), ((0,), 3), ((3, 3, 1), 5)]:
                expected = sampling.autoregressive_sampling(prompt, kind(TARGET), 8, temperature=0)
                got = multi_draft_speculative_sampling(prompt, kind(DRAFT), kind(TARGET), 8, K, K, n_drafts=n_drafts,
                                                       replacement=replacement, temperature=0)
                assert got.tolist() == expected.tolist()


def test_greedy_equals_autoregressive_on_the_bundled_pair(bundled_pair):
    prompt, draft, target = bundled_pair
    expected = sampling.autoregressive_sampling(prompt, target, 16, temperature=0)
    for n_drafts in (1, 2, 3):
        for replacement in (True, False):
            stats = SpeculativeStats()
            got = multi_draft_speculative_sampling(prompt, draft, target, 16, 4, 0, n_drafts=n_drafts, replacement=replacement,
                                                   temperature=0, stats=stats)
            assert got.tolist() == expected.tolist()
            assert stats.accepted > 0


@pytest.mark.parametrize("replacement, n_drafts", [(True, 3), (False, 2)])
def test_check_lossless_passes(replacement, n_drafts):
    check = lossless.check_lossless(with_n_drafts(n_drafts, replacement))
    assert check.passed, check.report


def test_a_perfect_draft_gives_K_plus_1_tokens_per_target_call():
    assert lossless.check_tokens_per_call(with_n_drafts(1, False)).passed  # it counts the model's calls: one draft
    for replacement in (True, False):  # several drafts: stats count one call per loop, as a batched engine makes
        stats = SpeculativeStats()
        out = multi_draft_speculative_sampling([2, 0], lossless.TableCallable(TARGET), lossless.TableCallable(TARGET),
                                               24, 3, 0, n_drafts=3, replacement=replacement, stats=stats)
        assert len(out) == 26 and stats.target_calls == stats.loops == 6 and stats.accepted == 18


def first_token_law(p, q, replacement, update_residual=True):
    """The exact law of the first token for K = 1 and two drafts, from the module's p' and residual steps, in
    fractions: c1 ~ p, c2 ~ p' (p, or p without c1), each tried in turn, then the residual."""
    p, q = np.array(p, dtype=object), np.array(q, dtype=object)
    law = np.array([Fraction(0)] * len(p), dtype=object)
    for c1 in np.flatnonzero(p):
        p2 = p if replacement else without(p, c1)
        for c2 in np.flatnonzero(p2):
            weight = p[c1] * p2[c2]
            accept_1 = min(Fraction(1), q[c1] / p[c1])
            residual = next_residual(q, p) if update_residual else q
            accept_2 = min(Fraction(1), residual[c2] / p2[c2])
            last = next_residual(residual, p2)
            law[c1] += weight * accept_1
            law[c2] += weight * (1 - accept_1) * accept_2
            law += weight * (1 - accept_1) * (1 - accept_2) * last
    return law


@pytest.mark.parametrize("replacement", [True, False])
def test_the_first_token_follows_q_exactly_and_not_without_the_residual_update(replacement):
    p = [Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)]
    q = [Fraction(1, 6), Fraction(1, 3), Fraction(1, 2)]
    assert first_token_law(p, q, replacement).tolist() == q
    # a verifier that tries every candidate against q itself is off by 1/6 in total variation here
    wrong = first_token_law(p, q, replacement, update_residual=False)
    assert sum(abs(a - b) for a, b in zip(wrong, q)) / 2 == Fraction(1, 6)


def test_drafts_without_replacement_start_with_distinct_tokens_drawn_from_the_rest_of_p():
    stats = SpeculativeStats()
    x = np.array([2, 0])
    drafts, p = draw_distinct_drafts(lossless.TableCallable(DRAFT), x, 3, 3, sampling.SamplingSettings(),
                                     np.random.default_rng(0), stats)
    first_tokens = [int(draft[0]) for draft in drafts]
    assert len(drafts) == 3 and len(set(first_tokens)) == 3 and all(len(draft) == 3 for draft in drafts)
    for i in (1, 2):  # each first token was drawn from p without the earlier ones
        np.testing.assert_array_equal(p[i][0], without(p[i - 1][0], first_tokens[i - 1]))
        assert p[i][0].dtype == np.float32 and p[i][0][first_tokens[:i]].sum() == 0
    assert stats.draft_calls == 3 + 2 + 2  # the later drafts reuse the first draft's p at x
    greedy, _ = draw_distinct_drafts(lossless.TableCallable(DRAFT), x, 3, 3, sampling.GREEDY,
                                     np.random.default_rng(0), stats)
    assert len(greedy) == 1  # a one-hot p has no second token to draw


@pytest.mark.parametrize("replacement", [True, False])
def test_the_counters_add_up(replacement):
    stats = SpeculativeStats()
    out = multi_draft_speculative_sampling([1, 3], lossless.CachedTableModel(DRAFT), lossless.CachedTableModel(TARGET),
                                           40, 3, 5, n_drafts=3, replacement=replacement, stats=stats)
    assert len(out) == 42 and stats.generated == 40
    assert stats.loops == stats.target_calls == len(stats.origins) - stats.origins.count("accepted")
    assert stats.accepted == stats.origins.count("accepted") > 0 and stats.rejected > 0
    assert stats.drafted <= 3 * 3 * stats.loops and stats.drafted >= stats.accepted
    assert set(stats.origins) <= {"accepted", "corrected", "bonus", "target"}
    if replacement:
        assert stats.draft_calls == stats.drafted  # one draft step per drafted token


@pytest.mark.parametrize("n_drafts", [0, -1, 1.5, True, None])
def test_bad_n_drafts_raise_value_error(n_drafts):
    with pytest.raises(ValueError, match="n_drafts"):
        multi_draft_speculative_sampling([2, 0], lossless.TableCallable(DRAFT), lossless.TableCallable(TARGET), 4, 2,
                                         n_drafts=n_drafts)


def test_bad_K_raises_value_error():
    with pytest.raises(ValueError, match="K must be"):
        multi_draft_speculative_sampling([2, 0], lossless.TableCallable(DRAFT), lossless.TableCallable(TARGET), 4, 0,
                                         n_drafts=2)
