"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification
Accelerates Speculative Decoding", arXiv 2403.10444, ICLR 2025), beside sampling.py's Algorithm 2.

Put the paper next to this file. The loop is Algorithm 2's: the draft proposes K tokens, the target scores
them in one call. Only the rule that decides how many drafts to keep changes. Token verification
(sampling.speculative_sampling) tests the drafts one at a time and stops at the first failure; block
verification judges the block as a whole: a draft that fails its own test can still be kept when the drafts
after it pass theirs. The paper names the models M_s (small, the draft) and M_b (big, the target) and the block
length gamma; here, as in sampling.py, p is the draft's next-token distribution, q the target's and K the
block length. x~_1..x~_K are the drafts; p_i and q_i are the distributions of the token after the first i
drafts (q_0 follows x itself), so q has K + 1 rows and p has K:

    b_0 = 1,   b_i = min(1, b_{i-1} q_{i-1}(x~_i) / p_{i-1}(x~_i))        how much of the block's weight is left
    r_i = sum_v (b_i q_i(v) - p_i(v))+                                     the residual mass after i drafts
    h_i = r_i / (r_i + 1 - b_i) for i < K,   h_K = b_K                    the chance to stop at i
    tau = the largest i in 1..K with eta_i < h_i, else 0                  eta_1..eta_K ~ U[0, 1], all drawn

The loop keeps x~_1..x~_tau and adds one token drawn from q_K if tau = K (the bonus token), else from
norm((b_tau q_tau - p_tau)+). At K = 1 and for one-hot drafts (prompt lookup, or any draft at temperature 0)
tau has token verification's law exactly, so the gain needs sampled drafts; with them block verification
keeps at least as many drafts per loop on average, and the paper proves that no valid verifier keeps more
(10/9 -> 11/9 drafts per loop in its two-token example, K = 2, p = (2/3, 1/3), q = (1/3, 2/3)).

The stats are sampling.py's: per loop `accepted` grows by tau and one token is "corrected" (tau < K) or
"bonus" (tau = K). Their alpha, accepted / (accepted + corrected), is therefore not the per-draft acceptance
probability of Algorithm 2, and (1 - a^(K+1)) / (1 - a) with it does not predict a loop's tokens: compare
verifiers by tokens per target call (stats.tokens_per_target_call) or accepted drafts per loop.
"""

import math

import numpy as np

from sampling import SamplingSettings, draw_drafts, max_fn, sample, timed_probs
from verifiers.loop import Loop, decode


def block_speculative_sampling(x, draft_model, target_model, N, K, rng=None, *, temperature=1.0, top_k=0,
                               top_p=1.0, stats=None, progress=None):
    """Speculative sampling with block verification: sampling.speculative_sampling's contract and stats."""
    settings = SamplingSettings(temperature, top_k, top_p)

    def one_loop(x, K_n, rng, stats):  # -> Loop: x~_1..x~_tau kept, then one token the target stands behind
        # draft x~_1..x~_K ~ p auto-regressively, with the distributions p_0..p_{K-1} they came from
        drafts, p = draw_drafts(draft_model, x, K_n, settings, rng, stats)
        # in parallel, q_0..q_K: the target's distributions after x and after each draft, one call
        q = timed_probs(target_model, np.append(x, drafts), len(drafts) + 1, settings, stats, "target")
        tau, next_token_probs = verify_block(drafts, p, q, rng)
        return Loop(len(drafts), list(drafts[:tau]), sample(next_token_probs, rng), rejected=tau < len(drafts))

    return decode(x, [draft_model, target_model], N, K, rng, stats, progress, one_loop)


def verify_block(drafts, p, q, rng):  # -> tau, the distribution of the token after x~_1..x~_tau
    """The paper's block verification: how many drafts to keep, and what to draw after them."""
    K = len(drafts)
    b, h = block_weights(drafts, p, q)
    eta = [rng.random() for _ in range(K)]  # eta_1..eta_K ~ U[0, 1], one per position, all drawn
    # tau = max{i : eta_i <= h_i}, or 0: the strict < has the same probability for eta ~ U[0, 1) and
    # never stops where h_i = 0, even for eta_i = 0
    tau = max((i for i in range(1, K + 1) if eta[i - 1] < h[i]), default=0)
    if tau == K:  # the whole block kept: the next token comes from q_K
        return tau, q[K]
    # otherwise from the residual norm((b_tau q_tau - p_tau)+); all zero only by rounding, where q_tau is right
    return tau, max_fn(b[tau] * q[tau] - p[tau], fallback=q[tau])


def block_weights(drafts, p, q):  # -> b [K + 1], h [K + 1] (h_0 is never used: tau = 0 needs no test)
    """b_i and h_i of the paper's Algorithm 2 along the drafts, for i = 0..K."""
    K = len(drafts)
    # b_i = min(1, b_{i-1} q_{i-1}(x~_i) / p_{i-1}(x~_i)) in log space: a product of K ratios can underflow
    # on the way even where b_K is not small; q = 0 gives log b = -inf, b = 0 for the rest of the block
    log_b = [0.0]
    for i in range(1, K + 1):
        token = drafts[i - 1]
        log_b.append(min(0.0, log_b[-1] + log(q[i - 1][token]) - log(p[i - 1][token])))
    b = [math.exp(value) for value in log_b]
    h = [1.0] * (K + 1)
    for i in range(1, K):
        r = float(np.maximum(b[i] * q[i] - p[i], 0).sum())  # r_i = sum_v (b_i q_i(v) - p_i(v))+
        # h_i = r_i / (r_i + 1 - b_i); with nothing left to draw from (r_i = 0) never stop at i. That covers the
        # paper's 0 / 0 (b_i = 1, q_i = p_i) too: the residual is empty there, so the block cannot end at i; the
        # later drafts' tests decide (their b may still fall below 1)
        h[i] = r / (r + 1 - b[i]) if r > 0 else 0.0
    h[K] = b[K]  # h_K = b_K: keep the whole block with the weight it has left
    return b, h


def log(probability):  # a probability as a float64 log; log 0 = -inf, as it should be
    with np.errstate(divide="ignore"):
        return float(np.log(np.float64(probability)))
