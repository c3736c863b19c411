"""How GPT2Model stores its weight matrices: plain, in column panels, or both, chosen by measuring this machine.

The numbers are the checkpoint's either way; what differs is how fast NumPy's BLAS multiplies them. A decode
step multiplies one row of activations by every weight matrix, x[1, n_in] @ w[n_in, n_out]; scoring K + 1
drafted tokens multiplies K + 1 rows by the same weights. Which layout serves which best depends on the CPU
and the BLAS kernels it runs (README, Speed), so `measure_plan` times both on the model's own matrices for 1
to 16 rows, interleaved (about a second for GPT-2 124M), and `plan_from_costs` turns the times into
a `LayoutPlan`: which layout multiplies m rows, whether to hold the weights twice (plain for one row, panels
for several) where that gains enough, and how many rows to feed for m where padding is measurably cheaper.
`fast_layout(params, plan)` builds the weights from it, once; gpt2.GPT2Model(layout="auto") does all this.
"""

import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

LAYOUTS = ("plain", "panels")
MAX_ROWS = 16  # the largest block measured: K + 1 for K up to 15 (more rows use the layout measured for 16)
PANEL_WIDTH = 32  # columns per panel; why 32, measured, in ColumnPanels
VERIFY_ROWS = range(2, 10)  # the blocks speculative sampling scores for K = 1 to 8: what "several rows" means
GAIN_WORTH_A_CHOICE = 0.05  # a layout or a padding is chosen over another only when it is this much cheaper
PROBE_BYTES = 64 * 2**20  # weights timed per layout: more than a 32 MB cache, so they stream as in a decode step


class ColumnPanels:
    """A weight matrix w [n_in, n_out] stored as contiguous column panels [n_out / 32, n_in, 32].

    `x @ panels` gives x @ w (the same numbers). Why: OpenBLAS copies ("packs") the whole right-hand matrix
    before a product of several rows, and a layer's weight matrix does not fit in cache, so with a plain
    layout scoring m = 2 to 16 new tokens can cost 3-4 times one token: packing, not arithmetic. One
    np.matmul over a stack of panels packs each panel while it is in cache. Measured on an AMD EPYC with
    AVX2 (OpenBLAS's Haswell kernels, one thread) over GPT-2 124M's weight shapes, as multiples of a plain
    single-row step:

        rows m          1     2     3     4     5     8
        plain          1.00  2.5-2.7  2.8  2.5  2.9-3.1  3.1-3.5
        panels of 16   0.93  0.89  1.26  1.37  1.58  1.69
        panels of 32   0.96  0.75  0.96  0.97  1.15  1.17
        panels of 64   1.09  0.70  0.92  0.75  0.96  1.59

    Sixteen-wide panels cost more for every block, 64-wide ones are slow on one row and on eight; 32 is
    the best all round. On an AMD Zen 5 with OpenBLAS's AVX-512 kernels, the whole 124M model: 16 wide
    1.86 at 5 rows, 1.58 at 6, 2.03 at 8; 32 wide 1.37, 1.14, 1.40; 64 wide 1.10, 1.41, 1.43. On an AMD
    Zen 3 (Haswell kernels by OpenBLAS's own choice) panels help less or not at all, and a single row costs
    8-18% more than plain: that is why the layout is measured on the machine at hand (measure_plan).
    """

    __array_ufunc__ = None  # makes NumPy hand `x @ panels` to __rmatmul__ instead of trying to convert us

    def __init__(self, w, width=PANEL_WIDTH):  # [n_in, n_out]
        n_in, self.n_out = w.shape
        n_panels = -(-self.n_out // width)
        padded = np.zeros((n_in, n_panels * width), w.dtype)  # zero columns fill the last panel
        padded[:, :self.n_out] = w
        self.panels = np.ascontiguousarray(padded.reshape(n_in, n_panels, width).transpose(1, 0, 2))
        self.shape, self.dtype, self.nbytes = w.shape, self.panels.dtype, self.panels.nbytes

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        out = np.matmul(x, self.panels)  # [n_panels, m, width], each panel packed while it is in cache
        return out.transpose(1, 0, 2).reshape(len(x), -1)[:, :self.n_out]


@dataclass(frozen=True)
class LayoutPlan:
    """Which layout multiplies m rows and how many rows to feed for m, for m = 1 .. MAX_ROWS.

    layouts[m - 1] is "plain" or "panels"; rows_to_feed[m - 1] >= m (zero rows pad the block, their results
    are dropped). costs, when measured: {layout: [time of m rows / time of one plain row, m = 1 .. MAX_ROWS]}.
    """

    layouts: tuple
    rows_to_feed: tuple
    costs: dict = None

    def __post_init__(self):
        if len(self.layouts) != MAX_ROWS or not set(self.layouts) <= set(LAYOUTS):
            raise ValueError(f"a plan names one of {LAYOUTS} for each of 1..{MAX_ROWS} rows, got {self.layouts}")
        if len(self.rows_to_feed) != MAX_ROWS or any(rows < m for m, rows in enumerate(self.rows_to_feed, 1)):
            raise ValueError(f"rows_to_feed must give at least m rows for each m = 1..{MAX_ROWS}, got {self.rows_to_feed}")

    def rows(self, m):  # how many rows to multiply to get m
        return self.rows_to_feed[m - 1] if m <= MAX_ROWS else m

    def layout(self, n_rows):  # the layout that multiplies n_rows (fed) rows
        return self.layouts[min(n_rows, MAX_ROWS) - 1]

    @property
    def kept(self):  # the layouts the weights are held in
        return tuple(layout for layout in LAYOUTS if layout in self.layouts)


def fixed_plan(layout):
    """One layout for every block, rows fed as they are."""
    return LayoutPlan((layout,) * MAX_ROWS, tuple(range(1, MAX_ROWS + 1)))


class PlannedMatrix:
    """A weight matrix w [n_in, n_out] held in the layouts its plan keeps; `x @ matrix` gives x @ w through the
    layout the plan chose for len(x) rows. The plain layout is the caller's array itself, not a copy."""

    __array_ufunc__ = None  # makes NumPy hand `x @ matrix` to __rmatmul__

    def __init__(self, w, plan):  # [n_in, n_out]
        self.shape, self.dtype = w.shape, w.dtype
        self.stored = {layout: w if layout == "plain" else ColumnPanels(w) for layout in plan.kept}
        self.nbytes = sum(stored.nbytes for stored in self.stored.values())
        # looked up once per product, so a decode step pays one list index: m -> (rows to feed, what multiplies them)
        self.by_rows = [None] + [(plan.rows(m), self.stored[plan.layout(plan.rows(m))]) for m in range(1, MAX_ROWS + 1)]
        self.for_more_rows = self.stored[plan.layout(MAX_ROWS)]

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        m = len(x)
        n_rows, w = self.by_rows[m] if m <= MAX_ROWS else (m, self.for_more_rows)
        if n_rows == m:
            return x @ w
        padded = np.concatenate([x, np.zeros((n_rows - m, x.shape[1]), x.dtype)])  # rows measured cheaper
        return (padded @ w)[:m]


def fast_layout(params, plan):
    """-> (params with every linear weight ("w") a PlannedMatrix, the tied output projection wte.T likewise).

    The other arrays (biases, layer norms, wte for the embedding lookup) are shared, not copied. A plan that
    multiplies every block as it is in the plain layout gives the params back as they are (and no separate
    output projection: gpt2 then uses wte.T), so the plain path pays nothing for having been measured.
    """
    if plan.kept == ("plain",) and plan.rows_to_feed == tuple(range(1, MAX_ROWS + 1)):
        return params, None

    def lay_out(tree):
        if isinstance(tree, list):
            return [lay_out(value) for value in tree]
        if isinstance(tree, dict):
            return {key: PlannedMatrix(value, plan) if key == "w" else lay_out(value) for key, value in tree.items()}
        return tree

    return lay_out(params), PlannedMatrix(params["wte"].T, plan)  # [n_embd, n_vocab]


# ---- choosing, from this machine's measurements ------------------------------------------------


def plan_from_costs(costs, weights_bytes=0, memory_bytes=None, spread=None):
    """A LayoutPlan from measured costs {layout: [cost of m rows, m = 1 .. MAX_ROWS]} (medians, any common unit).

    - One layout when the same one is cheapest for one row and for the blocks verification scores (2 to
      9 rows, on average). When they differ, both are kept (plain for one row, panels for several) only if
      each gains at least GAIN_WORTH_A_CHOICE and holding the weights twice takes under a quarter of the
      machine's memory; otherwise the layout whose advantage is the larger serves every block.
    - m rows are fed as m' rows, m < m' <= 2 m, only where m' is cheaper beyond doubt: spread, {layout:
      [(fastest, slowest) of m rows' rounds]}, must show m' rows' slowest round cheaper than m rows' fastest
      by GAIN_WORTH_A_CHOICE (on the AVX2 EPYC two rows once cost 0.75 of a single row: real, but a busy
      machine's noise can look the same, and a decode step fed twelve rows would cost several steps).
    """
    memory_bytes = physical_memory_bytes() if memory_bytes is None else memory_bytes
    spread = spread or {layout: [(cost, cost) for cost in costs[layout]] for layout in LAYOUTS}
    one_row = {layout: costs[layout][0] for layout in LAYOUTS}
    several_rows = {layout: statistics.mean(costs[layout][m - 1] for m in VERIFY_ROWS) for layout in LAYOUTS}
    best_one, best_several = min(one_row, key=one_row.get), min(several_rows, key=several_rows.get)
    if best_one == best_several:
        layouts = (best_one,) * MAX_ROWS
    else:
        gain_one = one_row[best_several] / one_row[best_one] - 1
        gain_several = several_rows[best_one] / several_rows[best_several] - 1
        both_fit = 2.4 * weights_bytes < memory_bytes / 4  # plain + panels (1.3x for GPT-2 124M)
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
    return LayoutPlan(layouts, tuple(rows_to_feed), {layout: tuple(costs[layout]) for layout in LAYOUTS})


def physical_memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a Unix: assume a laptop's 8 GB
        return 8 * 2**30


def weight_matrices(params):
    """The model's weight matrices in the order a forward pass reads them, the output projection wte.T last."""
    return [block[group][layer]["w"] for block in params["blocks"]
            for group, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))] + [
        params["wte"].T]


def probe_matrices(params, probe_bytes=PROBE_BYTES):
    """The first weight matrices up to probe_bytes: a large model is judged on a slice that still streams from
    memory, a small one on all of itself (its weights may fit in cache, and that is its reality)."""
    probe, total = [], 0
    for w in weight_matrices(params):
        if total >= probe_bytes:
            break
        probe.append(w)
        total += w.nbytes
    return probe


def measure_costs_by_layout(matrices, rounds=5, seed=0):
    """-> ({layout: [median time of m rows through every matrix, m = 1 .. MAX_ROWS]}, {layout: [(fastest,
    slowest) round of m rows]}), in units of the median one plain row.

    The layouts and row counts interleave within each round, so that the machine's drift touches them
    alike; a first round warms the caches and is not kept."""
    stored = {"plain": list(matrices), "panels": [ColumnPanels(w) for w in matrices]}
    rng = np.random.default_rng(seed)
    rows = {n_in: rng.standard_normal((MAX_ROWS, n_in)).astype(np.float32) for n_in in {w.shape[0] for w in matrices}}
    times = {(layout, m): [] for layout in LAYOUTS for m in range(1, MAX_ROWS + 1)}
    for round_ in range(rounds + 1):
        for m in range(1, MAX_ROWS + 1):
            for layout in LAYOUTS:
                start = time.perf_counter()
                for w in stored[layout]:
                    rows[w.shape[0]][:m] @ w
                if round_:
                    times[layout, m].append(time.perf_counter() - start)
    unit = statistics.median(times["plain", 1])
    costs = {layout: [statistics.median(times[layout, m]) / unit for m in range(1, MAX_ROWS + 1)] for layout in LAYOUTS}
    spread = {layout: [(min(times[layout, m]) / unit, max(times[layout, m]) / unit) for m in range(1, MAX_ROWS + 1)]
              for layout in LAYOUTS}
    return costs, spread


MEASURED_PLANS = {}  # measured once per process for each set of weight shapes


def measure_plan(params):
    """This machine's LayoutPlan for these weights (a fraction of a second for GPT-2 124M, once per shapes)."""
    matrices = weight_matrices(params)
    shapes = tuple(w.shape for w in matrices)
    if shapes not in MEASURED_PLANS:
        costs, spread = measure_costs_by_layout(probe_matrices(params))
        MEASURED_PLANS[shapes] = plan_from_costs(costs, weights_bytes=sum(w.nbytes for w in matrices), spread=spread)
    return MEASURED_PLANS[shapes]
