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

The KV cache lets a decoder feed only the tokens it has not fed yet: `gpt2(new_tokens, ...,
cache=..., start=n_cached)` attends to the cached keys and values of the first `start` positions.
`GPT2Model` wraps that bookkeeping, including the rollback speculative sampling needs. A token tree of
drafts (SpecInfer, Miao et al. 2023; Medusa; EAGLE) is the same call with the nodes' positions by depth and
a mask from the tree's ancestry (tree_mask): `GPT2Model.tree_logits`, then `keep_tree_path`.
"""

import math

import numpy as np

from engine import layouts

GELU_SCALE = math.sqrt(2 / math.pi)  # a Python float on purpose, see the module docstring
MASKED = -1e10  # added to the attention scores of positions a query may not see


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


# Reductions are written as methods, x.sum(...) rather than np.sum(x, ...) or np.mean: on the small arrays of a
# decode step NumPy's function wrappers cost more than the sums themselves (0.4 ms of a GPT-2 124M step).


def softmax(x):  # [..., n] -> [..., n], each row sums to 1
    xp = array_module(x)
    exp_x = xp.exp(x - x.max(axis=-1, keepdims=True))
    return exp_x / exp_x.sum(axis=-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):  # [n_seq, n_embd] -> [n_seq, n_embd]
    xp = array_module(x)
    n = x.shape[-1]
    centered = x - x.sum(axis=-1, keepdims=True) / n
    variance = (centered * centered).sum(axis=-1, keepdims=True) / n
    return g * centered / xp.sqrt(variance + eps) + b


def linear(x, w, b):  # [m, n_in] @ [n_in, n_out] + [n_out] -> [m, n_out]
    return x @ w + b  # w: an array, or the same matrix in a faster layout (layouts.PlannedMatrix)


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
    xp = array_module(x)
    return xp.swapaxes(x, 0, 1).reshape(x.shape[1], -1)


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

    Without a cache this is the plain full recompute (start must be 0). With `cache`, a list of
    (keys, values) buffers per layer holding the first `start` positions, the new keys and values are
    written into it, at slots start, start+1, ...; NumPy updates the buffers in place, JAX reads the
    updated list from gpt2_with_cache.
    `unembedding`, optional, is wte.T in another layout (engine/layouts.py): the same numbers, read faster.
    A token tree passes its own `positions` (by depth, not by slot) and `mask` ([n_seq, start + n_seq], 0 or
    MASKED: tree_mask); the defaults are a chain's, start.. and causal_mask.
    """
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


def gpt2_with_cache(inputs, wte, wpe, blocks, ln_f, n_head, cache, start, unembedding=None, positions=None,
                    mask=None):
    """gpt2() that also returns the updated cache (JAX's buffers are new arrays, not updated in place)."""
    xp = array_module(wte)
    positions = start + xp.arange(len(inputs)) if positions is None else positions  # a chain's, unless a tree's
    x = wte[inputs] + wpe[positions]  # [n_seq] -> [n_seq, n_embd]
    new_cache = []
    for layer, block in enumerate(blocks):
        x, layer_cache = transformer_block(x, **block, n_head=n_head, kv_cache=cache[layer] if cache else None,
                                           start=start, mask=mask)
        new_cache.append(layer_cache)
    x = layer_norm(x, **ln_f)  # [n_seq, n_embd]
    unembedding = wte.T if unembedding is None else unembedding  # tied to the token embedding
    return x @ unembedding, new_cache  # [n_seq, n_embd] -> [n_seq, n_vocab]


def init_params(hparams, rng):
    """Random GPT-2 parameters as GPT-2 initialises them (normal, std 0.02), nested like the checkpoint."""
    n_embd = hparams["n_embd"]

    def normal(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    def dense(n_in, n_out):
        return {"w": normal(n_in, n_out), "b": np.zeros(n_out, np.float32)}

    def norm():
        return {"g": np.ones(n_embd, np.float32), "b": np.zeros(n_embd, np.float32)}

    block = lambda: {"ln_1": norm(), "attn": {"c_attn": dense(n_embd, 3 * n_embd), "c_proj": dense(n_embd, n_embd)},
                     "ln_2": norm(), "mlp": {"c_fc": dense(n_embd, 4 * n_embd), "c_proj": dense(4 * n_embd, n_embd)}}
    return {"wte": normal(hparams["n_vocab"], n_embd), "wpe": normal(hparams["n_ctx"], n_embd),
            "blocks": [block() for _ in range(hparams["n_layer"])], "ln_f": norm()}


def perplexity(tokens, params, hparams):
    """exp(mean next-token cross-entropy) of a token sequence, scored in consecutive full-context windows."""
    nll, count = 0.0, 0
    for start in range(0, len(tokens) - 1, hparams["n_ctx"]):
        window = np.asarray(tokens[start:start + hparams["n_ctx"] + 1])
        logits = gpt2(window[:-1], **params, n_head=hparams["n_head"]).astype(np.float64)  # sums need float64
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        nll -= log_probs[np.arange(len(window) - 1), window[1:]].sum()
        count += len(window) - 1
    return math.exp(nll / count)


def empty_cache(hparams, xp=np, dtype=np.float32):  # -> n_layer x ([n_head, n_ctx, head_dim], same)
    head_dim = hparams["n_embd"] // hparams["n_head"]
    shape = (hparams["n_head"], hparams["n_ctx"], head_dim)
    return [(xp.zeros(shape, dtype), xp.zeros(shape, dtype)) for _ in range(hparams["n_layer"])]


def common_prefix_length(a, b):
    """How many leading tokens two sequences share."""
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(mismatches[0]) if len(mismatches) else n


def cache_resume(cached_tokens, x, n_last):  # -> (the cache position to resume at, the tokens of x to feed there)
    """How a cached model reads x: it resumes after the longest prefix of x it has cached and feeds the rest.

    That is the whole rollback: what the cache holds past that prefix (a rejected draft's keys and values)
    is overwritten by what is fed, and keys past the last position fed are never attended. The last n_last
    positions are fed even when cached: their logits are wanted. (classroom/bug_zoo.py patches this decision.)
    """
    start = min(common_prefix_length(cached_tokens, x), len(x) - n_last)
    return start, x[start:]


# A token tree after x: node i (tokens[i], parent parents[i], -1 for a child of the root, x's last token) sits at
# position len(x) + depth - 1, its keys and values in cache slot len(x) + i; it sees x, its ancestors and itself.


def integer_vector(values, name):  # -> [n] int64, or a ValueError
    values = np.asarray(values)
    if values.ndim != 1 or (values.size and not np.issubdtype(values.dtype, np.integer)):
        raise ValueError(f"{name} must be a 1-D sequence of integers, got shape {values.shape} of {values.dtype}")
    return values.astype(np.int64)


def check_tree(tokens, parents, n_vocab):  # -> tokens [n], parents [n], both int64
    """A token tree as arrays, or a clear ValueError: every node's parent is the root (-1) or an earlier node."""
    tokens, parents = integer_vector(tokens, "tokens"), integer_vector(parents, "parents")
    if len(tokens) != len(parents):
        raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents: a tree needs one parent per node")
    bad = np.flatnonzero((parents < -1) | (parents >= np.arange(len(parents))))
    if len(bad):
        i = bad[0]
        raise ValueError(f"parents[{i}] = {parents[i]}: a parent is -1 (the root) or an earlier node, in [-1, {i})")
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= n_vocab):
        raise ValueError(f"token ids must lie in [0, {n_vocab}), got {tokens.min()}..{tokens.max()}")
    return tokens, parents


def tree_ancestry(parents):  # [n] -> depths [n] int64, sees [n, n] bool
    """Each node's depth (1 for a child of the root) and what it sees: sees[i, j] when j is i or an ancestor of i."""
    depths, sees = np.ones(len(parents), dtype=np.int64), np.eye(len(parents), dtype=bool)
    for i, parent in enumerate(parents):  # a parent comes before its children: its row is complete
        if parent >= 0:
            depths[i] = depths[parent] + 1
            sees[i] |= sees[parent]
    return depths, sees


def tree_mask(start, n_prefix, sees):  # -> [n_prefix - start + n, n_prefix + n] float32, built once per call
    """The mask of the prefix's positions start..n_prefix-1 fed as a chain, then the tree's n nodes in slots
    n_prefix..: the prefix's rows are causal, a node's row sees the whole prefix, its ancestors and itself."""
    n_fed, n = n_prefix - start, len(sees)
    visible = np.zeros((n_fed + n, n_prefix + n), dtype=bool)
    visible[:n_fed, :n_prefix] = np.arange(n_prefix) <= np.arange(start, n_prefix)[:, None]
    visible[n_fed:, :n_prefix] = True
    visible[n_fed:, n_prefix:] = sees
    return np.where(visible, np.float32(0.0), np.float32(MASKED))


def check_tree_path(nodes, parents):  # -> nodes [m] int64
    """nodes must run down from the root: the first a child of the root, each next a child of the one before."""
    nodes = integer_vector(nodes, "nodes")
    if np.any((nodes < 0) | (nodes >= len(parents))):
        raise ValueError(f"nodes must index the tree's {len(parents)} nodes, got {nodes.tolist()}")
    if np.any(parents[nodes] != np.concatenate([[-1], nodes])[:-1]):
        raise ValueError(f"nodes {nodes.tolist()} are not a path down from the root (their parents are "
                         f"{parents[nodes].tolist()})")
    return nodes



def layout_plan(params, layout="auto"):
    """How GPT2Model will multiply these weights: a layouts.ModelPlan (or LayoutPlan), or None for the plain path.

    layout: "auto" measures this machine (layouts.measure_plan: layouts, and threads per product); "plain" keeps
    the checkpoint's arrays as they are; one of layouts.LAYOUTS for every matrix on one thread; or a plan.
    """
    if not isinstance(layout, str):
        return layout
    if layout == "plain":
        return None
    if layout not in ("auto", *layouts.LAYOUTS):
        raise ValueError(f"unknown layout {layout!r}: choose auto, plain, {', '.join(layouts.LAYOUTS)} or a ModelPlan")
    return layouts.measure_plan(params) if layout == "auto" else layouts.fixed_plan(layout)


def fast_layout(params, layout="auto", in_place=False):
    """The weights as GPT2Model multiplies them: -> (params with every linear weight in the chosen layout, the
    tied output projection wte.T in it too, or None for wte.T itself). Built once from the checkpoint's params,
    which stay the reference. layout: as for layout_plan. in_place: lay the matrices out inside params itself,
    freeing the checkpoint's as it goes (half the peak memory of a large model; params then holds the laid-out
    matrices).
    """
    plan = layout_plan(params, layout)
    return (params, None) if plan is None else layouts.fast_layout(params, plan, in_place)


class GPT2Model:
    """A GPT-2 that remembers what it has already read.

    `logits(x, n_last)` returns the logits of the last n_last positions of the token sequence x.
    With `use_cache` it feeds only the tokens after the longest prefix of x it has cached, and
    first rolls the cache back to that prefix: speculative sampling's rejected drafts simply
    disappear the next time the model is called with the corrected sequence. Without a cache it
    recomputes the whole sequence, as jaymody/speculative-sampling does.

    `layout` says how the weights are stored for the products (engine/layouts.py): "auto" (the default) times the
    layouts of each role's matrices on this machine (row-major, column-major, column panels, ...), on one thread
    and split over every core (engine/threads.py), for one row (a decode step) and for the few rows a
    verification scores, and keeps what is faster, two layouts where that pays; "plain" keeps the checkpoint's
    arrays as they are, the reference path; "panels" column panels for every product. `plan` is what was
    chosen. `in_place` lets the model lay its weights out inside `params` (see fast_layout).
    """

    def __init__(self, params, hparams, use_cache=True, layout="auto", in_place=False):
        self.hparams, self.use_cache = hparams, use_cache
        self.plan = layout_plan(params, layout)  # what multiplies each matrix, and on how many threads
        self.params, self.unembedding = fast_layout(params, self.plan, in_place)  # laid out once (engine/layouts.py)
        self.n_vocab, self.n_ctx = hparams["n_vocab"], hparams["n_ctx"]
        self.reset()

    def reset(self):
        """Forget everything cached (start a new sequence)."""
        self.cache = empty_cache(self.hparams) if self.use_cache else None
        self.cached_tokens = np.zeros(0, dtype=np.int64)
        self.tree = None  # (x, tokens, parents) of the last tree_logits call, until keep_tree_path

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab]
        x = np.array(x, dtype=np.int64)  # a copy: the caller may change its array after we cache it
        if len(x) > self.n_ctx:
            raise ValueError(f"a sequence of {len(x)} tokens exceeds the model's context of {self.n_ctx}")
        if not 1 <= n_last <= len(x):
            raise ValueError(f"n_last={n_last} must lie in [1, {len(x)}] for a sequence of {len(x)} tokens")
        if not self.use_cache:
            return gpt2(x, **self.params, n_head=self.hparams["n_head"], unembedding=self.unembedding)[-n_last:]
        start, new_tokens = cache_resume(self.cached_tokens, x, n_last)  # roll back to start
        logits = gpt2(new_tokens, **self.params, n_head=self.hparams["n_head"], cache=self.cache, start=start,
                      unembedding=self.unembedding)
        self.cached_tokens = x
        return logits[-n_last:]

    def __call__(self, x):  # jaymody/speculative-sampling's contract: probabilities for every position
        return softmax(self.logits(x, n_last=len(x)))

    def tree_logits(self, x, tokens, parents):  # [n_seq], [n], [n] -> [n + 1, n_vocab]
        """The logits after x (row 0) and after x followed by each node's path down the tree (row 1 + i), in one call.

        parents[i] is -1 for a child of x's last token, else an earlier node. x's last token is fed again (as
        logits(x, n_last=1) would) beside the n nodes; the nodes' keys and values go to cache slots len(x).. as
        scratch, until keep_tree_path moves the accepted path's into place. Without a cache, x is recomputed.
        """
        x = np.array(x, dtype=np.int64)
        tokens, parents = check_tree(tokens, parents, self.n_vocab)
        if len(x) == 0 or len(x) + len(tokens) > self.n_ctx:
            raise ValueError(f"a tree of {len(tokens)} nodes after {len(x)} tokens needs 1 to {self.n_ctx} "
                             f"tokens and nodes together (the model's context)")
        start = cache_resume(self.cached_tokens, x, n_last=1)[0] if self.use_cache else 0
        depths, sees = tree_ancestry(parents)
        positions = np.concatenate([np.arange(start, len(x)), len(x) - 1 + depths])  # the nodes' by depth
        logits = gpt2(np.concatenate([x[start:], tokens]), **self.params, n_head=self.hparams["n_head"],
                      cache=self.cache, start=start, unembedding=self.unembedding, positions=positions,
                      mask=tree_mask(start, len(x), sees))
        if self.use_cache:
            self.cached_tokens = x  # the slots past x hold the tree: scratch until keep_tree_path
        self.tree = (x, tokens, parents)
        return logits[len(x) - start - 1:]

    def keep_tree_path(self, nodes):
        """After tree_logits: keep the accepted path (node indices, root down, possibly none) as if fed after x.

        Each kept node's keys and values move from its slot to its depth's (EAGLE copies them likewise); the
        rest are dropped, so the next logits() call feeds only what is new. Without a cache there is nothing to keep.
        """
        if self.tree is None or (self.use_cache and self.tree[0] is not self.cached_tokens):
            raise ValueError("keep_tree_path must follow a tree_logits call, with no other call between them")
        x, tokens, parents = self.tree
        nodes = check_tree_path(nodes, parents)
        self.tree = None
        if self.use_cache:
            kept = slice(len(x), len(x) + len(nodes))  # the depth slots; the fancy index on the right copies first
            for keys, values in self.cache:
                keys[:, kept], values[:, kept] = keys[:, len(x) + nodes], values[:, len(x) + nodes]
            self.cached_tokens = np.concatenate([x, tokens[nodes]])
