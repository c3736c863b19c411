"""jax_backend/gpt2_jax.py and backends.py: the JAX backend against the NumPy one, on JAX's CPU.

The reference is gpt2.py run by NumPy (itself checked against transformers in test_gpt2_transformers.py). The tiny
random models have gains and biases moved away from 1 and 0 and weights ten times GPT-2's scale, so that
every parameter counts and the logits spread out (greedy choices are not near ties).
"""

import subprocess
import sys

import numpy as np
import pytest

import gpt2
import sampling
from conftest import REPO  # the repository root
from gpt2_cases import CONFIGS, full_logits, random_params  # the engine's random configurations
from cli import backends
from speedup.stats import SpeculativeStats

jax = pytest.importorskip("jax")
from jax_backend import gpt2_jax  # noqa: E402

LONG = dict(n_vocab=64, n_ctx=48, n_embd=32, n_head=4, n_layer=2)  # room for 20+ decode steps


def assert_close(actual, expected, rtol=1e-4):
    """rtol 1e-4, plus an absolute 1e-5 of the largest logit for entries that cancel to near zero."""
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=1e-5 * np.abs(expected).max())


class FixedUniform:
    """Stands in for a numpy Generator whose next random() is known: sampling.sample as a reference."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


@pytest.fixture(scope="module")
def long_setup():
    params = random_params(LONG, seed=10)
    tokens = np.random.default_rng(11).integers(0, LONG["n_vocab"], size=LONG["n_ctx"])
    return params, tokens, full_logits(tokens, params, LONG)


# ------------------------------------------------------------------------------- parity with NumPy


@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_logits_match_numpy(index):
    hparams = CONFIGS[index]
    params = random_params(hparams, seed=index)
    tokens = np.random.default_rng(index).integers(0, hparams["n_vocab"], size=hparams["n_ctx"])
    expected = full_logits(tokens, params, hparams)
    model = gpt2_jax.JaxGPT2Model(params, hparams)

    assert np.abs(expected).max() > 1.0
    assert_close(model.logits(tokens, n_last=len(tokens)), expected)
    model.reset()
    for end in range(1, len(tokens) + 1):  # one token at a time, through the cache
        assert_close(model.logits(tokens[:end]), expected[end - 1:end])


def test_blocks_of_any_length_and_rollback_match_numpy(long_setup):
    params, tokens, expected = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    for lengths in [(3, 1, 5, 7), (2, 4, 2, 1, 7)]:
        model.reset()
        end = 0
        for length in lengths:
            end += length
            assert_close(model.logits(tokens[:end], n_last=length), expected[end - length:end])
            assert_close(model.logits(tokens[:end]), expected[end - 1:end])  # asking again must not feed again

    # speculative sampling's pattern: score drafts, then continue from a corrected, shorter sequence
    for keep in [12, 3, 0, 20]:
        corrected = np.concatenate([tokens[:keep], [(tokens[keep] + 1) % LONG["n_vocab"], 5, 7]])
        reference = full_logits(corrected, params, LONG)
        assert_close(model.logits(corrected, n_last=3), reference[-3:])
        assert_close(model.logits(corrected[:-1]), reference[-2:-1])
    assert_close(model.logits(tokens[:28], n_last=8), expected[20:28])


def test_decoding_does_not_recompile_per_token_up_to_the_context_end(long_setup):
    params, tokens, expected = long_setup
    n_ctx = LONG["n_ctx"]
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    model.logits(tokens[:5], n_last=5)  # the prompt: a compilation for its bucket (8)
    model.logits(tokens[:6])  # the first decode step: one for bucket 1
    traces = gpt2_jax.TRACES["feed_block"]
    for end in range(7, n_ctx - 2):  # 39 more tokens, one at a time
        assert_close(model.logits(tokens[:end]), expected[end - 1:end])
    assert gpt2_jax.TRACES["feed_block"] == traces

    # scoring K + 1 = 5 drafts again and again, each time after a rollback, reuses bucket 8's program
    model.logits(tokens[:20], n_last=5)
    traces = gpt2_jax.TRACES["feed_block"]
    for end in range(21, 30):
        model.logits(tokens[:end - 5])
        assert_close(model.logits(tokens[:end], n_last=5), expected[end - 5:end])
    assert gpt2_jax.TRACES["feed_block"] == traces

    # near n_ctx, bucket 4 does not fit after the 45 cached tokens: the block starts one position earlier
    model.logits(tokens[:n_ctx - 3])
    assert_close(model.logits(tokens, n_last=3), expected[-3:])
    assert_close(model.logits(tokens), expected[-1:])
    with pytest.raises(ValueError, match="context"):
        model.logits(np.concatenate([tokens, [1]]))


def test_the_seed_contract_gives_probabilities(long_setup):
    params, tokens, expected = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    for length in (7, 8, 4):
        probs = model(tokens[:length].tolist())
        assert probs.shape == (length, LONG["n_vocab"]) and probs.dtype == np.float32
        np.testing.assert_allclose(probs, gpt2.softmax(expected[:length]), rtol=1e-4, atol=1e-7)


def test_bad_input_gets_a_clear_error(long_setup):
    params, tokens, _ = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    for bad in ([], [[1, 2]], [1.0, 2.0], [-1, 2], [LONG["n_vocab"], 2]):  # JAX would clamp ids silently
        with pytest.raises(ValueError, match="token"):
            model.logits(bad)
    for n_last in (0, 4):
        with pytest.raises(ValueError, match="n_last"):
            model.logits(tokens[:3], n_last=n_last)
    with pytest.raises(ValueError, match="uniform"):
        model.draft(tokens[:3], 2, [0.5])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        model.draft(tokens[:3], 2, [0.5, 1.0])
    with pytest.raises(ValueError, match="context"):
        model.draft(tokens[:40], 10, np.zeros(10))
    with pytest.raises(ValueError, match="dtype"):
        gpt2_jax.JaxGPT2Model(params, LONG, dtype="float16")


def test_a_fused_draft_compiles_once_per_bucket_of_K(long_setup):
    """Assisted generation changes K from loop to loop: K is padded to a power of two like the blocks."""
    params, tokens, _ = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    rng = np.random.default_rng(0)
    model.draft(tokens[:5], 4, rng.random(4))  # compiles for the prompt's bucket (8)
    model.draft(tokens[:6], 4, rng.random(4))  # and for one new token to feed before drafting
    traces = gpt2_jax.TRACES["draft_tokens"]
    for end in range(7, 20):
        K = 3 + end % 2  # 3 and 4 share bucket 4
        drafted, p = model.draft(tokens[:end], K, rng.random(K))
        assert drafted.shape == (K,) and p.shape == (K, LONG["n_vocab"])
    assert gpt2_jax.TRACES["draft_tokens"] == traces
    # a float64 uniform just below 1 rounds up to 1 in float32: the model must still take it
    drafted, p = model.draft(tokens[:20], 4, [1 - 1e-9, 0.0, 0.5, 1 - 1e-9])
    assert np.all(p[np.arange(4), drafted] > 0)


def test_float32_matmuls_are_not_lowered_to_tf32(long_setup):
    """On NVIDIA GPUs XLA computes DEFAULT-precision float32 matmuls in TF32; every one here asks for HIGHEST."""
    params, _, _ = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    lowered = gpt2_jax.feed_block.lower(model.params, model.cache, np.zeros(2, np.int32), np.int32(0), np.int32(0),
                                        n_head=LONG["n_head"], n_out=2).as_text()
    dots = [line for line in lowered.splitlines() if "dot_general" in line]
    assert len(dots) == 6 * LONG["n_layer"] + 1  # four linear layers and two attention products per block
    assert all("precision = [HIGHEST, HIGHEST]" in line for line in dots)


# ------------------------------------------------------------------------------------------ bfloat16


def test_bfloat16_mode_runs_close_to_float32(long_setup):
    params, tokens, expected = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG, dtype="bfloat16")
    assert all(buffer.dtype == jax.numpy.bfloat16 for buffer in jax.tree.leaves(model.cache))
    assert model.params["wte"].dtype == jax.numpy.bfloat16
    logits = model.logits(tokens[:16], n_last=16)
    assert logits.dtype == np.float32 and logits.shape == (16, LONG["n_vocab"])
    error = np.abs(logits - expected[:16]).max() / np.abs(expected[:16]).max()
    assert 0 < error < 0.05  # bfloat16 keeps 8 bits of mantissa: close, but visibly not float32
    for end in range(17, 22):
        np.testing.assert_allclose(model.logits(tokens[:end]), expected[end - 1:end],
                                   atol=0.05 * np.abs(expected).max())


def test_bfloat16_mode_multiplies_in_bfloat16(long_setup):
    params, _, _ = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG, dtype="bfloat16")
    step = lambda p, cache, tokens, start: gpt2.gpt2_with_cache(tokens, **p, n_head=LONG["n_head"], cache=cache,
                                                                 start=start)
    jaxpr = jax.make_jaxpr(step)(model.params, model.cache.layers, np.zeros(1, np.int32), np.int32(3))
    operand_dtypes = [str(var.aval.dtype) for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"
                      for var in eqn.invars]
    assert len(operand_dtypes) == 2 * (6 * LONG["n_layer"] + 1)
    assert set(operand_dtypes) == {"bfloat16"}


# ------------------------------------------------------------------------ sampling on the device


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.9),
            dict(temperature=0.5, top_k=10, top_p=0.8), dict(temperature=2.0, top_k=1), dict(temperature=0.0)]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_device_probabilities_match_sampling(settings):
    rng = np.random.default_rng(1)
    logits = (3 * rng.standard_normal((8, 200))).astype(np.float32)
    logits[0, :] = 1.0  # every token tied
    logits[1, [7, 3, 150]] = 20.0  # a three-way tie at the top: greedy takes id 3, top_k=1 keeps all three
    expected = sampling.logits_to_probs(logits, sampling.SamplingSettings(**settings))
    probabilities = jax.jit(jax.vmap(lambda row: gpt2_jax.probabilities(row, **settings)))
    actual = np.asarray(probabilities(logits))
    assert actual.dtype == np.float32
    np.testing.assert_array_equal(actual > 0, expected > 0)  # the same tokens kept
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-7)


def test_device_sampling_matches_sampling_sample():
    rng = np.random.default_rng(2)
    probs = rng.random((6, 50)).astype(np.float32) ** 4
    probs[:, rng.random(50) < 0.5] = 0.0  # about half the tokens impossible, the first and last ones too
    probs[:, [0, -1]] = 0.0
    probs /= probs.sum(axis=-1, keepdims=True)
    uniforms = np.concatenate([[0.0, np.nextafter(np.float32(1), np.float32(0))], rng.random(200)]).astype(np.float32)
    draw = jax.jit(jax.vmap(jax.vmap(gpt2_jax.sample_inverse_cdf, (None, 0)), (0, None)))
    drawn = np.asarray(draw(probs, uniforms))  # [6, 202]
    for row, row_probs in enumerate(probs):
        assert np.all(row_probs[drawn[row]] > 0)  # never a token of probability zero, even at u = 0 or near 1
        expected = [sampling.sample(row_probs, FixedUniform(float(u))) for u in uniforms]
        np.testing.assert_array_equal(drawn[row], expected)


@pytest.mark.parametrize("settings, Ks", [(dict(temperature=0.0), (4, 4, 4)), (dict(temperature=1.0), (4, 1, 6)),
                                          (dict(temperature=0.8, top_k=8, top_p=0.9), (4, 4, 4))], ids=str)
def test_fused_draft_equals_step_by_step_drafting(long_setup, settings, Ks):
    """K draft steps in one device call: the tokens and distributions of K separate calls."""
    params, tokens, _ = long_setup
    fused, stepwise = gpt2_jax.JaxGPT2Model(params, LONG), gpt2_jax.JaxGPT2Model(params, LONG)
    rng = np.random.default_rng(3)
    x = tokens[:6]
    stepwise.logits(x, n_last=len(x))  # the prompt as one block, as the fused draft feeds it
    for K in Ks:
        uniforms = rng.random(K)
        drafted, p = fused.draft(x, K, uniforms, **settings)
        assert drafted.dtype == np.int64 and drafted.shape == (K,)
        assert p.dtype == np.float32 and p.shape == (K, LONG["n_vocab"])
        assert np.all(p[np.arange(K), drafted] > 0)  # each draft is drawn from the p returned for it
        x_step = x
        for t in range(K):
            p_step = sampling.logits_to_probs(stepwise.logits(x_step)[0], sampling.SamplingSettings(**settings))
            np.testing.assert_allclose(p[t], p_step, rtol=1e-4, atol=1e-6)
            token = sampling.sample(p_step, FixedUniform(uniforms[t]))
            assert drafted[t] == token, f"K={K}, draft {t}"
            x_step = np.append(x_step, token)
        # as speculative sampling continues: keep some drafts, add a token, draft again from there
        x = np.concatenate([x_step[:len(x) + K // 2], [(K * 7) % LONG["n_vocab"]]])


def test_after_a_draft_the_cache_serves_the_drafted_sequence(long_setup):
    params, tokens, _ = long_setup
    model = gpt2_jax.JaxGPT2Model(params, LONG)
    drafted, _ = model.draft(tokens[:6], 4, np.random.default_rng(4).random(4), temperature=1.0)
    x = np.concatenate([tokens[:6], drafted])
    expected = full_logits(x, params, LONG)
    assert_close(model.logits(x, n_last=5), expected[-5:])
    assert_close(model.logits(x[:8], n_last=2), expected[6:8])


# ------------------------------------------------------------- the decoders on both backends


def test_greedy_tokens_are_the_same_on_both_backends():
    """Every decoder, NumPy models against JAX models (whose draft takes its K steps in one device call).

    The draft is the target with slightly perturbed embeddings, so that most drafts are accepted and
    some are not: both branches of the speculative loop run.
    """
    target = random_params(LONG, seed=20)
    noise = 0.02 * np.random.default_rng(22).standard_normal(target["wte"].shape)
    draft = {**target, "wte": (target["wte"] + noise).astype(np.float32)}
    x = np.random.default_rng(5).integers(0, LONG["n_vocab"], size=4)
    N = 24
    outputs = {}
    for backend in backends.BACKENDS:
        draft_model, target_model = (backends.make_model(p, LONG, backend=backend) for p in (draft, target))
        stats = SpeculativeStats()
        outputs[backend] = {
            "autoregressive": sampling.autoregressive_sampling(x, target_model, N, temperature=0),
            "speculative": sampling.speculative_sampling(x, draft_model, target_model, N, K=4, temperature=0,
                                                         stats=stats),
            "assisted": sampling.greedy_assisted_generation(x, draft_model, target_model, N),
        }
        assert 0.5 < stats.acceptance_rate < 1
    for decoder, tokens in outputs["numpy"].items():
        assert len(tokens) == len(x) + N
        np.testing.assert_array_equal(outputs["jax"][decoder], tokens, err_msg=decoder)
        np.testing.assert_array_equal(tokens, outputs["numpy"]["autoregressive"], err_msg=decoder)


# ---------------------------------------------------------------------------------- JAX is optional


def test_make_model_builds_either_backend(long_setup):
    params, _, _ = long_setup
    assert isinstance(backends.make_model(params, LONG), gpt2.GPT2Model)
    model = backends.make_model(params, LONG, backend="jax", dtype="bfloat16")
    assert isinstance(model, gpt2_jax.JaxGPT2Model) and model.dtype == "bfloat16"
    with pytest.raises(ValueError, match="backend"):
        backends.make_model(params, LONG, backend="torch")
    with pytest.raises(ValueError, match="float32 only"):
        backends.make_model(params, LONG, backend="numpy", dtype="bfloat16")


def test_without_jax_everything_else_works_and_the_jax_backend_says_how_to_install():
    script = """
import sys
sys.modules["jax"] = None  # importing jax now fails, as where it is not installed
import gpt2, sampling
import numpy as np
from cli import backends
hparams = dict(n_vocab=11, n_ctx=8, n_embd=8, n_head=2, n_layer=1)
params = gpt2.init_params(hparams, np.random.default_rng(0))
model = backends.make_model(params, hparams)
print(len(sampling.autoregressive_sampling([1, 2], model, 3, rng=np.random.default_rng(0))))
try:
    backends.make_model(params, hparams, backend="jax")
except ImportError as error:
    print(error)
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["5", backends.JAX_MISSING]
    assert "pip install -r requirements-jax.txt" in backends.JAX_MISSING and "jax[cuda12]" in backends.JAX_MISSING
