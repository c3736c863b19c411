"""classroom/lossless.py: its exact distributions, its models, its statistics, and its verdict on the reference and on
decoders that are wrong in ways it was not written against (bug_zoo.py's bugs: tests/test_bug_zoo.py)."""

import functools
import math

import numpy as np
import pytest

import sampling
from classroom import lossless
from kvcache import contract


def counted(decoder):  # -> (decoder that counts its runs, the list its count is kept in)
    runs = [0]

    def counting(*args, **kwargs):
        runs[0] += 1
        return decoder(*args, **kwargs)
    return counting, runs


@functools.cache
def reference_verdict():  # -> (the verdict, how many times it ran the decoder)
    decoder, runs = counted(sampling.speculative_sampling)
    return lossless.check_lossless(decoder), runs[0]


def autoregressive_decoder(x, draft_model, target_model, N, K, rng, **settings):  # ignores the draft: exact
    return sampling.autoregressive_sampling(x, target_model, N, rng, **settings)


def draft_only_decoder(x, draft_model, target_model, N, K, rng, **settings):  # samples the draft: wrong
    return sampling.autoregressive_sampling(x, draft_model, N, rng, **settings)


# ---- the verdict ----------------------------------------------------------------------------------


def test_the_reference_passes_at_seed_0_in_the_default_budget_of_runs():
    verdict, runs = reference_verdict()
    assert verdict.passed and verdict.p_value > lossless.ALPHA, verdict.report
    greedy_runs = 2 * 4 * 3  # the first two problems, K in 1, 2, 3, 5, three prompts
    assert runs == greedy_runs + sum(problem.n_samples for problem in lossless.default_problems()) == 24 + 8_700
    assert verdict.report.startswith("PASSED") and "Bonferroni" in verdict.report
    assert len(verdict.subtests) == len(lossless.default_problems()) + 1  # one per problem, and greedy identity
    assert all(subtest.p_value * len(verdict.subtests) > lossless.ALPHA for subtest in verdict.subtests)


def test_the_verdict_is_deterministic_for_a_seed():
    problems = lossless.default_problems()[:1]
    runs = [lossless.check_lossless(sampling.speculative_sampling, seed=3, sample_scale=0.2, problems=problems)
            for _ in range(2)]
    assert runs[0].p_value == runs[1].p_value and runs[0].statistic == runs[1].statistic


def test_autoregressive_sampling_of_the_target_passes_so_the_exact_distributions_are_right():
    verdict = lossless.check_lossless(autoregressive_decoder, sample_scale=0.5)
    assert verdict.passed, verdict.report


def test_sampling_the_draft_instead_fails_with_a_tiny_p_value():
    verdict = lossless.check_lossless(draft_only_decoder, sample_scale=0.2)
    assert not verdict.passed and verdict.p_value < 1e-9
    assert verdict.report.startswith("FAILED") and "FAIL" in verdict.report


def test_stopping_at_the_first_failure_gives_the_same_verdict_sooner():
    (full_decoder, full_runs), (early_decoder, early_runs) = counted(draft_only_decoder), counted(draft_only_decoder)
    full = lossless.check_lossless(full_decoder, sample_scale=0.2)
    early = lossless.check_lossless(early_decoder, sample_scale=0.2, stop_at_failure=True)
    assert not early.passed and early.p_value <= lossless.ALPHA and len(early.subtests) < len(full.subtests)
    assert "more tests not run" in early.report and early_runs[0] < full_runs[0]  # fewer runs of the decoder
    passing = lossless.check_lossless(autoregressive_decoder, sample_scale=0.05, stop_at_failure=True)
    assert passing.passed and len(passing.subtests) == len(lossless.default_problems()) + 1


def test_a_decoder_that_returns_the_wrong_length_fails_outright():
    def one_too_many(x, draft_model, target_model, N, K, rng, **settings):
        return sampling.speculative_sampling(x, draft_model, target_model, N + 1, K, rng, **settings)

    verdict = lossless.check_lossless(one_too_many, sample_scale=0.01)
    assert not verdict.passed and verdict.p_value == 0
    assert "malformed output: returned" in verdict.report


def test_a_decoder_that_raises_fails_and_the_report_says_why():
    def broken(x, draft_model, target_model, N, K, rng, **settings):
        raise RuntimeError("out of cheese")

    verdict = lossless.check_lossless(broken)
    assert not verdict.passed and verdict.p_value == 0 and "raised RuntimeError: out of cheese" in verdict.report


def test_greedy_identity_catches_a_decoder_that_is_only_wrong_at_temperature_0():
    def wrong_when_greedy(x, draft_model, target_model, N, K, rng, temperature, **settings):
        if temperature == 0:  # the draft's greedy tokens instead of the target's
            return sampling.autoregressive_sampling(x, draft_model, N, rng, temperature=0)
        return sampling.speculative_sampling(x, draft_model, target_model, N, K, rng, temperature=temperature,
                                             **settings)

    subtest = lossless.greedy_test(wrong_when_greedy, lossless.default_problems()[:2])
    assert subtest.p_value == 0 and "greedy runs differ" in subtest.detail
    assert lossless.greedy_test(sampling.speculative_sampling, lossless.default_problems()[:2]).p_value == 1


@pytest.mark.parametrize("bad", [{"decoder": "speculative_sampling"}, {"sample_scale": 0}, {"sample_scale": -1}])
def test_bad_arguments_get_a_one_line_value_error(bad):
    arguments = {"decoder": sampling.speculative_sampling, **bad}
    with pytest.raises(ValueError) as error:
        lossless.check_lossless(arguments.pop("decoder"), **arguments)
    assert "\n" not in str(error.value)


def test_no_problems_or_a_bad_N_or_K_get_a_one_line_value_error():
    with pytest.raises(ValueError, match="at least one Problem"):
        lossless.check_lossless(sampling.speculative_sampling, problems=[])
    for bad in [{"N": 0}, {"K": 0}, {"K": 2.5}]:
        with pytest.raises(ValueError, match="integers >= 1"):
            lossless.check_tokens_per_call(sampling.speculative_sampling, **bad)


def test_tokens_per_call_accepts_the_reference_and_counts_what_the_formula_says():
    check = lossless.check_tokens_per_call(sampling.speculative_sampling, N=24, K=3)
    assert check.passed and check.target_calls == check.expected_calls == 6
    assert check.report.startswith("PASSED")
    check = lossless.check_tokens_per_call(sampling.speculative_sampling, N=10, K=4)
    assert check.passed and check.target_calls == 2  # 5 + 5: the last loop drafts 4, all accepted, plus a bonus


# ---- the problems and their exact distributions -----------------------------------------------------


def test_the_problems_have_zeros_in_p_and_q_where_the_other_has_mass():
    for problem in lossless.default_problems():
        p = sampling.logits_to_probs(problem.draft.table.reshape(-1, problem.draft.n_vocab), problem.settings)
        q = sampling.logits_to_probs(problem.target.table.reshape(-1, problem.target.n_vocab), problem.settings)
        if problem.draft is not problem.target:
            assert ((p == 0) & (q > 0)).any() and ((q == 0) & (p > 0)).any(), problem.name
        assert (q > 0).sum(axis=-1).min() >= 1


def test_the_problems_cover_both_contracts_several_K_and_settings():
    problems = lossless.default_problems()
    assert {problem.cached for problem in problems} == {True, False}
    assert {problem.K for problem in problems} >= {1, 2, 3, 4}
    assert any(problem.K >= problem.N for problem in problems)  # drafts cut short so as not to pass N
    assert any(problem.draft is problem.target for problem in problems)  # every draft accepted: bonus tokens
    settings = [problem.settings for problem in problems]
    assert any(s.temperature < 1 for s in settings) and any(s.temperature > 1 for s in settings)
    assert any(s.top_k for s in settings) and any(s.top_p < 1 for s in settings)


def test_exact_joint_is_a_distribution_with_impossible_sequences():
    for problem in lossless.default_problems():
        joint = problem.exact_joint()
        assert joint.shape == (problem.target.n_vocab ** problem.n_joint,)
        assert joint.sum() == pytest.approx(1, abs=1e-6) and (joint == 0).any(), problem.name


def test_exact_joint_is_the_product_of_the_targets_next_token_probabilities():
    problem = lossless.default_problems()[1]
    q = lambda context: sampling.logits_to_probs(problem.target.table[context], problem.settings).astype(float)
    two_back, previous = problem.prompt
    tokens = (2, 0, 1)
    expected = q((two_back, previous))[2] * q((previous, 2))[0] * q((2, 0))[1]
    index = np.ravel_multi_index(tokens, (problem.target.n_vocab,) * 3)
    assert problem.exact_joint()[index] == pytest.approx(expected, rel=1e-6)


# ---- the table models -----------------------------------------------------------------------------


def test_the_cached_model_gives_the_plain_models_distributions_whatever_it_was_fed_before():
    table = lossless.random_context_table(4, seed=1)
    cached, plain = lossless.CachedTableModel(table), lossless.TableCallable(table)
    rng = np.random.default_rng(0)
    x = [2, 0]
    for _ in range(40):  # grow, roll back, score several positions, as speculative sampling does
        x = x[:max(1, len(x) - rng.integers(0, 3))] + rng.integers(0, 4, rng.integers(1, 4)).tolist()
        n_last = int(rng.integers(1, len(x) + 1))
        logits = cached.logits(x, n_last)
        assert logits.dtype == np.float32 and logits.shape == (n_last, 4)
        np.testing.assert_allclose(sampling.softmax(logits), plain(x)[-n_last:], rtol=1e-6)


def test_the_cached_model_resumes_through_the_one_rollback_decision(monkeypatch):
    decisions = []
    real = contract.cache_resume
    monkeypatch.setattr(contract, "cache_resume", lambda *args: decisions.append(args) or real(*args))
    model = lossless.CachedTableModel(lossless.random_context_table(4, seed=1))
    model.logits([1, 2, 3], 1)
    model.logits([1, 2, 0, 3], 2)
    assert len(decisions) == 2 and decisions[1][0].tolist() == [1, 2, 3]  # what it had cached


def test_the_plain_table_model_gives_probabilities_for_every_position():
    model = lossless.TableCallable(lossless.random_context_table(5, seed=4))
    probs = model([4, 0, 1, 3])
    assert probs.dtype == np.float32 and probs.shape == (4, 5)
    np.testing.assert_allclose(probs.sum(axis=-1), 1, rtol=1e-6)


# ---- the statistics ---------------------------------------------------------------------------------


def test_chi_square_test_matches_scipy_and_pools_small_cells():
    stats = pytest.importorskip("scipy.stats")
    counts, probs = np.array([30, 52, 18]), np.array([0.3, 0.5, 0.2])
    statistic, df, p_value = lossless.chi_square_test(counts, probs)
    reference = stats.chisquare(counts, probs * counts.sum())
    assert statistic == pytest.approx(reference.statistic) and p_value == pytest.approx(reference.pvalue)
    assert df == 2
    # cells expected fewer than 5 times are pooled, cells of probability zero skipped; a pool still expected
    # fewer than 5 times joins the largest cell: [50 + 4, 46] against [54, 46]
    statistic, df, _ = lossless.chi_square_test([50, 46, 2, 1, 1, 0], [0.5, 0.46, 0.02, 0.01, 0.01, 0.0])
    assert df == 1 and statistic == pytest.approx(0)
    statistic, df, _ = lossless.chi_square_test([50, 40, 4, 3, 3], [0.5, 0.4, 0.04, 0.03, 0.03])
    assert df == 2 and statistic == pytest.approx(0)  # a pool of 10 keeps its own cell


def test_chi_square_tail_of_a_huge_statistic_is_zero_not_an_error():
    assert lossless.chi2_sf(1e5, 10) == 0.0
    assert math.isclose(lossless.chi2_sf(0.0, 3), 1.0)


def test_the_check_is_quick_on_a_trivially_wrong_decoder():
    decoder, runs = counted(lambda x, *args, **kwargs: np.asarray(x))  # generates nothing
    verdict = lossless.check_lossless(decoder)
    assert not verdict.passed and runs[0] == 1 + len(lossless.default_problems())  # one run fails each sub-test
