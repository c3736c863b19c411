"""Medusa's heads as a drafter: a chain, or a sparse tree of the heads' top tokens.

Put the paper beside this file: Medusa (Cai et al. 2024, arXiv 2401.10774), Medusa-1 (the target frozen). The
target's feature f_t is its state after ln_f at position t, the vector its unembedding reads to predict token t+1.
Head k (k = 1..n_heads) reads the same f_t and predicts token t+k+1, through one residual block of its own:

    h_k = f_t + SiLU(f_t @ w_k + b_k)                 [n_embd] -> [n_embd]
    p_k = logits_to_probs(h_k @ wte.T)                  read out through the target's unembedding

Medusa-1 gives each head an LM head of its own, initialised as a copy of the target's; here every head reads out
through the target's frozen unembedding, shared, because at n_vocab 4096 a copy per head would cost more memory
than the heads' blocks and the target's readout is what a copy starts from anyway. Each head has arrays of its own,
shared with no other head and no other layer (FasterDecoding/Medusa PR #133 and linkedin/Liger-Kernel PR #269 fixed
one ResBlock object shared by the layers of each head, a list built by repeating one reference).

Indexing: with x of n tokens, the target's feature at position n-2 is the one that produced x's last token
(Medusa's root: the target's own next token), so head k at f_{n-2} drafts x_{n-1+k}: head 1 drafts x_n, head 2
x_{n+1}, and so on. head_targets pairs features and labels the same way for training.

Drafting never feeds a draft back: the heads' p do not depend on the earlier drafts, so a chain of min(K, n_heads)
tokens is drawn at once, token k from head k's p (sampling.sample from exactly the p returned: Algorithm 2's
exactness). The tree (`draft_tree`, verifiers/tree.py's drafts="dynamic") is Medusa's sparse candidate tree:
from each head's top n_drafts tokens, the n_nodes paths of highest expected acceptance, a path's being the product
along it of the probability that head k's rank-th token is right. Chosen tokens are verified by the one-hot rule,
exact whatever ranked them. Medusa's typical acceptance (lossy) is not used here: classroom/verifier_zoo.py
exhibits it, and its typical_total_variation measures how far it moves the output from the target.

Cost: the heads read one feature, so a proposal is one [n_embd] block and one readout per head, and a tree reads out
only the heads its search reaches (a budget of a few nodes may stop short of the last heads). The feature is the
one the verification call computed anyway: the target keeps it beside its KV cache (drafters/features.true_features
reads it), so a proposal runs no forward of the target, except the first after a prompt, which feeds the prompt
through the target's cache once (the first verification then resumes after it).
"""

import heapq
import time

import numpy as np

import gpt2
import sampling
from drafters.features import host_embeddings, true_features
from drafters.heads import check_shapes
from verifiers.tree import DEFAULT_N_NODES, TokenTree, check_n_nodes

LOSS_DECAY = 0.8  # Medusa-1's loss weights lambda_k = 0.8^k: a far head's loss counts less, its token is harder


def init_heads(hparams, n_heads, rng):
    """n_heads heads for a target of hparams' n_embd, each its own arrays, initialised as Medusa's ResBlock is: w
    zero (so every head starts at the target's own prediction from its feature, shifted by SiLU(b_k)), b as
    PyTorch's nn.Linear draws it, uniform in +-1/sqrt(n_embd)."""
    if not (sampling.is_integer(n_heads) and n_heads >= 1):
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    n_embd = hparams["n_embd"]
    bound = 1 / np.sqrt(n_embd)
    return {"heads": [{"w": np.zeros((n_embd, n_embd), np.float32),
                       "b": rng.uniform(-bound, bound, n_embd).astype(np.float32)} for _ in range(n_heads)]}


def silu(x):  # [...] -> [...]; x sigmoid(x), written with tanh so that no exp overflows
    return 0.5 * x * (1 + gpt2.array_module(x).tanh(0.5 * x))


def head_logits(features, heads, unembedding):  # [..., n_embd] -> [..., n_heads, n_vocab]
    """Every head's logits at each feature, on NumPy or jax.numpy arrays alike (tools/train_heads.py takes its
    gradient with JAX)."""
    states = [features + silu(features @ head["w"] + head["b"]) for head in heads["heads"]]  # h_k, [..., n_embd]
    xp = gpt2.array_module(states[0])  # from a result: NumPy features with JAX heads give JAX arrays
    return xp.stack(states, axis=-2) @ unembedding  # [..., n_heads, n_embd] -> [..., n_heads, n_vocab]


def head_targets(tokens, n_heads):  # [..., T] -> [..., T-1-n_heads, n_heads]
    """Head k's label at feature position i is tokens[i+1+k] (the target's own at i is tokens[i+1]); the features
    at positions 0..T-2-n_heads are the ones with a label for every head."""
    m = labelled_features(tokens.shape[-1], n_heads)
    xp = gpt2.array_module(tokens)
    return xp.stack([tokens[..., 1 + k:1 + k + m] for k in range(1, n_heads + 1)], axis=-1)


def labelled_features(n_tokens, n_heads):  # -> m = n_tokens - 1 - n_heads, the features with a label for every head
    m = n_tokens - 1 - n_heads
    if m < 1:
        raise ValueError(f"a sequence of {n_tokens} tokens has no feature with labels for {n_heads} heads")
    return m


def loss_weights(n_heads):  # -> [n_heads] float32: lambda_k = 0.8^k, k = 1..n_heads
    return (LOSS_DECAY ** np.arange(1, n_heads + 1)).astype(np.float32)


def head_loss(features, labels, heads, unembedding):  # [m, n_embd], [m, n_heads] -> a scalar
    """Medusa-1's loss: sum over heads of lambda_k times head k's cross-entropy, averaged over the features."""
    log_probs = gpt2.log_softmax(head_logits(features, heads, unembedding))  # [m, n_heads, n_vocab]
    xp = gpt2.array_module(log_probs)
    return weighted_over_heads(xp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0])


def weighted_over_heads(log_likelihood):  # [m, n_heads] -> a scalar: minus sum_k lambda_k x head k's mean over the m
    return -(log_likelihood.mean(axis=0) * loss_weights(log_likelihood.shape[-1])).sum()


def head_distillation_loss(features, target_logits, heads, unembedding):  # [T, n_embd], [T, n_vocab] -> a scalar
    """head_loss with soft labels, this kit's variant: the target's own distribution of each head's token (its logits
    one position before that token) in place of the text's token, as EAGLE's and Kangaroo's losses learn the target's
    distribution (Medusa-1 trains on the text's tokens; Medusa's self-distillation, Cai et al. 2024 section 2.3.2,
    on the target's own generated text: tools/train_heads.py --continued). At feature i, head k
    learns softmax(target_logits[i + k]) (the soft cross-entropy, the KL up to the target's entropy), weighted
    0.8^k. The features with a label for every head are those head_targets pairs, T - 1 - n_heads."""
    n_heads = len(heads["heads"])
    m = labelled_features(len(features), n_heads)
    log_probs = gpt2.log_softmax(head_logits(features[:m], heads, unembedding))  # [m, n_heads, n_vocab]
    xp = gpt2.array_module(log_probs)
    teacher = xp.stack([gpt2.softmax(target_logits[k:k + m]) for k in range(1, n_heads + 1)], axis=1)  # the same
    return weighted_over_heads((teacher * log_probs).sum(axis=-1))


def best_paths(confidence, n_nodes, ceilings=None):  # [depth, top] -> up to n_nodes tuples of ranks, parents first
    """The n_nodes paths (r_1, .., r_d), d <= depth, of highest product of confidence[k-1][r_k]: Medusa's expected
    acceptance of a path. A child's product never exceeds its parent's, so the best paths hold their ancestors,
    and a best-first search finds them parents first. Paths of product zero are never kept.

    Row k is read only when the search may keep a path through it: confidence may read its rows on demand (HeadRanks
    reads out a head). A kept path's children wait in the frontier as one entry valued at the path's product times
    ceilings[k], a bound on row k's entries (None: 1, a probability's), and are ranked when that entry comes first:
    no child could have come before it, and on a tie it comes first, so the paths kept are the same."""
    depth, ceilings = len(confidence), [1.0] * len(confidence) if ceilings is None else ceilings
    frontier, kept = [], []  # entries (key, is_path, path, -product): a path's key is its -product

    def await_children(path, negative_score):  # a kept path's children, unranked, keyed by their bound
        if len(path) < depth and ceilings[len(path)] > 0:
            heapq.heappush(frontier, (negative_score * float(ceilings[len(path)]), False, path, negative_score))

    await_children((), -1.0)
    while frontier and len(kept) < n_nodes:
        _, is_path, path, negative_score = heapq.heappop(frontier)
        if is_path:
            kept.append(path)
            await_children(path, negative_score)
            continue
        for rank, c in enumerate(confidence[len(path)]):  # the children may come next: rank them
            if c > 0:
                child_score = negative_score * float(c)
                heapq.heappush(frontier, (child_score, True, (*path, rank), child_score))
    return kept


class HeadRanks:
    """best_paths' confidence for Medusa's tree after one feature: row k is the confidence of head k+1's n_drafts
    most likely tokens (`tokens[k]`, by its untempered p, ties to the lowest id), the head read out the first time the
    search asks for its row. ceilings: what no entry of a row exceeds, the row's measured accuracies where given."""

    def __init__(self, drafter, feature, depth, n_drafts):
        self.drafter, self.feature, self.depth, self.n_drafts = drafter, feature, depth, n_drafts
        self.tokens, self.confidence = [], []  # the rows read, heads 1.. in order
        accuracies = drafter.accuracies
        self.ceilings = None if accuracies is None else accuracies[:depth, :n_drafts].max(axis=1)

    def __len__(self):
        return self.depth

    def __getitem__(self, k):  # -> [n_drafts] the confidence of head k+1's tokens
        while len(self.confidence) <= k:  # the search reaches head k+1 through head k: they are read in order
            self.read_head(len(self.confidence))
        return self.confidence[k]

    def read_head(self, k):  # head k+1's readout alone: the heads the tree never reaches are never read out
        logits = head_logits(self.feature, {"heads": self.drafter.heads["heads"][k:k + 1]}, self.drafter.unembedding)
        probs = sampling.softmax(logits[0].astype(np.float64))  # [n_vocab]
        ranked = np.argsort(-probs, kind="stable")[:self.n_drafts]  # most likely first, ties to the lowest id
        own = probs[ranked]
        accuracies = self.drafter.accuracies
        self.tokens.append(ranked)
        self.confidence.append(own if accuracies is None else np.where(own > 0, accuracies[k, :self.n_drafts], 0))


class MedusaDraft:
    """Medusa's heads (init_heads' nesting) on a gpt2.GPT2Model or JaxGPT2Model target, whose params it reads and
    whose cache it never touches. `propose` is sampling.draw_drafts' contract, `draft_tree` verifiers/tree.py's
    "dynamic" one.

    accuracies: [n_heads, top], the measured probability that head k's rank-th token is right (tools/train_heads.py
    measures it); None: the heads' own probabilities of their tokens stand in for it. n_nodes: the tree's budget.
    """

    def __init__(self, target, heads, accuracies=None, n_nodes=DEFAULT_N_NODES):
        _, self.unembedding = host_embeddings(target, "Medusa's heads")
        n_embd, n_heads = target.hparams["n_embd"], len(heads["heads"])
        if n_heads < 1:
            raise ValueError("Medusa's heads: no head")
        check_shapes(heads, {f"heads/{k}/{part}": shape for k in range(n_heads)
                             for part, shape in (("w", (n_embd, n_embd)), ("b", (n_embd,)))},
                     "Medusa's heads", f"a target of n_embd {n_embd}")
        if accuracies is not None:
            accuracies = np.asarray(accuracies, dtype=np.float64)
            if accuracies.ndim != 2 or len(accuracies) != n_heads or not np.all((accuracies >= 0) & (accuracies <= 1)):
                raise ValueError(f"accuracies must be [{n_heads}, top] probabilities (one row per head), got "
                                 f"shape {list(accuracies.shape)}")
        self.target, self.heads, self.accuracies, self.n_nodes = target, heads, accuracies, check_n_nodes(n_nodes)
        self.n_vocab, self.n_ctx, self.n_heads = target.n_vocab, target.n_ctx, n_heads

    def reset(self):
        """Nothing to forget: the heads keep no cache, the feature is read afresh at every proposal."""

    def depth(self, x, K):  # -> how many heads draft after x: none before x has a feature at n-2
        return min(K, self.n_heads) if len(x) >= 2 else 0

    def feature_before(self, x):  # -> f_{n-2} [n_embd], the target's feature that produced x[-1]
        return true_features(self.target, x[:-1], start=len(x) - 2)[0]

    def logits_after(self, x, depth):  # -> [depth, n_vocab]: heads 1..depth at the feature that produced x[-1]
        feature = self.feature_before(x)
        return head_logits(feature, {"heads": self.heads["heads"][:depth]}, self.unembedding)

    def propose(self, x, K, settings, rng, stats):  # -> drafts [min(K, n_heads) or 0], p [same, n_vocab]
        """Token k drawn from head k's p; the heads read no draft, so all are drawn from one feature."""
        started = time.perf_counter()
        x = np.asarray(x, dtype=np.int64)
        depth = self.depth(x, K)
        p = np.zeros((0, self.n_vocab), np.float32)
        if depth:
            p = sampling.logits_to_probs(self.logits_after(x, depth), settings)
        drafts = [sampling.sample(row, rng) for row in p]  # in head order, each from exactly its row of p
        stats.record_call("draft", time.perf_counter() - started, steps=depth)  # a step: one head read out
        return np.array(drafts, dtype=np.int64), p

    def draft_tree(self, x, K, n_drafts, settings, stats):  # -> TokenTree of chosen tokens, depth <= min(K, n_heads)
        """Medusa's sparse tree: each head's top n_drafts tokens by its untempered p, and the n_nodes paths of
        highest expected acceptance (fewer where the target's context after x has less room). Only the heads the
        search reaches are read out (HeadRanks, best_paths): with measured accuracies, a tree that stops at depth d
        reads heads 1..d (but for exact ties). settings is not read: chosen tokens are verified by the one-hot rule,
        which is exact whatever ranked them, and an untempered ranking keeps the tree at temperature 0."""
        started = time.perf_counter()
        x = np.asarray(x, dtype=np.int64)
        depth, tree = self.depth(x, K), TokenTree()
        if self.accuracies is not None and n_drafts > self.accuracies.shape[1]:
            raise ValueError(f"n_drafts {n_drafts} asks for more ranks than the {self.accuracies.shape[1]} the heads' "
                             "accuracies were measured for")
        ranks = HeadRanks(self, self.feature_before(x) if depth else None, depth, n_drafts)
        nodes = {(): -1}
        for path in best_paths(ranks, min(self.n_nodes, self.n_ctx - len(x)), ranks.ceilings):  # the room after x
            nodes[path] = tree.add_choice(nodes[path[:-1]], ranks.tokens[len(path) - 1][path[-1]])
        stats.record_call("draft", time.perf_counter() - started, steps=len(ranks.tokens))  # a step: a head read out
        return tree
