"""Solutions to notebook 9's exercises, with the reasoning. A teacher may withhold this folder from a class.

1. Tokens per loop. A loop yields 1 + (the drafts accepted before the first rejection): the last token, a
   correction or the bonus, always comes. At least i drafts are accepted with probability alpha^i (i <= K), so
   E = 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha), and K + 1 at alpha = 1. By hand, alpha = 0.8,
   K = 4: 1 + 0.8 + 0.64 + 0.512 + 0.4096 = 3.3616.

2. Speedup. A loop costs K draft steps (c each) and one verification (v), K c + v decode steps, where plain
   decoding makes one token per step: speedup = E / (K c + v). By hand, alpha = 0.8, c = 0.1, K = 4, v = 1:
   3.3616 / 1.4 = 2.40; with v = 1.6 (a CPU that scores 5 tokens for 1.6 steps), 3.3616 / 2.0 = 1.68.

3. alpha = 1 - TV(p, q). A draft x is drawn with probability p(x) and kept with probability min(1, q(x)/p(x)),
   so P(accept) = sum_x p(x) min(1, q(x)/p(x)) = sum_x min(p(x), q(x)). Since min(a, b) = (a + b - |a - b|) / 2
   and p, q both sum to 1, that is 1 - (1/2) sum |p - q| = 1 - TV(p, q). Written as min(p, q) the sum needs no
   division: the literal p * min(1, q / p) in NumPy gives nan where p(x) = q(x) = 0 (0/0), though the term is 0
   (the draft never proposes x), a case every top-k or top-p setting creates.

4. Speculation pays for some K exactly when alpha > c (with v = 1). K = 1 gives (1 + alpha) / (1 + c), above 1
   exactly when alpha > c. Conversely, if alpha <= c, then for every K, 1 + alpha + ... + alpha^K <= 1 + K alpha
   <= 1 + K c (each alpha^i <= alpha), so the speedup is at most 1. With v > 1 the bar rises: K = 1 needs
   1 + alpha > c + v.

5. The best K. K drafts make the target score K + 1 tokens, at v(K + 1) decode steps. Try every K: the speedup
   (1 - alpha^(K+1)) / (1 - alpha) / (K c + v(K + 1)) first grows with K, as more tokens come per call, then
   falls, as the drafts and the verification cost more than the tokens they add; a search over 1..32 finds the
   top. If no K beats 1, decode plainly (answer 0). With alpha = 0.8, c = 0.1, v = 1 the best is K = 6 (2.47x);
   if scoring m tokens costs v(m) = 1 + 0.15 (m - 1) steps, K = 3 (1.69x). Pricing K drafts at v(K) instead of
   v(K + 1) is off by one scored token, and where v grows steeply it picks too large a K.

6. Argmax drafts with a one-hot p are exact. Drafting the argmax a with p = one-hot(a): the draft is accepted with
   probability min(1, q(a) / 1) = q(a), and on rejection (probability 1 - q(a)) the correction comes from
   (q - one-hot(a))+ = q on every other token, normalised by 1 - q(a). So a comes out with probability q(a) and
   every other x with (1 - q(a)) q(x) / (1 - q(a)) = q(x): exactly q. It is jaymody#3's bug that breaks this: the
   argmax drafted, the soft p in the ratio.

7. The published formula alpha (1 - alpha^K) / (1 - alpha) = alpha + ... + alpha^K is the expected number of
   *accepted drafts*. Used as the tokens a target call yields, it drops the loop's final token (the correction or
   the bonus), which always comes: the tokens are 1 + alpha (1 - alpha^K) / (1 - alpha) = (1 - alpha^(K+1)) /
   (1 - alpha). The speedup it gives is low by exactly 1 / (K c + 1): at alpha = 0.5, c = 0.1, K = 4 it says
   0.67x (speculation loses) where the truth is 1.38x: 0.71 more (2.07 times the write-up's figure).

8. A prompt-lookup draft proposes the tokens that followed the latest earlier occurrence of the text's last
   `ngram` tokens (Saxena's prompt-lookup decoding, transformers' prompt_lookup_num_tokens). Its proposals are
   deterministic, so the distribution each came from is one-hot: with that p, exercise 6 shows the rule stays
   exact, whatever the proposals.

9. Roofline. A step reads every weight once: P b / beta seconds for P weights of b bytes at a bandwidth of beta
   bytes/s. Scoring m tokens multiplies each weight by m rows, 2 m P flops, 2 m P / F seconds at F flop/s. While
   the arithmetic hides under the reading, verification costs one step: 2 m P / F <= P b / beta, i.e.
   m <= m* = F b / (2 beta), the machine's ridge point (notebook 8). An H100
   in bfloat16 (989 TFLOP/s, 3.35 TB/s, b = 2): about 295 tokens. One core of this CPU (about 80 GFLOP/s float32,
   30 GB/s, b = 4): about 5, and the README measures 4 to 8 tokens at 1.2-1.6 decode steps with column panels on
   the Zen 4 of its numbers card (an AMD EPYC of family 25, model 17, AVX-512).

10. alpha from a run. Each corrected token is one judged draft that was rejected; each accepted token one that
    was accepted; bonus tokens and plain target steps judge none. So alpha = accepted / (accepted + corrected).
    accepted / drafted would count the drafts after a rejection, which are never judged, as failures.

11. The blind bug quiz (exercise_checks.blind_bugs, seed 9): five textbook mistakes that notebook 7 does not show.
    Every decoder fails check_lossless; the diffs say which line of the proof each breaks. A re-seeds the generator
    with the position at every loop, so the same random numbers come back whenever a loop starts at the same n:
    they are reused, not fresh, step 5. B draws the bonus from q[0], the target's distribution given none of the
    drafts, not all K: step 4. C draws the drafts from p squared (renormalised) but judges them with p: the accept
    rule min(1, q/p) and (q - p)+ assume x ~ p, step 1. D draws the correction from (p - q)+, the draft's excess,
    where the rest of q, (q - p)+, must come: step 3. E accepts a draft with probability q(x) alone, not
    min(1, q(x)/p(x)): step 2.

12. The spread. The tokens of a loop are T = 1 + min(G, K), G the drafts accepted before the first rejection,
    geometric; P(T >= t) = alpha^(t-1) for t = 1..K+1. So E[T] = sum_t P(T >= t) (exercise 1) and
    E[T^2] = sum_t (2t - 1) P(T >= t) (since T^2 = sum over t <= T of 2t - 1), and Var[T] = E[T^2] - E[T]^2: 0 at
    alpha = 0 and 1, 2.57 at alpha = 0.8, K = 4 (an untruncated geometric, alpha / (1 - alpha)^2 = 20, would be
    far off). N tokens take L loops, the first L whose tokens reach N; by the central limit theorem for renewal
    processes L is about normal with mean N / E[T] and variance N Var[T] / E[T]^3. Each loop costs K c + v
    decode steps, so the time is (K c + v) L: mean (K c + v) N / E[T], standard deviation
    (K c + v) sqrt(N Var[T] / E[T]^3). At alpha = 0.8, K = 4, c = 0.1, v = 1, N = 128: 53.3 +- 4.1 steps, a
    spread of 8% (it shrinks like 1 / sqrt(N)): the error bars of Chen et al.'s Figure 1 come from the draws
    alone, before any noise of the machine.

13. The batch at which speculation stops paying. A call on m rows takes max(W / beta, 2 m P / F) seconds, P = W / b
    weights: flat up to the ridge m* = F b / (2 beta), then proportional to m. The weights' size W cancels. A
    batch of B decodes with steps of B rows and verifies (K + 1) B rows, so v(B) = time((K + 1) B) / time(B):
    1 while (K + 1) B <= m*, (K + 1) B / m* while B <= m* <= (K + 1) B, K + 1 beyond. The speedup
    E[T] / (K c + v) falls to 1 where v = E[T] - K c, which lies in the middle piece whenever speculation pays for
    a small batch at all (E[T] - K c > 1): B = m* (E[T] - K c) / (K + 1); otherwise 0. An H100 in bfloat16
    (m* = 295), alpha = 0.8, c = 0.05, K = 4: B = 187; one CPU core in float32 (m* = 5.3), alpha = 0.7, c = 0.1,
    K = 4: B = 2.5, which notebook 8 sees on the bundled pair (1.09x at B = 2, 0.86x at B = 4).

14. The alpha a speedup implies. The speedup E[T] / (K c + v) grows with alpha, from 1 / (K c + v) at alpha = 0 to
    (K + 1) / (K c + v) at alpha = 1, so each speedup in between comes from exactly one alpha: bisection finds it;
    outside, no alpha gives it (ValueError). c = 0, a free draft, gives the least alpha a speedup can come from.
    At K = 4, v = 1: Chen et al.'s 2x and 2.5x (their abstract's range, Chinchilla 70B) need alpha >= 0.52 and 0.64
    whatever the draft costs; jaymody/speculative-sampling's README run (60.64 s against 27.15 s, 2.23x, K = 4,
    temperature 0) needs 0.58. At c = 0.1 the same speedups need 0.71, 0.82 and 0.76: the draft's cost is
    paid in acceptance. A speedup quoted without c, K and v says little about alpha, and the reverse.

Notebook 10's exercise (block verification on p = (3/4, 1/4), q = (1/4, 3/4), K = 2). The ratio q/p is 1/3 for a
and 3 for b. aa (probability 9/16): b = 1/3, 1/9; r_1 = 0 (b_1 q - p <= 0 everywhere), so h_1 = 0, h_2 = 1/9:
E = 2/9. ab (3/16): b_1 = 1/3, b_2 = min(1, 1/3 * 3) = 1, h_2 = 1: both kept, E = 2. ba (3/16): b = 1, 1/3; r_1 =
sum (q - p)+ = 1/2, h_1 = 1/2 / (1/2 + 0) = 1, h_2 = 1/3: E = 1 * 2/3 + 2 * 1/3 = 4/3. bb (1/16): b = 1, 1: E = 2.
In all: 9/16 * 2/9 + 3/16 * 2 + 3/16 * 4/3 + 1/16 * 2 = 1/8 + 3/8 + 1/4 + 1/8 = 7/8, against token verification's
alpha + alpha^2 = 1/2 + 1/4 = 3/4 (alpha = 1 - TV(p, q) = 1/2): the gain is in ab, kept whole.
"""

import math
import time
from fractions import Fraction

import numpy as np

import sampling


def tokens_per_loop(alpha, K):
    return K + 1 if alpha == 1 else (1 - alpha ** (K + 1)) / (1 - alpha)


def speedup(alpha, c, K, v=1.0):
    return tokens_per_loop(alpha, K) / (K * c + v)


def acceptance_rate(p, q):
    return float(np.minimum(p, q).sum())


def pays(alpha, c):
    return alpha > c


def best_K(alpha, c, verify_cost, K_max=32):  # verify_cost(m): scoring m tokens, in decode steps
    speedups = {K: speedup(alpha, c, K, verify_cost(K + 1)) for K in range(1, K_max + 1)}
    best = max(speedups, key=speedups.get)
    return best if speedups[best] > 1 else 0


def one_step_output(drawn_from, p, q):
    out = np.zeros(len(q))
    residual = sampling.max_fn(q - p, fallback=q)
    for draft in np.flatnonzero(drawn_from):
        accept = min(1.0, q[draft] / p[draft])
        out[draft] += drawn_from[draft] * accept
        out += drawn_from[draft] * (1 - accept) * residual
    return out


def corrected_speedup(alpha, c, K):
    accepted = K if alpha == 1 else alpha * (1 - alpha**K) / (1 - alpha)  # the published formula
    return (1 + accepted) / (K * c + 1)  # plus the final token


underestimate = corrected_speedup(0.5, 0.1, 4) - 0.5 * (1 - 0.5**4) / (1 - 0.5) / (4 * 0.1 + 1)


class PromptLookupDraft:
    """Drafts copied from the text itself: what followed the latest earlier occurrence of its last n-gram."""

    def __init__(self, n_vocab, ngram=2):
        self.n_vocab, self.ngram = n_vocab, ngram

    def propose(self, x, K, settings, rng, stats):  # -> drafts [K_n <= K] int64, p [K_n, n_vocab] float32
        start = time.perf_counter()
        x = np.asarray(x)
        drafts = np.zeros(0, dtype=np.int64)
        tail = x[-self.ngram:]
        for i in range(len(x) - self.ngram - 1, -1, -1):  # the latest earlier occurrence first
            if np.array_equal(x[i:i + self.ngram], tail):
                drafts = x[i + self.ngram:i + self.ngram + K].astype(np.int64)
                break
        p = sampling.one_hot(drafts, self.n_vocab)  # deterministic proposals: the distribution is one-hot
        stats.record_call("draft", time.perf_counter() - start, steps=len(drafts))
        return drafts, p


def tokens_at_one_step(flops_per_second, bytes_per_second, bytes_per_parameter):
    return flops_per_second * bytes_per_parameter / (2 * bytes_per_second)


def alpha_from_origins(origins):
    accepted, rejected = origins.count("accepted"), origins.count("corrected")
    return accepted / (accepted + rejected) if accepted + rejected else None


bug_quiz = {"A": 5, "B": 4, "C": 1, "D": 3, "E": 2}  # the proof step each breaks (see 11 above)


def tokens_per_loop_variance(alpha, K):
    t = np.arange(1, K + 2)
    at_least = float(alpha) ** (t - 1)  # P(T >= t)
    return float(((2 * t - 1) * at_least).sum() - at_least.sum() ** 2)


def time_for_tokens(alpha, K, c, v, N):  # -> (mean, standard deviation) of the time for N tokens, in decode steps
    mean_tokens, variance = tokens_per_loop(alpha, K), tokens_per_loop_variance(alpha, K)
    loop_cost = K * c + v
    return loop_cost * N / mean_tokens, loop_cost * math.sqrt(N * variance / mean_tokens**3)


def break_even_batch(weight_bytes, bytes_per_parameter, bytes_per_second, flops_per_second, alpha, c, K):
    ridge = flops_per_second * bytes_per_parameter / (2 * bytes_per_second)  # m*: rows the reading hides
    margin = tokens_per_loop(alpha, K) - K * c  # the verification cost v at which the speedup is 1
    return ridge * margin / (K + 1) if margin > 1 else 0.0


def implied_alpha(target_speedup, c, K, v=1.0):  # -> the alpha whose expected speedup is target_speedup
    if not speedup(0.0, c, K, v) <= target_speedup <= speedup(1.0, c, K, v):
        raise ValueError(f"a speedup of {target_speedup} needs no alpha in [0, 1]: they give "
                         f"{speedup(0.0, c, K, v):.3g}x to {speedup(1.0, c, K, v):.3g}x")
    low, high = 0.0, 1.0
    for _ in range(60):  # the speedup grows with alpha: bisection
        middle = (low + high) / 2
        low, high = (middle, high) if speedup(middle, c, K, v) < target_speedup else (low, middle)
    return (low + high) / 2


ANSWERS = {1: tokens_per_loop, 2: speedup, 3: acceptance_rate, 4: pays, 5: best_K, 6: one_step_output,
           7: corrected_speedup, "7b": underestimate, 8: PromptLookupDraft, 9: tokens_at_one_step,
           10: alpha_from_origins, 11: bug_quiz, 12: tokens_per_loop_variance, "12b": time_for_tokens,
           13: break_even_batch, 14: implied_alpha, "block": Fraction(7, 8)}
