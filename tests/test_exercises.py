"""Notebook 9's automatic checks (classroom/exercise_checks.py): the solutions pass every one, and typical
wrong answers get a hint instead."""

import sys

import numpy as np
import pytest

import sampling
from classroom import lossless
from conftest import REPO

sys.path.insert(0, str(REPO / "notebooks" / "solutions"))
import exercise_solutions  # noqa: E402
from classroom import exercise_checks  # noqa: E402


def test_every_exercise_has_a_solution():
    assert set(exercise_solutions.ANSWERS) == set(exercise_checks.EXERCISES)
    assert len([key for key in exercise_checks.EXERCISES if isinstance(key, int)]) == 10


@pytest.mark.parametrize("number", list(exercise_checks.EXERCISES), ids=str)
def test_the_solution_passes_its_check(number):
    assert exercise_checks.check(number, exercise_solutions.ANSWERS[number]) == "correct"


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
}


@pytest.mark.parametrize("number", list(WRONG), ids=str)
def test_a_typical_wrong_answer_gets_a_hint(number):
    verdict = exercise_checks.check(number, WRONG[number])
    assert verdict.startswith("not yet: ") and len(verdict) > len("not yet: ") + 10, verdict


def test_a_stub_is_unsolved_and_a_crash_is_reported_not_raised():
    def stub(*args):
        raise NotImplementedError

    assert exercise_checks.check(1, stub) == "unsolved"
    assert exercise_checks.check("7b", None) == "unsolved"
    assert exercise_checks.check(1, lambda alpha, K: 1 / 0).startswith("not yet: ZeroDivisionError")


def test_the_lookup_solution_drafts_in_a_real_run_and_stays_greedy_exact():
    model = lossless.CachedTableModel(lossless.random_context_table(4, seed=1))
    stats = sampling.SpeculativeStats()
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2])  # a text that repeats itself: the lookup has something to copy
    out = sampling.speculative_sampling(prompt, exercise_solutions.PromptLookupDraft(4), model, 12, 3, 0,
                                        temperature=0, stats=stats)
    model.reset()
    assert np.array_equal(out, sampling.autoregressive_sampling(prompt, model, 12, temperature=0))
    assert stats.drafted > 0 and stats.draft_calls == stats.drafted
