"""Build a model on the chosen backend: NumPy (always there) or JAX (optional, imported only when asked for).

Both give the same interface (gpt2.GPT2Model's): `logits(x, n_last)`, `reset()`, `n_vocab`, `n_ctx` and
the `__call__` of jaymody/speculative-sampling's model contract. JAX's model also has `draft()`, K draft
steps in one device call, and `decoders` gives a JAX pair sampling_jax's decoders, whose whole loop runs on the device.
`make_batched_model` and `batched_decoders` do the same for several sequences at once (gpt2_batched.py,
sampling_batched.py, sampling_jax's batched loops).
"""

import types

import engine
from drafters.load import load_drafter
from speedup import drafts

BACKENDS = ("numpy", "jax")
JAX_MISSING = ("the JAX backend needs jax: pip install -r requirements-jax.txt (CPU), or pip install -U 'jax[cuda12]' "
               "(NVIDIA GPU)")


def make_model(params, hparams, backend="numpy", dtype="float32", in_place=False, layout="plain"):
    """A GPT-2 model on `backend`; dtype "bfloat16" is a JAX-only compute mode. layout: how the NumPy model stores
    its weights (engine.fast_model: "plain", the checkpoint's arrays, or "auto", measured on this machine); in_place:
    it lays them out inside params, freeing the checkpoint's matrices as it goes."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "numpy":
        if dtype != "float32":
            raise ValueError(f"the numpy backend computes in float32 only, got dtype {dtype!r} (try --backend jax)")
        return engine.fast_model(params, hparams, layout=layout, in_place=in_place)
    try:
        from jax_backend import gpt2_jax
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] not in ("jax", "jaxlib"):
            raise  # a different missing module: not ours to explain
        raise ImportError(JAX_MISSING) from error
    return gpt2_jax.JaxGPT2Model(params, hparams, dtype=dtype)


def draft_without_a_model(name, target, models_dir, exit_layer=None, n_nodes=None, confidence_threshold=None):
    """A draft with no model folder of its own: prompt lookup (speedup/drafts.py), or a drafter made from the target
    (drafters/load.py: early-exit, its first exit_layer layers; eagle, eagle3, medusa or kangaroo, a head read from
    models_dir; n_nodes: eagle's, eagle3's and medusa's tree; confidence_threshold: kangaroo's, None its default)."""
    if name == drafts.PROMPT_LOOKUP:
        return drafts.PromptLookup(target.n_vocab)
    return load_drafter(name, target, models_dir, exit_layer=exit_layer, n_nodes=n_nodes,
                        confidence_threshold=confidence_threshold)


def decoders(target, draft=None):
    """The module whose decoders suit the models: sampling (the host's loops), or sampling_jax when the target
    and the draft (if any) are both JAX models.

    Both have autoregressive_sampling, speculative_sampling and greedy_assisted_generation with the same
    arguments, tokens and statistics; sampling_jax runs the first two as one device call each. A draft that
    is not a JAX model (prompt lookup, costs.AutoK) drafts on the host: then the host's loop calls the JAX
    target as it calls any model.
    """
    if hasattr(target, "device_forward") and (draft is None or hasattr(draft, "device_forward")):
        from jax_backend import sampling_jax

        return sampling_jax
    import sampling

    return sampling


def make_batched_model(params, hparams, batch_size, backend="numpy", dtype="float32", layout="plain"):
    """A model for batch_size sequences at once: gpt2_batched.BatchedGPT2Model (NumPy, its weights in `layout`, as
    for make_model), or the JAX model itself, whose batched device loops (sampling_jax) keep one cache per row."""
    if backend == "numpy" and dtype == "float32":
        from batching import gpt2_batched

        return gpt2_batched.BatchedGPT2Model(params, hparams, batch_size, layout)
    return make_model(params, hparams, backend, dtype)  # the same checks and messages as for one sequence


def batched_decoders(target):
    """sampling_batched (NumPy), or for a JAX target sampling_jax's batched device loops, under the same names:
    autoregressive_sampling and speculative_sampling over a list of rows, row i as it would decode alone."""
    if hasattr(target, "device_forward"):
        from jax_backend import sampling_jax

        return types.SimpleNamespace(autoregressive_sampling=sampling_jax.batched_autoregressive_sampling,
                                     speculative_sampling=sampling_jax.batched_speculative_sampling)
    from batching import sampling_batched

    return sampling_batched
