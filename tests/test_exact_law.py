"""classroom/exact_law.py: exact laws of decoders on small tables, and classroom/symbolic.py's choice points."""

import copy
import dataclasses
from fractions import Fraction

import numpy as np
import pytest

import sampling
from classroom import bug_zoo, exact_law
from classroom.symbolic import OracleCannotFollow
from speedup.stats import SpeculativeStats

PROBLEMS = exact_law.default_exact_problems()


def law_of(run):  # run(rng) -> outcome: {outcome: probability}
    return exact_law.enumerate_paths(run).law


# ---- the symbolic uniform ---------------------------------------------------------------------------


def test_an_interval_of_a_uniform_has_exactly_its_length():
    law = law_of(lambda rng: (lambda u: u < 0.3 and u >= 0.1)(rng.random()))
    assert law[True] == Fraction(0.3) - Fraction(0.1)  # the floats' exact values: 0.2 up to their rounding
    assert law[True] + law[False] == 1 and abs(float(law[True]) - 0.2) < 1e-16
    assert law_of(lambda rng: (lambda u: 0.25 <= u < 0.75)(rng.random()))[True] == Fraction(1, 2)


def test_monotone_arithmetic_maps_comparisons_back_to_the_uniform():
    assert law_of(lambda rng: 1 - rng.random() < 0.25)[True] == Fraction(1, 4)
    assert law_of(lambda rng: 2 * rng.random() + 1 > 2.5)[True] == Fraction(1, 4)
    assert law_of(lambda rng: rng.random() / 4 >= 0.125)[True] == Fraction(1, 2)
    assert law_of(lambda rng: 0.75 < rng.uniform(0.5, 1.0))[True] == Fraction(1, 2)
    assert abs(law_of(lambda rng: np.log(rng.random(1))[0] < np.log(0.5))[True] - Fraction(1, 2)) < 1e-15
    assert abs(law_of(lambda rng: np.exp(rng.random(1))[0] > np.e ** 0.5)[True] - Fraction(1, 2)) < 1e-15


def test_object_arrays_compare_elementwise_against_float_arrays():
    law = law_of(lambda rng: tuple((rng.random(2) < np.array([0.5, 0.25], dtype=np.float32)).tolist()))
    assert law == {(True, True): Fraction(1, 8), (True, False): Fraction(3, 8), (False, True): Fraction(1, 8),
                   (False, False): Fraction(3, 8)}


def test_a_uniform_compared_twice_is_conditioned_and_copies_read_the_same_numbers():
    assert law_of(lambda rng: (lambda u: u < 0.5 and u < 0.25)(rng.random()))[True] == Fraction(1, 4)
    copied = law_of(lambda rng: (copy.deepcopy(rng).random() < 0.5, rng.random() < 0.5))
    assert copied == {(True, True): Fraction(1, 2), (False, False): Fraction(1, 2)}


def test_sample_branches_over_the_tokens_with_their_exact_probabilities():
    probs = np.array([0.5, 0.0, 0.25, 0.25], dtype=np.float32)
    assert law_of(lambda rng: sampling.sample(probs, rng)) == {0: Fraction(1, 2), 2: Fraction(1, 4),
                                                                3: Fraction(1, 4)}
    # a one-hot row still reads a uniform, so the next draw uses the second one, as with a real generator
    law = law_of(lambda rng: (sampling.sample(np.array([0, 1, 0], np.float32), rng), rng.random() < 0.5,
                              rng.drawn))
    assert law == {(1, True, 2): Fraction(1, 2), (1, False, 2): Fraction(1, 2)}


def test_choice_and_integers_are_choice_points():
    assert law_of(lambda rng: rng.choice(["a", "b", "c"], p=[0.5, 0.25, 0.25])) == \
        {"a": Fraction(1, 2), "b": Fraction(1, 4), "c": Fraction(1, 4)}
    assert law_of(lambda rng: int(rng.integers(2, 5))) == {2: Fraction(1, 3), 3: Fraction(1, 3), 4: Fraction(1, 3)}


def test_a_threshold_at_the_closed_lower_end_reaches_u_equal_zero_with_probability_zero():
    result = exact_law.enumerate_paths(lambda rng: rng.random() <= 0.0)
    assert result.law == {False: 1} and result.support == {True, False} and result.paths == 2
    assert exact_law.enumerate_paths(lambda rng: rng.random() < 0.0).support == {False}
    assert exact_law.enumerate_paths(lambda rng: rng.random() > 0.0).support == {True, False}


FOLLOW = "the exact oracle cannot follow "


@pytest.mark.parametrize("use, message", [
    (float, FOLLOW + r"float\(\)"), (bool, FOLLOW + "truth testing"), (lambda u: u == 0.5, FOLLOW + "an equality"),
    (lambda u: u < u, FOLLOW + "a comparison with SymbolicUniform"), (lambda u: u * u, FOLLOW + "arithmetic"),
    (lambda u: np.sqrt(np.array([u])), "SymbolicUniform which has no callable sqrt method")])  # numpy's words
def test_what_the_oracle_cannot_follow_raises_a_clear_type_error(use, message):
    with pytest.raises(TypeError, match=message):
        exact_law.enumerate_paths(lambda rng: use(rng.random()))
    with pytest.raises(OracleCannotFollow, match=r"no normal\(\)"):
        exact_law.enumerate_paths(lambda rng: rng.normal())


# ---- the oracle on decoders -------------------------------------------------------------------------


def autoregressive(x, draft_model, target_model, N, K, rng, **settings):
    return sampling.autoregressive_sampling(x, target_model, N, rng, **settings)


@pytest.mark.parametrize("cached", [False, True], ids=["plain callables", "cached"])
@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, autoregressive],
                         ids=["speculative", "autoregressive"])
def test_lossless_decoders_have_the_targets_law_on_every_problem_through_both_contracts(decoder, cached):
    problems = [dataclasses.replace(problem, cached=cached) for problem in PROBLEMS]
    check = exact_law.check_exact(decoder, problems=problems)
    assert check.passed and check.max_tv < 1e-6, check.report
    assert all(result.paths >= 1 and not result.impossible for result in check.results)


def test_the_law_is_a_dict_of_fractions_summing_to_exactly_one():
    problem = PROBLEMS[1]
    exact = exact_law.exact_output_law(sampling.speculative_sampling, problem)
    target = exact_law.target_law(problem)
    for law in (exact.law, target):
        assert sum(law.values()) == 1 and all(isinstance(weight, Fraction) and weight > 0 for weight in law.values())
        assert all(isinstance(key, tuple) and len(key) == problem.n_joint and all(type(token) is int for token in key)
                   for key in law)
    assert set(exact.law) <= exact.support <= set(target) and exact.paths == 75
    tv, max_difference = exact_law.total_variation(exact.law, target)
    assert type(tv) is float and 0 < max_difference <= tv < 1e-7  # float32 rounding, not zero
    assert np.allclose(sorted(map(float, target.values())), sorted(problem.exact_joint()[problem.exact_joint() > 0]))


# The largest total variation each bug shows over the default problems (every problem's TV is in the report)
BUG_TV = {"argmax_drafts": 0.218, "drafts_from_processed_p": 0.0621, "target_without_settings": 0.841,
          "always_accept": 1.0, "shared_random_numbers": 0.134, "no_rollback": 0.377, "cache_position_plus_one": 0.283,
          "first_draft_unverified": 1.0, "correction_from_q": 0.150, "correction_from_next_row": 1.0,
          "bonus_from_wrong_row": 0.765}


@pytest.mark.parametrize("name", [bug.name for bug in bug_zoo.BUGS if not bug.speed_only])
def test_every_distribution_bug_of_the_zoo_fails_with_its_total_variation(name):
    check = exact_law.check_exact(bug_zoo.ZOO[name].decoder())
    assert not check.passed and check.max_tv == pytest.approx(BUG_TV[name], abs=1e-3), check.report
    assert check.report.startswith("FAILED") and sum(not result.passed for result in check.results) >= 1


def test_a_bug_below_the_chi_square_sight_is_seen():
    """shared_random_numbers moves the temperature-0.6 problem by 0.0045, a tenth of what check_lossless sees."""
    check = exact_law.check_exact(bug_zoo.ZOO["shared_random_numbers"].decoder(), problems=[PROBLEMS[1]])
    assert not check.passed and 1e-3 < check.max_tv < 0.01, check.report


@pytest.mark.parametrize("variant", [bug_zoo.EXACT_MATCH_VERIFICATION, bug_zoo.ZOO["no_bonus_token"]],
                         ids=lambda variant: variant.name)
def test_the_myth_and_the_speed_only_bug_are_lossless(variant):
    check = exact_law.check_exact(variant.decoder())
    assert check.passed and check.max_tv < 1e-6, check.report


def patched(name, new_test):  # speculative_sampling with its acceptance test replaced
    patch = bug_zoo.Patch(sampling, "speculative_sampling", bug_zoo.ACCEPT_TEST, new_test)
    return bug_zoo.Variant(name, name, "sglang#35771", "see the test", (patch,)).decoder()


def test_accepting_with_u_at_most_q_over_p_fails_through_the_support_alone():
    """sglang #35771: u <= q/p accepts a draft the target gives probability zero when u == 0.0 exactly."""
    decoder = patched("at_most", "if r <= min(1.0, float(q[t][token]) / float(p[t][token])):")
    check = exact_law.check_exact(decoder)
    assert not check.passed and check.max_tv < 1e-6, check.report  # the law itself is right
    assert any(result.impossible for result in check.results) and "of target probability 0" in check.report


def test_a_decoder_that_reads_the_uniform_as_a_float_gets_the_clear_error():
    decoder = patched("as_float", "if float(r) < min(1.0, float(q[t][token]) / float(p[t][token])):")
    with pytest.raises(TypeError, match=r"the exact oracle cannot follow float\(\)"):
        exact_law.check_exact(decoder)


def test_a_decoder_that_hands_the_uniform_to_numpy_gets_numpys_error_not_a_verdict():
    decoder = patched("sqrt", "if np.sqrt(r) < min(1.0, float(q[t][token]) / float(p[t][token])):")
    with pytest.raises(TypeError, match="SymbolicUniform which has no callable sqrt method"):
        exact_law.check_exact(decoder, problems=PROBLEMS[:1])


def recursive_rejection(x, draft_model, target_model, N, K, rng, *, n_drafts, forget_residual=False, **settings):
    """Several drafts by recursive rejection sampling (SpecInfer, arXiv 2305.09781): a decoder the oracle never saw.

    forget_residual=True is a plausible mistake: every candidate is tested against q, never against the residual.
    """
    settings, stats = sampling.SamplingSettings(**settings), SpeculativeStats()
    x = np.asarray(x, dtype=np.int64)
    T = len(x) + N
    while len(x) < T:
        K_n = min(K, T - len(x) - 1)
        drafts = [sampling.draw_drafts(draft_model, x, K_n, settings, rng, stats) for _ in range(n_drafts)]
        accepted = []
        while True:  # at position t, try in turn the drafts that agree with the tokens accepted so far
            t = len(accepted)
            residual = sampling.next_token_probs(target_model, np.append(x, np.array(accepted, np.int64)), 1,
                                                 settings)[0]
            for tokens, p in [(tokens, p) for tokens, p in drafts if t < K_n and list(tokens[:t]) == accepted]:
                if rng.random() < min(1.0, float(residual[tokens[t]]) / float(p[t][tokens[t]])):
                    accepted.append(int(tokens[t]))
                    break
                if not forget_residual:  # a rejected candidate's p leaves the residual norm((q' - p)+)
                    residual = sampling.max_fn(residual - p[t], fallback=residual)
            else:  # every candidate rejected, or none left: draw from what remains
                x = np.append(x, [*accepted, sampling.sample(residual, rng)])
                break
    return x


def test_a_decoder_with_two_drafts_is_exact_and_its_forgotten_residual_is_caught():
    check = exact_law.check_exact(recursive_rejection, n_drafts=2)
    assert check.passed and check.max_tv < 1e-6, check.report
    assert [result.paths for result in check.results] == [384, 293, 200, 1]
    buggy = exact_law.check_exact(recursive_rejection, problems=PROBLEMS[1:2], n_drafts=2, forget_residual=True)
    assert not buggy.passed and buggy.max_tv == pytest.approx(0.125, abs=1e-3), buggy.report


def test_extra_keyword_arguments_reach_the_decoder():
    seen = []

    def with_drafts(x, draft_model, target_model, N, K, rng, *, n_drafts, **settings):
        seen.append(n_drafts)
        return sampling.speculative_sampling(x, draft_model, target_model, N, K, rng, **settings)

    assert exact_law.check_exact(with_drafts, problems=PROBLEMS[:1], n_drafts=3).passed
    assert set(seen) == {3} and len(seen) == 52


def test_malformed_output_fails_and_too_many_paths_and_bad_input_raise():
    short = lambda x, draft, target, N, K, rng, **settings: sampling.speculative_sampling(  # noqa: E731
        x, draft, target, N - 1, K, rng, **settings)
    check = exact_law.check_exact(short, problems=PROBLEMS[:1])
    assert not check.passed and check.max_tv == np.inf and "malformed output" in check.report
    with pytest.raises(exact_law.TooManyPaths, match="more than 10 paths"):
        exact_law.check_exact(sampling.speculative_sampling, problems=PROBLEMS[:1], max_paths=10)
    with pytest.raises(ValueError, match="decoder must be a function"):
        exact_law.check_exact("speculative_sampling")
    with pytest.raises(ValueError, match="at least one Problem"):
        exact_law.check_exact(sampling.speculative_sampling, problems=[])
