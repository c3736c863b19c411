"""Notebook 9's automatic checks (classroom/exercise_checks.py): the solutions pass every one, so do the
textbook formulas a student would type (or they get the hint about their 0/0 edge, never a bare exception),
and typical wrong answers get a hint instead."""

import sys
from fractions import Fraction

import numpy as np
import pytest

import sampling
from classroom import lossless
from conftest import REPO
from speedup.stats import SpeculativeStats, expected_speedup

sys.path.insert(0, str(REPO / "notebooks" / "solutions"))
import exercise_solutions  # noqa: E402
from classroom import exercise_checks  # noqa: E402


def test_every_exercise_has_a_solution():
    assert set(exercise_solutions.ANSWERS) == set(exercise_checks.EXERCISES)
    assert len([key for key in exercise_checks.EXERCISES if isinstance(key, int)]) == 14
    assert "block" in exercise_checks.EXERCISES  # notebook 10's exercise


@pytest.mark.parametrize("number", list(exercise_checks.EXERCISES), ids=str)
def test_the_solution_passes_its_check(number):
    assert exercise_checks.check(number, exercise_solutions.ANSWERS[number]) == "correct"


# ---- what a student would type: the textbook formula, as it stands in the paper or on the blackboard


def geometric_sum(alpha, K):  # 1 + alpha + ... + alpha^K, term by term: no 0/0 anywhere
    return sum(alpha**i for i in range(K + 1))


def textbook_variance(alpha, K):  # Var[T] in closed form: E[T^2] - E[T]^2 with the sums summed
    mean = (1 - alpha ** (K + 1)) / (1 - alpha)
    sum_t_alpha = (1 - (K + 2) * alpha ** (K + 1) + (K + 1) * alpha ** (K + 2)) / (1 - alpha) ** 2
    return 2 * sum_t_alpha - mean - mean**2


def variance_by_sum(alpha, K):  # sum over t of (2t - 1) P(T >= t), minus E[T]^2
    return sum((2 * t - 1) * alpha ** (t - 1) for t in range(1, K + 2)) - geometric_sum(alpha, K) ** 2


def textbook_time(alpha, K, c, v, N):
    mean_tokens = geometric_sum(alpha, K)
    return (K * c + v) * N / mean_tokens, (K * c + v) * (N * variance_by_sum(alpha, K) / mean_tokens**3) ** 0.5


def textbook_break_even(weight_bytes, bytes_per_parameter, bytes_per_second, flops_per_second, alpha, c, K):
    ridge = flops_per_second * bytes_per_parameter / (2 * bytes_per_second)
    tokens = (1 - alpha ** (K + 1)) / (1 - alpha)
    return ridge * (tokens - K * c) / (K + 1) if tokens - K * c > 1 else 0


def bisected_alpha(speedup, c, K, v=1.0):  # a student's search, raising where no alpha in [0, 1] fits
    low, high = 0.0, 1.0
    if not geometric_sum(low, K) / (K * c + v) <= speedup <= geometric_sum(high, K) / (K * c + v):
        raise ValueError("no alpha gives it")
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if geometric_sum(middle, K) / (K * c + v) < speedup else (low, middle)
    return low


def textbook_best_K(alpha, c, verify_cost):
    speedups = {K: geometric_sum(alpha, K) / (K * c + verify_cost(K + 1)) for K in range(1, 33)}
    best = max(speedups, key=speedups.get)
    return best if speedups[best] > 1 else 0


ALPHA_ONE = "not yet: " + exercise_checks.ALPHA_ONE
TRUE_7, PUBLISHED_7 = expected_speedup(0.5, 0.1, 4), 0.5 * (1 - 0.5**4) / (1 - 0.5) / (4 * 0.1 + 1)
LITERAL = [  # (exercise, the student's answer, the verdict it must get)
    (1, lambda alpha, K: (1 - alpha ** (K + 1)) / (1 - alpha), ALPHA_ONE),
    (1, geometric_sum, "correct"),
    (1, lambda alpha, K: K + 1 if alpha == 1 else (1 - alpha ** (K + 1)) / (1 - alpha), "correct"),
    (2, lambda alpha, c, K, v=1.0: (1 - alpha ** (K + 1)) / (1 - alpha) / (K * c + v), ALPHA_ONE),
    (2, lambda alpha, c, K, v=1.0: geometric_sum(alpha, K) / (K * c + v), "correct"),
    (3, lambda p, q: np.sum(p * np.minimum(1, q / p)), "nan"),
    (3, lambda p, q: sum(p[x] * min(1, q[x] / p[x]) for x in range(len(p))), "correct"),  # Python's min skips nan
    (3, lambda p, q: np.minimum(p, q).sum(), "correct"),
    (3, lambda p, q: 1 - 0.5 * np.abs(p - q).sum(), "correct"),
    (4, lambda alpha, c: alpha > c, "correct"),
    (5, textbook_best_K, "correct"),
    (7, lambda alpha, c, K: (1 + alpha * (1 - alpha**K) / (1 - alpha)) / (K * c + 1), ALPHA_ONE),
    (7, lambda alpha, c, K: geometric_sum(alpha, K) / (K * c + 1), "correct"),
    ("7b", TRUE_7 - PUBLISHED_7, "correct"),
    ("7b", TRUE_7 / PUBLISHED_7, "correct"),
    ("7b", 0.71, "correct"),  # read off two rounded speedups
    (9, lambda F, beta, b: F * b / (2 * beta), "correct"),
    (11, {"A": 5, "B": 4, "C": 1, "D": 3, "E": 2}, "correct"),
    (12, textbook_variance, ALPHA_ONE),
    (12, variance_by_sum, "correct"),
    ("12b", textbook_time, "correct"),
    (13, textbook_break_even, "correct"),
    (14, lambda speedup, c, K, v=1.0: bisected_alpha(speedup, c, K, v), "correct"),
    ("block", Fraction(7, 8), "correct"),
    ("block", 0.875, "correct"),
    ("block", "7/8", "correct"),
]


@pytest.mark.parametrize("number, answer, verdict", LITERAL, ids=[f"{case[0]}-{i}" for i, case in enumerate(LITERAL)])
def test_a_literal_correct_answer_is_correct_or_gets_the_hint_about_its_edge(number, answer, verdict):
    with np.errstate(divide="ignore", invalid="ignore"):  # the 0/0 a literal formula meets, which the hint names
        got = exercise_checks.check(number, answer)
    if verdict == "nan":
        assert got.startswith("not yet: ") and "you give nan" in got and "min(p(x), q(x))" in got, got
    else:
        assert got == verdict, got


def published_tokens_per_loop(alpha, K):  # the accepted drafts only: one token short
    return K if alpha == 1 else alpha * (1 - alpha**K) / (1 - alpha)


class SoftLookup(exercise_solutions.PromptLookupDraft):  # proposes the right tokens but claims a uniform p
    def propose(self, x, K, settings, rng, stats):
        drafts, p = super().propose(x, K, settings, rng, stats)
        return drafts, np.full(p.shape, 1 / self.n_vocab, dtype=np.float32)


WRONG = {
    1: published_tokens_per_loop,
    2: lambda alpha, c, K, v=1.0: exercise_solutions.tokens_per_loop(alpha, K) / (K * c + 1),  # ignores v
    3: lambda p, q: float(np.sum(p * q)),  # exact-match acceptance, not the rejection rule's
    4: lambda alpha, c: alpha > 0,
    5: lambda alpha, c, verify_cost: 1,
    6: lambda drawn_from, p, q: q,  # assumes every rule is exact
    7: lambda alpha, c, K: published_tokens_per_loop(alpha, K) / (K * c + 1),
    "7b": 0.0,
    8: SoftLookup,
    9: lambda flops, bandwidth, bytes_per_parameter: flops * bytes_per_parameter / bandwidth,  # 1 flop a weight
    10: lambda origins: origins.count("accepted") / max(1, origins.count("accepted") + origins.count("corrected")
                                                        + origins.count("bonus")),
    11: {"A": 5, "B": 4, "C": 3, "D": 1, "E": 2},  # two swapped
    12: lambda alpha, K: alpha / (1 - alpha) ** 2 if alpha < 1 else 0.0,  # the untruncated geometric's variance
    "12b": lambda alpha, K, c, v, N: (textbook_time(alpha, K, c, v, N)[0],  # the spread of the tokens, not the loops
                                      (K * c + v) * (N * variance_by_sum(alpha, K)) ** 0.5 / geometric_sum(alpha, K)),
    13: lambda weight_bytes, b, beta, F, alpha, c, K: F * b / (2 * beta) / (K + 1),  # where verifying stops being free
    14: lambda speedup, c, K, v=1.0: bisected_alpha(min(max(speedup, 1 / (K * c + v)), (K + 1) / (K * c + v)), c, K,
                                                    v),  # right inside, but clamps what no alpha gives
    "block": Fraction(3, 4),  # token verification's alpha + alpha^2
}

MORE_WRONG = [  # (exercise, answer): more mistakes a student makes, each must not pass
    (3, lambda p, q: float(np.sum(p * q / np.maximum(p, q).max()))),  # accepted with probability q, scaled
    (5, lambda alpha, c, verify_cost: textbook_best_K(alpha, c, lambda m: verify_cost(m - 1))),  # v(K), not v(K + 1)
    ("7b", PUBLISHED_7 - TRUE_7),  # the sign
    ("7b", PUBLISHED_7 / TRUE_7),
    (12, lambda alpha, K: geometric_sum(alpha, K) ** 2),
    (13, lambda weight_bytes, b, beta, F, alpha, c, K: F * b / (2 * beta) * (geometric_sum(alpha, K) - K * c)),
    (13, lambda weight_bytes, b, beta, F, alpha, c, K: textbook_break_even(weight_bytes, b, beta, F, alpha, 0, K)),
    (14, lambda speedup, c, K, v=1.0: bisected_alpha(speedup, 0.0, K, v)),  # c left out: the least alpha only
    ("block", Fraction(11, 9)),  # the paper's example, not the exercise's toy
]


@pytest.mark.parametrize("number", list(WRONG), ids=str)
def test_a_typical_wrong_answer_gets_a_hint(number):
    verdict = exercise_checks.check(number, WRONG[number])
    assert verdict.startswith("not yet: ") and len(verdict) > len("not yet: ") + 10, verdict


@pytest.mark.parametrize("number, answer", MORE_WRONG, ids=[f"{case[0]}-{i}" for i, case in enumerate(MORE_WRONG)])
def test_more_wrong_answers_do_not_pass(number, answer):
    verdict = exercise_checks.check(number, answer)
    assert verdict.startswith("not yet: "), verdict


def test_the_quiz_marks_each_answer_and_hides_the_names():
    verdict = exercise_checks.check(11, {"A": 5, "B": 4, "C": 3, "D": None, "E": 2})
    assert "A right" in verdict and "B right" in verdict and "C wrong" in verdict and "D unanswered" in verdict
    assert "E right" in verdict
    assert exercise_checks.check(11, dict.fromkeys("ABCDE")) == "unsolved"
    assert exercise_checks.check(11, {"A": 1}).startswith("not yet: answer with a dict")
    decoders = exercise_checks.blind_bugs()
    assert list(decoders) == list("ABCDE")
    names = set(exercise_checks.QUIZ_BUGS)
    for label, decoder in decoders.items():
        shown = decoder.__name__ + str(decoder.__doc__) + exercise_checks.blind_diff(label)
        assert "(bug)" not in shown and not any(name in shown for name in names), shown
        assert exercise_checks.blind_diff(label).startswith("--- a/")
    assert sorted(exercise_checks.QUIZ_BUGS.values()) == sorted(set(exercise_checks.QUIZ_BUGS.values()))


def test_the_quiz_shows_none_of_notebook_7_s_bugs():
    from classroom import bug_zoo
    assert not set(exercise_checks.QUIZ_BUGS) & set(bug_zoo.ZOO)  # notebook 7 shows every bug of the zoo by name
    shown = {diff_line(bug.diff()) for bug in bug_zoo.BUGS}
    assert not shown & {diff_line(exercise_checks.blind_diff(label)) for label in "ABCDE"}


def diff_line(diff):  # the lines a diff adds, without comments
    return tuple(line.split("#")[0].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))


def test_a_blind_decoder_is_its_zoo_bug():
    for label, variant in exercise_checks.quiz_variants().items():
        model = lossless.CachedTableModel(lossless.random_context_table(4, seed=1))
        draft = lossless.CachedTableModel(lossless.random_context_table(4, seed=2))
        runs = []
        for decoder in (exercise_checks.blind_bugs()[label], variant.decoder()):
            model.reset(), draft.reset()
            runs.append(decoder(np.array([2, 0]), draft, model, 8, 3, np.random.default_rng(7)))
        assert np.array_equal(*runs), label


def test_the_variance_and_the_break_even_batch_in_numbers():
    assert exercise_solutions.tokens_per_loop_variance(0.8, 4) == pytest.approx(2.57004544)
    mean, spread = exercise_solutions.time_for_tokens(0.8, 4, 0.1, 1.0, 128)
    assert mean == pytest.approx(53.31, abs=0.01) and spread == pytest.approx(4.12, abs=0.01)
    h100 = (3.1e9, 2, 3.35e12, 989e12, 0.8, 0.05, 4)
    assert exercise_solutions.break_even_batch(*h100) == pytest.approx(186.7, abs=0.1)
    assert exercise_checks.roofline_break_even(*h100) == pytest.approx(186.7, abs=0.1)


def test_the_alpha_each_quoted_speedup_implies():
    """Solution 14's numbers: Chen et al.'s 2x and 2.5x (abstract) and jaymody's 60.64 s / 27.15 s, at K = 4, v = 1."""
    implied = {c: [round(exercise_solutions.implied_alpha(speedup, c, 4), 2) for speedup in (2, 2.5, 60.64 / 27.15)]
               for c in (0.0, 0.1)}
    assert implied == {0.0: [0.52, 0.64, 0.58], 0.1: [0.71, 0.82, 0.76]}
    assert exercise_checks.block_expected_kept([Fraction(2, 3), Fraction(1, 3)], [Fraction(1, 3), Fraction(2, 3)],
                                               2) == Fraction(11, 9)  # Sun et al.'s example, as notebook 10 finds it


def test_a_stub_is_unsolved_and_a_crash_is_reported_not_raised():
    def stub(*args):
        raise NotImplementedError

    assert exercise_checks.check(1, stub) == "unsolved"
    assert exercise_checks.check("7b", None) == "unsolved"
    assert exercise_checks.check(1, lambda alpha, K: 1 / 0).startswith("not yet: ZeroDivisionError")


def test_the_lookup_solution_drafts_in_a_real_run_and_stays_greedy_exact():
    model = lossless.CachedTableModel(lossless.random_context_table(4, seed=1))
    stats = SpeculativeStats()
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2])  # a text that repeats itself: the lookup has something to copy
    out = sampling.speculative_sampling(prompt, exercise_solutions.PromptLookupDraft(4), model, 12, 3, 0,
                                        temperature=0, stats=stats)
    model.reset()
    assert np.array_equal(out, sampling.autoregressive_sampling(prompt, model, 12, temperature=0))
    assert stats.drafted > 0 and stats.draft_calls == stats.drafted
