"""The one way into the engine: a GPT2Model whose weight matrices are laid out for this machine's products.

gpt2.GPT2Model multiplies the checkpoint's arrays as they are, the reference path. fast_model measures which
layouts multiply this CPU's matrices fastest (measure.py, kept per machine by plan_cache.py), lays the weights
out once (layouts.fast_layout) and builds the same GPT2Model on them: the same dot products, read faster.
Opting in sets BLAS to one thread per call (engine/threads.py says why).
"""

import gpt2
from engine import layouts, measure
from engine.threads import THREADS


def layout_plan(params, layout="auto"):
    """How the weights will be multiplied: a layouts.ModelPlan (or LayoutPlan), or None for the plain path.

    layout: "auto" measures this machine (measure.measure_plan: layouts, and threads per product); "plain" keeps
    the checkpoint's arrays as they are; one of layouts.LAYOUTS for every matrix on one thread; or a plan (None
    is the plain path's).
    """
    if not isinstance(layout, str):
        return layout
    if layout == "plain":
        return None
    if layout not in ("auto", *layouts.LAYOUTS):
        raise ValueError(f"unknown layout {layout!r}: choose auto, plain, {', '.join(layouts.LAYOUTS)} or a ModelPlan")
    return measure.measure_plan(params) if layout == "auto" else layouts.fixed_plan(layout)


def lay_out(params, layout="auto", in_place=False):
    """-> (the plan, params with every linear weight laid out by it, the output projection wte.T laid out too or
    None for wte.T itself). layout: as for layout_plan. in_place: lay the matrices out inside params itself,
    freeing the checkpoint's as it goes (half the peak memory of a large model; params then holds the laid-out
    matrices)."""
    plan = layout_plan(params, layout)
    if plan is None:
        return None, params, None
    THREADS.claim()  # BLAS on one thread per call: our splits, or BlasThreaded for one product, use the others
    return (plan, *layouts.fast_layout(params, plan, in_place))


def fast_model(params, hparams, layout="auto", use_cache=True, in_place=False):
    """A gpt2.GPT2Model multiplying its weights in the layouts measured fastest on this machine (layout "auto"), or
    in the layout or plan given (layout_plan's choices); `model.plan` is the plan, None for the plain path."""
    plan, laid_out, unembedding = lay_out(params, layout, in_place)
    model = gpt2.GPT2Model(laid_out, hparams, use_cache=use_cache, unembedding=unembedding)
    model.plan = plan
    return model
