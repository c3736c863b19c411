"""EAGLE-2's dynamic draft tree: EAGLE's head grows a tree where it is confident, within a budget of nodes.

Put the paper beside this file: EAGLE-2 (Li et al. 2024, arXiv 2406.16858), on drafters/eagle.py's head (EAGLE,
arXiv 2401.15077). The paper's observation: the head's confidence in a token tracks how likely the target is to
accept it, so a node's value is the product of the confidences along its path, here in log space:

    value(node) = sum over the tokens t on the path from x down to node of log softmax(head logits)[t]      <= 0

Expansion phase, depth by depth up to K: the n_drafts nodes of highest value among the latest depth's (the
frontier) are fed to the head in ONE call, and each gets its n_drafts most likely tokens as children. Rerank
phase: the n_nodes nodes of highest value over the whole grown tree are kept. A value never rises down a path,
so a kept node's ancestors are kept with it; on a tie the shallower node (the parent) wins. The kept nodes go to
the verifier (verifiers/tree.py, drafts="dynamic") as chosen tokens, parents before children, siblings most
likely first.

Tree attention in the head's own cache: slots 0..n-2 hold the true pairs (f_j, x_{j+1}), as in EagleDraft; the
expanded nodes follow from slot n-1 in the order they were fed. A node's pair is (its parent's predicted feature,
its token), and its row of the mask (kvcache/tree.tree_mask) sees the true pairs, its expanded ancestors and
itself. The head has no position embedding: the mask alone says where a node sits. Once the tree is verified,
the slots past the true pairs are scratch: the next proposal resumes at slot n-1 at the latest
(EagleDraft.resume) and refills them with true pairs, so the head never keeps a drafted pair.

Ranking reads the head's untempered distribution, its raw log-softmax, as EAGLE-2 does, whatever the run's
settings: a chosen token is verified by the one-hot rule (accepted with probability q'(c)), exact whatever ranked
it, while the tempered p at temperature 0 is one-hot and the tree would collapse into a chain.
"""

import time
from dataclasses import dataclass, field

import numpy as np

import gpt2
from drafters.eagle import EagleDraft, head_forward
from kvcache.tree import tree_ancestry, tree_mask
from verifiers.tree import TokenTree, check_n_nodes


@dataclass
class GrownTree:
    """The expansion phase's tree. Node i: tokens[i], its parent parents[i] (-1: x's last token, the root),
    depths[i] (1 for a child of the root) and values[i], its cumulative draft log-probability. `after` maps an
    expanded node (and the root, -1) to the head's predicted feature after it [n_embd] and its children's
    log-probabilities [n_vocab]."""

    tokens: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    depths: list = field(default_factory=list)
    values: list = field(default_factory=list)
    after: dict = field(default_factory=dict)

    def expand(self, node, feature, log_probs, n_children):
        """node's n_children most likely tokens as its children (ties to the lowest id), each valued by its path."""
        self.after[node] = (feature, log_probs)
        value, depth = (np.float32(0), 0) if node == -1 else (self.values[node], self.depths[node])
        for token in np.argsort(-log_probs, kind="stable")[:n_children]:
            self.tokens.append(int(token))
            self.parents.append(node)
            self.depths.append(depth + 1)
            self.values.append(value + log_probs[token])  # adding a log-probability (<= 0) never raises the value

    def best(self, nodes, m):  # -> the m nodes of highest value among nodes, best first
        """Ties go to the shallower node, then to the earlier: a parent always comes before its children."""
        return sorted(nodes, key=lambda node: (-self.values[node], self.depths[node], node))[:m]

    def at_depth(self, depth):  # -> the nodes of that depth, in the order they were grown
        return [node for node, node_depth in enumerate(self.depths) if node_depth == depth]


def rerank(grown, n_nodes):  # -> TokenTree of the n_nodes nodes of highest value
    """The rerank phase: best() lists every ancestor before its descendants, so each kept node's parent is in the
    tree when the node is added; siblings come most likely first, the order the verifier tries them in."""
    tree, kept = TokenTree(), {-1: -1}  # grown node -> its node in the tree
    for node in grown.best(range(len(grown.tokens)), n_nodes):
        kept[node] = tree.add_choice(kept[grown.parents[node]], grown.tokens[node])
    return tree


class EagleTree(EagleDraft):
    """EAGLE's head growing EAGLE-2's dynamic tree of at most n_nodes nodes for verifiers/tree.py's
    drafts="dynamic" (`draft_tree`); as an EagleDraft it still drafts a chain (`propose`)."""

    def __init__(self, target, head, n_nodes):
        super().__init__(target, head)
        self.n_nodes = check_n_nodes(n_nodes)

    def draft_tree(self, x, K, n_drafts, settings, stats):  # -> TokenTree of chosen tokens, to depth K
        """The expansion phase to depth K (n_drafts nodes expanded per depth, n_drafts children each), then the
        rerank. settings is not read: the ranking is the untempered head's (see the module's docstring). The tree
        also fits the target's context after x. A prompt of one token has no feature yet: an empty tree."""
        started = time.perf_counter()
        x = np.array(x, dtype=np.int64)  # a copy: the head remembers it (`fed`), the caller may change its array
        grown = self.grow(x, K, n_drafts) if K > 0 and len(x) >= 2 else GrownTree()
        tree = rerank(grown, min(self.n_nodes, self.n_ctx - len(x)))
        # one step per readout, the root's and each expanded node's, as verifiers/tree.top_k_tree counts them
        stats.record_call("draft", time.perf_counter() - started, steps=len(grown.after))
        return tree

    def grow(self, x, K, n_drafts):  # -> GrownTree, to depth K
        """The expansion phase: the true pairs give the root's children, then each depth's frontier is fed at once."""
        start = self.resume(x)
        features, tokens = self.true_reads(x[:-1], start), self.paired_tokens(x)[start:]
        predicted = head_forward(features, tokens, self.head, self.wte, self.n_head, self.cache, start)
        grown = GrownTree()
        self.read_out(grown, [-1], predicted[-1:], n_drafts)
        n_prefix, fed = len(x) - 1, []  # the true pairs' slots; the expanded nodes, in slot order after them
        for depth in range(1, K):
            room = self.n_ctx - n_prefix - len(fed)  # the head's free slots
            frontier = grown.best(grown.at_depth(depth), min(n_drafts, room))
            if not frontier:
                break
            fed += frontier
            self.read_out(grown, frontier, self.feed_nodes(grown, fed, n_prefix, len(frontier)), n_drafts)
        return grown

    def feed_nodes(self, grown, fed, n_prefix, n_new):  # -> the head's predicted features [n_new, n_embd]
        """The last n_new fed nodes through the head in one call, into slots n_prefix + len(fed) - n_new..: each pair
        is (its parent's predicted feature, its token), and each sees the true pairs, its ancestors and itself."""
        slot = {node: i for i, node in enumerate(fed)}  # grown node -> its place after the true pairs
        # a fed node's parent is the root or was fed before it (at the depth above)
        _, sees = tree_ancestry([slot.get(grown.parents[node], -1) for node in fed])
        new = fed[-n_new:]
        features = np.stack([grown.after[grown.parents[node]][0] for node in new])  # [n_new, n_embd]
        tokens = np.array([grown.tokens[node] for node in new], dtype=np.int64)
        mask = tree_mask(n_prefix, n_prefix, sees)[-n_new:]  # [n_new, n_prefix + len(fed)]: no chain rows
        return head_forward(features, tokens, self.head, self.wte, self.n_head, self.cache, n_prefix + len(fed) - n_new,
                            mask)

    def read_out(self, grown, nodes, predicted, n_drafts):
        """Each node's children, ranked by the head's raw log-softmax after it (predicted [len(nodes), n_embd])."""
        log_probs = gpt2.log_softmax(self.readout(predicted))  # [len(nodes), n_vocab], untempered
        for node, feature, row in zip(nodes, predicted, log_probs):
            grown.expand(node, feature, row, n_drafts)
