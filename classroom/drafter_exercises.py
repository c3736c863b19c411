"""Automatic checks for notebook 11's exercises on drafters: `check(name, answer)`, as notebook 9's.

The checks compare with the kit itself rather than with a copy of the solution: a weight count with the arrays the
kit's drafters really multiply (gpt2.init_params, drafters.eagle.init_head, drafters.kangaroo.init_adapter), a
break-even alpha with speedup/stats.expected_speedup, a rerank with drafters.eagle2's, a ranking of the drafter
zoo's bugs with the committed benchmark (bench/drafter_zoo.py's JSON). tests/test_drafter_exercises.py runs them
on the solutions (notebooks/solutions/drafter_solutions.py), on the literal formulas a student would type, and on
wrong answers, which get a hint.

The cost model of exercises d2 and d3: a decode step on one token multiplies every weight matrix it reads once, so
its cost is about the matrices' weights (biases, norms and the embedding's one-row lookup are left out). A GPT-2
block holds 12 d^2 of them (c_attn 3 d^2, attention's c_proj d^2, c_fc 4 d^2, the MLP's c_proj 4 d^2) and the tied
unembedding d x n_vocab. That count ranks the kit's drafters and lands near the c they pay in the loop; a step's
fixed part (NumPy's cost per operation) and the loop's own work are why only near (docs/DRAFTERS.md, "What a step
costs", from bench/step_cost.py).
"""

import json
import math
from pathlib import Path

import numpy as np

import gpt2
from classroom import exercise_checks
from drafters.eagle import init_head
from drafters.eagle2 import GrownTree
from drafters.heads import flatten
from drafters.kangaroo import init_adapter
from speedup.stats import expected_speedup

REPO = Path(__file__).resolve().parents[1]
ZOO_RESULTS = REPO / "bench" / "results" / "drafter_zoo_cpu_zen4.json"
DRAFTERS = ("target", "eagle", "early-exit", "kangaroo")  # "target": the target's own decode step
SEVEN_B = {"n_layer": 32, "n_embd": 4096, "n_vocab": 32000, "exit_layer": 2}  # Kangaroo's exit: 2 of 32 layers


def matrix_weights(tree, vectors=False):  # nested dicts and lists of arrays -> the weights of its matrices
    """The weights of its 2-D arrays, or (vectors) of all of them: biases and norms too."""
    return sum(array.size for array in flatten(tree).values() if vectors or array.ndim == 2)


def counted_weights(drafter, n_layer, n_embd, n_vocab, exit_layer):
    """The matrix weights one token multiplies in a step of `drafter` (one of DRAFTERS), counted in shapes: the
    reference the exercises compare with (tests/test_drafter_exercises.py ties it to the arrays themselves)."""
    block, unembedding = 12 * n_embd**2, n_embd * n_vocab
    return {"target": n_layer * block + unembedding,
            "eagle": 2 * n_embd**2 + block + unembedding,  # fc over [feature; embedding], one block, the readout
            "early-exit": exit_layer * block + unembedding,
            "kangaroo": exit_layer * block + 4 * n_embd**2 + unembedding}[drafter]  # + the adapter's attention


def kit_weights(hparams, exit_layer, rng, vectors=False):  # -> {drafter: the weights of the kit's own arrays}
    """What a step of each drafter reads, from arrays built as the kit builds them (random, the same shapes): its
    matrices, or (vectors) its biases and norms too. EAGLE's fusion of lower layers (fuse) applies once per true
    position, not per draft step: left out."""
    target = gpt2.init_params(hparams, rng)

    def count(tree):
        return matrix_weights(tree, vectors)

    readout = target["wte"].size + (count(target["ln_f"]) if vectors else 0)
    exit_blocks = count(target["blocks"][:exit_layer]) + readout
    return {"target": count(target["blocks"]) + readout, "eagle": count(init_head(hparams, rng)) + readout,
            "early-exit": exit_blocks, "kangaroo": exit_blocks + count(init_adapter(hparams, rng, target["ln_f"]))}


# ---- d1: the break-even alpha at K = 1 -------------------------------------------------------------------------


def check_break_even_k1(break_even_alpha):
    for c, v in [(0.1, 1.0), (0.267, 1.0), (0.3, 1.2), (0.05, 1.5)]:
        answer = break_even_alpha(c, v)
        if v != 1 and exercise_checks.close(answer, c):
            raise AssertionError(f"c = {c}, v = {v}: alpha = c is the bar when verification costs one step (v = 1); "
                                 "a loop at K = 1 costs c + v steps")
        assert exercise_checks.close(expected_speedup(answer, c, 1, v), 1), (
            f"c = {c}, v = {v}: at alpha = {answer} the formula gives {expected_speedup(answer, c, 1, v):.3f}x, not "
            "1x. A loop at K = 1 yields 1 + alpha tokens and costs c + v decode steps")
    below = break_even_alpha(0.1, 0.85)  # a measured v below 1 is noise around 1: the formula pays at any alpha
    assert below is not None and below <= 0, (
        "c = 0.1, v = 0.85: c + v < 1, so 1 + alpha > c + v already at alpha = 0; the bar is c + v - 1 (or 0)")


# ---- d2: a drafter's c from its weights ------------------------------------------------------------------------


def check_draft_step_weights(draft_step_weights):
    shapes = [{"n_vocab": 4096, "n_ctx": 8, "n_embd": 384, "n_head": 6, "n_layer": 8, "exit_layer": 2},  # the pair
              {"n_vocab": 50, "n_ctx": 8, "n_embd": 16, "n_head": 2, "n_layer": 3, "exit_layer": 1}]
    for shape in shapes:  # a count of the matrices passes, and so does one with the biases and norms too
        exit_layer = shape.pop("exit_layer")
        matrices, everything = (kit_weights(shape, exit_layer, np.random.default_rng(0), vectors) for vectors in (False, True))
        for drafter, truth in matrices.items():
            answer = draft_step_weights(drafter, shape["n_layer"], shape["n_embd"], shape["n_vocab"], exit_layer)
            assert answer is not None, f"{drafter}: your function returned None"
            hint = (" (the readout through the unembedding, n_embd x n_vocab, is part of every step)"
                    if math.isclose(truth - answer, shape["n_embd"] * shape["n_vocab"], rel_tol=0.05) else "")
            assert 0.99 * truth <= answer <= 1.01 * everything[drafter], (
                f"{drafter}, n_layer {shape['n_layer']}, n_embd {shape['n_embd']}, n_vocab {shape['n_vocab']}, exit "
                f"after {exit_layer}: the kit's arrays hold {truth:,} matrix weights per step ({everything[drafter]:,} "
                f"with biases and norms), you count {answer:,}{hint}")


# ---- d3: the same head on a 7B target --------------------------------------------------------------------------


def seven_b_costs():  # -> {drafter: c} and EAGLE's speedup at alpha 0.8, K 4, v = 1 on SEVEN_B
    shape = SEVEN_B
    target = counted_weights("target", **shape)
    c = {drafter: counted_weights(drafter, **shape) / target for drafter in ("eagle", "early-exit", "kangaroo")}
    return {**c, "eagle_speedup": expected_speedup(0.8, c["eagle"], 4, 1.0)}


def check_scale_transfer(answer):
    truth = seven_b_costs()
    assert set(answer) == set(truth), f"give {sorted(truth)}"
    for key, value in truth.items():
        if key == "eagle" and exercise_checks.close(answer[key], 0.231, 0.05):
            raise AssertionError("0.23 is EAGLE's c on the bundled 8 x 384 target: recount with 32 layers of "
                                 "d = 4096 and 32,000 tokens, where one block is a far smaller share of the model")
        assert math.isclose(answer[key], value, rel_tol=0.02), (
            f"{key}: you give {answer[key]:.4g}, the weight count gives {value:.4g}")


# ---- d4: EAGLE-2's rerank by hand ------------------------------------------------------------------------------

# node: (token, parent, log-probability of the token under the head after its parent)
PRINTED_TREE = [(" the", -1, -0.2), (" a", -1, -1.9), (" an", -1, -2.5),  # the root's children
                (" first", 0, -0.4), (" next", 0, -2.0), (" new", 1, -0.1),  # depth 2
                (" line", 3, -0.3), (" value", 3, -2.1)]  # depth 3
RERANK_NODES = 5


def printed_grown_tree():  # -> drafters.eagle2.GrownTree holding PRINTED_TREE
    grown = GrownTree()
    for token, parent, log_prob in PRINTED_TREE:
        grown.tokens.append(token)
        grown.parents.append(parent)
        grown.depths.append(1 if parent == -1 else grown.depths[parent] + 1)
        grown.values.append((0.0 if parent == -1 else grown.values[parent]) + log_prob)
    return grown


def check_rerank(kept):
    grown = printed_grown_tree()
    truth = grown.best(range(len(grown.tokens)), RERANK_NODES)
    assert len(kept) == RERANK_NODES, f"keep exactly {RERANK_NODES} nodes (the budget)"
    assert 2 not in kept or 5 in kept, ("node 2 (' an', value -2.5) loses to node 5 (' a new', -1.9 - 0.1 = -2.0): "
                                        "a node's value is the sum of the log-probabilities on its whole path")
    assert sorted(kept) == sorted(truth), (
        "add the log-probabilities along each node's path, then keep the nodes of the highest sums, whatever their "
        "depth")
    assert list(kept) == list(truth), "right nodes; list them best first (highest value first)"


WHY_NO_PRUNED_PARENT = {
    "a": "the verifier would reject an orphan anyway",
    "b": "a child's value is its parent's plus a log-probability <= 0, so never above it; ties go to the shallower",
    "c": "the rerank walks down from the root and stops at the first node it drops",
    "d": "the head is trained to give children lower probabilities than their parents",
}


def check_why_no_pruned_parent(letter):
    assert letter in WHY_NO_PRUNED_PARENT, f"answer with one of {', '.join(WHY_NO_PRUNED_PARENT)}"
    assert letter != "c", "drafters/eagle2.rerank sorts every node by value at once: it walks nothing"
    assert letter == "b", "compare a child's value with its parent's: what is added on the way down?"


# ---- d5: the drafter zoo's wiring bugs, ranked by the acceptance they cost -------------------------------------


def zoo_ranking():  # -> the committed benchmark's wiring bugs of EAGLE's and Medusa's heads, most tokens lost first
    rows = [row for row in json.loads(ZOO_RESULTS.read_text())["by_bug"] if row["drafter"] in ("eagle", "medusa")]
    return [row["bug"] for row in sorted(rows, key=lambda row: -row["lost_tokens_per_target_call"])]


def check_zoo_ranking(ranking):
    truth = zoo_ranking()
    assert sorted(ranking) == sorted(truth), f"rank the four: {', '.join(sorted(truth))}"
    assert ranking[0] == truth[0], ("which mistake leaves the head predicting from a feature that does not belong "
                                    "to the token beside it, at every step?")
    assert list(ranking) == truth, (f"the first is right; the committed benchmark ({ZOO_RESULTS.name}) measures the "
                                    "rest: compare what each bug changes at a draft step with how often it happens")


# ---- d6: what EAGLE-3 changed from EAGLE-1 ---------------------------------------------------------------------

EAGLE3_CHANGES = {
    "a": "the head reads a low, a middle and a high layer's states, concatenated and projected by fc, not only the "
         "top feature",
    "b": "the feature-regression loss is dropped: the head trains on the token loss alone",
    "c": "the training-time test: in training the head reads its own predictions for several steps, as in drafting",
    "d": "a draft readout of its own, over a reduced vocabulary (maps d2t and t2d)",
    "e": "verification by typical acceptance instead of the rejection rule",
    "f": "a second transformer block in the head",
}


def check_eagle3_changes(letters):
    letters = set(letters)
    assert letters <= set(EAGLE3_CHANGES), f"choose among {', '.join(EAGLE3_CHANGES)}"
    assert "e" not in letters, "typical acceptance is Medusa's, and it is not lossless; EAGLE-3 keeps the exact rule"
    assert "f" not in letters, "EAGLE-3's draft model is still one decoder layer"
    assert letters == {"a", "b", "c", "d"}, "one change that EAGLE-3's paper names is missing"


EXERCISES = {"d1": check_break_even_k1, "d2": check_draft_step_weights, "d3": check_scale_transfer,
             "d4": check_rerank, "d4b": check_why_no_pruned_parent, "d5": check_zoo_ranking, "d6": check_eagle3_changes}


def check(name, answer):
    """-> "correct", "unsolved" or "not yet: <hint>"; printed too, for the notebook."""
    return exercise_checks.check(name, answer, EXERCISES)
