"""A token tree of drafts (SpecInfer, Miao et al. 2023; Medusa; EAGLE) read in one forward pass.

A tree after x: node i (tokens[i], parent parents[i], -1 for a child of the root, x's last token) sits at position
len(x) + depth - 1, its keys and values in cache slot len(x) + i; it sees x, its ancestors and itself. So the
forward pass needs only two small generalisations, both in gpt2.gpt2: the nodes' `positions` (by depth, not by
slot) and an attention `mask` from the tree's ancestry (tree_mask). After verification, keep_tree_path moves the
accepted path's keys and values (and the target's features) to their depths' slots (move_path; EAGLE copies them
likewise).
"""

import numpy as np

MASKED = -1e10  # added to the attention scores of positions a query may not see (gpt2.causal_mask's too)


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


def tree_feed(x, tokens, parents, start):  # -> tokens [n_fed + n], positions [n_fed + n], mask (tree_mask's)
    """What one forward pass feeds for a tree after x when the cache holds x[:start]: x's remaining tokens as a
    chain (x's last token at least, whose logits are row 0 of the answer), then the nodes at their depths."""
    depths, sees = tree_ancestry(parents)
    positions = np.concatenate([np.arange(start, len(x)), len(x) - 1 + depths])
    return np.concatenate([x[start:], tokens]), positions, tree_mask(start, len(x), sees)


def check_tree_path(nodes, parents):  # -> nodes [m] int64
    """nodes must run down from the root: the first a child of the root, each next a child of the one before."""
    nodes = integer_vector(nodes, "nodes")
    if np.any((nodes < 0) | (nodes >= len(parents))):
        raise ValueError(f"nodes must index the tree's {len(parents)} nodes, got {nodes.tolist()}")
    if np.any(parents[nodes] != np.concatenate([[-1], nodes])[:-1]):
        raise ValueError(f"nodes {nodes.tolist()} are not a path down from the root (their parents are "
                         f"{parents[nodes].tolist()})")
    return nodes


def move_path(buffers, n_prefix, nodes):  # buffers: NumPy arrays [..., n_ctx, d] indexed by cache slot, in place
    """The accepted path's rows from the nodes' slots n_prefix + nodes to their depths' slots, in every buffer: each
    layer's keys and values ([n_head, n_ctx, head_dim]) and the target's states ([len(taps) + 1, n_ctx, n_embd],
    gpt2.GPT2Model)."""
    kept = slice(n_prefix, n_prefix + len(nodes))  # the fancy index on the right copies before the write
    for buffer in buffers:
        buffer[..., kept, :] = buffer[..., n_prefix + nodes, :]
