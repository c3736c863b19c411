"""GPT-2 on JAX: gpt2.py's forward pass run by jax.numpy under jax.jit, the weights on the device.

`JaxGPT2Model` has GPT2Model's interface (`logits(x, n_last)`, jaymody/speculative-sampling's `__call__`,
`reset`, `n_vocab`, `n_ctx`, the token tree's `tree_logits` and `keep_tree_path`, and the `features` a drafter
reads), so the sampling algorithms, verifiers/ and the drafters that read features use it unchanged. What makes it
fast on an accelerator:

- The weights are copied to the device once. The KV cache lives there too, as static-shape buffers of
  n_ctx positions per layer (gpt2.empty_cache) beside the features of every slot (`DeviceCache.states`); the jitted
  step donates them, so XLA updates them in place instead of copying the whole cache every token.
- The step is compiled once per *bucket*, not once per call: the tokens to feed are padded to the next
  power of two (capped at n_ctx) and their position `start` is a traced scalar, so decoding token after
  token reuses one compiled program. The padding is harmless: padded positions come after every real
  query, so causal_mask hides them, and the next real tokens overwrite them.
- `draft()` runs a draft model's K sampling steps in one device call (a lax.fori_loop; K padded to a
  power of two as well): a small model's step costs less on the device than the host spends
  dispatching it (on an H100 we measured about 4.7 us per XLA kernel, and a round trip to the host per
  token costing about as much as a large model's step).

dtype="bfloat16" stores the weights and the KV cache in bfloat16, half the bytes to read per token,
and computes in bfloat16 throughout (gpt2.attention casts its float32-masked scores back). Logits and probabilities always come back as float32 NumPy arrays.
"""

import collections
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gpt2
from kvcache.contract import CachedModel
from kvcache.tree import MASKED, check_tree, tree_feed

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# How often each jitted function below has been traced. jax.jit traces only when its cache misses, and
# every trace is followed by a compilation, so this counts compilations: the tests use it to check that
# decoding does not recompile per token.
TRACES = collections.Counter()


def bucket_size(n_tokens, n_ctx):
    """The padded length a block of n_tokens is fed as: the next power of two, at most n_ctx."""
    return min(n_ctx, 1 << (n_tokens - 1).bit_length())


# ------------------------------------------------------------------------------ sampling on the device


def probabilities(logits, temperature=1.0, top_k=0, top_p=1.0):  # [n_vocab] -> [n_vocab], float32
    """Logits -> the distribution to sample from, as sampling.logits_to_probs computes it on the host.

    Temperature, then top-k (ties with the k-th kept), then top-p (keep a token while the more likely
    ones hold less than top_p; equal probabilities rank by id), renormalised; temperature 0 is a one-hot
    at the argmax, ties to the lowest id. The settings are Python numbers, fixed at trace time. Two
    differences: the host sums top-p's mass in float64, which JAX does not have by default, so a token
    whose mass lands within float32 rounding of top_p may be cut differently; and the host raises a
    temperature below float32's smallest normal number to it, where this gives NaN.
    """
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits), logits.shape[-1], dtype=jnp.float32)
    scaled = (logits - jnp.max(logits)) / temperature  # max first: a tiny temperature cannot overflow
    if 0 < top_k < logits.shape[-1]:
        kth_highest = lax.top_k(scaled, top_k)[0][-1]
        scaled = jnp.where(scaled < kth_highest, -jnp.inf, scaled)
    probs = gpt2.softmax(scaled)
    if top_p < 1:
        order = jnp.argsort(-probs, stable=True)
        sorted_probs = probs[order]
        mass_above = jnp.cumsum(sorted_probs) - sorted_probs  # the mass of the tokens ranked above
        keep = jnp.zeros(probs.shape, dtype=bool).at[order].set(mass_above < top_p)
        kept = jnp.where(keep, probs, 0.0)
        probs = kept / jnp.sum(kept)
    return probs


def sample_inverse_cdf(probs, uniform):  # [n_vocab], scalar in [0, 1) -> token id
    """A draw from probs given one uniform number, as sampling.sample draws on the host.

    The first token whose cumulative mass exceeds uniform * total (scaling by the total keeps float32
    rounding from pushing the draw off the end). A token of probability zero is never drawn, however the
    device's parallel cumulative sum rounds; if rounding leaves no positive token past the threshold,
    the last token of positive probability is drawn.
    """
    cumulative = jnp.cumsum(probs)
    hits = (cumulative > uniform * cumulative[-1]) & (probs > 0)
    last_possible = probs.shape[-1] - 1 - jnp.argmax(probs[::-1] > 0)
    return jnp.where(jnp.any(hits), jnp.argmax(hits), last_possible)


# ---------------------------------------------------------------------------------- jitted functions
# Static arguments: the number of logits rows n_out, n_head and the sampling settings, all fixed for a run.
# Traced arguments: tokens, positions, row offsets and K, so that new values never recompile.


class DeviceCache(NamedTuple):
    """What a JAX model keeps on the device between calls, slot by slot (slots on axis 1 of every buffer)."""

    layers: list  # n_layer x (keys, values), each [n_head, n_ctx, head_dim] (gpt2.empty_cache)
    states: jax.Array  # [len(taps) + 1, n_ctx, n_embd]: each slot's tapped residuals, then its state after ln_f


def empty_device_cache(hparams, dtype, n_taps=0):
    return DeviceCache(gpt2.empty_cache(hparams, xp=jnp, dtype=dtype),
                       jnp.zeros((n_taps + 1, hparams["n_ctx"], hparams["n_embd"]), dtype))


def forward(params, cache, tokens, start, n_head, positions=None, mask=None, taps=()):  # [n_seq] -> [n_seq, n_vocab]
    """gpt2.gpt2_with_cache, writing the tokens' features to their slots beside their keys and values, its matmuls at
    full precision: XLA would use TF32 (a 10-bit mantissa) for float32 on NVIDIA GPUs. Memory-bound decoding loses
    nothing by it."""
    with jax.default_matmul_precision("highest"):
        states, layers = gpt2.hidden_states(tokens, **params, n_head=n_head, cache=cache.layers, start=start,
                                            positions=positions, mask=mask, taps=taps)
        logits = gpt2.unembed(states[-1], params["wte"])
    states = lax.dynamic_update_slice_in_dim(cache.states, jnp.stack(states).astype(cache.states.dtype), start, 1)
    return logits, DeviceCache(layers, states)


@dataclasses.dataclass(frozen=True)
class Forward:
    """forward() for one n_head and taps, equal and hashable by value: sampling_jax's loops take it as a static
    argument."""

    n_head: int
    taps: tuple = ()

    def __call__(self, params, cache, tokens, start):  # [n_seq] -> [n_seq, n_vocab], the new cache
        return forward(params, cache, tokens, start, self.n_head, taps=self.taps)


@functools.partial(jax.jit, static_argnames=("n_head", "n_out", "taps"), donate_argnames=("cache",))
def feed_block(params, cache, tokens, start, first_row, n_head, n_out, taps=()):
    """Feed a padded block at positions start..; return logits rows first_row.. (n_out of them) and the cache."""
    TRACES["feed_block"] += 1
    logits, cache = forward(params, cache, tokens, start, n_head, taps=taps)
    rows = lax.dynamic_slice_in_dim(logits, first_row, n_out)  # [n_out, n_vocab]
    return rows.astype(jnp.float32), cache


@functools.partial(jax.jit, static_argnames=("n_head", "temperature", "top_k", "top_p", "taps"),
                   donate_argnames=("cache",))
def draft_tokens(params, cache, logits_row, position, uniforms, n_draft, n_head, temperature, top_k, top_p, taps=()):
    """Draw n_draft tokens one after another on the device, starting from the logits of the last token fed.

    Token i is drawn with uniforms[i] from its distribution p_i; every token but the last is fed back, at
    position, position + 1, ... The outputs have the static length of `uniforms` (a bucket, so that a K
    changing from loop to loop does not recompile) and n_draft, traced, says how many are real. Returns
    the tokens, their distributions [len(uniforms), n_vocab] and the cache.
    """
    TRACES["draft_tokens"] += 1

    def draw(i, logits_row):  # -> token id, its distribution [n_vocab]
        probs = probabilities(logits_row, temperature, top_k, top_p)
        return sample_inverse_cdf(probs, uniforms[i]).astype(jnp.int32), probs

    def draw_and_feed(i, carry):
        cache, logits_row, drafted, drafted_probs = carry
        token, probs = draw(i, logits_row)
        next_logits, cache = forward(params, cache, token[None], position + i, n_head, taps=taps)
        return cache, next_logits[0].astype(jnp.float32), drafted.at[i].set(token), drafted_probs.at[i].set(probs)

    n_out, n_vocab = uniforms.shape[0], logits_row.shape[-1]
    carry = (cache, logits_row, jnp.zeros(n_out, jnp.int32), jnp.zeros((n_out, n_vocab), jnp.float32))
    cache, logits_row, drafted, drafted_probs = lax.fori_loop(0, n_draft - 1, draw_and_feed, carry)
    token, probs = draw(n_draft - 1, logits_row)  # the last draft is not fed: nobody needs its logits yet
    return drafted.at[n_draft - 1].set(token), drafted_probs.at[n_draft - 1].set(probs), cache


@functools.partial(jax.jit, static_argnames=("n_head", "taps"), donate_argnames=("cache",))
def feed_tree(params, cache, tokens, positions, mask, start, n_head, taps=()):
    """Feed a padded block of a prefix's tokens and a token tree's nodes at slots start.., with the nodes'
    positions and a mask over the whole cache buffer: -> logits [len(tokens), n_vocab] float32, the cache."""
    TRACES["feed_tree"] += 1
    logits, cache = forward(params, cache, tokens, start, n_head, positions, mask, taps)
    return logits.astype(jnp.float32), cache


@functools.partial(jax.jit, donate_argnames=("cache",))
def move_cache_slots(cache, sources, destinations):
    """Every layer's keys and values and the features at slots `sources` copied to slots `destinations` (all read
    before any write)."""
    TRACES["move_cache_slots"] += 1
    return jax.tree.map(lambda buffer: buffer.at[:, destinations].set(buffer[:, sources]), cache)


# ------------------------------------------------------------------------------------------ the model


class JaxGPT2Model(CachedModel):
    """GPT2Model's interface and cache rollback, computed by JAX on its default device.

    The cache has the compute dtype (float32, or bfloat16 to halve its reads as well as the weights'). `features`,
    as gpt2.GPT2Model's, is the state after ln_f of the token in each cache slot, valid where `cached_tokens` is
    (written by every call that feeds a slot, the device loops of sampling_jax included).
    """

    use_cache = True  # always: the cache is what the device keeps

    def __init__(self, params, hparams, dtype="float32"):
        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r} for the JAX backend: choose float32 or bfloat16")
        self.hparams, self.dtype = hparams, dtype
        self.n_vocab, self.n_ctx, self.n_head = hparams["n_vocab"], hparams["n_ctx"], hparams["n_head"]
        self.taps = ()
        self.device_forward = Forward(self.n_head)  # what sampling_jax's whole-loop decoders run
        # NumPy arrays are copied to the device once; arrays already there (a benchmark's) stay there
        self.params = jax.tree.map(lambda a: jnp.asarray(a, dtype=COMPUTE_DTYPES[dtype]), params)
        self.reset()

    def reset(self):
        """Forget everything cached (start a new sequence)."""
        self.cache = empty_device_cache(self.hparams, COMPUTE_DTYPES[self.dtype], len(self.taps))
        super().reset()

    def tap(self, taps):  # gpt2.GPT2Model.tap: keep the residual stream after these blocks too; forgets the cache
        self.taps = tuple(taps)
        self.device_forward = Forward(self.n_head, self.taps)
        self.reset()

    @property
    def states(self):  # [len(taps) + 1, n_ctx, n_embd] on the device, in the compute dtype
        return self.cache.states

    @property
    def features(self):  # [n_ctx, n_embd] on the device, in the compute dtype
        return self.cache.states[-1]

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab], float32 NumPy
        x = self._check_tokens(x)
        if not 1 <= n_last <= len(x):
            raise ValueError(f"n_last must be between 1 and the sequence length {len(x)}, got {n_last}")
        rows, offset = self._feed(x, n_last)
        return np.asarray(rows)[offset:offset + n_last]

    def __call__(self, x):  # jaymody/speculative-sampling's contract: probabilities for every position
        x = self._check_tokens(x)  # first: an empty or 0-d x gets this message, not n_last's or a TypeError
        return gpt2.softmax(self.logits(x, n_last=len(x)))

    def draft(self, x, n_draft, uniforms, temperature=1.0, top_k=0, top_p=1.0):
        """Draw n_draft tokens after x in one device call: -> (tokens [n_draft] int64, p [n_draft, n_vocab]).

        Token i is drawn from p[i] (float32, after temperature, top-k and top-p, as `probabilities` does) by
        inverse CDF with uniforms[i], numbers the caller draws from its own numpy Generator, so a seeded run
        is reproducible. At temperature 0, p[i] is the one-hot argmax and the uniforms do not matter.
        Afterwards the cache holds x and the first n_draft - 1 drafted tokens.
        """
        x = self._check_tokens(x)
        uniforms = np.asarray(uniforms, dtype=np.float64).reshape(-1)
        if n_draft < 1 or len(uniforms) != n_draft:
            raise ValueError(f"draft needs n_draft >= 1 and one uniform per token, got {n_draft} and {len(uniforms)}")
        if not np.all((uniforms >= 0) & (uniforms < 1)):
            raise ValueError("the uniforms must lie in [0, 1)")
        if len(x) + n_draft - 1 > self.n_ctx:
            raise ValueError(f"drafting {n_draft} tokens after {len(x)} exceeds the model's context of {self.n_ctx}")
        # float32 on the device, where a uniform within 2**-25 of 1 would round up to 1 itself
        padded_uniforms = np.zeros(bucket_size(n_draft, self.n_ctx), dtype=np.float32)  # K bucketed, like blocks
        padded_uniforms[:n_draft] = np.minimum(uniforms, np.nextafter(np.float32(1), np.float32(0)))
        last_logits, _ = self._feed(x, 1)  # stays on the device: the draft loop is queued right behind it
        drafted, probs, self.cache = draft_tokens(
            self.params, self.cache, last_logits[0], np.int32(len(x)), padded_uniforms, np.int32(n_draft),
            n_head=self.n_head, temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), taps=self.taps)
        drafted = np.asarray(drafted)[:n_draft].astype(np.int64)
        self.cached_tokens = np.concatenate([x, drafted[:-1]])
        return drafted, np.asarray(probs)[:n_draft]

    def tree_logits(self, x, tokens, parents):  # [n_seq], [n], [n] -> [n + 1, n_vocab], float32 NumPy
        """gpt2.GPT2Model.tree_logits in one device call: the logits after x (row 0) and after x followed by each
        node's path (row 1 + i). What the cache lacks of x and the n nodes are fed as one padded block (a bucket,
        as in _feed) with kvcache/tree.py's mask; the nodes' keys and values wait in the slots after x."""
        x = self._check_tokens(x)
        tokens, parents = check_tree(tokens, parents, self.n_vocab)
        if len(x) + len(tokens) > self.n_ctx:
            raise ValueError(f"a tree of {len(tokens)} nodes after {len(x)} tokens exceeds the model's context "
                             f"of {self.n_ctx}")
        resume = self.resume(x, n_last=1)[0]  # x's last token is fed again
        bucket = bucket_size(len(x) - resume + len(tokens), self.n_ctx)
        start = min(resume, self.n_ctx - bucket)  # near the end of the context the block begins earlier
        n_fed, n_real = len(x) - start, len(x) - start + len(tokens)  # the prefix's tokens fed, then the nodes
        block, positions = np.zeros(bucket, dtype=np.int32), np.zeros(bucket, dtype=np.int32)
        mask = np.full((bucket, self.n_ctx), MASKED, dtype=np.float32)
        block[:n_real], positions[:n_real], mask[:n_real, :len(x) + len(tokens)] = tree_feed(x, tokens, parents, start)
        mask[n_real:, 0] = 0.0  # a padding row sees the first position (its output is dropped)
        logits, self.cache = feed_tree(self.params, self.cache, block, positions, mask, np.int32(start),
                                       n_head=self.n_head, taps=self.taps)
        self.cached_tokens = x  # the slots past x hold the tree: scratch until keep_tree_path
        self.tree = (x, tokens, parents)
        return np.asarray(logits)[n_fed - 1:n_real]

    def keep_tree_path(self, nodes):
        """After tree_logits: keep the accepted path (node indices, root down, possibly none) as if fed after x;
        its nodes' keys, values and features move to their depths' slots in one device call."""
        x, tokens, nodes = self.take_tree_path(nodes)
        if len(nodes):
            n_moves = bucket_size(len(nodes), self.n_ctx)  # padded with the last move again: the same write
            sources = np.full(n_moves, len(x) + nodes[-1], dtype=np.int32)
            destinations = np.full(n_moves, len(x) + len(nodes) - 1, dtype=np.int32)
            sources[:len(nodes)], destinations[:len(nodes)] = len(x) + nodes, len(x) + np.arange(len(nodes))
            self.cache = move_cache_slots(self.cache, sources, destinations)
        self.cached_tokens = np.concatenate([x, tokens[nodes]])

    def _feed(self, x, n_last):
        """Feed what the cache lacks of x (rolling back to the longest cached prefix, keeping n_last to feed).

        -> (logits rows on the device, the index of x's last n_last rows among them). Decoding (n_last 1)
        brings back one row; anything else brings back the whole padded block, so that n_last, like the
        block's length, takes few distinct values and compiles few programs.
        """
        start, new_tokens = self.resume(x, n_last)  # roll back to start and feed new_tokens there
        block, block_start = self._padded_block(x, start, new_tokens)
        n_real = start + len(new_tokens) - block_start  # real tokens in the block; the rest is padding
        n_out = 1 if n_last == 1 else len(block)
        first_row = n_real - n_out if n_last == 1 else 0
        rows, self.cache = feed_block(self.params, self.cache, block, np.int32(block_start), np.int32(first_row),
                                      n_head=self.n_head, n_out=n_out, taps=self.taps)
        self.cached_tokens = x
        return rows, n_real - n_last - first_row

    def _check_tokens(self, x):
        x = np.asarray(x)
        if x.ndim != 1 or len(x) == 0 or not np.issubdtype(x.dtype, np.integer):
            raise ValueError(f"expected a non-empty 1-D sequence of token ids, got shape {x.shape} of {x.dtype}")
        if len(x) > self.n_ctx:
            raise ValueError(f"a sequence of {len(x)} tokens exceeds the model's context of {self.n_ctx}")
        if x.min() < 0 or x.max() >= self.n_vocab:  # JAX would clamp an out-of-range id silently
            raise ValueError(f"token ids must lie in [0, {self.n_vocab}), got {x.min()}..{x.max()}")
        return x.astype(np.int64)

    def _padded_block(self, x, start, new_tokens):
        """new_tokens (x[start:]) padded with token 0 to a bucket size -> (block int32 [bucket], its first position).

        Near the end of the context the bucket may not fit after start; the block then begins earlier and
        feeds some of x's cached tokens again, which rewrites their keys and values (the same up to rounding).
        """
        bucket = bucket_size(len(new_tokens), self.n_ctx)
        block_start = min(start, self.n_ctx - bucket)
        block = np.zeros(bucket, dtype=np.int32)
        block[:start - block_start] = x[block_start:start]
        block[start - block_start:start - block_start + len(new_tokens)] = new_tokens
        return block, block_start
