"""engine/threads.py: a product split over threads gives the matrix's product, in any layout, for any row count,
and the model's logits stay the plain path's across rollbacks; one thread measures and builds exactly what it
did before threads existed; in_place frees the checkpoint's matrices as it lays them out."""

import ctypes

import numpy as np
import pytest

import engine
import gpt2
from engine import layouts, measure
from engine import threads
from engine.threads import THREADS, BlasThreaded, SplitMatrix, column_groups
from gpt2_cases import random_params

# one row split in two row-major halves, several rows in three groups of panels (more groups than a 2-core
# machine has threads: the third waits for a free one) or in two of column panels
SPLIT_PLAN = layouts.LayoutPlan(("row-major on 2 threads",) + ("panels on 3 threads",) * 7
                                + ("column-panels on 2 threads",) * 8, (1, 3, *range(3, 17)))
# one row on BLAS's own threads (column-major), several split by us in column panels of the same storage
BLAS_PLAN = layouts.LayoutPlan(("column-major on 2 BLAS threads",) + ("column-panels on 2 threads",) * 15,
                               tuple(range(1, 17)))
HPARAMS = dict(n_vocab=70, n_ctx=40, n_embd=64, n_head=4, n_layer=2)
needs_blas_threads = pytest.mark.skipif(not threads.Threads(2).blas_threading,
                                        reason="NumPy here has no OpenBLAS of its own to thread")


def test_column_groups_cover_the_columns_in_aligned_runs():
    assert column_groups(100, 2) == [(0, 64), (64, 100)]
    assert column_groups(64, 3) == [(0, 32), (32, 64)]  # two 32-column blocks cannot make three groups
    assert column_groups(5000, 2, align=4096) == [(0, 4096), (4096, 5000)]
    for n, groups in [(1, 4), (33, 2), (4800, 2), (50257, 3)]:
        cuts = column_groups(n, groups)
        assert cuts[0][0] == 0 and cuts[-1][1] == n and all(a % 32 == 0 for a, _ in cuts)
        assert all(stop == start for (_, stop), (start, _) in zip(cuts, cuts[1:]))


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("shape", [(24, 70), (16, 4100), (8, 31), (8, 64)])
def test_split_products_give_the_matrix_product(layout, shape):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape, dtype=np.float32)
    for groups in (2, 3):
        split = SplitMatrix(layouts.laid_out(w, layout), groups)
        assert split.shape == w.shape and split.nbytes == 0  # views: no memory of its own
        for m in (1, 2, 5, 16, 17):
            x = rng.standard_normal((m, shape[0]), dtype=np.float32)
            product = x @ split
            assert product.shape == (m, shape[1]) and product.dtype == np.float32
            np.testing.assert_allclose(product, x @ w, rtol=1e-5, atol=1e-5)


def assert_plain_logits_across_rollbacks(plan, n, multiplier_type):
    """The model built with `plan` gives the plain path's logits, n rows at a time, across rollbacks."""
    params = random_params(HPARAMS, seed=n)
    tokens = np.random.default_rng(n).integers(0, HPARAMS["n_vocab"], size=HPARAMS["n_ctx"])
    diverged = np.concatenate([tokens[:4], (tokens[4:] + 1) % HPARAMS["n_vocab"]])
    plain = gpt2.GPT2Model(params, HPARAMS)
    model = engine.fast_model(params, HPARAMS, layout=plan)
    assert isinstance(model.params["blocks"][0]["mlp"]["c_fc"]["w"].by_rows[1][1], multiplier_type)
    for x, n_last in [(tokens[:7], 1), (tokens[:7 + n], n), (diverged[:4 + n], n), (tokens[:9], 1), (tokens, n)]:
        logits = model.logits(x, n_last=n_last)
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, plain.logits(x, n_last=n_last), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", range(1, 17))
def test_split_plans_give_the_plain_paths_logits_across_rollbacks(n):
    assert_plain_logits_across_rollbacks(SPLIT_PLAN, n, SplitMatrix)

@needs_blas_threads
@pytest.mark.parametrize("layout", layouts.BLAS_LAYOUTS)
def test_blas_threaded_products_give_the_matrix_product_and_leave_blas_at_one_thread(layout):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((300, 2000), dtype=np.float32)  # large enough for OpenBLAS to use its threads
    count = THREADS.count
    try:
        THREADS.set(2)
        product = layouts.multiplier(layouts.laid_out(w, layout), layouts.way(layout, 2, blas=True))
        assert isinstance(product, BlasThreaded) and product.nbytes == 0
        for m in range(1, 17):
            x = rng.standard_normal((m, 300), dtype=np.float32)
            result = x @ product
            assert result.dtype == np.float32 and THREADS.blas_awake
            np.testing.assert_allclose(result, x @ w, rtol=1e-5, atol=1e-4)
            assert threads.openblas_call("get_num_threads", ctypes.c_int) == 1  # other products stay on one thread
        x @ SplitMatrix(w, 2)
        assert not THREADS.blas_awake  # a split product stops OpenBLAS's threads first: none spins beside it
    finally:
        THREADS.set(count)


@needs_blas_threads
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_blas_threaded_plans_give_the_plain_paths_logits_across_rollbacks(n):
    assert BLAS_PLAN.kept == ("column-major",)  # one copy serves both ways
    count = THREADS.count
    try:
        THREADS.set(2)
        assert_plain_logits_across_rollbacks(BLAS_PLAN, n, BlasThreaded)
    finally:
        THREADS.set(count)


def test_blas_threads_serve_a_row_count_in_every_role_or_in_none():
    roles = {role: 1.0 for role in layouts.ROLES}
    split, blas = "column-panels on 2 threads", "column-major on 2 BLAS threads"
    measured = {role: ({split: [1.0] * 16, blas: [0.8] + [3.0] * 15}, None) for role in roles}
    assert measure.on_blas_threads_pays(measured, roles, (1,)) and not measure.on_blas_threads_pays(
        measured, roles, measure.VERIFY_ROWS)
    measured["mlp.c_fc"] = ({split: [1.0] * 16, blas: [1.5] + [3.0] * 15}, None)  # one role's loss, weighed by bytes
    assert measure.on_blas_threads_pays(measured, roles, (1,))
    assert not measure.on_blas_threads_pays(measured, {**roles, "mlp.c_fc": 10.0}, (1,))


@needs_blas_threads
def test_a_measured_plan_uses_blas_threads_for_a_row_count_in_every_role_or_in_none(monkeypatch):
    monkeypatch.setattr(measure, "STREAMING_BYTES", 0)  # offered to this small model too
    count = THREADS.count
    try:
        THREADS.set(2)
        plan = measure.measure_plan(random_params(dict(HPARAMS, n_embd=128, n_layer=3), seed=2))
        assert all("column-major on 2 BLAS threads" in plan[role].costs for role in layouts.ROLES)  # measured
        assert len({measure.blas_by_rows(plan[role]) for role in layouts.ROLES}) == 1
    finally:
        THREADS.set(count)


def test_one_thread_measures_and_builds_no_split():
    count = THREADS.count
    try:
        THREADS.set(1)
        assert THREADS.pool is None and layouts.ways(THREADS.count) == layouts.LAYOUTS
        params = random_params(HPARAMS, seed=0)
        plan = measure.measure_plan(params)
        assert all(" on " not in way for role in layouts.ROLES for way in plan[role].layouts)
        assert all(set(plan[role].costs) == set(layouts.LAYOUTS) for role in layouts.ROLES)
        model = engine.fast_model(params, HPARAMS, layout="panels")
        tokens = list(range(10))
        before = model.logits(tokens, n_last=5)
        THREADS.set(2)  # a fixed layout never splits: the same numbers, bit for bit, whatever the threads
        assert np.array_equal(engine.fast_model(params, HPARAMS, layout="panels").logits(tokens, n_last=5), before)
        assert "panels on 2 threads" in layouts.ways(2)
    finally:
        THREADS.set(count)


def test_thread_counts_are_checked():
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="positive integer"):
            threads.Threads(bad)
    three = threads.Threads(3)
    assert three.pool._max_workers == 2  # the caller's thread is the third
    assert three.set(2).pool._max_workers == 1 and three.set(1).pool is None


def test_an_error_in_a_worker_reaches_the_caller_and_the_workers_go_on():
    count = THREADS.count
    try:
        THREADS.set(2)
        split = SplitMatrix(np.ones((4, 64), np.float32), 2)
        with pytest.raises(ValueError):
            np.ones((2, 5), np.float32) @ split  # 5 inputs for a matrix of 4: every group fails
        np.testing.assert_array_equal(np.ones((2, 4), np.float32) @ split, np.full((2, 64), 4, np.float32))
    finally:
        THREADS.set(count)


def test_products_from_several_threads_at_once_stay_right():
    import threading as python_threads

    w = np.random.default_rng(0).standard_normal((32, 256), dtype=np.float32)
    split, errors = SplitMatrix(w, 2), []

    def work(seed):
        x = np.random.default_rng(seed).standard_normal((3, 32), dtype=np.float32)
        for _ in range(200):
            if not np.allclose(x @ split, x @ w, rtol=1e-5, atol=1e-5):
                errors.append(seed)

    callers = [python_threads.Thread(target=work, args=(seed,)) for seed in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not errors


def tree_copy(tree):
    if isinstance(tree, dict):
        return {key: tree_copy(value) for key, value in tree.items()}
    return [tree_copy(value) for value in tree] if isinstance(tree, list) else tree


def test_in_place_layout_frees_the_checkpoints_matrices():
    params = random_params(HPARAMS, seed=1)
    expected = gpt2.GPT2Model(params, HPARAMS).logits(list(range(12)), n_last=3)
    copy = tree_copy(params)  # new dicts, the same arrays
    model = engine.fast_model(copy, HPARAMS, layout="panels", in_place=True)
    assert model.params is copy
    assert all(isinstance(copy["blocks"][i][group][layer]["w"], layouts.PlannedMatrix)
               for i in range(HPARAMS["n_layer"]) for group, layer in (("attn", "c_attn"), ("mlp", "c_proj")))
    assert isinstance(params["blocks"][0]["attn"]["c_attn"]["w"], np.ndarray)  # only the tree given was changed
    np.testing.assert_allclose(model.logits(list(range(12)), n_last=3), expected, rtol=1e-5, atol=1e-5)
