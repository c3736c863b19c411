"""GPT-2's forward pass, written once for NumPy and jax.numpy.

Read it top to bottom like the architecture diagram: gelu, softmax, layer_norm and linear are the
building blocks; ffn and mha make a transformer_block; gpt2 stacks the blocks between the token and
position embeddings and the tied output projection. Parameters nest like OpenAI's checkpoint
(`blocks[i]["attn"]["c_attn"]["w"]`) and are passed as keyword arguments, as in picoGPT.

Every function works on NumPy arrays and, unchanged, on JAX arrays (traced under jax.jit): the array
module is picked from the input's type, constants are Python floats (which keep float32 float32 under
NumPy 2's promotion rules; a NumPy float64 scalar would silently turn the residual stream into
float64) and the one difference in the model math, how a KV cache is written, sits in `write_cache`
(check_inputs also skips its token-range check on traced JAX inputs, which have no values to check).

The KV cache lets a decoder feed only the tokens it has not fed yet: `gpt2(new_tokens, ..., cache=..., start=n_cached)`
attends to the cached keys and values of the first `start` positions. `GPT2Model` wraps that bookkeeping, including
the rollback speculative sampling needs (kvcache/contract.py), and keeps beside the cache the state after ln_f of
every slot it fed, the features a drafter reads (drafters/features.py). A token tree of drafts is the same call with
the nodes' positions by depth and a mask from the tree's ancestry (kvcache/tree.py): `GPT2Model.tree_logits`, then
`keep_tree_path`. An early exit's verification is the same call from a layer: the rows its draft fed enter block L
with the states the draft computed (`hidden_states`' first_layer and x; `exit_draft`, drafters/early_exit.py). How
fast the products run is not this file's concern: engine.fast_model lays a GPT2Model's weights out for this CPU.
"""

import math

import numpy as np

from kvcache.contract import CachedModel
from kvcache.tree import MASKED, check_tree, move_path, tree_feed

GELU_SCALE = math.sqrt(2 / math.pi)  # a Python float on purpose, see the module docstring


def array_module(x):
    """numpy for NumPy arrays, jax.numpy for JAX arrays and tracers."""
    if isinstance(x, np.ndarray):  # the common case first: this runs a hundred times a decode step
        return np
    if type(x).__module__.startswith("jax"):
        import jax.numpy as jnp

        return jnp
    return np


def gelu(x):  # [...] -> [...]
    xp = array_module(x)
    return 0.5 * x * (1 + xp.tanh(GELU_SCALE * (x + 0.044715 * x * x * x)))  # x * x * x: NumPy's x**3 is 10x slower


# Reductions are methods, x.sum(...), not np.sum(x, ...): on a decode step's arrays NumPy's wrappers outcost the sums.


def softmax(x):  # [..., n] -> [..., n], each row sums to 1
    exp_x = array_module(x).exp(x - x.max(axis=-1, keepdims=True))
    return exp_x / exp_x.sum(axis=-1, keepdims=True)


def log_softmax(x):  # [..., n] -> [..., n], each entry <= 0: log(softmax(x)), with no exp underflowing to log(0)
    xp, shifted = array_module(x), x - x.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


def layer_norm(x, g, b, eps=1e-5):  # [n_seq, n_embd] -> [n_seq, n_embd]
    n = x.shape[-1]
    centered = x - x.sum(axis=-1, keepdims=True) / n
    variance = (centered * centered).sum(axis=-1, keepdims=True) / n
    return g * centered / array_module(x).sqrt(variance + eps) + b


def linear(x, w, b):  # [m, n_in] @ [n_in, n_out] + [n_out] -> [m, n_out]
    return x @ w + b  # w: an array, or the same matrix in a faster layout (engine/layouts.py)


def ffn(x, c_fc, c_proj):  # [n_seq, n_embd] -> [n_seq, n_embd]
    a = gelu(linear(x, **c_fc))  # [n_seq, n_embd] -> [n_seq, 4*n_embd]
    return linear(a, **c_proj)  # [n_seq, 4*n_embd] -> [n_seq, n_embd]


def causal_mask(start, n_new, n_keys, xp):  # -> [n_new, n_keys]
    """0 where query i (at position start + i) may attend to key j, MASKED where j is in its future.

    Keys past the last written position (a static-size JAX cache, or entries left by rolled-back
    drafts) are in every query's future, so they are masked too.
    """
    if xp is np and n_keys <= start + 1:  # every key is at or before the first query: nothing to hide
        return 0.0  # (a decode step's case; JAX's static-size cache always has keys to hide)
    query_positions = start + xp.arange(n_new)[:, None]
    key_positions = xp.arange(n_keys)[None, :]
    return xp.where(key_positions > query_positions, MASKED, 0.0).astype(xp.float32)


def attention(q, k, v, mask):  # [n_head, n_q, d], [n_head, n_k, d] x2, [n_q, n_k] -> [n_head, n_q, d]
    xp = array_module(q)
    scores = q @ xp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # [n_head, n_q, n_k]
    return softmax(scores + mask).astype(v.dtype, copy=False) @ v  # the mask is float32: keep bfloat16 bfloat16


def split_qkv_heads(qkv, n_head):  # [n_seq, 3*n_embd] -> [3, n_head, n_seq, head_dim]: q, k and v, head by head
    xp = array_module(qkv)
    return xp.transpose(qkv.reshape(qkv.shape[0], 3, n_head, -1), (1, 2, 0, 3))  # one view: np.split costs more


def merge_heads(x):  # [n_head, n_seq, head_dim] -> [n_seq, n_head*head_dim]
    return x.swapaxes(0, 1).reshape(x.shape[1], -1)


def write_cache(buffer, new, start):  # [n_head, n_ctx, d], [n_head, n_new, d] -> buffer, [n_head, n_k, d]
    """Store the new keys (or values) at positions start.. and return the buffer and what to attend to.

    NumPy writes in place and attends to the filled prefix only; JAX needs static shapes, so it
    writes functionally and attends to the whole buffer, whose unwritten tail causal_mask hides.
    """
    if array_module(buffer) is np:
        end = start + new.shape[1]
        buffer[:, start:end] = new
        return buffer, buffer[:, :end]
    from jax import lax

    buffer = lax.dynamic_update_slice(buffer, new.astype(buffer.dtype), (0, start, 0))
    return buffer, buffer


def mha(x, c_attn, c_proj, n_head, kv_cache=None, start=0, mask=None):  # [n_seq, n_embd] -> [n_seq, n_embd]
    xp = array_module(x)
    qkv = linear(x, **c_attn)  # [n_seq, n_embd] -> [n_seq, 3*n_embd]
    q, k, v = split_qkv_heads(qkv, n_head)  # 3 x [n_head, n_seq, head_dim]
    if kv_cache is not None:  # attend to the cached positions too
        k_buffer, v_buffer = kv_cache
        k_buffer, k = write_cache(k_buffer, k, start)  # [n_head, n_k, head_dim]
        v_buffer, v = write_cache(v_buffer, v, start)
        kv_cache = (k_buffer, v_buffer)
    if mask is None:  # a chain of new tokens; a tree brings its own mask (tree_mask)
        mask = causal_mask(start, x.shape[0], k.shape[1], xp)  # [n_seq, n_k]
    heads = attention(q, k, v, mask)  # [n_head, n_seq, head_dim]
    return linear(merge_heads(heads), **c_proj), kv_cache  # [n_seq, n_embd] -> [n_seq, n_embd]


def transformer_block(x, mlp, attn, ln_1, ln_2, n_head, kv_cache=None, start=0, mask=None):  # [n_seq, n_embd] -> same
    attn_out, kv_cache = mha(layer_norm(x, **ln_1), **attn, n_head=n_head, kv_cache=kv_cache, start=start, mask=mask)
    x = x + attn_out  # residual connection around attention
    x = x + ffn(layer_norm(x, **ln_2), **mlp)  # residual connection around the feed-forward network
    return x, kv_cache


def gpt2(inputs, wte, wpe, blocks, ln_f, n_head, cache=None, start=0, unembedding=None, positions=None,
         mask=None):  # [n_seq] -> [n_seq, n_vocab]
    """Logits for every position of `inputs`, which sit at positions start, start+1, ...

    Without a cache this is the plain full recompute (start must be 0). With `cache`, a list of (keys, values)
    buffers per layer holding the first `start` positions, the new keys and values go to slots start.. (NumPy
    writes in place; JAX returns the new buffers from gpt2_with_cache). `unembedding`: wte.T in a faster layout
    (engine/layouts.py). A token tree passes its `positions` (by depth) and `mask` (kvcache/tree.py)."""
    check_inputs(inputs, start, n_vocab=wte.shape[0], n_ctx=wpe.shape[0], cached=cache is not None)
    logits, _ = gpt2_with_cache(inputs, wte, wpe, blocks, ln_f, n_head, cache, start, unembedding, positions, mask)
    return logits


def check_inputs(inputs, start, n_vocab, n_ctx, cached):
    """Clear errors for what would otherwise wrap around (negative ids) or fail deep inside."""
    if len(inputs) == 0:
        raise ValueError("no input tokens")
    if start + len(inputs) > n_ctx:
        raise ValueError(f"positions up to {start + len(inputs)} exceed the model's context of {n_ctx}")
    if start < 0 or (start > 0 and not cached):
        raise ValueError(f"start={start}: a position offset needs a cache holding the first {start} positions")
    if array_module(inputs) is np and (np.min(inputs) < 0 or np.max(inputs) >= n_vocab):
        raise ValueError(f"token ids must lie in [0, {n_vocab}), got {np.min(inputs)}..{np.max(inputs)}")


def gpt2_with_cache(inputs, wte, wpe, blocks, ln_f, n_head, cache, start, unembedding=None, positions=None, mask=None):
    """gpt2() that also returns the updated cache (JAX's buffers are new arrays, not updated in place)."""
    states, new_cache = hidden_states(inputs, wte, wpe, blocks, ln_f, n_head, cache, start, positions, mask)
    return unembed(states[-1], wte, unembedding), new_cache


def unembed(features, wte, unembedding=None):  # [n_seq, n_embd] -> [n_seq, n_vocab]
    return features @ (wte.T if unembedding is None else unembedding)  # tied to the token embedding


def hidden_states(inputs, wte, wpe, blocks, ln_f, n_head, cache, start, positions=None, mask=None, taps=(),
                  first_layer=0, x=None):
    """The target's features a drafter reads (drafters/), and the updated cache: the residual stream after the first
    n blocks for each n in taps (increasing, 1..n_layer), then the state after ln_f, which the unembedding reads.
    Given x [n_seq, n_embd], the stream entering block first_layer (an early exit's), only blocks first_layer.. run."""
    xp = array_module(wte)
    positions = start + xp.arange(len(inputs)) if positions is None else positions  # a chain's, unless a tree's
    x = wte[inputs] + wpe[positions] if x is None else x  # [n_seq] -> [n_seq, n_embd]
    states, new_cache = [], list(cache[:first_layer]) if cache else []
    for layer, block in enumerate(blocks[first_layer:], first_layer):
        x, layer_cache = transformer_block(x, **block, n_head=n_head, kv_cache=cache[layer] if cache else None,
                                           start=start, mask=mask)
        new_cache.append(layer_cache)
        if layer + 1 in taps:
            states.append(x)  # [n_seq, n_embd]
    return [*states, layer_norm(x, **ln_f)], new_cache  # len(taps) + 1 x [n_seq, n_embd]


def init_params(hparams, rng):
    """Random GPT-2 parameters as GPT-2 initialises them (normal, std 0.02), nested like the checkpoint."""
    n_embd = hparams["n_embd"]
    normal = lambda *shape: (0.02 * rng.standard_normal(shape)).astype(np.float32)
    dense = lambda n_in, n_out: {"w": normal(n_in, n_out), "b": np.zeros(n_out, np.float32)}
    norm = lambda: {"g": np.ones(n_embd, np.float32), "b": np.zeros(n_embd, np.float32)}
    block = lambda: {"ln_1": norm(), "attn": {"c_attn": dense(n_embd, 3 * n_embd), "c_proj": dense(n_embd, n_embd)},
                     "ln_2": norm(), "mlp": {"c_fc": dense(n_embd, 4 * n_embd), "c_proj": dense(4 * n_embd, n_embd)}}
    return {"wte": normal(hparams["n_vocab"], n_embd), "wpe": normal(hparams["n_ctx"], n_embd),
            "blocks": [block() for _ in range(hparams["n_layer"])], "ln_f": norm()}


def empty_cache(hparams, xp=np, dtype=np.float32):  # -> n_layer x ([n_head, n_ctx, head_dim], same)
    shape = (hparams["n_head"], hparams["n_ctx"], hparams["n_embd"] // hparams["n_head"])  # head_dim last
    return [(xp.zeros(shape, dtype), xp.zeros(shape, dtype)) for _ in range(hparams["n_layer"])]


class GPT2Model(CachedModel):
    """A GPT-2 that remembers what it has already read.

    `logits(x, n_last)` returns the logits of the last n_last positions of the token sequence x. With
    `use_cache` it feeds only the tokens after the longest prefix of x it has cached, rolling the cache back to
    that prefix (kvcache/contract.py): rejected drafts disappear the next time the model reads the corrected
    sequence. Without a cache it recomputes the whole sequence, as jaymody/speculative-sampling does.
    It multiplies params as they are (the checkpoint's arrays: the reference path); engine.fast_model lays
    them out for this machine first (`unembedding`, then, is wte.T in another layout).

    `features` [n_ctx, n_embd] float32: the state after ln_f (what the unembedding reads) of the token in each cache
    slot, written by the same forward pass that writes the slot's keys and values, and valid exactly where
    `cached_tokens` is. Without a cache there is none (None): nothing is kept between calls. `states`
    [len(taps) + 1, n_ctx, n_embd]: each slot's residual stream after every block in `taps` (set by `tap`, for a
    drafter that reads lower layers), then its features (`features` is the last row, a view). `exit_draft`: what an
    early exit's draft wrote past `cached_tokens` (drafters/early_exit.ExitDraft): the next chain call reuses it.
    """

    def __init__(self, params, hparams, use_cache=True, unembedding=None):
        self.params, self.hparams, self.use_cache, self.unembedding = params, hparams, use_cache, unembedding
        self.n_vocab, self.n_ctx, self.taps = hparams["n_vocab"], hparams["n_ctx"], ()
        self.reset()

    def reset(self):
        """Forget everything cached (start a new sequence)."""
        self.cache = empty_cache(self.hparams) if self.use_cache else None
        shape = (len(self.taps) + 1, self.n_ctx, self.hparams["n_embd"])
        self.states = np.zeros(shape, np.float32) if self.use_cache else None
        self.features = self.states[-1] if self.use_cache else None  # a view: written with states
        self.exit_draft = None  # what an early exit drafted into this cache, for the next call to reuse
        super().reset()

    def tap(self, taps):
        """Keep the residual stream after the blocks in taps (increasing, 1..n_layer) beside the features, from now
        on; forgets what is cached."""
        self.taps = tuple(taps)
        self.reset()

    def forward(self, tokens, start=0, positions=None, mask=None, first_layer=0, x=None):  # [n] -> [n, n_vocab]
        """gpt2(), through the cache: the tokens' features go to slots start.. as their keys and values do. first_layer
        and x: hidden_states', to start after an early exit; the slots an exit_draft described are rewritten."""
        wte, wpe = self.params["wte"], self.params["wpe"]
        check_inputs(tokens, start, n_vocab=wte.shape[0], n_ctx=wpe.shape[0], cached=self.use_cache)
        states, _ = hidden_states(tokens, **self.params, n_head=self.hparams["n_head"], cache=self.cache, start=start,
                                  positions=positions, mask=mask, taps=self.taps, first_layer=first_layer, x=x)
        self.exit_draft = None
        if self.use_cache:
            for kept, state in zip(self.states, states):  # each tapped stream, then the features: [n, n_embd]
                kept[start:start + len(tokens)] = state
        return unembed(states[-1], wte, self.unembedding)

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab]
        x = np.array(x, dtype=np.int64)  # a copy: the caller may change its array after we cache it
        if len(x) > self.n_ctx:
            raise ValueError(f"a sequence of {len(x)} tokens exceeds the model's context of {self.n_ctx}")
        if not 1 <= n_last <= len(x):
            raise ValueError(f"n_last={n_last} must lie in [1, {len(x)}] for a sequence of {len(x)} tokens")
        if not self.use_cache:
            return self.forward(x)[-n_last:]
        start, new_tokens = self.resume(x, n_last)  # roll back to start
        reused = self.exit_draft.reuse(new_tokens, start) if self.exit_draft else {}  # {first_layer, x} or nothing
        logits = self.forward(new_tokens, start, **reused)
        self.cached_tokens = x
        return logits[-n_last:]

    def __call__(self, x):  # jaymody/speculative-sampling's contract: probabilities for every position
        return softmax(self.logits(x, n_last=len(x)))

    def tree_logits(self, x, tokens, parents):  # [n_seq], [n], [n] -> [n + 1, n_vocab]
        """The logits after x (row 0) and after x followed by each node's path down the tree (row 1 + i), in one call:
        parents[i] is -1 for a child of x's last token, else an earlier node. x's last token is fed again (as
        logits(x, n_last=1) would) beside the n nodes; the nodes' keys, values and features go to cache slots
        len(x).. as scratch, until keep_tree_path moves the accepted path's into place. Without a cache, x is
        recomputed.
        """
        x = np.array(x, dtype=np.int64)
        tokens, parents = check_tree(tokens, parents, self.n_vocab)
        if len(x) == 0 or len(x) + len(tokens) > self.n_ctx:
            raise ValueError(f"a tree of {len(tokens)} nodes after {len(x)} tokens needs 1 to {self.n_ctx} "
                             f"tokens and nodes together (the model's context)")
        start = self.resume(x, n_last=1)[0] if self.use_cache else 0
        fed, positions, mask = tree_feed(x, tokens, parents, start)  # x[start:] as a chain, then the nodes by depth
        logits = self.forward(fed, start, positions, mask)
        if self.use_cache:
            self.cached_tokens = x  # the slots past x hold the tree: scratch until keep_tree_path
        self.tree = (x, tokens, parents)
        return logits[len(x) - start - 1:]

    def keep_tree_path(self, nodes):
        """After tree_logits: keep the accepted path (node indices, root down, possibly none) as if fed after x: its
        keys and values and features move to their depths' slots, the rest are dropped. Without a cache there is nothing
        to keep."""
        x, tokens, nodes = self.take_tree_path(nodes)
        if self.use_cache:
            move_path([buffer for layer in self.cache for buffer in layer] + [self.states], len(x), nodes)
            self.cached_tokens = np.concatenate([x, tokens[nodes]])
