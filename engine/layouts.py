"""How GPT2Model stores its weight matrices for the products, chosen by measuring this machine.

The numbers are the checkpoint's whatever the layout; what differs is how fast NumPy's BLAS multiplies them.
A decode step multiplies one row of activations by every weight matrix, x[1, n_in] @ w[n_in, n_out]; scoring
K + 1 drafted tokens multiplies K + 1 rows by the same weights. Three layouts of w:

- "row-major" (C order, the checkpoint's for the blocks' weights): one row is a sum of w's rows;
- "column-major" (Fortran order, that of wte.T, the tied output projection, a transposed view of the
  embedding): one row is a dot product with each of w's columns;
- "panels" (ColumnPanels, [n_out / 32, n_in, 32]): made for several rows, see ColumnPanels;
- "wide-panels" (ColumnPanels 4096 wide, at most the matrix's width): for one row through a wide matrix,
  each panel a row-major block whose output row fits in a core's 32 KB first-level cache.

Which is fastest depends on the CPU, its BLAS kernels (README, Speed) and the matrix's shape. On an AMD Zen 3
(OpenBLAS's Haswell kernels, one thread) one row through GPT-2 124M's mlp.c_fc [768, 3072] read 17.5 GB/s
row-major and 9.4 column-major, through its mlp.c_proj [3072, 768] 10.8 and 14.6, and through the output
projection [768, 50257] 11.2 as the view wte.T, 15.2 row-major, 12.9 in panels and 18.4 in wide panels. So
`measure_plan` times the four layouts for 1 to 16 rows on
each role of the model's matrices (ROLES, all interleaved), and `plan_from_costs` turns each role's times into
a `LayoutPlan`: which layout multiplies m rows, whether to hold a matrix twice (one layout for one row, another
for several) where that gains enough, and how many rows to feed for m where padding is measurably cheaper.
`fast_layout(params, plan)` builds the weights from the `ModelPlan`, once; gpt2.GPT2Model(layout="auto") does
all this.
"""

import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

LAYOUTS = ("row-major", "column-major", "panels", "wide-panels")
ROLES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "unembedding")  # the matrices a block and the head read
MAX_ROWS = 16  # the largest block measured: K + 1 for K up to 15 (more rows use the layout measured for 16)
PANEL_WIDTH = 32  # columns per panel; why 32, measured, in ColumnPanels
WIDE_PANEL_WIDTH = 4096  # 16 KB of output per panel: fits a first-level cache beside the input row
VERIFY_ROWS = range(2, 10)  # the blocks speculative sampling scores for K = 1 to 8: what "several rows" means
GAIN_WORTH_A_CHOICE = 0.05  # a layout, a copy or a padding is chosen over another only when this much cheaper
PROBE_BYTES = 16 * 2**20  # timed per role: the five roles together pass a 32 MB cache, streaming as in a decode step


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
    Zen 3 (Haswell kernels by OpenBLAS's own choice) panels help the output projection and little else:
    that is why the layout is measured, role by role, on the machine at hand.
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


def laid_out(w, layout):
    """w in a layout: the array itself where it already lies so (no copy), else a C- or F-ordered copy, or panels."""
    if layout == "row-major":
        return np.ascontiguousarray(w)
    if layout == "column-major":
        return np.asfortranarray(w)
    if layout == "wide-panels":
        return ColumnPanels(w, width=min(WIDE_PANEL_WIDTH, -(-w.shape[1] // PANEL_WIDTH) * PANEL_WIDTH))
    return ColumnPanels(w)


def native_layout(w):  # the layout w already lies in, if any
    return "row-major" if w.flags.c_contiguous else "column-major" if w.flags.f_contiguous else None


@dataclass(frozen=True)
class LayoutPlan:
    """Which layout multiplies m rows and how many rows to feed for m, for m = 1 .. MAX_ROWS.

    layouts[m - 1] is one of LAYOUTS; rows_to_feed[m - 1] >= m (zero rows pad the block, their results are
    dropped). costs, when measured: {layout: [time of m rows / time of one row in the first layout, m = 1..]}.
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
    def kept(self):  # the layouts the matrix is held in
        return tuple(layout for layout in LAYOUTS if layout in self.layouts)

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


def as_it_is(w, plan):
    """Whether the plan multiplies w as it is: one layout, the one w lies in, every block fed as it is."""
    return plan.kept == (native_layout(w),) and plan.rows_to_feed == tuple(range(1, MAX_ROWS + 1))


def fast_layout(params, plan):
    """-> (params with each linear weight ("w") laid out by its role's plan, the output projection wte.T likewise).

    plan: a ModelPlan, or one LayoutPlan for every role. A matrix its plan multiplies as it is stays the
    caller's array; the other arrays (biases, layer norms, wte for the embedding lookup) are shared, not
    copied; params comes back as it is where no block matrix changes, and the output projection as None (gpt2
    then uses wte.T) where it does not change, so the plain path pays nothing for having been measured.
    """
    plan = plan if isinstance(plan, ModelPlan) else ModelPlan.uniform(plan)
    matrix = lambda w, role: w if as_it_is(w, plan[role]) else PlannedMatrix(w, plan[role])

    def lay_out(block):
        return {**block, **{group: {layer: {**weights, "w": matrix(weights["w"], f"{group}.{layer}")}
                                    for layer, weights in block[group].items()} for group in ("attn", "mlp")}}

    blocks = [lay_out(block) for block in params["blocks"]]
    unchanged = all(new[group][layer]["w"] is old[group][layer]["w"] for new, old in zip(blocks, params["blocks"])
                    for group in ("attn", "mlp") for layer in new[group])
    unembedding = params["wte"].T  # [n_embd, n_vocab]
    unembedding = None if as_it_is(unembedding, plan["unembedding"]) else PlannedMatrix(unembedding, plan["unembedding"])
    return (params if unchanged else {**params, "blocks": blocks}), unembedding


# ---- choosing, from this machine's measurements ------------------------------------------------


def plan_from_costs(costs, weights_bytes=0, memory_bytes=None, spread=None, native=None):
    """A LayoutPlan from measured costs {layout: [cost of m rows, m = 1 .. MAX_ROWS]} (medians, any common unit).

    - One layout when the same one is cheapest for one row and for the blocks verification scores (2 to 9
      rows, on average). When they differ, both are kept (one for one row, the other for several) only if
      each gains at least GAIN_WORTH_A_CHOICE and holding the matrix twice takes under a quarter of the
      machine's memory; otherwise the layout whose advantage is the larger serves every block. A layout
      needing a copy of the matrix must beat its `native` layout (the one it lies in) by GAIN_WORTH_A_CHOICE.
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
        both_fit = 2.4 * weights_bytes < memory_bytes / 4  # two layouts, panels up to 1.3x the matrix
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


def measure_costs_by_layout(probes, rounds=2, one_row_rounds=6, seed=0):
    """{role: ({layout: [median time of m rows through the role's probe, m = 1 .. MAX_ROWS]}, {layout: [(fastest,
    slowest) round]})}, in units of the role's median one row in its native layout (about four seconds for GPT-2
    124M's probes, a second for the bundled pair's on the Zen 3).

    Within each round the row counts, the layouts and the roles interleave, so that the machine's drift
    touches them alike and each role's matrices come from memory (the others pass through the cache in
    between); a first round warms up and is not kept. One row, the decode step, is timed one_row_rounds times
    in all: its choice matters most, and it is the cheapest to time."""
    stored = {role: {layout: [laid_out(w, layout) for w in matrices] for layout in LAYOUTS}
              for role, matrices in probes.items()}
    rng = np.random.default_rng(seed)
    rows = {n_in: rng.standard_normal((MAX_ROWS, n_in)).astype(np.float32)
            for matrices in probes.values() for n_in in {w.shape[0] for w in matrices}}
    times = {(role, layout, m): [] for role in probes for layout in LAYOUTS for m in range(1, MAX_ROWS + 1)}
    for round_ in range(rounds + 1):
        for m in range(1, MAX_ROWS + 1):
            for _ in range(-(-one_row_rounds // rounds) if m == 1 else 1):
                for layout in LAYOUTS:
                    for role in probes:
                        start = time.perf_counter()
                        for w in stored[role][layout]:
                            rows[w.shape[0]][:m] @ w
                        if round_:
                            times[role, layout, m].append(time.perf_counter() - start)
    result = {}
    for role, matrices in probes.items():
        unit = statistics.median(times[role, native_layout(matrices[0]) or LAYOUTS[0], 1])
        costs = {layout: [statistics.median(times[role, layout, m]) / unit for m in range(1, MAX_ROWS + 1)]
                 for layout in LAYOUTS}
        spread = {layout: [(min(times[role, layout, m]) / unit, max(times[role, layout, m]) / unit)
                           for m in range(1, MAX_ROWS + 1)] for layout in LAYOUTS}
        result[role] = costs, spread
    return result


MEASURED_PLANS = {}  # measured once per process for each set of weight shapes


def measure_plan(params):
    """This machine's ModelPlan for these weights: every role timed on its own probe (under a second for the
    bundled pair, two to three seconds for GPT-2 124M; once per process for each set of shapes)."""
    matrices = role_matrices(params)
    shapes = tuple(w.shape for role in ROLES for w in matrices[role])
    if shapes not in MEASURED_PLANS:
        measured = measure_costs_by_layout({role: probe(matrices[role]) for role in ROLES})
        MEASURED_PLANS[shapes] = ModelPlan({
            role: plan_from_costs(costs, weights_bytes=sum(w.nbytes for w in matrices[role]), spread=spread,
                                  native=native_layout(matrices[role][0]))
            for role, (costs, spread) in measured.items()})
    return MEASURED_PLANS[shapes]
