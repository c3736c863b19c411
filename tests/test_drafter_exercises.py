"""Notebook 11's exercise checks (classroom/drafter_exercises.py): the solutions pass, the literal answers a student
would give pass too, wrong ones get a hint, and the weight count the checks compare with is the kit's arrays'."""

import sys

import numpy as np
import pytest

from conftest import REPO
from classroom import drafter_exercises

sys.path.insert(0, str(REPO / "notebooks" / "solutions"))
import drafter_solutions  # noqa: E402


def test_every_exercise_has_a_solution_that_passes():
    assert set(drafter_solutions.ANSWERS) == set(drafter_exercises.EXERCISES)
    for name, answer in drafter_solutions.ANSWERS.items():
        assert drafter_exercises.check(name, answer) == "correct", name


@pytest.mark.parametrize("shape", [(3, 16, 50, 1), (8, 384, 4096, 2), (4, 32, 100, 3)])
def test_the_counted_weights_are_the_kit_arrays(shape):
    n_layer, n_embd, n_vocab, exit_layer = shape
    hparams = {"n_layer": n_layer, "n_embd": n_embd, "n_vocab": n_vocab, "n_ctx": 4, "n_head": 2}
    arrays = drafter_exercises.kit_weights(hparams, exit_layer, np.random.default_rng(0))
    for drafter, weights in arrays.items():
        assert drafter_exercises.counted_weights(drafter, n_layer, n_embd, n_vocab, exit_layer) == weights, drafter


def test_the_scale_transfer_is_the_issue_of_scale():
    costs = drafter_exercises.seven_b_costs()  # one block is a fortieth of a 32-layer target
    assert costs["eagle"] == pytest.approx(0.0557, abs=5e-4)
    assert costs["eagle"] < costs["early-exit"] < costs["kangaroo"] < 0.1
    assert costs["eagle_speedup"] == pytest.approx(2.75, abs=0.01)


def with_biases(drafter, n_layer, n_embd, n_vocab, exit_layer):  # a student who counts every bias too
    biases = {"target": n_layer * 13 * n_embd, "eagle": 14 * n_embd, "early-exit": exit_layer * 13 * n_embd,
              "kangaroo": exit_layer * 13 * n_embd + 4 * n_embd}[drafter]
    return drafter_solutions.draft_step_weights(drafter, n_layer, n_embd, n_vocab, exit_layer) + biases


@pytest.mark.parametrize("name, answer", [
    ("d1", lambda c, v: max(0.0, c + v - 1)),
    ("d1", lambda c, v: (c + v) - 1.0),
    ("d2", with_biases),
    ("d4", (0, 3, 6, 1, 5)),
    ("d4b", "b"),
    ("d6", ["d", "c", "b", "a"]),
], ids=["d1-clipped", "d1-literal", "d2-with-biases", "d4-tuple", "d4b", "d6-list"])
def test_literal_answers_pass(name, answer):
    assert drafter_exercises.check(name, answer) == "correct"


def without_readout(drafter, n_layer, n_embd, n_vocab, exit_layer):
    return drafter_solutions.draft_step_weights(drafter, n_layer, n_embd, n_vocab, exit_layer) - n_embd * n_vocab


@pytest.mark.parametrize("name, answer, hint", [
    ("d1", lambda c, v: c, "v = 1"),
    ("d1", lambda c, v: 1 - c, "1x"),
    ("d2", without_readout, "unembedding"),
    ("d3", {"eagle": 0.231, "early-exit": 0.325, "kangaroo": 0.362, "eagle_speedup": 1.75}, "bundled"),
    ("d3", {"eagle": 0.0557}, "give"),
    ("d4", [0, 1, 2, 3, 4], "path"),
    ("d4", [0, 1, 3, 5, 6], "best first"),
    ("d4b", "c", "walks nothing"),
    ("d5", ["draft_cache_not_rebuilt", "one_shared_medusa_block", "feature_normed_twice", "feature_off_by_one"],
     "feature"),
    ("d6", {"a", "b", "c", "d", "e"}, "typical acceptance"),
    ("d6", {"a", "b", "c"}, "missing"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_wrong_answers_get_a_hint(name, answer, hint):
    verdict = drafter_exercises.check(name, answer)
    assert verdict.startswith("not yet") and hint in verdict, verdict


def test_an_unanswered_exercise_is_unsolved():
    def stub(c, v):
        raise NotImplementedError
    assert drafter_exercises.check("d1", stub) == "unsolved"
    assert drafter_exercises.check("d6", None) == "unsolved"
