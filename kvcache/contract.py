"""The cache contract every cached model keeps: `logits(x, n_last)` reads the whole sequence x, and the model feeds
only what its cache lacks.

A cached model remembers the tokens whose keys and values it holds (`cached_tokens`). Given x it resumes after the
longest prefix of x it has cached and feeds the rest: that is the whole rollback speculative sampling needs, since a
rejected draft is simply not in the next x. `cache_resume` takes that decision, once for every model (classroom/
bug_zoo.py patches it here, and every cached model then runs the patched decision). `CachedModel` holds the
bookkeeping (reset, resume, the token tree's guard) for gpt2.GPT2Model, jax_backend's JaxGPT2Model and
classroom/lossless.CachedTableModel; batching/gpt2_batched.py calls cache_resume row by row.
"""

import numpy as np

from kvcache.tree import check_tree_path


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


class CachedModel:
    """The bookkeeping of a model with a KV cache; a subclass holds the buffers and feeds what resume() says.

    `cached_tokens` [n] int64: the tokens whose keys and values the cache holds, slot i for token i.
    `tree`: (x, tokens, parents) of the last tree_logits call, until keep_tree_path takes its accepted path.
    """

    use_cache = True  # GPT2Model without a cache recomputes x at every call and keeps no tokens

    def reset(self):
        """Forget everything cached (start a new sequence); a subclass also clears its buffers."""
        self.cached_tokens = np.zeros(0, dtype=np.int64)
        self.tree = None

    def resume(self, x, n_last):  # -> (the cache position to resume at, the tokens of x to feed there)
        return cache_resume(self.cached_tokens, x, n_last)  # looked up at each call: the zoo's patch applies

    def take_tree_path(self, nodes):  # -> x [n_seq], the tree's tokens [n], the path's nodes [m] int64
        """The tree guard: keep_tree_path must follow tree_logits directly; nodes must be a path down from the root."""
        if self.tree is None or (self.use_cache and self.tree[0] is not self.cached_tokens):
            raise ValueError("keep_tree_path must follow a tree_logits call, with no other call between them")
        x, tokens, parents = self.tree
        nodes = check_tree_path(nodes, parents)
        self.tree = None
        return x, tokens, nodes
