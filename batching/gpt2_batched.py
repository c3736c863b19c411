"""GPT-2 on several sequences at once: B rows of different lengths through one forward pass.

Why batch: a decode step multiplies one row of activations by every weight matrix, so its time goes to
reading the weights. B rows multiplied by the same weights read them once for all: the B sequences'
next tokens cost about as much as one sequence's, as long as the arithmetic stays cheap (bench/batch.py
measures where it stops being cheap, and notebook 8 why speculative sampling gains less there).

`BatchedGPT2Model` is gpt2.GPT2Model for B rows. The batch-1 model stays the readable reference; this
file composes gpt2.py's functions (layer_norm, linear, ffn, attention) and adds only what a batch needs:

- One KV cache for the whole batch, allocated once: per layer keys and values [B, n_head, n_ctx,
  head_dim], and each row's cached length. Rows hold sequences of different lengths; rolling a row back
  (a rejected draft) changes its length and nothing else, and what lies past it is rewritten before
  any query can see it.
- A forward pass feeds each row's new tokens, padded to the longest, at that row's own positions. The
  rows are flattened into one block [rows x tokens, n_embd] for the products, so the weights are read
  once; attention is batched over rows, with a causal mask built from each row's start, and the new
  keys and values are scattered into the cache by fancy indexing: no Python loop over rows.
- Only the rows a decoder asks for are fed (a row that has finished costs nothing), and only the
  positions whose logits it asks for go through the output projection.

NumPy only: the JAX backend batches its whole decoding loops with jax.vmap instead (sampling_jax.py).
"""

import numpy as np

import engine
import gpt2
from kvcache import contract

# ---- the batched forward pass: gpt2.py's functions over rows ---------------------------------------


def split_rows_into_heads(qkv, n_rows, n_head):  # [n_rows*m, 3*n_embd] -> 3 x [n_rows, n_head, m, head_dim]
    return qkv.reshape(n_rows, -1, 3, n_head, qkv.shape[-1] // (3 * n_head)).transpose(2, 0, 3, 1, 4)


def merge_heads_into_rows(x):  # [n_rows, n_head, m, head_dim] -> [n_rows*m, n_head*head_dim]
    return x.transpose(0, 2, 1, 3).reshape(x.shape[0] * x.shape[2], -1)


def batched_causal_mask(starts, n_new, n_keys):  # [n_rows], m, L -> [n_rows, 1, m, L]
    """gpt2.causal_mask for each row at its own start: query i of row r sits at position starts[r] + i.

    Keys past a row's last written position (rolled-back drafts, another row's longer sequence) lie in
    every query's future, so they are masked too.
    """
    query_positions = starts[:, None, None] + np.arange(n_new)[None, :, None]  # [n_rows, m, 1]
    key_positions = np.arange(n_keys)[None, None, :]  # [1, 1, L]
    return np.where(key_positions > query_positions, gpt2.MASKED, 0.0).astype(np.float32)[:, None]


def batched_mha(x, c_attn, c_proj, n_head, kv_cache, feed):  # [n_rows*m, n_embd] -> [n_rows*m, n_embd]
    qkv = gpt2.linear(x, **c_attn)  # [n_rows*m, n_embd] -> [n_rows*m, 3*n_embd]: the weights read once
    q, k, v = split_rows_into_heads(qkv, feed.n_rows, n_head)  # 3 x [n_rows, n_head, m, head_dim]
    k = feed.write_and_read(kv_cache[0], k)  # [n_rows, n_head, L, head_dim]
    v = feed.write_and_read(kv_cache[1], v)
    heads = gpt2.attention(q, k, v, feed.mask)  # [n_rows, n_head, m, head_dim]: its products broadcast over rows
    return gpt2.linear(merge_heads_into_rows(heads), **c_proj)  # [n_rows*m, n_embd]


def batched_block(x, mlp, attn, ln_1, ln_2, n_head, kv_cache, feed):  # [n_rows*m, n_embd] -> same
    x = x + batched_mha(gpt2.layer_norm(x, **ln_1), **attn, n_head=n_head, kv_cache=kv_cache, feed=feed)
    return x + gpt2.ffn(gpt2.layer_norm(x, **ln_2), **mlp)  # gpt2.transformer_block, row by row


class Feed:
    """Where one forward pass puts each row's tokens: positions, what is real and what is padding, the mask.

    rows [n_rows]: the cache rows fed; starts [n_rows]: each row's first new position; n_new [n_rows]: its
    real new tokens; m = max(n_new): the padded block's width.
    """

    def __init__(self, rows, starts, n_new, batch_size):
        self.rows, self.n_rows, self.n_new, m = rows, len(rows), n_new, int(n_new.max())
        self.positions = starts[:, None] + np.arange(m)  # [n_rows, m]
        self.real = real = np.arange(m) < n_new[:, None]  # [n_rows, m]: False for padding
        # where the real tokens' keys and values go: (cache row, position) pairs, padding left out
        self.write_rows, self.write_positions = np.broadcast_to(rows[:, None], real.shape)[real], self.positions[real]
        self.n_keys = int((starts + n_new).max())  # the longest row's length after this pass
        self.mask = batched_causal_mask(starts, m, self.n_keys)  # [n_rows, 1, m, L]
        self.all_rows = self.n_rows == batch_size  # then the cache's rows are read as a view, not gathered

    def write_and_read(self, buffer, new):  # [B, n_head, n_ctx, d], [n_rows, n_head, m, d] -> [n_rows, n_head, L, d]
        """Scatter the real tokens' keys (or values) into the cache; return the rows' first L positions."""
        buffer[self.write_rows, :, self.write_positions] = new.transpose(0, 2, 1, 3)[self.real]  # [n_real, n_head, d]
        if self.all_rows:
            return buffer[:, :, :self.n_keys]  # a view
        return buffer[self.rows, :, :self.n_keys]  # a copy of the fed rows only


def batched_gpt2(tokens, feed, n_out, wte, wpe, blocks, ln_f, n_head, cache, unembedding):  # [n_rows, m] -> ...
    """-> [n_rows, n_out, n_vocab]: the logits of each row's last n_out real positions, right-aligned (a row
    with fewer new tokens repeats its first one's at the left). The new keys and values go into the cache."""
    n_rows, m = tokens.shape
    positions = np.minimum(feed.positions, wpe.shape[0] - 1)  # padding may run past the context: never read
    x = (wte[tokens] + wpe[positions]).reshape(n_rows * m, -1)  # [n_rows, m] -> [n_rows*m, n_embd]
    for block, layer_cache in zip(blocks, cache):
        x = batched_block(x, **block, n_head=n_head, kv_cache=layer_cache, feed=feed)
    last = np.maximum(feed.n_new[:, None] - n_out + np.arange(n_out), 0)  # [n_rows, n_out]: the positions asked for
    x = x.reshape(n_rows, m, -1)[np.arange(n_rows)[:, None], last].reshape(n_rows * n_out, -1)
    unembedding = wte.T if unembedding is None else unembedding  # tied to the token embedding
    logits = gpt2.layer_norm(x, **ln_f) @ unembedding  # [n_rows*n_out, n_embd] -> [n_rows*n_out, n_vocab]
    return logits.reshape(n_rows, n_out, -1)


# ---- the model --------------------------------------------------------------------------------


class BatchedGPT2Model:
    """gpt2.GPT2Model for batch_size sequences at once, each with its own cache length.

    `logits(xs, n_last, rows)` returns, for each sequence xs[i] held in cache row rows[i], the logits of
    its last n_last[i] positions, as one float32 array [len(rows), max(n_last), n_vocab] right-aligned:
    row i's are out[i, -n_last[i]:]. Like GPT2Model, each row first rolls back to the longest prefix of
    its sequence that it has cached (a length change) and feeds the rest, all rows in one pass.
    `layout` is engine.fast_model's: "plain" (the default) keeps the checkpoint's arrays, "auto" measures which
    layouts multiply faster on this machine, "panels" column panels (engine/layouts.py), or a plan.
    """

    def __init__(self, params, hparams, batch_size, layout="plain"):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.hparams, self.batch_size = hparams, int(batch_size)
        self.n_vocab, self.n_ctx, self.n_head = hparams["n_vocab"], hparams["n_ctx"], hparams["n_head"]
        self.plan, self.params, self.unembedding = engine.lay_out(params, layout)  # as engine.fast_model's are
        head_dim = hparams["n_embd"] // self.n_head
        shape = (self.batch_size, self.n_head, self.n_ctx, head_dim)  # untouched positions cost no memory
        self.cache = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(hparams["n_layer"])]
        self.reset()

    def reset(self):
        """Forget every row's sequence (the cache stays allocated: lengths of zero hide what it holds)."""
        self.cached_tokens = [np.zeros(0, dtype=np.int64) for _ in range(self.batch_size)]

    @property
    def lengths(self):  # [batch_size]: positions cached per row
        return np.array([len(tokens) for tokens in self.cached_tokens])

    def logits(self, xs, n_last=1, rows=None):  # B' x [n_seq_i] -> [B', max(n_last), n_vocab]
        rows = np.arange(len(xs)) if rows is None else np.asarray(rows, dtype=np.int64)
        xs = [np.array(x, dtype=np.int64) for x in xs]  # copies: the caller may change its arrays after we cache them
        n_last = np.broadcast_to(np.asarray(n_last, dtype=np.int64), (len(xs),))
        self._check(xs, n_last, rows)
        # each row resumes after the longest prefix it has cached (a rollback), as GPT2Model's cache does
        resumed = [contract.cache_resume(self.cached_tokens[row], x, n) for row, x, n in zip(rows, xs, n_last)]
        starts, n_new = np.array([start for start, _ in resumed]), np.array([len(new) for _, new in resumed])
        tokens = np.zeros((len(xs), n_new.max()), dtype=np.int64)  # padded with token 0, never attended to
        for i, (_, new) in enumerate(resumed):
            tokens[i, :len(new)] = new
        feed = Feed(rows, starts, n_new, self.batch_size)
        logits = batched_gpt2(tokens, feed, int(n_last.max()), **self.params, n_head=self.n_head, cache=self.cache,
                              unembedding=self.unembedding)
        for row, x in zip(rows, xs):
            self.cached_tokens[row] = x
        return logits

    def _check(self, xs, n_last, rows):
        if len(xs) == 0 or len(rows) != len(xs):
            raise ValueError(f"need one cache row per sequence, got {len(xs)} sequences and {len(rows)} rows")
        if rows.min() < 0 or rows.max() >= self.batch_size or len(set(rows.tolist())) != len(rows):
            raise ValueError(f"rows must be distinct cache rows in [0, {self.batch_size}), got {rows.tolist()}")
        if (np.diff(rows) <= 0).any():
            raise ValueError(f"rows must be in increasing order, got {rows.tolist()}")
        for x, n in zip(xs, n_last):
            if x.ndim != 1 or not 1 <= n <= len(x):
                raise ValueError(f"each sequence needs 1 <= n_last <= its length, got n_last={n} for {len(x)} tokens")
            if len(x) > self.n_ctx:
                raise ValueError(f"a sequence of {len(x)} tokens exceeds the model's context of {self.n_ctx}")
            if x.min() < 0 or x.max() >= self.n_vocab:
                raise ValueError(f"token ids must lie in [0, {self.n_vocab}), got {x.min()}..{x.max()}")
