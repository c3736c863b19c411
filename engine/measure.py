"""Which layouts multiply this machine's matrices fastest: the measuring policy behind engine.fast_model.

Which layout (engine/layouts.py) is fastest depends on the CPU, its BLAS kernels (docs/SPEED.md) and the matrix's
shape: on one CPU one row reads one of a model's matrices fastest row-major, another column-major and the output
projection in wide panels (measured: bench/results/ENGINE.md, 'Layout by CPU and shape'). So `measure_plan` times
every way (each layout on one thread, split over the threads, on BLAS's threads) for 1 to 16 rows on each role of
the model's matrices (all interleaved), and `plan_from_costs` turns each role's times into a `LayoutPlan`: which
way multiplies m rows, whether to hold a matrix twice (one layout for one row, another for several) where that
gains enough, and how many rows to feed for m where padding is measurably cheaper. A measured plan is kept per
machine on disk (plan_cache.py), so only a machine's first run pays for the measurement.
"""

import dataclasses
import math
import os
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

from engine import plan_cache
from engine.layouts import (LAYOUTS, MAX_ROWS, ROLES, LayoutPlan, ModelPlan, laid_out, layout_and_threads,
                            multiplier, native_layout, on_blas_threads, role_matrices, stored_as, ways)
from engine.threads import THREADS

# BLAS's threads are offered only to a model whose weights stream from memory: an idle OpenBLAS thread spins beside
# whatever runs next, and on the bundled pair (24 MB) they won their per-matrix timings yet lowered the pair's
# speedups (measured: bench/results/ENGINE.md, 'BLAS threads on a small model')
STREAMING_BYTES = 64 * 2**20
VERIFY_ROWS = range(2, 10)  # the blocks speculative sampling scores for K = 1 to 8: what "several rows" means
GAIN_WORTH_A_CHOICE = 0.05  # a layout, a copy or a padding is chosen over another only when this much cheaper
PROBE_BYTES = 16 * 2**20  # timed per role: the five roles together pass a 32 MB cache, streaming as in a decode step


def plan_from_costs(costs, weights_bytes=0, memory_bytes=None, spread=None, native=None, second_copy=True):
    """A LayoutPlan from measured costs {way: [cost of m rows, m = 1 .. MAX_ROWS]} (medians, any common unit).

    - One way when the same one is cheapest for one row and for the blocks verification scores (2 to 9
      rows, on average). When they differ, both are used (one for one row, the other for several) only if
      each gains at least GAIN_WORTH_A_CHOICE and, where they need two layouts of the matrix, second_copy
      allows one and holding the matrix twice takes under a quarter of the machine's memory; otherwise the
      way whose advantage is the larger serves every block. Any other way must beat the `native` one (the
      layout the matrix lies in, one thread) by GAIN_WORTH_A_CHOICE.
    - m rows are fed as m' rows, m < m' <= 2 m, only where m' is cheaper beyond doubt: spread, {layout:
      [(fastest, slowest) of m rows' rounds]}, must show m' rows' slowest round cheaper than m rows' fastest
      by GAIN_WORTH_A_CHOICE (padding can truly be cheaper, but a busy machine's noise can look the same, and a
      decode step fed twelve rows would cost several steps; measured: bench/results/ENGINE.md, 'Padding').
    """
    memory_bytes = physical_memory_bytes() if memory_bytes is None else memory_bytes
    spread = spread or {layout: [(cost, cost) for cost in costs[layout]] for layout in costs}

    def cheapest(cost_of):  # the cheapest layout, the native one unless another beats it by the margin
        best = min(cost_of, key=cost_of.get)
        return native if native in cost_of and cost_of[best] >= (1 - GAIN_WORTH_A_CHOICE) * cost_of[native] else best

    one_row = {layout: cost[0] for layout, cost in costs.items()}
    several_rows = {layout: statistics.mean(cost[m - 1] for m in VERIFY_ROWS) for layout, cost in costs.items()}
    best_one, best_several = cheapest(one_row), cheapest(several_rows)
    if best_one == best_several:
        layouts = (best_one,) * MAX_ROWS
    else:
        gain_one = one_row[best_several] / one_row[best_one] - 1
        gain_several = several_rows[best_one] / several_rows[best_several] - 1
        one_layout = len({stored_as(layout_and_threads(name)[0]) for name in (best_one, best_several)}) == 1  # views
        both_fit = one_layout or second_copy and 2.4 * weights_bytes < memory_bytes / 4  # panels up to 1.3x the matrix
        if min(gain_one, gain_several) >= GAIN_WORTH_A_CHOICE and both_fit:
            layouts = (best_one,) + (best_several,) * (MAX_ROWS - 1)
        else:
            layouts = (best_one if gain_one >= gain_several else best_several,) * MAX_ROWS
    median = lambda rows: costs[layouts[rows - 1]][rows - 1]
    fastest = lambda rows: spread[layouts[rows - 1]][rows - 1][0]
    slowest = lambda rows: spread[layouts[rows - 1]][rows - 1][1]
    rows_to_feed = []
    for m in range(1, MAX_ROWS + 1):
        cheaper = [rows for rows in range(m + 1, min(2 * m, MAX_ROWS) + 1)
                   if slowest(rows) < (1 - GAIN_WORTH_A_CHOICE) * fastest(m)]
        rows_to_feed.append(min(cheaper, key=median) if cheaper else m)
    return LayoutPlan(layouts, tuple(rows_to_feed), {layout: tuple(cost) for layout, cost in costs.items()})


def physical_memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a Unix: assume a laptop's 8 GB
        return 8 * 2**30


def probe(matrices, probe_bytes=PROBE_BYTES):
    """The first matrices up to probe_bytes, or the first columns of a single larger one (a slice of GPT-2
    124M's 154 MB output projection behaves as the whole): a small model is judged on all of itself."""
    if len(matrices) == 1 and matrices[0].nbytes > probe_bytes:
        w = matrices[0]
        return [w[:, :max(1, probe_bytes // (w.shape[0] * w.itemsize))]]
    chosen, total = [], 0
    for w in matrices:
        if total >= probe_bytes:
            break
        chosen.append(w)
        total += w.nbytes
    return chosen


def measure_costs_by_layout(probes, rounds=2, one_row_rounds=6, seed=0, threads=None, blas=None):
    """{role: ({way: [median time of m rows through the role's probe, m = 1 .. MAX_ROWS]}, {way: [(fastest,
    slowest) round]})}, in units of the role's median one row in its native layout (seconds, once per machine:
    bench/results/ENGINE.md, 'Measuring time').

    The ways are every layout on one thread and, with threads > 1 (default: THREADS.count), split over that many
    and, unless blas is False (ways), on that many BLAS threads.
    Within each round the row counts, the ways and the roles interleave, so that the machine's drift touches
    them alike and each role's matrices come from memory (the others pass through the cache in between); a
    first round warms up and is not kept. One row, the decode step, is timed one_row_rounds times in all: its
    choice matters most, and it is the cheapest to time."""
    threads = THREADS.count if threads is None else threads
    names = ways(threads, blas)
    stored = {}
    for role, matrices in probes.items():
        laid = {layout: [laid_out(w, layout) for w in matrices] for layout in LAYOUTS}
        stored[role] = {name: [multiplier(w, name) for w in laid[layout_and_threads(name)[0]]] for name in names}
    rng = np.random.default_rng(seed)
    rows = {n_in: rng.standard_normal((MAX_ROWS, n_in)).astype(np.float32)
            for matrices in probes.values() for n_in in {w.shape[0] for w in matrices}}
    times = {(role, name, m): [] for role in probes for name in names for m in range(1, MAX_ROWS + 1)}
    repeats = lambda m: -(-one_row_rounds // rounds) if m == 1 else 1  # timings of m rows per round
    progress = tqdm(total=(rounds + 1) * sum(repeats(m) for m in range(1, MAX_ROWS + 1)) * len(names),
                    desc="measuring this machine's weight layouts (once)", file=sys.stderr, leave=False)
    for round_ in range(rounds + 1):
        for m in range(1, MAX_ROWS + 1):
            for _ in range(repeats(m)):
                for name in names:
                    progress.update()
                    THREADS.use_blas_threads(on_blas_threads(name))  # started or stopped outside the timing
                    for role in probes:
                        start = time.perf_counter()
                        for w in stored[role][name]:
                            rows[w.shape[0]][:m] @ w
                        if round_:
                            times[role, name, m].append(time.perf_counter() - start)
    progress.close()
    result = {}
    for role, matrices in probes.items():
        unit = statistics.median(times[role, native_layout(matrices[0]) or LAYOUTS[0], 1])
        costs = {name: [statistics.median(times[role, name, m]) / unit for m in range(1, MAX_ROWS + 1)]
                 for name in names}
        spread = {name: [(min(times[role, name, m]) / unit, max(times[role, name, m]) / unit)
                         for m in range(1, MAX_ROWS + 1)] for name in names}
        result[role] = costs, spread
    return result


def on_blas_threads_pays(measured, role_bytes, rows):
    """Whether BLAS's own threads multiply these row counts (mean cost) faster than any other way, over all the
    roles together: each role's cost in its own unit (a time through its probe) weighted by its bytes."""
    def total(blas):
        return sum(role_bytes[role] * min((statistics.mean(costs[name][m - 1] for m in rows)
                                           for name in costs if on_blas_threads(name) == blas), default=math.inf)
                   for role, (costs, _) in measured.items())
    return total(True) < total(False)


def on_one_side(times, blas, never):
    """times {way: [per row count m]} with `never` for every way on the other side of the model's choice, blas:
    {(1,): BLAS's threads for one row?, VERIFY_ROWS: for several?}: plan_from_costs then chooses on that side."""
    side = lambda m: blas[(1,) if m == 1 else VERIFY_ROWS]
    return {name: [time if on_blas_threads(name) == side(m) else never for m, time in enumerate(by_rows, 1)]
            for name, by_rows in times.items()}


def blas_by_rows(plan):  # whether the plan multiplies m rows on BLAS's threads, m = 1 .. MAX_ROWS
    return tuple(on_blas_threads(plan.layout(plan.rows(m))) for m in range(1, MAX_ROWS + 1))


MEASURED_PLANS = {}  # looked up once per process for each set of weight shapes and thread count
COPY_BUDGET = 0.25  # second layouts of a large model's matrices may take at most this share of its weights
LARGE_MODEL = 1 / 16  # a model whose weights take more than this share of the machine's memory is large


def measure_plan(params):
    """This machine's ModelPlan for these weights: every role timed on its own probe (under a second for the
    bundled pair, two to three seconds for GPT-2 124M; once per machine for each set of shapes and threads: the
    plan is kept in the user's cache folder, plan_cache.py). BLAS is set to one thread first (THREADS.claim).

    A second layout of a role's matrices (one for one row, another for several) is kept only where it pays; for a
    large model (LARGE_MODEL) all such copies together must also stay within COPY_BUDGET of its weights, the
    smallest first: GPT-2 1558M held twice (13 GB) would not fit many laptops, the bundled pair's 24 MB would.

    BLAS's own threads, offered to a model over STREAMING_BYTES, serve one row (and, apart, several rows) in every
    role or in none, whichever costs less over the whole model: a pass that took turns between them and our split
    would stop and start OpenBLAS's threads at every product (engine/threads.py)."""
    THREADS.claim()
    matrices = role_matrices(params)
    shapes = tuple(w.shape for role in ROLES for w in matrices[role]) + (THREADS.count,)
    if shapes not in MEASURED_PLANS:
        key = plan_cache.machine_key(shapes, physical_memory_bytes())
        MEASURED_PLANS[shapes] = plan_cache.load(key) or plan_cache.save(key, plan_for(matrices))
    return MEASURED_PLANS[shapes]


def plan_for(matrices):
    """measure_plan's measurement and choice: {role: [matrices]} (layouts.role_matrices) -> a ModelPlan."""
    role_bytes = {role: sum(w.nbytes for w in matrices[role]) for role in ROLES}
    offered = THREADS.blas_threading and sum(role_bytes.values()) > STREAMING_BYTES
    measured = measure_costs_by_layout({role: probe(matrices[role]) for role in ROLES}, blas=offered)
    blas = {rows: offered and on_blas_threads_pays(measured, role_bytes, rows) for rows in ((1,), VERIFY_ROWS)}

    def plan(role, second_copy=True, blas=blas):
        costs, spread = measured[role]
        chosen = plan_from_costs(on_one_side(costs, blas, math.inf), weights_bytes=role_bytes[role],
                                 spread=on_one_side(spread, blas, (math.inf, math.inf)),
                                 native=native_layout(matrices[role][0]), second_copy=second_copy)
        return dataclasses.replace(chosen, costs={name: tuple(by_rows) for name, by_rows in costs.items()})

    def plans_within_budget(blas):
        plans = {role: plan(role, blas=blas) for role in ROLES}
        weights = sum(role_bytes.values())
        budget = COPY_BUDGET * weights if weights > LARGE_MODEL * physical_memory_bytes() else math.inf
        copied = sorted((role for role in ROLES if len(plans[role].kept) > 1), key=lambda role: role_bytes[role])
        for role in copied:  # the smallest copies first: the most roles sped up for the memory
            if role_bytes[role] <= budget:
                budget -= role_bytes[role]
            else:
                plans[role] = plan(role, second_copy=False, blas=blas)
        return plans

    plans = plans_within_budget(blas)
    chosen = tuple(blas[(1,) if m == 1 else VERIFY_ROWS] for m in range(1, MAX_ROWS + 1))
    if any(blas_by_rows(plans[role]) != chosen for role in ROLES):  # a copy refused, or a block padded across
        plans = plans_within_budget({(1,): False, VERIFY_ROWS: False})  # the choice, broke it: no BLAS threads
    return ModelPlan(plans)
