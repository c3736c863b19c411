"""sampling.py's decoders with the whole loop on the device: one jitted call generates all N tokens.

`autoregressive_sampling` (Algorithm 1) and `speculative_sampling` (Algorithm 2 of Chen et al. 2023) take
the same arguments as sampling.py's and return the same tokens and statistics; the loop runs inside one
`lax.while_loop`, so the host is not waited for between tokens (each round trip costs about as much as
a large model's decode step on a GPU). The steps and names mirror sampling.py: x the tokens, n their
count, T = the prompt's length + N, K drafts per loop, p the draft's distributions, q the target's.

Where the randomness comes from: uniform numbers drawn from sampling.py's numpy Generator before the
call and consumed on the device in exactly the order sampling.py consumes them (per loop: K_n for the
drafts, one r per judged draft, one for the correction or the bonus token). So the same seed gives the
same tokens on the host and on the device (up to float32 rounding at a CDF boundary), which is what the
tests check. A JAX key derived from the seed would give other tokens than the NumPy backend for the
same seed, and could not be checked against it draw for draw. The cost: (K + 2) N uniforms per call, a
few kilobytes.

The models are JAX models with `params`, `cache`, `n_ctx`, `n_vocab` and `device_forward`, a hashable
function (params, cache, tokens, start) -> (logits, cache) (gpt2_jax.JaxGPT2Model). Each cache keeps
this invariant at the top of a loop: positions 0..n-2 hold keys and values of x[:n-1] (the draft may lag
one more, see `draft_loop`); whatever lies beyond is garbage that causal_mask hides and that is rewritten
before a query can see it. The device does not time the draft and the target apart: their seconds in
the stats stay 0, so the cost ratio is None.

Greedy assisted generation changes K, a shape, from loop to loop: it stays the host's loop (with the
fused draft), re-exported here.

`batched_autoregressive_sampling` and `batched_speculative_sampling` are sampling_batched.py's decoders on
the device: the same loops vmapped over rows, each row with its own cache and its own Generator's uniforms.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import sampling
from batching import sampling_batched
from jax_backend.gpt2_jax import bucket_size, probabilities, sample_inverse_cdf
from sampling import greedy_assisted_generation  # noqa: F401  (the host's loop, see above)

ORIGINS = ("target", "accepted", "corrected", "bonus")  # SpeculativeStats' origins, by code


def max_fn(x, fallback):  # [n_vocab] -> [n_vocab], sampling.max_fn: (x)+ normalised, or fallback if none is > 0
    positive = jnp.maximum(x, 0.0)
    total = jnp.sum(positive)
    return jnp.where(total > 0, positive / jnp.where(total > 0, total, 1.0), fallback)


def prefill(forward, params, cache, x, n_prompt):
    """Feed the prompt's bucket of x at position 0; the padding's keys are rewritten before they are read."""
    block = lax.slice_in_dim(x, 0, n_prompt)  # n_prompt: static, the prompt's length bucketed
    _, cache = forward(params, cache, block, jnp.int32(0))
    return cache


# ------------------------------------------------------------------------------------------ Algorithm 1


@functools.partial(jax.jit, static_argnames=("forward", "n_prompt", "settings"), donate_argnames=("cache",))
def autoregressive_loop(forward, params, cache, x, n, T, uniforms, n_prompt, settings):
    """x [buffer] holding the prompt, n its length -> (x with T tokens, cache). One uniform per token."""
    cache = prefill(forward, params, cache, x, n_prompt)
    n_start = n

    def step(carry):
        x, n, cache = carry
        logits, cache = forward(params, cache, lax.dynamic_slice_in_dim(x, n - 1, 1), n - 1)
        q = probabilities(logits[0], *settings)  # q(x | x_1..x_n)
        token = sample_inverse_cdf(q, uniforms[n - n_start])  # sample x_{n+1} ~ q(x | x_1..x_n)
        return x.at[n].set(token.astype(x.dtype)), n + 1, cache

    x, _, cache = lax.while_loop(lambda carry: carry[1] < T, step, (x, n, cache))
    return x, cache


# ------------------------------------------------------------------------------------------ Algorithm 2


def draft_loop(forward, params, cache, x, n, K, K_n, u, settings):
    """for t = 1 : K_n, sample x~_t ~ p(x | x_1..x_n, x~_1..x~_{t-1}): -> drafts [K], p [K, n_vocab], cache.

    The first call feeds x[n-2], x[n-1] at n-2: the cache lacks x[n-2] after a loop that accepted all
    its drafts (the last draft is never fed), and rewriting it otherwise costs nothing on a device.
    Draft t is drawn with uniform u[t]; each draft but the last is fed back. Rows past K_n are unused.
    """
    start = jnp.maximum(n - 2, 0)
    logits, cache = forward(params, cache, lax.dynamic_slice_in_dim(x, start, 2), start)
    row = logits[n - 1 - start]
    drafts, p = jnp.zeros(K, x.dtype), jnp.zeros((K, logits.shape[-1]), jnp.float32)

    def draw_and_feed(t, carry):
        cache, row, drafts, p = carry
        p_t = probabilities(row, *settings)
        token = sample_inverse_cdf(p_t, u[t]).astype(x.dtype)
        logits, cache = forward(params, cache, token[None], n + t)  # x~_t sits at position n + t
        return cache, logits[0], drafts.at[t].set(token), p.at[t].set(p_t)

    cache, row, drafts, p = lax.fori_loop(0, K_n - 1, draw_and_feed, (cache, row, drafts, p))
    last = jnp.maximum(K_n - 1, 0)  # K_n = 0 (the last loop may draft nothing): a draw nobody judges
    p_last = probabilities(row, *settings)
    drafts = drafts.at[last].set(sample_inverse_cdf(p_last, u[last]).astype(x.dtype))
    return drafts, p.at[last].set(p_last), cache


@functools.partial(jax.jit, static_argnames=("draft_forward", "target_forward", "n_prompt", "K", "settings"),
                   donate_argnames=("draft_cache", "target_cache"))
def speculative_loop(draft_forward, draft_params, draft_cache, target_forward, target_params, target_cache,
                     x, n, T, uniforms, n_prompt, K, settings):
    """Algorithm 2 until n = T: -> (x, origins [buffer] (ORIGINS' codes), loops, drafted, accepted, caches).

    x: a buffer of at least T + K + 1 tokens holding the prompt; n: the prompt's length.
    """
    draft_cache = prefill(draft_forward, draft_params, draft_cache, x, n_prompt)
    target_cache = prefill(target_forward, target_params, target_cache, x, n_prompt)
    # the target's context (GPT-2: wpe's rows); a model without positions has only the buffer's bound
    target_ctx = target_params["wpe"].shape[0] if isinstance(target_params, dict) else x.shape[0]
    t = jnp.arange(K)

    def loop(carry):
        x, n, i, draft_cache, target_cache, origins, loops, drafted, accepted = carry
        # draft at most T - n - 1, as sampling.py does: no token and no position past T - 1
        K_n = jnp.minimum(K, T - n - 1)
        u = lax.dynamic_slice_in_dim(uniforms, i, 2 * K + 1)  # this loop's uniforms, in the host's order
        drafts, p, draft_cache = draft_loop(draft_forward, draft_params, draft_cache, x, n, K, K_n, u, settings)
        x_draft = lax.dynamic_update_slice_in_dim(x, drafts, n, 0)
        # in parallel, q(x | x_1..x_n), ..., q(x | x_1..x_n, x~_1..x~_K): K + 1 positions in one call (the
        # block starts earlier near the end of the context, feeding cached tokens again)
        start = jnp.minimum(n - 1, target_ctx - (K + 1))
        logits, target_cache = target_forward(target_params, target_cache,
                                              lax.dynamic_slice_in_dim(x_draft, start, K + 1), start)
        rows = jnp.take(logits, n - 1 - start + jnp.arange(K + 1), axis=0, mode="clip")
        q = jax.vmap(lambda row: probabilities(row, *settings))(rows)
        # r ~ U[0, 1] for each judged draft; accept x~_t if r < q(x~_t) / p(x~_t), up to the first rejection
        r = u[K_n + t]
        judged = t < K_n
        ratio = q[t, drafts] / jnp.where(judged, p[t, drafts], 1.0)
        m = jnp.sum(jnp.cumprod(judged & (r < ratio)))  # drafts accepted before the first rejection
        rejected = m < K_n
        # reject: sample x_{n+m+1} ~ (q - p)+; all accepted: the bonus token from q(x | .., x~_K)
        m_p = jnp.minimum(m, K - 1)
        final = jnp.where(rejected, max_fn(q[m] - p[m_p], q[m]), q[K_n])
        n_uniforms = K_n + jnp.where(rejected, m + 1, K_n)  # drafts' and r's uniforms used so far
        token = sample_inverse_cdf(final, u[n_uniforms]).astype(x.dtype)
        x = x_draft.at[n + m].set(token)
        # accepted, then corrected or bonus; a loop with no room for drafts (the last) is a plain target step
        codes = jnp.where(jnp.arange(K + 1) < m, 1, jnp.where(rejected, 2, jnp.where(K_n > 0, 3, 0))).astype(origins.dtype)
        origins = lax.dynamic_update_slice_in_dim(origins, codes, n, 0)  # past n + m: rewritten later
        return (x, n + m + 1, i + n_uniforms + 1, draft_cache, target_cache, origins, loops + 1, drafted + K_n,
                accepted + m)

    zero = jnp.int32(0)
    carry = (x, n, zero, draft_cache, target_cache, jnp.zeros(x.shape, jnp.int8), zero, zero, zero)
    x, _, _, draft_cache, target_cache, origins, loops, drafted, accepted = lax.while_loop(
        lambda carry: carry[1] < T, loop, carry)
    return x, origins, loops, drafted, accepted, draft_cache, target_cache


# ------------------------------------------------------------------------- the host side of one call


def prepared(x, N, models, rng, stats, K=0):
    """sampling.prepare's checks, then the device's inputs: (x, n, T, buffer, n_prompt, rng, stats)."""
    x, rng, stats, _ = sampling.prepare(x, N, models, rng, stats, None)
    n, T = len(x), len(x) + N
    n_ctx = min(model.n_ctx for model in models)
    if K + 1 > n_ctx:
        raise ValueError(f"K + 1 = {K + 1} positions to score exceed the model's context of {n_ctx}")
    buffer = np.zeros(n_ctx + K + 1, np.int32)  # room for K drafts past any n: the writes never clamp
    buffer[:n] = x
    return x, n, T, buffer, bucket_size(n, n_ctx), rng, stats


def uniforms_from(rng, count):
    """count uniforms from the Generator, as float32 below 1, padded to a power of two (fewer programs)."""
    padded = np.zeros(1 << max(count - 1, 0).bit_length(), np.float32)
    padded[:count] = np.minimum(rng.random(count), sampling.FLOAT32_BELOW_ONE)
    return padded


def autoregressive_sampling(x, model, N, rng=None, *, temperature=1.0, top_k=0, top_p=1.0, stats=None,
                            progress=None):
    """sampling.autoregressive_sampling with the loop on the device: the same tokens for the same rng."""
    settings = sampling.SamplingSettings(temperature, top_k, top_p)
    x, n, T, buffer, n_prompt, rng, stats = prepared(x, N, [model], rng, stats)
    if N == 0:
        return x
    out, model.cache = autoregressive_loop(model.device_forward, model.params, model.cache, buffer, np.int32(n),
                                           np.int32(T), uniforms_from(rng, N), n_prompt=n_prompt,
                                           settings=astuple(settings))
    out = np.asarray(out)[:T].astype(np.int64)
    model.cached_tokens = out[:T - 1]  # the last token was sampled, never fed
    stats.target_calls += N
    stats.record_tokens("target", N)
    if progress:
        progress(N)
    return out


def speculative_sampling(x, draft_model, target_model, N, K, rng=None, *, temperature=1.0, top_k=0, top_p=1.0,
                         stats=None, progress=None):
    """sampling.speculative_sampling with the loop on the device: the same tokens and counts for the same rng."""
    settings = sampling.SamplingSettings(temperature, top_k, top_p)
    sampling.check_K(K)
    if draft_model is target_model:
        raise ValueError("the device loop needs two model objects: each keeps its own cache on the device")
    x, n, T, buffer, n_prompt, rng, stats = prepared(x, N, [draft_model, target_model], rng, stats, K)
    if N == 0:
        return x
    # (K + 2) N bounds the uniforms used: a loop of k tokens uses at most K + k + 1 <= (K + 2) k; the last
    # loop's slice of 2 K + 1 may read past them, into padding nobody judges
    out, origins, loops, drafted, accepted, draft_model.cache, target_model.cache = speculative_loop(
        draft_model.device_forward, draft_model.params, draft_model.cache, target_model.device_forward,
        target_model.params, target_model.cache, buffer, np.int32(n), np.int32(T),
        uniforms_from(rng, (K + 2) * N + 2 * K + 1), n_prompt=n_prompt, K=K, settings=astuple(settings))
    out = np.asarray(out)[:T].astype(np.int64)
    target_model.cached_tokens, draft_model.cached_tokens = out[:T - 1], out[:max(T - 2, 0)]
    loops, drafted = int(loops), int(drafted)
    stats.loops += loops
    stats.target_calls += loops
    stats.drafted += drafted
    stats.draft_calls += drafted
    for code in np.asarray(origins)[n:T]:
        stats.record_tokens(ORIGINS[code])  # counts the accepted drafts too; the tests check them against accepted
    if progress:
        progress(N)
    return out


def astuple(settings):  # hashable, for jit's static arguments, in probabilities' argument order
    return (settings.temperature, settings.top_k, settings.top_p)


# ---------------------------------------------------------------------------- several sequences at once
# The loops above, vmapped over rows: each row has its own cache, token buffer, n, T and uniforms (drawn
# from its own Generator, as the batch-1 decoders draw them); the parameters are shared, so every step
# multiplies all the rows by one read of the weights. Under vmap a while_loop runs until every row is
# done: a finished row's steps are still computed, and discarded.


@functools.partial(jax.jit, static_argnames=("forward", "n_prompt", "settings"), donate_argnames=("cache",))
def batched_autoregressive_loop(forward, params, cache, x, n, T, uniforms, n_prompt, settings):
    """autoregressive_loop over rows: cache, x [B, buffer], n [B], T [B], uniforms [B, ...] -> (x, cache)."""
    row = lambda cache, x, n, T, u: autoregressive_loop(forward, params, cache, x, n, T, u, n_prompt=n_prompt,
                                                        settings=settings)
    return jax.vmap(row)(cache, x, n, T, uniforms)


@functools.partial(jax.jit, static_argnames=("draft_forward", "target_forward", "n_prompt", "K", "settings"),
                   donate_argnames=("draft_cache", "target_cache"))
def batched_speculative_loop(draft_forward, draft_params, draft_cache, target_forward, target_params, target_cache,
                             x, n, T, uniforms, n_prompt, K, settings):
    """speculative_loop over rows: -> (x, origins, loops, drafted, accepted, caches), each with a row axis."""
    row = lambda draft_cache, target_cache, x, n, T, u: speculative_loop(
        draft_forward, draft_params, draft_cache, target_forward, target_params, target_cache, x, n, T, u,
        n_prompt=n_prompt, K=K, settings=settings)
    return jax.vmap(row)(draft_cache, target_cache, x, n, T, uniforms)


def batched_prepared(xs, N, models, rngs, stats, K=0):
    """sampling_batched.prepare_rows' checks, then the device's inputs: (x, T, buffers, n_prompt, rngs, stats)."""
    x, T, rngs, stats, _ = sampling_batched.prepare_rows(xs, N, models, rngs, stats, None)
    n_ctx = min(model.n_ctx for model in models)
    if K + 1 > n_ctx:
        raise ValueError(f"K + 1 = {K + 1} positions to score exceed the model's context of {n_ctx}")
    buffers = np.zeros((len(x), n_ctx + K + 1), np.int32)  # as `prepared`, one row per sequence
    for buffer, row in zip(buffers, x):
        buffer[:len(row)] = row
    # the longest prompt's bucket: a shorter row feeds some padding too, rewritten before it is read
    return x, T, buffers, bucket_size(max(len(row) for row in x), n_ctx), rngs, stats


def batched_cache(model, batch_size):  # model.cache's buffers with a row axis first [B, ...], allocated once a batch
    return jax.tree.map(lambda buffer: jnp.zeros((batch_size, *buffer.shape), buffer.dtype), model.cache)


def batched_uniforms(rngs, counts):  # -> [B, the longest padded count]: uniforms_from for each row's Generator
    rows = [uniforms_from(rng, int(count)) for rng, count in zip(rngs, counts)]
    stacked = np.zeros((len(rows), max(len(row) for row in rows)), np.float32)
    for i, row in enumerate(rows):
        stacked[i, :len(row)] = row
    return stacked


def batched_autoregressive_sampling(xs, model, N, rngs=None, *, temperature=1.0, top_k=0, top_p=1.0, stats=None,
                                    progress=None):
    """sampling_batched.autoregressive_sampling with the loop on the device: row i gives the tokens and counts
    autoregressive_sampling gives with row i's Generator. -> a list of int64 arrays, one per row."""
    settings = sampling.SamplingSettings(temperature, top_k, top_p)
    x, T, buffers, n_prompt, rngs, stats = batched_prepared(xs, N, [model], rngs, stats)
    n = np.array([len(row) for row in x], np.int32)
    N_rows = np.array(T) - n
    if not N_rows.any():
        return x
    out, _ = batched_autoregressive_loop(model.device_forward, model.params, batched_cache(model, len(x)), buffers,
                                         n, np.array(T, np.int32), batched_uniforms(rngs, N_rows), n_prompt=n_prompt,
                                         settings=astuple(settings))
    stats.target_calls += int(N_rows.max())  # vmapped steps, each scoring every row
    for i, row_stats in enumerate(stats.rows):
        row_stats.target_calls += int(N_rows[i])
        row_stats.record_tokens("target", int(N_rows[i]))
    if progress:
        progress(int(N_rows.sum()))
    return [np.asarray(row)[:T_i].astype(np.int64) for row, T_i in zip(out, T)]


def batched_speculative_sampling(xs, draft_model, target_model, N, K, rngs=None, *, temperature=1.0, top_k=0,
                                 top_p=1.0, stats=None, progress=None):
    """sampling_batched.speculative_sampling with the loop on the device: row i gives the tokens and counts
    speculative_sampling gives with row i's Generator. -> a list of int64 arrays, one per row.

    The batch's loops and target calls are the vmapped loop's iterations (the most any row needed); the
    device does not count the batch's draft steps (draft_calls is None) nor time its calls.
    """
    settings = sampling.SamplingSettings(temperature, top_k, top_p)
    sampling.check_K(K)
    x, T, buffers, n_prompt, rngs, stats = batched_prepared(xs, N, [draft_model, target_model], rngs, stats, K)
    n = np.array([len(row) for row in x], np.int32)
    N_rows = np.array(T) - n
    if not N_rows.any():
        return x
    out, origins, loops, drafted, accepted, _, _ = batched_speculative_loop(
        draft_model.device_forward, draft_model.params, batched_cache(draft_model, len(x)),
        target_model.device_forward, target_model.params, batched_cache(target_model, len(x)), buffers, n,
        np.array(T, np.int32), batched_uniforms(rngs, np.where(N_rows > 0, (K + 2) * N_rows + 2 * K + 1, 0)),
        n_prompt=n_prompt, K=K, settings=astuple(settings))
    loops, drafted, origins = np.asarray(loops), np.asarray(drafted), np.asarray(origins)
    stats.loops += int(loops.max())
    stats.target_calls += int(loops.max())
    stats.draft_calls = None
    for i, row_stats in enumerate(stats.rows):
        row_stats.loops += int(loops[i])
        row_stats.target_calls += int(loops[i])
        row_stats.drafted += int(drafted[i])
        row_stats.draft_calls += int(drafted[i])
        for code in origins[i, n[i]:T[i]]:
            row_stats.record_tokens(ORIGINS[code])
    if progress:
        progress(int(N_rows.sum()))
    return [np.asarray(row)[:T_i].astype(np.int64) for row, T_i in zip(out, T)]
