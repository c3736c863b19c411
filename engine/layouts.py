"""How GPT2Model's weight matrices can be stored for the products: the mechanism (measure.py chooses among them).

The numbers are the checkpoint's whatever the layout; what differs is how fast NumPy's BLAS multiplies them.
A decode step multiplies one row of activations by every weight matrix, x[1, n_in] @ w[n_in, n_out]; scoring
K + 1 drafted tokens multiplies K + 1 rows by the same weights. Five layouts of w (LAYOUTS):

- "row-major" (C order, the checkpoint's for the blocks' weights): one row is a sum of w's rows;
- "column-major" (Fortran order, that of wte.T, the tied output projection, a transposed view of the
  embedding): one row is a dot product with each of w's columns;
- "panels" (ColumnPanels, [n_out / 32, n_in, 32]): made for several rows, see ColumnPanels;
- "wide-panels" (ColumnPanels 4096 wide, at most the matrix's width): for one row through a wide matrix,
  each panel a row-major block whose output row fits in a core's 32 KB first-level cache;
- "column-panels" (ColumnMajorPanels): the column-major matrix itself, multiplied 16 columns at a time, each
  block of 16 columns a contiguous [16, n_in] stretch of memory: no copy beyond the column-major one, one row
  read front to back as column-major reads it, and several rows packed panel by panel as in "panels"
  (measured: bench/results/ENGINE.md, 'Column panels').

Each layout can also be split across every core (engine/threads.py: the matrix's column groups, one thread
each, views of the same layout, no copy), and the column-major one run on BLAS's own threads: a way of
multiplying is a layout and how it is threaded, written "panels" for one thread, "panels on 2 threads" for
our split in two and "column-major on 2 BLAS threads". A `LayoutPlan` names the way for each row count (and
how many rows to feed, where padding is cheaper), a `ModelPlan` one LayoutPlan per role of the model's
matrices (ROLES), and `fast_layout(params, plan)` builds the weights from it, once, as `PlannedMatrix`es.
engine.fast_model(params, hparams) measures a plan (measure.measure_plan) and builds a GPT2Model this way.
"""

from dataclasses import dataclass

import numpy as np

from engine.panels import PANEL_WIDTH, ColumnMajorPanels, ColumnPanels
from engine.threads import THREADS, BlasThreaded, SplitMatrix

LAYOUTS = ("row-major", "column-major", "panels", "wide-panels", "column-panels")
# What is offered to BLAS's own threads: column-major only, the storage column-panels are views of, so that one
# copy serves one row on BLAS's threads and several rows in panels (a stack of panels is many small products,
# which BLAS does not thread). Row-major on BLAS's threads read a large model's matrices no faster, so it is not
# offered (measured: bench/results/ENGINE.md, 'BLAS threads for one row').
BLAS_LAYOUTS = ("column-major",)
STORED_AS = {"column-panels": "column-major"}  # a layout that is a view of another's storage
ROLES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "unembedding")  # the matrices a block and the head read
MAX_ROWS = 16  # the largest block measured: K + 1 for K up to 15 (more rows use the layout measured for 16)
WIDE_PANEL_WIDTH = 4096  # 16 KB of output per panel: fits a first-level cache beside the input row


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

    def as_dict(self, digits=3):  # JSON's types; costs rounded to `digits` (None: as measured)
        rounded = lambda cost: cost if digits is None else round(cost, digits)
        return {role: {"layouts": plan.layouts, "rows_to_feed": plan.rows_to_feed,
                       "costs": None if plan.costs is None else {layout: [rounded(cost) for cost in costs]
                                                                 for layout, costs in plan.costs.items()}}
                for role, plan in self.plans.items()}

    @classmethod
    def from_dict(cls, plans):  # as_dict's inverse; a ValueError for what is not a plan of every role
        if set(plans) != set(ROLES):
            raise ValueError(f"a model plan has one plan for each of {ROLES}, got {sorted(plans)}")
        return cls({role: LayoutPlan(tuple(plan["layouts"]), tuple(plan["rows_to_feed"]),
                                     None if plan["costs"] is None else {name: tuple(costs) for name, costs
                                                                         in plan["costs"].items()})
                    for role, plan in plans.items()})

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


def role_matrices(params):
    """{role: the model's matrices of that role, in the order a forward pass reads them}."""
    roles = {f"{group}.{layer}": [block[group][layer]["w"] for block in params["blocks"]]
             for group, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))}
    return {**roles, "unembedding": [params["wte"].T]}
