"""engine/layouts.py: column panels and planned matrices multiply like the matrix; a plan follows the measured costs
(one layout, both where each gains enough and memory allows, padding where more rows cost less); the
measurement gives a valid plan for a model's own weights, once per process; a fixed layout repeats a run
bit for bit."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpt2
from engine import layouts, measure
from engine.threads import THREADS
from gpt2_cases import random_params

ROWS = range(1, layouts.MAX_ROWS + 1)


@pytest.mark.parametrize("n_out", [1, 31, 32, 33, 100])
def test_column_panels_multiply_like_the_matrix(n_out):
    rng = np.random.default_rng(n_out)
    w = rng.standard_normal((24, n_out), dtype=np.float32)
    panels = layouts.ColumnPanels(w)
    assert panels.panels.shape == (-(-n_out // 32), 24, 32) and panels.panels.flags.c_contiguous
    assert panels.shape == w.shape and panels.dtype == np.float32
    for m in range(1, 17):
        x = rng.standard_normal((m, 24), dtype=np.float32)
        product = x @ panels
        assert product.shape == (m, n_out) and product.dtype == np.float32
        np.testing.assert_allclose(product, x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_out", [1, 31, 32, 33, 100])
def test_column_major_panels_are_a_view_that_multiplies_like_the_matrix(n_out):
    rng = np.random.default_rng(n_out)
    w = np.asfortranarray(rng.standard_normal((24, n_out), dtype=np.float32))
    panels = layouts.ColumnMajorPanels(w)
    assert np.shares_memory(panels.panels, w) or n_out < 32  # no copy (fewer than 32 columns are all tail)
    assert panels.nbytes == 0 and panels.shape == w.shape
    matrix = layouts.PlannedMatrix(w, layouts.fixed_plan("column-panels"))
    assert list(matrix.stored) == ["column-major"] and matrix.stored["column-major"] is w  # held as it lies
    for m in range(1, 17):
        x = rng.standard_normal((m, 24), dtype=np.float32)
        for product in (x @ panels, x @ matrix):
            assert product.shape == (m, n_out) and product.dtype == np.float32
            np.testing.assert_allclose(product, x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("plan", [layouts.fixed_plan("row-major"), layouts.fixed_plan("panels"),
                                  layouts.LayoutPlan(("row-major",) + ("panels",) * 15, (2, 2, 6, 6, 6, *range(6, 17)))],
                         ids=["row-major", "panels", "both, padded"])
def test_planned_matrices_multiply_like_the_matrix_for_any_row_count(plan):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((24, 70), dtype=np.float32)
    matrix = layouts.PlannedMatrix(w, plan)
    assert matrix.shape == w.shape and set(matrix.stored) == set(plan.kept)
    for m in [*ROWS, 17, 40]:  # past MAX_ROWS, the layout measured for 16
        x = rng.standard_normal((m, 24), dtype=np.float32)
        product = x @ matrix
        assert product.shape == (m, 70) and product.dtype == np.float32
        np.testing.assert_allclose(product, x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gpt2.linear(x, matrix, np.ones(70, np.float32)), x @ w + 1, rtol=1e-5, atol=1e-5)


def test_a_plan_must_feed_at_least_m_rows_and_name_known_layouts():
    with pytest.raises(ValueError, match="at least m rows"):
        layouts.LayoutPlan(("row-major",) * 16, (1, 1, *range(3, 17)))
    with pytest.raises(ValueError, match="one of"):
        layouts.LayoutPlan(("columns",) * 16, tuple(ROWS))
    plan = layouts.fixed_plan("panels")
    assert plan.rows(5) == 5 and plan.rows(300) == 300 and plan.layout(300) == "panels" and plan.kept == ("panels",)


# measured shapes of the two CPUs this kit was measured on (docs/SPEED.md), in one row-major row's time
ZEN3_LIKE = {"row-major": [1.0, 1.8, 2.3, 1.8, 2.4, 2.5, 2.7, 2.7, 2.8, 2.8, 2.8, 2.5, 2.9, 2.9, 3.0, 2.9],
             "panels": [1.15, 1.7, 2.1, 2.0, 2.1, 2.0, 2.5, 2.0, 2.4, 2.5, 3.0, 2.3, 2.6, 2.6, 3.0, 2.4]}
ZEN5_LIKE = {"row-major": [1.0, 2.9, 3.0, 3.2, 3.4, 3.4, 3.3, 3.3, 3.4, 3.4, 3.5, 3.5, 3.5, 3.6, 3.7, 3.7],
             "panels": [0.96, 0.98, 1.18, 1.20, 1.20, 1.23, 1.4, 1.54, 1.6, 1.7, 1.8, 1.86, 2.0, 2.1, 2.3, 2.4]}
GB = 2**30


def test_plan_keeps_one_layout_when_it_wins_one_row_and_several():
    plan = measure.plan_from_costs(ZEN5_LIKE, weights_bytes=GB, memory_bytes=24 * GB)
    assert plan.kept == ("panels",)
    assert plan.costs["panels"] == tuple(ZEN5_LIKE["panels"])
    assert all(rows >= m for m, rows in zip(ROWS, plan.rows_to_feed))


def test_plan_keeps_both_where_each_gains_enough_and_memory_allows():
    plan = measure.plan_from_costs(ZEN3_LIKE, weights_bytes=GB // 2, memory_bytes=24 * GB)
    assert plan.layouts[0] == "row-major" and set(plan.layouts[1:]) == {"panels"}
    # the same costs for a model too large to hold twice: the layout with the larger advantage serves all
    large = measure.plan_from_costs(ZEN3_LIKE, weights_bytes=4 * GB, memory_bytes=24 * GB)
    assert len(large.kept) == 1
    # and a one-row gain below GAIN_WORTH_A_CHOICE is not worth holding the weights twice
    close = dict(ZEN3_LIKE, panels=[1.02] + ZEN3_LIKE["panels"][1:])
    assert measure.plan_from_costs(close, weights_bytes=GB // 2, memory_bytes=24 * GB).kept == ("panels",)


def test_plan_pads_rows_only_where_more_rows_are_cheaper_beyond_doubt():
    plan = measure.plan_from_costs(ZEN3_LIKE, weights_bytes=GB // 2, memory_bytes=24 * GB)
    assert plan.rows_to_feed[2] == 3  # 4 rows (2.0) are cheaper than 3 (2.1), but by less than 5%
    assert plan.rows_to_feed[6] == 8  # 7 rows (2.5) fed as 8 (2.0)
    assert plan.rows_to_feed[10] == 12  # 11 rows (3.0) fed as 12 (2.3)
    assert all(m <= rows <= 2 * m for m, rows in zip(ROWS, plan.rows_to_feed))
    costs = [plan.costs[plan.layout(rows)][rows - 1] for rows in plan.rows_to_feed]
    assert all(cost <= plan.costs[plan.layout(m)][m - 1] for m, cost in zip(ROWS, costs))
    flat = {"row-major": [1.0] * 16, "panels": [1.5] * 16}  # equal costs: nothing is padded
    assert measure.plan_from_costs(flat, weights_bytes=GB).rows_to_feed == tuple(ROWS)
    # a busy machine: 12 rows' median looks cheaper than one row's, but their rounds overlap: no padding,
    # and never beyond twice the rows
    noisy = {"row-major": [1.0] + [0.8] * 15, "panels": [1.2] * 16}
    overlapping = {"row-major": [(0.5, 3.0)] * 16, "panels": [(0.6, 3.0)] * 16}
    assert measure.plan_from_costs(noisy, weights_bytes=GB, spread=overlapping).rows_to_feed == tuple(ROWS)
    believed = measure.plan_from_costs(noisy, weights_bytes=GB)  # without a spread the medians are believed...
    assert believed.rows_to_feed[:3] == (2, 2, 3)  # ...but one row is fed as two at most, not as twelve


def test_plan_prefers_the_layout_a_matrix_lies_in_unless_another_is_clearly_cheaper():
    close = {"row-major": [1.0] * 16, "column-major": [0.97] * 16, "panels": [1.5] * 16}
    assert measure.plan_from_costs(close, native="row-major").kept == ("row-major",)  # 3% is no reason to copy
    assert measure.plan_from_costs(close, native="column-major").kept == ("column-major",)
    clear = dict(close, **{"column-major": [0.8] * 16})
    assert measure.plan_from_costs(clear, native="row-major").kept == ("column-major",)


def test_planned_matrices_hold_each_layout_once_and_no_copy_of_the_layout_they_lie_in():
    w = np.random.default_rng(0).standard_normal((24, 70)).astype(np.float32)
    for layout, lies_in in (("row-major", w), ("column-major", np.asfortranarray(w))):
        matrix = layouts.PlannedMatrix(lies_in, layouts.fixed_plan(layout))
        assert matrix.stored[layout] is lies_in
    copied = layouts.PlannedMatrix(w, layouts.fixed_plan("column-major")).stored["column-major"]
    assert copied.flags.f_contiguous and not np.shares_memory(copied, w)
    assert layouts.as_it_is(w, layouts.fixed_plan("row-major")) and not layouts.as_it_is(w.T, layouts.fixed_plan("row-major"))


def test_fast_layout_keeps_the_callers_arrays_where_the_plan_multiplies_them_as_they_are():
    params = random_params(dict(n_vocab=50, n_ctx=16, n_embd=16, n_head=2, n_layer=2), seed=0)
    as_they_are = layouts.ModelPlan({**layouts.ModelPlan.uniform(layouts.fixed_plan("row-major")).plans,
                                     "unembedding": layouts.fixed_plan("column-major")})  # wte.T is column-major
    laid_out, unembedding = layouts.fast_layout(params, as_they_are)
    assert laid_out is params and unembedding is None
    # the output projection in panels, mlp.c_proj column-major (a copy), the rest as they are
    plan = layouts.ModelPlan({**as_they_are.plans, "unembedding": layouts.fixed_plan("panels"),
                              "mlp.c_proj": layouts.fixed_plan("column-major")})
    laid_out, unembedding = layouts.fast_layout(params, plan)
    block, original = laid_out["blocks"][0], params["blocks"][0]
    assert block["attn"]["c_attn"]["w"] is original["attn"]["c_attn"]["w"] and block["ln_1"] is original["ln_1"]
    assert list(block["mlp"]["c_proj"]["w"].stored) == ["column-major"] and list(unembedding.stored) == ["panels"]
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(x @ unembedding, x @ params["wte"].T, rtol=1e-5, atol=1e-5)
    assert "unembedding panels" in plan.summary() and "mlp.c_proj column-major" in plan.summary()
    mixed = layouts.ModelPlan.uniform(layouts.LayoutPlan(("row-major",) + ("panels",) * 15, (2, *range(2, 17))))
    assert "row-major for one row, panels for several (rows fed padded: 1 as 2)" in mixed.summary()
    assert set(mixed.as_dict()) == set(layouts.ROLES)


def test_measured_plan_is_valid_and_measured_once_per_shapes():
    hparams = dict(n_vocab=300, n_ctx=32, n_embd=64, n_head=4, n_layer=2)
    params = random_params(hparams, seed=0)
    measure.MEASURED_PLANS.clear()
    plan = measure.measure_plan(params)  # a small model: BLAS's threads are not offered (measure.STREAMING_BYTES)
    assert set(plan.plans) == set(layouts.ROLES)
    for role, group in plan.plans.items():
        assert len(group.layouts) == len(group.rows_to_feed) == layouts.MAX_ROWS
        assert set(group.costs) == set(layouts.ways(THREADS.count, blas=False)) and all(cost > 0 for costs in group.costs.values() for cost in costs)
        native = "column-major" if role == "unembedding" else "row-major"
        assert group.costs[native][0] == pytest.approx(1.0)  # the unit: one row in the layout the matrix lies in
    assert measure.measure_plan(random_params(hparams, seed=1)) is plan  # the same shapes: not measured again
    assert len(measure.MEASURED_PLANS) == 1


def test_probes_stop_once_they_hold_enough_bytes():
    params = random_params(dict(n_vocab=50, n_ctx=16, n_embd=16, n_head=2, n_layer=3), seed=0)
    roles = layouts.role_matrices(params)
    assert list(roles) == list(layouts.ROLES) and len(roles["attn.c_attn"]) == 3
    assert roles["attn.c_attn"][0] is params["blocks"][0]["attn"]["c_attn"]["w"]
    blocks = roles["mlp.c_fc"]
    assert measure.probe(blocks, probe_bytes=10**9) == blocks
    assert measure.probe(blocks, probe_bytes=blocks[0].nbytes) == blocks[:1]
    (whole,) = measure.probe(roles["unembedding"], probe_bytes=10**9)
    assert whole.shape == (16, 50) and np.shares_memory(whole, params["wte"])  # a view, not a copy
    (first,) = measure.probe(roles["unembedding"], probe_bytes=10 * 16 * 4)
    np.testing.assert_array_equal(first, params["wte"][:10].T)


REPEATED_RUN = """
import hashlib, sys
sys.path[:0] = sys.argv[1:3]
import gpt2, sampling
from gpt2_cases import random_params
hparams = dict(n_vocab=300, n_ctx=64, n_embd=64, n_head=4, n_layer=2)
draft, target = (gpt2.GPT2Model(random_params(hparams, seed), hparams) for seed in (1, 0))
tokens = sampling.speculative_sampling([5, 6, 7], draft, target, 40, 3, rng=0, temperature=1.0, top_p=0.9)
print(tokens.tolist(), hashlib.sha256(target.logits(tokens, len(tokens)).tobytes()).hexdigest())
"""


def test_a_fixed_layout_repeats_a_sampled_run_bit_for_bit_in_a_fresh_process():
    """The README's promise: with a fixed layout, nothing measured per process, a seed repeats a run exactly."""
    tests = Path(__file__).resolve().parent
    runs = [subprocess.run([sys.executable, "-c", REPEATED_RUN, str(tests.parent), str(tests)], capture_output=True,
                           text=True, timeout=120, check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0].split("]")[0].split(",")) == 43
