"""How GPT2Model stores its weight matrices for the products, chosen by measuring this machine.

The numbers are the checkpoint's whatever the layout; what differs is how fast NumPy's BLAS multiplies them.
A decode step multiplies one row of activations by every weight matrix, x[1, n_in] @ w[n_in, n_out]; scoring
K + 1 drafted tokens multiplies K + 1 rows by the same weights. Three layouts of w:

- "row-major" (C order, the checkpoint's for the blocks' weights): one row is a sum of w's rows;
- "column-major" (Fortran order, that of wte.T, the tied output projection, a transposed view of the
  embedding): one row is a dot product with each of w's columns;
- "panels" (ColumnPanels, [n_out / 32, n_in, 32]): made for several rows, see ColumnPanels;
- "wide-panels" (ColumnPanels 4096 wide, at most the matrix's width): for one row through a wide matrix,
  each panel a row-major block whose output row fits in a core's 32 KB first-level cache;
- "column-panels" (ColumnMajorPanels): the column-major matrix itself, multiplied 16 columns at a time, each
  block of 16 columns a contiguous [16, n_in] stretch of memory: no copy beyond the column-major one, and on
  the Intel Xeon we measured (AVX-512) one row as fast as column-major and several rows almost as cheap.

Which is fastest depends on the CPU, its BLAS kernels (docs/SPEED.md) and the matrix's shape. On an AMD Zen 3
(OpenBLAS's Haswell kernels, one thread) one row through GPT-2 124M's mlp.c_fc [768, 3072] read 17.5 GB/s
row-major and 9.4 column-major, through its mlp.c_proj [3072, 768] 10.8 and 14.6, and through the output
projection [768, 50257] 11.2 as the view wte.T, 15.2 row-major, 12.9 in panels and 18.4 in wide panels. So
`measure_plan` times the four layouts for 1 to 16 rows on
each role of the model's matrices (ROLES, all interleaved), and `plan_from_costs` turns each role's times into
a `LayoutPlan`: which layout multiplies m rows, whether to hold a matrix twice (one layout for one row, another
for several) where that gains enough, and how many rows to feed for m where padding is measurably cheaper.
`fast_layout(params, plan)` builds the weights from the `ModelPlan`, once; gpt2.GPT2Model(layout="auto") does
all this.

Each layout is also timed split across every core (engine/threads.py: the matrix's column groups, one thread
each, views of the same layout, no copy), and the column-major one on BLAS's own threads: a way
of multiplying is a layout and how it is threaded, written "panels" for one thread, "panels on 2 threads" for
our split in two and "column-major on 2 BLAS threads", and the plan names the way for each row count.
"""

import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

from engine.panels import PANEL_WIDTH, ColumnMajorPanels, ColumnPanels
from engine.threads import THREADS, BlasThreaded, SplitMatrix

LAYOUTS = ("row-major", "column-major", "panels", "wide-panels", "column-panels")
# What is offered to BLAS's own threads: column-major only, the storage column-panels are views of, so that one
# copy serves one row on BLAS's threads and several rows in panels (a stack of panels is many small products,
# which BLAS does not thread). Row-major on BLAS's threads read GPT-2 1558M's matrices no faster (within 4%, Xeon).
BLAS_LAYOUTS = ("column-major",)
# BLAS's threads are offered only to a model whose weights stream from memory: an idle OpenBLAS thread spins beside
# whatever runs next, and on the bundled pair (24 MB) they won their per-matrix timings yet lowered the pair's
# speedups (K = 1: 1.07-1.11x against 1.15-1.18x, measured alternating on the Intel Xeon, family 6, model 167)
STREAMING_BYTES = 64 * 2**20
STORED_AS = {"column-panels": "column-major"}  # a layout that is a view of another's storage
ROLES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "unembedding")  # the matrices a block and the head read
MAX_ROWS = 16  # the largest block measured: K + 1 for K up to 15 (more rows use the layout measured for 16)
WIDE_PANEL_WIDTH = 4096  # 16 KB of output per panel: fits a first-level cache beside the input row
VERIFY_ROWS = range(2, 10)  # the blocks speculative sampling scores for K = 1 to 8: what "several rows" means
GAIN_WORTH_A_CHOICE = 0.05  # a layout, a copy or a padding is chosen over another only when this much cheaper
PROBE_BYTES = 16 * 2**20  # timed per role: the five roles together pass a 32 MB cache, streaming as in a decode step


def stored_as(layout):  # the layout whose memory holds this one
    return STORED_AS.get(layout, layout)


def laid_out(w, layout):
    """w in a layout: the array itself where it already lies so (no copy), else a C- or F-ordered copy, or panels."""
    if layout == "column-panels":
        return ColumnMajorPanels(np.asfortranarray(w))
    if layout == "row-major":
        return np.ascontiguousarray(w)
    if layout == "column-major":
        return np.asfortranarray(w)
    if layout == "wide-panels":
        return ColumnPanels(w, width=min(WIDE_PANEL_WIDTH, -(-w.shape[1] // PANEL_WIDTH) * PANEL_WIDTH))
    return ColumnPanels(w)


def way(layout, threads=1, blas=False):
    """The name of a way to multiply: a layout, on one thread, split over several by us, or on BLAS's threads."""
    return layout if threads == 1 else f"{layout} on {threads} {'BLAS ' if blas else ''}threads"


def ways(threads, blas=None):
    """Every way measured with `threads` threads available: each layout on one thread and split over all of
    them, and the plain layouts on BLAS's threads (blas: default, where THREADS can use them)."""
    blas = THREADS.blas_threading if blas is None else blas
    split = tuple(way(layout, threads) for layout in LAYOUTS) if threads > 1 else ()
    return LAYOUTS + split + (tuple(way(layout, threads, blas=True) for layout in BLAS_LAYOUTS) if blas and threads > 1 else ())


def layout_and_threads(name):  # "panels on 2 threads" -> ("panels", 2); "column-major on 2 BLAS threads" likewise
    layout, _, threads = name.partition(" on ")
    return layout, int(threads.split()[0]) if threads else 1


def on_blas_threads(name):  # whether a way runs on BLAS's own threads
    return name.endswith(" BLAS threads")


def multiplier(stored, name):
    """What multiplies by the way `name`, for a matrix already laid out in its layout's storage (stored_as)."""
    layout, threads = layout_and_threads(name)
    stored = ColumnMajorPanels(stored) if layout == "column-panels" and not isinstance(stored, ColumnMajorPanels) else stored
    if threads == 1:
        return stored
    return BlasThreaded(stored) if on_blas_threads(name) else SplitMatrix(stored, threads)


def native_layout(w):  # the layout w already lies in, if any
    return "row-major" if w.flags.c_contiguous else "column-major" if w.flags.f_contiguous else None


@dataclass(frozen=True)
class LayoutPlan:
    """Which layout multiplies m rows and how many rows to feed for m, for m = 1 .. MAX_ROWS.

    layouts[m - 1] is a way to multiply: one of LAYOUTS, or one of them split over threads (`way`); rows_to_feed[m - 1]
    >= m (zero rows pad the block, their results are dropped). costs, when measured: {way: [time of m rows / time
    of one row in the matrix's native layout, m = 1..]}.
    """

    layouts: tuple
    rows_to_feed: tuple
    costs: dict = None

    def __post_init__(self):
        if len(self.layouts) != MAX_ROWS or not {layout_and_threads(name)[0] for name in self.layouts} <= set(LAYOUTS):
            raise ValueError(f"a plan names one of {LAYOUTS} for each of 1..{MAX_ROWS} rows, got {self.layouts}")
        if len(self.rows_to_feed) != MAX_ROWS or any(rows < m for m, rows in enumerate(self.rows_to_feed, 1)):
            raise ValueError(f"rows_to_feed must give at least m rows for each m = 1..{MAX_ROWS}, got {self.rows_to_feed}")

    def rows(self, m):  # how many rows to multiply to get m
        return self.rows_to_feed[m - 1] if m <= MAX_ROWS else m

    def layout(self, n_rows):  # the way that multiplies n_rows (fed) rows
        return self.layouts[min(n_rows, MAX_ROWS) - 1]

    @property
    def kept(self):  # the layouts the matrix is held in (a split or column panels are views of one of them)
        held = {stored_as(layout_and_threads(name)[0]) for name in self.layouts}
        return tuple(layout for layout in LAYOUTS if layout in held)

    def describe(self):
        one, several = self.layouts[0], sorted(set(self.layouts[1:]))
        text = one if several == [one] else f"{one} for one row, {' and '.join(several)} for several"
        padded = [f"{m} as {rows}" for m, rows in enumerate(self.rows_to_feed, 1) if rows > m]
        return text + (f" (rows fed padded: {', '.join(padded)})" if padded else "")


def fixed_plan(layout):
    """One layout for every block, rows fed as they are."""
    return LayoutPlan((layout,) * MAX_ROWS, tuple(range(1, MAX_ROWS + 1)))


@dataclass(frozen=True)
class ModelPlan:
    """A LayoutPlan for each role of a model's matrices (ROLES)."""

    plans: dict  # role -> LayoutPlan

    @classmethod
    def uniform(cls, plan):
        return cls({role: plan for role in ROLES})

    def __getitem__(self, role):
        return self.plans[role]

    def as_dict(self):
        return {role: {"layouts": plan.layouts, "rows_to_feed": plan.rows_to_feed,
                       "costs": None if plan.costs is None else {layout: [round(cost, 3) for cost in costs]
                                                                 for layout, costs in plan.costs.items()}}
                for role, plan in self.plans.items()}

    def summary(self):
        """One line: each role's layouts by row count, and the row counts fed padded."""
        return "; ".join(f"{role} {plan.describe()}" for role, plan in self.plans.items())


class PlannedMatrix:
    """A weight matrix w [n_in, n_out] held in the layouts its plan keeps; `x @ matrix` gives x @ w through the
    layout the plan chose for len(x) rows. A layout w already lies in is w itself, not a copy."""

    __array_ufunc__ = None  # makes NumPy hand `x @ matrix` to __rmatmul__

    def __init__(self, w, plan):  # [n_in, n_out]
        self.shape, self.dtype = w.shape, w.dtype
        self.stored = {layout: laid_out(w, layout) for layout in plan.kept}
        self.nbytes = sum(stored.nbytes for stored in self.stored.values())
        multipliers = {}  # way -> what multiplies: a stored layout, or column groups of it on several threads

        def multiplier_of(name):
            if name not in multipliers:
                multipliers[name] = multiplier(self.stored[stored_as(layout_and_threads(name)[0])], name)
            return multipliers[name]

        # looked up once per product, so a decode step pays one list index: m -> (rows to feed, what multiplies them)
        self.by_rows = [None] + [(plan.rows(m), multiplier_of(plan.layout(plan.rows(m)))) for m in range(1, MAX_ROWS + 1)]
        self.for_more_rows = multiplier_of(plan.layout(MAX_ROWS))

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        m = len(x)
        n_rows, w = self.by_rows[m] if m <= MAX_ROWS else (m, self.for_more_rows)
        if n_rows == m:
            return x @ w
        padded = np.concatenate([x, np.zeros((n_rows - m, x.shape[1]), x.dtype)])  # rows measured cheaper
        return (padded @ w)[:m]


def as_it_is(w, plan):
    """Whether the plan multiplies w as it is: one layout, the one w lies in, on one thread, every block fed as it is."""
    return set(plan.layouts) == {native_layout(w)} and plan.rows_to_feed == tuple(range(1, MAX_ROWS + 1))


def fast_layout(params, plan, in_place=False):
    """-> (params with each linear weight ("w") laid out by its role's plan, the output projection wte.T likewise).

    plan: a ModelPlan, or one LayoutPlan for every role. A matrix its plan multiplies as it is stays the
    caller's array; the other arrays (biases, layer norms, wte for the embedding lookup) are shared, not
    copied; params comes back as it is where no block matrix changes, and the output projection as None (gpt2
    then uses wte.T) where it does not change, so the plain path pays nothing for having been measured.
    in_place: write the laid-out matrices into params itself, so that each checkpoint matrix is freed as soon as
    its new layout is built (when nothing else holds it): GPT-2 1558M then peaks near its 6.2 GB instead of twice.
    """
    plan = plan if isinstance(plan, ModelPlan) else ModelPlan.uniform(plan)
    matrix = lambda w, role: w if as_it_is(w, plan[role]) else PlannedMatrix(w, plan[role])
    unembedding = params["wte"].T  # [n_embd, n_vocab]
    unembedding = None if as_it_is(unembedding, plan["unembedding"]) else PlannedMatrix(unembedding, plan["unembedding"])
    if in_place:
        for block in params["blocks"]:
            for group in ("attn", "mlp"):
                for layer, weights in block[group].items():
                    weights["w"] = matrix(weights.pop("w"), f"{group}.{layer}")
        return params, unembedding

    def lay_out(block):
        return {**block, **{group: {layer: {**weights, "w": matrix(weights["w"], f"{group}.{layer}")}
                                    for layer, weights in block[group].items()} for group in ("attn", "mlp")}}

    blocks = [lay_out(block) for block in params["blocks"]]
    unchanged = all(new[group][layer]["w"] is old[group][layer]["w"] for new, old in zip(blocks, params["blocks"])
                    for group in ("attn", "mlp") for layer in new[group])
    return (params if unchanged else {**params, "blocks": blocks}), unembedding


# ---- choosing, from this machine's measurements ------------------------------------------------


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
      by GAIN_WORTH_A_CHOICE (on the AVX2 EPYC two rows once cost 0.75 of a single row: real, but a busy
      machine's noise can look the same, and a decode step fed twelve rows would cost several steps).
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


def role_matrices(params):
    """{role: the model's matrices of that role, in the order a forward pass reads them}."""
    roles = {f"{group}.{layer}": [block[group][layer]["w"] for block in params["blocks"]]
             for group, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))}
    return {**roles, "unembedding": [params["wte"].T]}


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
    slowest) round]})}, in units of the role's median one row in its native layout (about four seconds for GPT-2
    124M's probes, a second for the bundled pair's on the Zen 3, twice that with a split on two threads).

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
    for round_ in range(rounds + 1):
        for m in range(1, MAX_ROWS + 1):
            for _ in range(-(-one_row_rounds // rounds) if m == 1 else 1):
                for name in names:
                    THREADS.use_blas_threads(on_blas_threads(name))  # started or stopped outside the timing
                    for role in probes:
                        start = time.perf_counter()
                        for w in stored[role][name]:
                            rows[w.shape[0]][:m] @ w
                        if round_:
                            times[role, name, m].append(time.perf_counter() - start)
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


MEASURED_PLANS = {}  # measured once per process for each set of weight shapes and thread count
COPY_BUDGET = 0.25  # second layouts of a large model's matrices may take at most this share of its weights
LARGE_MODEL = 1 / 16  # a model whose weights take more than this share of the machine's memory is large


def measure_plan(params):
    """This machine's ModelPlan for these weights: every role timed on its own probe (under a second for the
    bundled pair, two to three seconds for GPT-2 124M; once per process for each set of shapes and threads).

    A second layout of a role's matrices (one for one row, another for several) is kept only where it pays; for a
    large model (LARGE_MODEL) all such copies together must also stay within COPY_BUDGET of its weights, the
    smallest first: GPT-2 1558M held twice (13 GB) would not fit many laptops, the bundled pair's 24 MB would.

    BLAS's own threads, offered to a model over STREAMING_BYTES, serve one row (and, apart, several rows) in every
    role or in none, whichever costs less over the whole model: a pass that took turns between them and our split
    would stop and start OpenBLAS's threads at every product (engine/threads.py)."""
    matrices = role_matrices(params)
    shapes = tuple(w.shape for role in ROLES for w in matrices[role]) + (THREADS.count,)
    if shapes not in MEASURED_PLANS:
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
        MEASURED_PLANS[shapes] = ModelPlan(plans)
    return MEASURED_PLANS[shapes]
