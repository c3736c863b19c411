"""Several drafts verified by recursive rejection sampling: SpecInfer's multi-step speculative sampling (Miao et
al. 2023, "SpecInfer: Accelerating Generative LLM Serving with Tree-based Speculative Inference and
Verification") and Recursive Speculative Decoding (Jeon et al. 2024, arXiv 2402.14160).

Put the papers beside this file; the names are sampling.py's. The draft model proposes n_drafts sequences of K
tokens; the target scores them; then, position by position, the candidates are the next tokens of the drafts
that agree with every token accepted so far, tried in turn. Candidate c is accepted with probability
min(1, q'(c) / p'(c)); after each rejected candidate the residual becomes q' <- norm((q' - p')+) (sampling's
max_fn), and the next candidate is tried against it. If every candidate is rejected, the token is drawn from
the last residual and the loop ends; if one is accepted, the drafts that share it go on to the next position.

- With replacement (SpecInfer) the drafts are independent and p' = p: a token drafted twice is two candidates,
  and each rejection subtracts p from the residual again.
- Without replacement (RSD) the drafts' first tokens are distinct, drawn from p one after the other with the
  earlier ones removed and the rest renormalised, and p' is that distribution: p without the candidates
  already tried. Each draft then goes on as its own chain, and after the first position the rule is
  Algorithm 2's. A draft distribution with fewer tokens than n_drafts gives fewer drafts.

Either way the output follows q exactly: at a position the i-th candidate was drawn from p'_i, and a rejection
step with target q'_i, proposal p'_i and, when it rejects, a draw from norm((q'_i - p'_i)+) yields q'_i; the
recursion replaces that last draw by the same step one candidate on (Jeon et al.'s recursive rejection sampling).
This file holds the rules: how the drafts are drawn, and the recursive rejection at one position. The loop is
verifiers/tree.py's, which merges the drafts into a token tree and scores it in one target call.
"""

import numpy as np

from sampling import accepts, draw_drafts, is_integer, max_fn, sample


def multi_draft_speculative_sampling(x, draft_model, target_model, N, K, rng=None, *, n_drafts=3, replacement=False,
                                     temperature=1.0, top_k=0, top_p=1.0, stats=None, progress=None):
    """Draft n_drafts sequences of K tokens, keep the longest path the target accepts by recursive rejection.

    replacement=True: SpecInfer's independent drafts; False: RSD's drafts with distinct first tokens. With
    n_drafts=1 both are sampling.speculative_sampling, token for token for the same seed. The drafts, merged
    where they share a prefix, are a token tree: this is verifiers/tree.py's decoder with drafts="sampled" (the
    same candidates in the same order, so the same tokens and stats), which scores them in one target call.
    stats.drafted counts every drafted token, stats.accepted the accepted ones.
    """
    from verifiers.tree import tree_speculative_sampling  # imported here: tree.py builds on this module's rules
    return tree_speculative_sampling(x, draft_model, target_model, N, K, rng, n_drafts=n_drafts,
                                     replacement=replacement, drafts="sampled", temperature=temperature, top_k=top_k,
                                     top_p=top_p, stats=stats, progress=progress)


def check_n_drafts(n_drafts):
    if not is_integer(n_drafts) or n_drafts < 1:
        raise ValueError(f"n_drafts must be an integer >= 1, got {n_drafts!r}")


def draw_independent_drafts(draft_model, x, K, n_drafts, settings, rng, stats):  # -> drafts, p per draft
    """SpecInfer: n_drafts independent drafts from p (the draft model's cache rolls back between them)."""
    drawn = [draw_drafts(draft_model, x, K, settings, rng, stats) for _ in range(n_drafts)]
    return [drafts for drafts, _ in drawn], [list(p) for _, p in drawn]


def draw_distinct_drafts(draft_model, x, K, n_drafts, settings, rng, stats):  # -> drafts, p per draft
    """RSD: the first draft as usual; each later one starts from a token of p without the first tokens drawn so
    far, renormalised (the p' its rule divides by), and goes on from there as its own chain."""
    first_draft, first_p = draw_drafts(draft_model, x, K, settings, rng, stats)
    drafts, p = [first_draft], [list(first_p)]
    while len(drafts) < n_drafts and len(first_draft):  # no first draft (a lookup without a match): no others
        p_rest = without(p[-1][0], drafts[-1][0])  # p with every first token drawn so far removed
        if p_rest is None:  # all of p's mass drawn: no token is left to start another draft
            break
        token = sample(p_rest, rng)
        rest, p_after = draw_drafts(draft_model, np.append(x, token), K - 1, settings, rng, stats)
        drafts.append(np.append(token, rest).astype(np.int64))
        p.append([p_rest, *p_after])
    return drafts, p


def without(p, token):  # [n_vocab] -> [n_vocab], or None where nothing is left
    """p with token removed and the rest renormalised: the draw without replacement's next distribution."""
    rest = p.copy()
    rest[token] = 0
    total = rest.sum()
    return rest / total if total > 0 else None


def recursive_rejection(candidates, p_rows, q, rng):  # -> (the accepted candidate's index or None, the residual)
    """One position: try each candidate c (drawn from its p') against the residual q', starting from q' = q."""
    residual = q
    for i, (token, p_prime) in enumerate(zip(candidates, p_rows)):
        r = rng.random()  # r ~ U[0, 1]
        if accepts(r, residual, p_prime, token):  # Algorithm 2's test, against q' and p'
            return i, residual
        residual = next_residual(residual, p_prime)  # rejected: the next candidate aims at (q' - p')+
    return None, residual


def next_residual(residual, p_prime):  # [n_vocab] x2 -> [n_vocab]
    """norm((q' - p')+) after a rejected candidate; q' itself where rounding leaves nothing positive."""
    return max_fn(residual - p_prime, fallback=residual)
