"""Solutions to notebook 9's exercises, with the reasoning. A teacher may withhold this folder from a class.

1. Tokens per loop. A loop yields 1 + (the drafts accepted before the first rejection): the last token, a
   correction or the bonus, always comes. At least i drafts are accepted with probability alpha^i (i <= K), so
   E = 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha), and K + 1 at alpha = 1. By hand, alpha = 0.8,
   K = 4: 1 + 0.8 + 0.64 + 0.512 + 0.4096 = 3.3616.

2. Speedup. A loop costs K draft steps (c each) and one verification (v), K c + v decode steps, where plain
   decoding makes one token per step: speedup = E / (K c + v). By hand, alpha = 0.8, c = 0.1, K = 4, v = 1:
   3.3616 / 1.4 = 2.40; with v = 1.6 (a CPU that scores 5 tokens for 1.6 steps), 3.3616 / 2.0 = 1.68.

3. alpha = 1 - TV(p, q). A draft x is drawn with probability p(x) and kept with probability min(1, q(x)/p(x)),
   so P(accept) = sum_x min(p(x), q(x)). Since min(a, b) = (a + b - |a - b|) / 2 and p, q both sum to 1, that is
   1 - (1/2) sum |p - q| = 1 - TV(p, q).

4. Speculation pays for some K exactly when alpha > c (with v = 1). K = 1 gives (1 + alpha) / (1 + c), above 1
   exactly when alpha > c. Conversely, if alpha <= c, then for every K, 1 + alpha + ... + alpha^K <= 1 + K alpha
   <= 1 + K c (each alpha^i <= alpha), so the speedup is at most 1. With v > 1 the bar rises: K = 1 needs
   1 + alpha > c + v.

5. The best K. Try them all: the speedup (1 - alpha^(K+1)) / (1 - alpha) / (K c + v(K)) first grows with K, as
   more tokens come per call, then falls, as the drafts and the verification cost more than the tokens they
   add; a search over 1..32 finds the top. If no K beats 1, decode plainly (answer 0). With alpha = 0.8,
   c = 0.1, v = 1 the best is K = 6 (2.47x); if verification costs 1 + 0.15 K steps, K = 3 (1.69x).

6. Argmax drafts with a one-hot p are exact. Drafting the argmax a with p = one-hot(a): the draft is accepted with
   probability min(1, q(a) / 1) = q(a), and on rejection (probability 1 - q(a)) the correction comes from
   (q - one-hot(a))+ = q on every other token, normalised by 1 - q(a). So a comes out with probability q(a) and
   every other x with (1 - q(a)) q(x) / (1 - q(a)) = q(x): exactly q. It is jaymody#3's bug that breaks this: the
   argmax drafted, the soft p in the ratio.

7. The published formula alpha (1 - alpha^K) / (1 - alpha) = alpha + ... + alpha^K is the expected number of
   *accepted drafts*. Used as the tokens a target call yields, it drops the loop's final token (the correction or
   the bonus), which always comes: the tokens are 1 + alpha (1 - alpha^K) / (1 - alpha) = (1 - alpha^(K+1)) /
   (1 - alpha). The speedup it gives is low by exactly 1 / (K c + 1): at alpha = 0.5, c = 0.1, K = 4 it says
   0.67x (speculation loses) where the truth is 1.38x, 0.71 more.

8. A prompt-lookup draft proposes the tokens that followed the latest earlier occurrence of the text's last
   `ngram` tokens (Saxena's prompt-lookup decoding, transformers' prompt_lookup_num_tokens). Its proposals are
   deterministic, so the distribution each came from is one-hot: with that p, exercise 6 shows the rule stays
   exact, whatever the proposals.

9. Roofline. A step reads every weight once: P b / B seconds for P weights of b bytes at bandwidth B. Scoring m
   tokens multiplies each weight by m rows, 2 m P flops, 2 m P / F seconds at F flop/s. While the arithmetic
   hides under the reading, verification costs one step: 2 m P / F <= P b / B, i.e. m <= F b / (2 B). An H100
   in bfloat16 (989 TFLOP/s, 3.35 TB/s, b = 2): about 295 tokens. One core of this CPU (about 80 GFLOP/s float32,
   30 GB/s, b = 4): about 5, and the README measures 5 tokens at 1.2 decode steps on the Zen 5 with column panels.

10. alpha from a run. Each corrected token is one judged draft that was rejected; each accepted token one that
    was accepted; bonus tokens and plain target steps judge none. So alpha = accepted / (accepted + corrected).
    accepted / drafted would count the drafts after a rejection, which are never judged, as failures.
"""

import time

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


def best_K(alpha, c, verify_cost, K_max=32):
    speedups = {K: speedup(alpha, c, K, verify_cost(K)) for K in range(1, K_max + 1)}
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


ANSWERS = {1: tokens_per_loop, 2: speedup, 3: acceptance_rate, 4: pays, 5: best_K, 6: one_step_output,
           7: corrected_speedup, "7b": underestimate, 8: PromptLookupDraft, 9: tokens_at_one_step,
           10: alpha_from_origins}
