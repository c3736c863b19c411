"""The engine's random test models, shared by test_gpt2.py, test_gpt2_transformers.py and test_jax_backend.py
(the first and the last must not need torch)."""

import numpy as np

import gpt2

# Tiny shapes that still differ in every dimension: heads of width 4, 8 and 16, one to three layers,
# vocabularies and contexts that are not powers of two.
CONFIGS = [
    dict(n_vocab=37, n_ctx=16, n_embd=16, n_head=4, n_layer=2),
    dict(n_vocab=101, n_ctx=24, n_embd=24, n_head=3, n_layer=1),
    dict(n_vocab=64, n_ctx=12, n_embd=32, n_head=2, n_layer=3),
    dict(n_vocab=50, n_ctx=20, n_embd=48, n_head=6, n_layer=2),
]


def random_params(hparams, seed):
    """Our own random parameters with gains and biases moved away from 1 and 0, so that they count."""
    rng = np.random.default_rng(seed)
    params = gpt2.init_params(hparams, rng)

    def perturb(tree):
        for key, value in tree.items():
            if isinstance(value, dict):
                perturb(value)
            elif key == "g":
                tree[key] = (1.0 + 0.2 * rng.standard_normal(value.shape)).astype(np.float32)
            elif key == "b":
                tree[key] = (0.1 * rng.standard_normal(value.shape)).astype(np.float32)
            else:  # weights: larger than GPT-2's 0.02 so attention is far from uniform
                tree[key] = (10.0 * value).astype(np.float32)

    for block in params["blocks"]:
        perturb(block)
    perturb({"ln_f": params["ln_f"]})
    params["wte"] = (10.0 * params["wte"]).astype(np.float32)
    params["wpe"] = (10.0 * params["wpe"]).astype(np.float32)
    return params


def full_logits(tokens, params, hparams):
    """The plain full recompute, no cache."""
    return gpt2.gpt2(np.asarray(tokens), **params, n_head=hparams["n_head"])
