"""A token tree, scored by the target in one call and verified by recursive rejection: SpecInfer's tree-based
speculative inference (Miao et al. 2023), with EAGLE's top-k drafts (Li et al. 2024) and prompt lookup with
several matches as other ways to grow the tree.

Put SpecInfer beside this file; the names are sampling.py's and verifiers/multi_draft.py's. Drafts that share a
prefix share its nodes: the tree has a node per distinct drafted prefix, tokens[i] and parents[i] (-1 for a
child of x's last token, otherwise an earlier node), and the target gives q after x and after every node in one
call, `target_model.tree_logits(x, tokens, parents)` (tree attention: a node attends to x, its ancestors and
itself). Verification walks down from x: at each node its candidates are tried in turn by multi_draft's
recursive rejection; the first accepted becomes the next node, and when all are rejected the token is drawn
from the residual. `target_model.keep_tree_path(nodes)` then keeps the accepted nodes' keys and values.

How the tree grows (`drafts`):
- "sampled": multi_draft's n_drafts drafts (replacement as there), a candidate per draft through a node, a token
  drafted twice tried twice, in draft order: multi_draft_speculative_sampling is this mode.
- "top_k": EAGLE's drafts: each node's children are the n_drafts most likely tokens of the draft model's p there
  (tokens of probability zero left out), to depth K: at most n_drafts + n_drafts^2 + ... + n_drafts^K nodes and
  one draft step per inner node.
- "lookup": the n_drafts latest distinct continuations (at most K tokens) of the text's last n-gram's earlier
  occurrences (speedup/drafts.PromptLookup, which keeps only the latest); draft_model is not used (pass None).
- "dynamic": the drafter grows the tree itself, `draft_model.draft_tree(x, K, n_drafts, settings, stats)` -> a
  TokenTree of chosen tokens (drafters/: EAGLE-2's dynamic tree, Medusa's heads), to depth K.
Chosen children are one-hot drafts: candidate c is accepted with probability q'(c), and else q'(c) <- 0 and q'
is renormalised, which is the recursive rule with p' one-hot at c.
"""

import time

import numpy as np

from sampling import SamplingSettings, is_integer, logits_to_probs, next_token_probs, one_hot, sample, timed_probs
from speedup.drafts import continuation_starts
from verifiers.loop import Loop, decode
from verifiers.multi_draft import check_n_drafts, draw_distinct_drafts, draw_independent_drafts, recursive_rejection

DRAFTS = ("sampled", "top_k", "lookup", "dynamic")
DEFAULT_N_NODES = 8  # a dynamic tree's budget: on a CPU a tree of n nodes costs about a chain of n tokens to verify


def check_n_nodes(n_nodes):  # -> n_nodes as an int, or a ValueError
    """A tree's budget of nodes, as the drafters that grow their own trees take it (drafts="dynamic")."""
    if not (is_integer(n_nodes) and n_nodes >= 1):
        raise ValueError(f"n_nodes (the draft tree's budget of nodes) must be an integer of at least 1, "
                         f"got {n_nodes!r}")
    return int(n_nodes)


def tree_speculative_sampling(x, draft_model, target_model, N, K, rng=None, *, n_drafts=3, replacement=False,
                              drafts="sampled", temperature=1.0, top_k=0, top_p=1.0, stats=None, progress=None):
    """Grow a token tree of depth K (see the module's docstring for `drafts`; n_drafts drafts or children per
    node), score it in one target call, keep the path recursive rejection accepts.

    A target with tree_logits scores the tree in one forward pass; any other model (either of sampling's
    contracts) scores each root-to-leaf path in turn, counted as one call in stats all the same.
    stats.drafted counts the drafted tokens ("sampled": every draft's; otherwise the tree's nodes).
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    check_n_drafts(n_drafts)
    if drafts not in DRAFTS:
        raise ValueError(f"drafts must be one of {', '.join(DRAFTS)}, got {drafts!r}")

    def one_loop(x, K_n, rng, stats):  # -> Loop: the accepted path's tokens, then one from the last residual
        tree, drafted = grow_tree(drafts, draft_model, x, K_n, n_drafts, replacement, settings, rng, stats)
        # q after x and after every node, in one call: row 0 after x, row 1 + i after node i
        q = score_tree(target_model, x, tree.tokens, tree.parents, settings, stats)
        path, residual, rejected = walk(tree, q, rng)
        if hasattr(target_model, "tree_logits"):
            target_model.keep_tree_path(path)  # the accepted nodes' keys and values stay in the cache
        return Loop(drafted, [tree.tokens[node] for node in path], sample(residual, rng), rejected)

    return decode(x, [draft_model, target_model], N, K, rng, stats, progress, one_loop)


def walk(tree, q, rng):  # -> the accepted nodes, the residual to draw the next token from, whether a child failed
    """Down from x (node -1): a node's children are tried in turn by recursive rejection; the first accepted is
    the next node (x_{n+1} <- its token); when every child is rejected, or at a leaf, the walk ends."""
    node, path = -1, []
    while True:
        children = [child for child, _ in tree.candidates[node]]
        p_rows = [one_hot(tree.tokens[child], q.shape[-1]) if p_prime is None else p_prime
                  for child, p_prime in tree.candidates[node]]
        choice, residual = recursive_rejection([tree.tokens[child] for child in children], p_rows, q[node + 1], rng)
        if choice is None:
            return path, residual, bool(children)
        node = children[choice]
        path.append(node)


class TokenTree:
    """Nodes, one per distinct drafted prefix, and the candidates each node tries, in order.

    tokens[i] and parents[i] (-1: a child of x's last token) describe node i; candidates[node] (node -1: after x)
    lists (child, p') pairs, p' the distribution the child's token was drawn from, or None for a chosen token.
    """

    def __init__(self):
        self.tokens, self.parents = [], []
        self.candidates = {-1: []}
        self.index = {}  # (parent, token) -> node

    def node(self, parent, token):  # -> the child of parent holding token, added if new
        key = (parent, int(token))
        if key not in self.index:
            self.index[key] = len(self.tokens)
            self.tokens.append(int(token))
            self.parents.append(parent)
            self.candidates[self.index[key]] = []
        return self.index[key]

    def add_draft(self, draft, p):
        """A sampled draft: one candidate at every node it passes, with its p', so duplicates are tried again."""
        parent = -1
        for token, p_prime in zip(draft, p):
            child = self.node(parent, token)
            self.candidates[parent].append((child, p_prime))
            parent = child

    def add_choice(self, parent, token):  # -> the child
        """A chosen token: one one-hot candidate per distinct child (a second try could only be rejected)."""
        is_new = (parent, int(token)) not in self.index
        child = self.node(parent, token)
        if is_new:
            self.candidates[parent].append((child, None))
        return child


def grow_tree(drafts, draft_model, x, K, n_drafts, replacement, settings, rng, stats):  # -> TokenTree, drafted
    """The tree of one loop, and how many tokens were drafted for it."""
    if drafts == "sampled":
        draw = draw_independent_drafts if replacement else draw_distinct_drafts
        sampled, p = draw(draft_model, x, K, n_drafts, settings, rng, stats)
        tree = TokenTree()
        for draft, p_draft in zip(sampled, p):
            tree.add_draft(draft, p_draft)
        return tree, sum(len(draft) for draft in sampled)
    if drafts == "dynamic":
        tree = draft_model.draft_tree(x, K, n_drafts, settings, stats)
    elif drafts == "top_k":
        tree = top_k_tree(draft_model, x, K, n_drafts, settings, stats)
    else:
        tree = lookup_tree(x, K, n_drafts, stats)
    return tree, len(tree.tokens)


def top_k_tree(draft_model, x, depth, k, settings, stats):  # -> TokenTree
    """EAGLE's drafts: the k most likely tokens of the draft's p at every node, depth first, to depth levels."""
    tree = TokenTree()

    def expand(node, path):
        if len(path) == depth:
            return
        p = timed_probs(draft_model, np.append(x, np.asarray(path, dtype=np.int64)), 1, settings, stats, "draft")[0]
        for token in np.argsort(-p, kind="stable")[:k]:  # most likely first, ties to the lowest id
            if p[token] > 0:  # a token the draft rules out tells nothing
                expand(tree.add_choice(node, token), [*path, token])

    expand(-1, [])
    return tree


def lookup_tree(x, depth, m, stats, max_ngram=3, min_ngram=1):  # -> TokenTree
    """Prompt lookup with several matches: the m latest distinct continuations, merged where they agree."""
    start = time.perf_counter()
    tree = TokenTree()
    for continuation in lookup_continuations(x, depth, m, max_ngram, min_ngram):
        node = -1
        for token in continuation:
            node = tree.add_choice(node, token)
    stats.record_call("draft", time.perf_counter() - start, steps=len(tree.tokens))
    return tree


def lookup_continuations(x, K, m, max_ngram=3, min_ngram=1):  # -> up to m tuples of at most K tokens
    """What followed the m latest distinct earlier occurrences of x's last n tokens, latest first: the matches
    of speedup/drafts.PromptLookup, which keeps only the latest."""
    x = np.asarray(x)
    continuations = []
    for start in continuation_starts(x, max_ngram, min_ngram):
        continuation = tuple(int(token) for token in x[start:start + K])
        if continuation and continuation not in continuations:
            continuations.append(continuation)
        if len(continuations) == m:
            break
    return continuations


def score_tree(target_model, x, tokens, parents, settings, stats):  # -> q [len(tokens) + 1, n_vocab] float32
    """q after x (row 0) and after each node (row 1 + i): through tree_logits where the model has it, else
    each root-to-leaf path in turn; either way one target call in stats, as a tree-attention engine makes."""
    start = time.perf_counter()
    if hasattr(target_model, "tree_logits"):
        logits = target_model.tree_logits(x, np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64))
        q = logits_to_probs(logits, settings)
    else:
        q = score_paths(target_model, x, tokens, parents, settings)
    stats.record_call("target", time.perf_counter() - start)
    return q


def score_paths(target_model, x, tokens, parents, settings):  # -> q [len(tokens) + 1, n_vocab]
    """Without tree attention: every root-to-leaf path scored as a sequence, its rows filling q."""
    if not tokens:
        return next_token_probs(target_model, x, 1, settings)
    q = [None] * (len(tokens) + 1)
    for leaf in sorted(set(range(len(tokens))) - set(parents)):
        path = [leaf]
        while parents[path[0]] >= 0:  # climb to the root
            path.insert(0, parents[path[0]])
        rows = next_token_probs(target_model, np.append(x, [tokens[i] for i in path]), len(path) + 1, settings)
        for node, row in zip([-1, *path], rows):
            q[node + 1] = row
    return np.stack(q)
