"""The draft-then-verify loop every verifier here runs, written once; each verifier gives it one loop's work.

sampling.speculative_sampling writes Algorithm 2's loop out in the paper's names; the verifiers keep that loop
and change only the rule that decides which drafts stay. `decode` is the loop: the inputs checked before any
model call, n from the prompt's length to T = n + N, at most K_n = min(K, T - n - 1) drafts a loop, so that a
loop yields at most T - n tokens and no position passes T - 1, and the stats counted as speculative_sampling
counts them. `one_loop(x, K_n, rng, stats)` drafts, scores and verifies, and returns a `Loop`.
"""

from typing import NamedTuple

import numpy as np

from sampling import check_K, prepare


class Loop(NamedTuple):
    """What one loop yields: the drafts kept, then one token the target stands behind."""

    drafted: int  # tokens drafted this loop (every draft's, or the tree's nodes)
    accepted: list  # the drafted tokens kept, in order
    next_token: int  # drawn after them: a correction, the bonus token, or (no drafts) the target's own step
    rejected: bool  # whether next_token replaces a rejected draft


def decode(x, models, N, K, rng, stats, progress, one_loop):  # -> x followed by N new tokens, int64
    """sampling.speculative_sampling's loop with one_loop's rule: the same checks, stats and progress."""
    check_K(K)
    x, rng, stats, progress = prepare(x, N, models, rng, stats, progress)
    n = len(x)  # initialise n <- t, the prompt's length
    T = n + N
    while n < T:
        stats.loops += 1
        loop = one_loop(x, min(K, T - n - 1), rng, stats)  # K_n drafts at most: never past T
        new_tokens = [*loop.accepted, loop.next_token]
        x = np.append(x, np.asarray(new_tokens, dtype=np.int64))
        n += len(new_tokens)
        stats.drafted += loop.drafted
        stats.record_tokens("accepted", len(loop.accepted))
        stats.record_tokens("corrected" if loop.rejected else "bonus" if loop.drafted else "target")
        progress(len(new_tokens))
    return x
