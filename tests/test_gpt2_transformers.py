"""gpt2.py's forward pass against Hugging Face transformers: the same logits to rtol 1e-4.

The reference is transformers' GPT2LMHeadModel on torch CPU in float32, built with random weights for several
tiny shapes and converted to our nested layout by `hf_to_params` below. Skipped without torch and transformers
(a failure under CI=true, tests/conftest.py); the NumPy-only tests of gpt2.py are tests/test_gpt2.py.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpt2_cases import CONFIGS, full_logits  # noqa: E402

# ---------------------------------------------------------------------------------------------- helpers


def hf_model(hparams, seed):
    """A random GPT2LMHeadModel in eval mode whose every parameter is far from its default.

    GPT-2's own initialisation (std 0.02, layer-norm gains 1 and biases 0) would leave the logits tiny and
    the gains and biases untested, so every tensor is redrawn: weights with std 0.2, biases with std 0.1,
    layer-norm gains around 1 with std 0.2 and their biases with std 0.1.
    """
    config = transformers.GPT2Config(
        vocab_size=hparams["n_vocab"], n_positions=hparams["n_ctx"], n_embd=hparams["n_embd"],
        n_head=hparams["n_head"], n_layer=hparams["n_layer"], activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager")  # the plain softmax(QK^T)V reference
    model = transformers.GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.transformer.named_parameters():  # lm_head.weight is wte.weight (tied)
            noise = torch.randn(tensor.shape, generator=generator)
            if ".ln_" in name or name.startswith("ln_"):
                tensor.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            else:
                tensor.copy_(0.2 * noise if name.endswith("weight") else 0.1 * noise)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    return model


def hf_to_params(model, n_layer):
    """transformers' GPT-2 state dict -> our nested layout. Conv1D weights are already [n_in, n_out]."""
    state = {name: tensor.detach().numpy().astype(np.float32) for name, tensor in model.state_dict().items()}

    def take(prefix, *names):
        return {ours: state[f"{prefix}.{theirs}"] for ours, theirs in names}

    dense = (("w", "weight"), ("b", "bias"))
    norm = (("g", "weight"), ("b", "bias"))

    def block(i):
        h = f"transformer.h.{i}"
        return {"ln_1": take(f"{h}.ln_1", *norm), "ln_2": take(f"{h}.ln_2", *norm),
                "attn": {"c_attn": take(f"{h}.attn.c_attn", *dense), "c_proj": take(f"{h}.attn.c_proj", *dense)},
                "mlp": {"c_fc": take(f"{h}.mlp.c_fc", *dense), "c_proj": take(f"{h}.mlp.c_proj", *dense)}}

    return {"wte": state["transformer.wte.weight"], "wpe": state["transformer.wpe.weight"],
            "blocks": [block(i) for i in range(n_layer)], "ln_f": take("transformer.ln_f", *norm)}


# ---------------------------------------------------------------------------- parity with transformers


@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_logits_match_transformers(index):
    hparams = CONFIGS[index]
    model = hf_model(hparams, seed=index)
    params = hf_to_params(model, hparams["n_layer"])
    tokens = np.random.default_rng(index).integers(0, hparams["n_vocab"], size=hparams["n_ctx"])
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens)[None]).logits[0].numpy()

    ours = full_logits(tokens, params, hparams)

    assert ours.dtype == np.float32
    assert ours.shape == (hparams["n_ctx"], hparams["n_vocab"])
    assert np.abs(expected).max() > 1.0  # the perturbed weights give logits that are not all near zero
    # rtol 1e-4 is the parity target. A logit is a dot product of n_embd terms about as large as the largest
    # logit, so one that cancels to near zero carries an absolute rounding error of float32 epsilon times
    # that scale, not times itself: atol = 1e-5 * max|logit| (about 80 float32 ulps of the largest logit)
    # covers that and nothing more; a wrong gain, bias, mask or activation moves logits by far more.
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
