"""gpt2.py: float32 throughout, the KV cache and its rollback, the context limit and the simple model contract
of jaymody/speculative-sampling. NumPy only: the parity with Hugging Face transformers (which needs torch) is
tests/test_gpt2_transformers.py.
"""

import itertools
import math

import numpy as np
import pytest

import engine
import gpt2
from engine import layouts
from gpt2_cases import CONFIGS, full_logits, random_params

CACHE_HPARAMS = CONFIGS[0]


# ---------------------------------------------------------------------------------------------- helpers


def compositions(n):
    """Every way of writing n as an ordered sum of positive parts: 2^(n-1) tuples of block lengths."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        lengths, length = [], 1
        for cut in cuts:
            if cut:
                lengths.append(length)
                length = 1
            else:
                length += 1
        yield tuple(lengths + [length])


@pytest.fixture(scope="module")
def cache_setup():
    params = random_params(CACHE_HPARAMS, seed=1)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, CACHE_HPARAMS["n_vocab"], size=9)
    return params, tokens, full_logits(tokens, params, CACHE_HPARAMS)


# ------------------------------------------------------------------------------------------ float32 only


def test_numpy_promotes_float32_with_float64_scalars():
    """The hazard the dtype tests below guard against is real in this NumPy (NEP 50)."""
    x = np.ones(3, np.float32)
    assert (np.sqrt(2 / np.pi) * x).dtype == np.float64
    assert (math.sqrt(2 / math.pi) * x).dtype == np.float32


def test_building_blocks_keep_float32():
    rng = np.random.default_rng(0)
    n_seq, n_embd, n_head = 5, 16, 4
    x = rng.standard_normal((n_seq, n_embd)).astype(np.float32)
    block = random_params(dict(CACHE_HPARAMS, n_embd=n_embd, n_head=n_head), seed=3)["blocks"][0]
    q, k, v = (rng.standard_normal((n_head, n_seq, n_embd // n_head)).astype(np.float32) for _ in range(3))
    mask = gpt2.causal_mask(0, n_seq, n_seq, np)

    # each of these would turn float64 with a NumPy float64 constant (np.sqrt(2 / np.pi) in gelu,
    # np.sqrt(head_dim) in attention, an np.float64 epsilon in layer_norm)
    outputs = {
        "gelu": gpt2.gelu(x),
        "softmax": gpt2.softmax(x),
        "layer_norm": gpt2.layer_norm(x, **block["ln_1"]),
        "linear": gpt2.linear(x, **block["mlp"]["c_fc"]),
        "ffn": gpt2.ffn(x, **block["mlp"]),
        "causal_mask": mask,
        "attention": gpt2.attention(q, k, v, mask),
        "mha": gpt2.mha(x, **block["attn"], n_head=n_head)[0],
        "transformer_block": gpt2.transformer_block(x, **block, n_head=n_head)[0],
    }
    for name, output in outputs.items():
        assert output.dtype == np.float32, f"{name} returned {output.dtype}"


def test_gelu_softmax_layer_norm_values():
    """The building blocks against their formulas computed in float64 (gelu_new, GPT-2's tanh gelu)."""
    x = np.linspace(-6, 6, 97, dtype=np.float32).reshape(1, -1)
    x64 = x.astype(np.float64)
    gelu64 = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    np.testing.assert_allclose(gpt2.gelu(x), gelu64, rtol=1e-6, atol=1e-6)
    softmax64 = np.exp(x64 - x64.max()) / np.exp(x64 - x64.max()).sum()
    np.testing.assert_allclose(gpt2.softmax(x), softmax64, rtol=1e-5, atol=1e-9)
    g, b = np.float32([2.0] * 97), np.float32([0.5] * 97)
    norm64 = 2.0 * (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5) + 0.5
    np.testing.assert_allclose(gpt2.layer_norm(x, g, b), norm64, rtol=1e-5, atol=1e-5)


def test_log_softmax_is_the_log_of_softmax_and_stays_finite_where_softmax_underflows():
    """The drafters rank by it and bench/text_quality.py scores by it: log(softmax) to float32 rounding, and a token
    far below the top keeps its log-probability where softmax rounds its probability to 0."""
    x = np.linspace(-6, 6, 97, dtype=np.float32).reshape(1, -1)
    x64 = x.astype(np.float64)
    log_softmax64 = x64 - x64.max() - np.log(np.exp(x64 - x64.max()).sum())
    assert gpt2.log_softmax(x).dtype == np.float32
    np.testing.assert_allclose(gpt2.log_softmax(x), log_softmax64, rtol=1e-6, atol=1e-6)
    far = np.float32([[0.0, -200.0]])
    assert gpt2.softmax(far)[0, 1] == 0 and gpt2.log_softmax(far)[0, 1] == np.float32(-200.0)


def test_cached_logits_are_float32(cache_setup):
    params, tokens, _ = cache_setup
    cache = gpt2.empty_cache(CACHE_HPARAMS)
    assert all(k.dtype == np.float32 and v.dtype == np.float32 for k, v in cache)
    logits = gpt2.gpt2(tokens, **params, n_head=CACHE_HPARAMS["n_head"], cache=cache, start=0)
    assert logits.dtype == np.float32
    assert all(k.dtype == np.float32 and v.dtype == np.float32 for k, v in cache)


# -------------------------------------------------------------------------------------------- KV cache


def test_every_split_into_cached_blocks_equals_the_full_recompute(cache_setup):
    params, tokens, expected = cache_setup
    splits = list(compositions(len(tokens)))
    assert len(splits) == 2 ** (len(tokens) - 1) and len(set(splits)) == len(splits)
    for lengths in splits:
        cache = gpt2.empty_cache(CACHE_HPARAMS)
        start = 0
        for length in lengths:
            logits = gpt2.gpt2(tokens[start:start + length], **params, n_head=CACHE_HPARAMS["n_head"],
                               cache=cache, start=start)
            np.testing.assert_allclose(logits, expected[start:start + length], rtol=1e-5, atol=1e-5,
                                       err_msg=f"blocks {lengths}, block at {start}")
            start += length


@pytest.mark.parametrize("keep", range(0, 9))
def test_rollback_then_new_tokens_equals_the_full_recompute(cache_setup, keep):
    """Fill the cache with 9 tokens, roll back to `keep` of them, continue with different tokens."""
    params, tokens, _ = cache_setup
    n_head = CACHE_HPARAMS["n_head"]
    cache = gpt2.empty_cache(CACHE_HPARAMS)
    gpt2.gpt2(tokens, **params, n_head=n_head, cache=cache, start=0)
    replacement = (tokens[keep:keep + 4] + 1) % CACHE_HPARAMS["n_vocab"]  # differs at every position
    continued = np.concatenate([tokens[:keep], replacement, [3]])

    first = gpt2.gpt2(replacement, **params, n_head=n_head, cache=cache, start=keep)
    second = gpt2.gpt2(continued[-1:], **params, n_head=n_head, cache=cache, start=len(continued) - 1)

    expected = full_logits(continued, params, CACHE_HPARAMS)
    np.testing.assert_allclose(first, expected[keep:keep + len(replacement)], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, expected[-1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False])
def test_model_logits_grow_one_block_at_a_time(cache_setup, use_cache):
    params, tokens, expected = cache_setup
    model = gpt2.GPT2Model(params, CACHE_HPARAMS, use_cache=use_cache)
    for lengths in [(9,), (1,) * 9, (3, 1, 5), (2, 4, 2, 1)]:
        model.reset()
        end = 0
        for length in lengths:
            end += length
            for n_last in sorted({1, length}):
                logits = model.logits(tokens[:end], n_last=n_last)  # asking twice must not double-feed
                assert logits.shape == (n_last, CACHE_HPARAMS["n_vocab"]) and logits.dtype == np.float32
                np.testing.assert_allclose(logits, expected[end - n_last:end], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False])
def test_model_rolls_back_when_the_sequence_diverges(cache_setup, use_cache):
    """Speculative sampling's pattern: score drafts, then continue from a corrected, shorter sequence."""
    params, tokens, expected = cache_setup
    n_vocab = CACHE_HPARAMS["n_vocab"]
    model = gpt2.GPT2Model(params, CACHE_HPARAMS, use_cache=use_cache)
    np.testing.assert_allclose(model.logits(tokens, n_last=len(tokens)), expected, rtol=1e-5, atol=1e-5)

    for keep in [6, 2, 0, 8]:
        corrected = np.concatenate([tokens[:keep], [(tokens[keep] + 1) % n_vocab], [5, 7]])
        reference = full_logits(corrected, params, CACHE_HPARAMS)
        np.testing.assert_allclose(model.logits(corrected, n_last=3), reference[-3:], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.logits(corrected[:-1]), reference[-2:-1], rtol=1e-5, atol=1e-5)

    # a prefix of what is cached, the whole cached sequence again, and all positions after a rollback
    np.testing.assert_allclose(model.logits(tokens[:4]), expected[3:4], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.logits(tokens), expected[-1:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.logits(tokens), expected[-1:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.logits(tokens, n_last=len(tokens)), expected, rtol=1e-5, atol=1e-5)


PANEL_HPARAMS = dict(n_vocab=70, n_ctx=40, n_embd=32, n_head=4, n_layer=2)


# a plan that exercises every path: plain for one row, panels for several, 2 rows fed as 3 and 5 as 8
MIXED_PLAN = layouts.LayoutPlan(("row-major",) + ("panels",) * 15, (1, 3, 3, 4, 8, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16))


@pytest.mark.parametrize("n", range(1, 17))
@pytest.mark.parametrize("layout", ["panels", MIXED_PLAN, "auto"], ids=["panels", "mixed", "auto"])
def test_fast_layouts_give_the_plain_paths_logits_for_every_block_length(n, layout):
    """A block of n new tokens after a cached prefix, after a rollback, and ending at the end of the context."""
    hparams = PANEL_HPARAMS
    params = random_params(hparams, seed=n)
    rng = np.random.default_rng(n)
    tokens = rng.integers(0, hparams["n_vocab"], size=hparams["n_ctx"])
    diverged = np.concatenate([tokens[:4], (tokens[4:] + 1) % hparams["n_vocab"]])  # differs from position 4 on
    expected, expected_diverged = (full_logits(t, params, hparams) for t in (tokens, diverged))
    model = engine.fast_model(params, hparams, layout=layout)
    assert model.logits(tokens[:7]).dtype == np.float32  # 7 cached
    np.testing.assert_allclose(model.logits(tokens[:7 + n], n_last=n), expected[7:7 + n], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.logits(diverged[:4 + n], n_last=n), expected_diverged[4:4 + n],  # rolled back
                               rtol=1e-5, atol=1e-5)
    model.logits(tokens[:hparams["n_ctx"] - n])
    np.testing.assert_allclose(model.logits(tokens, n_last=n), expected[-n:], rtol=1e-5, atol=1e-5)
    plain = gpt2.GPT2Model(params, hparams)
    np.testing.assert_allclose(plain.logits(tokens, n_last=n), expected[-n:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lengths", [(13, 3), (12, 2, 2), (11, 5), (14, 1, 1)])
def test_model_blocks_up_to_the_end_of_the_context(lengths):
    """Blocks that end at n_ctx, and rollbacks over positions the cache held before."""
    params = random_params(CACHE_HPARAMS, seed=3)
    tokens = np.random.default_rng(4).integers(0, CACHE_HPARAMS["n_vocab"], size=CACHE_HPARAMS["n_ctx"])
    expected = full_logits(tokens, params, CACHE_HPARAMS)
    model = gpt2.GPT2Model(params, CACHE_HPARAMS)
    end = 0
    for length in lengths:
        end += length
        logits = model.logits(tokens[:end], n_last=length)
        np.testing.assert_allclose(logits, expected[end - length:end], rtol=1e-5, atol=1e-5)
    for keep in (5, 10):  # roll back over positions that held padding, then run to the end again
        np.testing.assert_allclose(model.logits(tokens[:keep + 2], n_last=2), expected[keep:keep + 2],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.logits(tokens, n_last=len(tokens) - keep - 2), expected[keep + 2:],
                                   rtol=1e-5, atol=1e-5)


def test_model_accepts_lists(cache_setup):
    params, tokens, expected = cache_setup
    model = gpt2.GPT2Model(params, CACHE_HPARAMS)
    np.testing.assert_allclose(model.logits(tokens.tolist(), n_last=2), expected[-2:], rtol=1e-5, atol=1e-5)


def test_panels_keep_the_numbers_and_the_callers_params(cache_setup):
    params, _, _ = cache_setup
    model = engine.fast_model(params, CACHE_HPARAMS, layout="panels")
    for block, laid_out in zip(params["blocks"], model.params["blocks"]):
        for group, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            w, fast = block[group][layer]["w"], laid_out[group][layer]["w"]
            assert isinstance(fast, layouts.PlannedMatrix) and fast.dtype == np.float32
            assert list(fast.stored) == ["panels"]  # held once, in panels only
            n_in, n_out = w.shape
            unstacked = fast.stored["panels"].panels.transpose(1, 0, 2).reshape(n_in, -1)
            assert np.array_equal(unstacked[:, :n_out], w) and not unstacked[:, n_out:].any()
            assert isinstance(w, np.ndarray) and w.flags.c_contiguous  # the caller's arrays are left as they were
            assert laid_out[group][layer]["b"] is block[group][layer]["b"]  # unchanged arrays are shared
    assert model.params["wte"] is params["wte"]
    unembedding = model.unembedding.stored["panels"].panels.transpose(1, 0, 2).reshape(CACHE_HPARAMS["n_embd"], -1)
    assert np.array_equal(unembedding[:, :CACHE_HPARAMS["n_vocab"]], params["wte"].T)
    plain = gpt2.GPT2Model(params, CACHE_HPARAMS)
    assert plain.params is params and plain.unembedding is None
    both = engine.fast_model(params, CACHE_HPARAMS, layout=MIXED_PLAN)
    w = both.params["blocks"][0]["mlp"]["c_fc"]["w"]
    assert w.stored["row-major"] is params["blocks"][0]["mlp"]["c_fc"]["w"]  # the layout it lies in: the caller's array
    assert w.nbytes == w.stored["row-major"].nbytes + w.stored["panels"].nbytes
    with pytest.raises(ValueError, match="unknown layout"):
        engine.fast_model(params, CACHE_HPARAMS, layout="columns")


# ------------------------------------------------------------------------------------------ context limit


def test_positions_beyond_the_context_raise():
    hparams = CACHE_HPARAMS
    n_ctx, n_head = hparams["n_ctx"], hparams["n_head"]
    params = random_params(hparams, seed=4)
    tokens = np.random.default_rng(4).integers(0, hparams["n_vocab"], size=n_ctx + 1)

    assert full_logits(tokens[:n_ctx], params, hparams).shape == (n_ctx, hparams["n_vocab"])  # the edge fits
    with pytest.raises(ValueError, match="context"):
        full_logits(tokens, params, hparams)

    cache = gpt2.empty_cache(hparams)
    gpt2.gpt2(tokens[:n_ctx - 2], **params, n_head=n_head, cache=cache, start=0)
    gpt2.gpt2(tokens[n_ctx - 2:n_ctx], **params, n_head=n_head, cache=cache, start=n_ctx - 2)  # ends at n_ctx
    with pytest.raises(ValueError, match="context"):
        gpt2.gpt2(tokens[n_ctx - 2:n_ctx + 1], **params, n_head=n_head, cache=cache, start=n_ctx - 2)
    with pytest.raises(ValueError, match="context"):
        gpt2.gpt2(tokens[:1], **params, n_head=n_head, cache=cache, start=n_ctx)

    for use_cache in (True, False):
        model = gpt2.GPT2Model(params, hparams, use_cache=use_cache)
        assert model.logits(tokens[:n_ctx]).shape == (1, hparams["n_vocab"])
        with pytest.raises(ValueError, match="context"):
            model.logits(tokens)


# --------------------------------------- the simple contract of jaymody/speculative-sampling: model(x) -> probs


@pytest.mark.parametrize("use_cache", [True, False])
def test_model_call_returns_probabilities_for_every_position(cache_setup, use_cache):
    params, tokens, expected = cache_setup
    model = gpt2.GPT2Model(params, CACHE_HPARAMS, use_cache=use_cache)
    for length in (3, 9, 5):  # grow, then roll back
        probs = model(tokens[:length])
        assert probs.shape == (length, CACHE_HPARAMS["n_vocab"])
        assert probs.dtype == np.float32
        assert np.all(probs >= 0)
        np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(probs, gpt2.softmax(expected[:length]), rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------------------------------ bad input


def test_start_without_a_cache_is_rejected(cache_setup):
    params, tokens, _ = cache_setup
    with pytest.raises(ValueError):
        gpt2.gpt2(tokens[:4], **params, n_head=CACHE_HPARAMS["n_head"], start=2)


def test_out_of_range_token_ids_are_rejected(cache_setup):
    params, _, _ = cache_setup
    for bad in ([-1, 2], [CACHE_HPARAMS["n_vocab"], 2]):
        with pytest.raises(ValueError, match="token"):
            full_logits(np.array(bad), params, CACHE_HPARAMS)


@pytest.mark.parametrize("use_cache", [True, False])
def test_n_last_out_of_range_is_rejected(cache_setup, use_cache):
    params, tokens, _ = cache_setup
    model = gpt2.GPT2Model(params, CACHE_HPARAMS, use_cache=use_cache)
    for n_last in (0, len(tokens) + 1):
        with pytest.raises(ValueError, match="n_last"):
            model.logits(tokens, n_last=n_last)
