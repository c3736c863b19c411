"""Speculative sampling (Chen et al. 2023), beside the autoregressive sampling it accelerates.

Put the paper next to this file. `autoregressive_sampling` is Algorithm 1 and `speculative_sampling`
Algorithm 2, in the paper's names: x the token sequence, n its current length, T the length to reach (the
prompt's length plus N), K the number of tokens drafted per loop, p the draft model's next-token
distribution and q the target model's. `greedy_assisted_generation` is Hugging Face's greedy variant, whose
K adapts from loop to loop. Every decoder returns x followed by exactly N new tokens, as an int64 array.

A model is either the project's (gpt2.GPT2Model: `model.logits(x, n_last)`, float32 logits of the last
n_last positions, from a KV cache that rolls back to the longest prefix of x it has read) or a plain
callable, jaymody/speculative-sampling's contract: `model(x)` gives probabilities [len(x), n_vocab].

Logits become probabilities by temperature, then top-k, then top-p (Hugging Face's order), alike for p and
q; temperature 0 is exact greedy decoding. Drafts are drawn from exactly the p in the ratio q/p. Randomness
comes only from `rng` (a numpy Generator, an int seed or None), one uniform number per decision, so a seed
repeats the tokens. `stats`, a SpeculativeStats (speedup/stats.py), gets a run's counters and timers;
`progress`, a function of the number of new tokens, follows it (e.g. tqdm's update).
"""

import math
import time
from dataclasses import dataclass

import numpy as np

from gpt2 import softmax  # one softmax for the model and the sampler
from speedup.stats import SpeculativeStats


def is_integer(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingSettings:
    """How logits become a next-token distribution: temperature, then top-k, then top-p."""

    temperature: float = 1.0  # 0 is greedy: all the mass on the argmax
    top_k: int = 0  # keep the k most likely tokens (and any tied with the k-th); 0 keeps all
    top_p: float = 1.0  # keep the fewest most likely tokens holding at least this mass; 1 keeps all

    def __post_init__(self):
        if not is_real(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not is_integer(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 keeps every token), got {self.top_k!r}")
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1] (1 keeps every token), got {self.top_p!r}")
        # Python scalars: a NumPy float64 temperature would turn float32 logits into float64
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(self.top_p))

    def is_identity(self):
        return self.temperature == 1 and self.top_k == 0 and self.top_p == 1


GREEDY = SamplingSettings(temperature=0)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
FLOAT32_BELOW_ONE = 1 - 2**-24  # the largest float32 below 1


# ---- the decoders ------------------------------------------------------------------------------------


def autoregressive_sampling(x, model, N, rng=None, *, temperature=1.0, top_k=0, top_p=1.0, stats=None,
                            progress=None):
    """Algorithm 1: sample N tokens from the model (the paper's target q), one call per token.
    temperature=1.0 samples from the model's own distribution; main.py's default is 0, greedy."""
    settings = SamplingSettings(temperature, top_k, top_p)
    x, rng, stats, progress = prepare(x, N, [model], rng, stats, progress)
    n = len(x)  # initialise n <- t, the prompt's length
    T = n + N
    while n < T:
        q = timed_probs(model, x, 1, settings, stats, "target")[0]  # q(x | x_1..x_n)
        x = np.append(x, sample(q, rng))  # sample x_{n+1} ~ q(x | x_1..x_n)
        n += 1
        stats.record_tokens("target")
        progress(1)
    return x


def speculative_sampling(x, draft_model, target_model, N, K, rng=None, *, temperature=1.0, top_k=0, top_p=1.0,
                         stats=None, progress=None):
    """Algorithm 2: the draft proposes K tokens, the target scores them in one call and keeps a prefix.

    The paper counts t from 1; here t counts from 0, so the paper's drafted token x~_t is
    drafts[t - 1] and its p(x | x_1..x_n, x~_1..x~_{t-1}) is p[t - 1], and likewise for q.
    temperature=1.0 samples from the models' own distributions; main.py's default is 0, greedy."""
    settings = SamplingSettings(temperature, top_k, top_p)
    check_K(K)
    x, rng, stats, progress = prepare(x, N, [draft_model, target_model], rng, stats, progress)
    n = len(x)  # initialise n <- t, the prompt's length
    T = n + N
    while n < T:
        # The paper drafts K every loop and may overshoot T; drafting at most T - n - 1 yields at
        # most T - n tokens, so nothing is wasted or trimmed and no position passes T - 1.
        K_n = min(K, T - n - 1)
        stats.loops += 1
        # for t = 1 : K, sample draft x~_t ~ p(x | x_1..x_n, x~_1..x~_{t-1}) auto-regressively
        drafts, p = draw_drafts(draft_model, x, K_n, settings, rng, stats)
        K_n = len(drafts)  # a draft that is not a model may propose fewer (speedup/drafts.py); none makes a plain step
        stats.drafted += K_n
        x_draft = np.append(x, drafts)
        # in parallel, the K + 1 distributions q(x | x_1..x_n), ..., q(x | x_1..x_n, x~_1..x~_K): one call
        q = timed_probs(target_model, x_draft, K_n + 1, settings, stats, "target")
        n_loop_start = n
        for t in range(K_n):
            r = rng.random()  # r ~ U[0, 1]
            token = drafts[t]
            if accepts(r, q[t], p[t], token):  # accept: x_{n+1} <- x~_t
                x = np.append(x, token)
                n += 1
                stats.record_tokens("accepted")
            else:  # reject: sample x_{n+1} ~ (q - p)+ and exit the loop
                x = np.append(x, sample(max_fn(q[t] - p[t], fallback=q[t]), rng))
                n += 1
                stats.record_tokens("corrected")
                break
        else:  # all K drafts accepted: sample an extra token from q(x | x_1..x_n, x~_1..x~_K)
            x = np.append(x, sample(q[K_n], rng))
            n += 1
            stats.record_tokens("bonus" if K_n else "target")  # with no drafts, the target's own step
        progress(n - n_loop_start)
    return x


def greedy_assisted_generation(x, draft_model, target_model, N, K=5, *, stats=None, progress=None):
    """Hugging Face's assisted generation, greedy: exactly the target's greedy tokens, fewer target calls.

    The target scores the draft's K greedy tokens in one call, keeps the longest prefix matching its own greedy
    choices and adds its own next token. K follows Hugging Face's schedule: from K (5, as there), 2 more after
    a loop that accepted every draft, 1 fewer (never below 1) otherwise."""
    check_K(K)
    # draws from one-hot distributions do not depend on the uniform numbers: any generator will do
    x, rng, stats, progress = prepare(x, N, [draft_model, target_model], np.random.default_rng(0), stats, progress)
    n = len(x)
    T = n + N
    while n < T:
        K_n = min(K, T - n - 1)  # as in speculative_sampling: never past T
        stats.loops += 1
        drafts, _ = draw_drafts(draft_model, x, K_n, GREEDY, rng, stats)  # the draft's greedy continuation
        K_n = len(drafts)  # a draft that is not a model may propose fewer
        stats.drafted += K_n
        x_draft = np.append(x, drafts)
        q = timed_probs(target_model, x_draft, K_n + 1, GREEDY, stats, "target")
        target_choice = np.argmax(q, axis=-1)  # the target's greedy token after x and after each draft
        mismatches = np.flatnonzero(drafts != target_choice[:K_n])
        matches = int(mismatches[0]) if len(mismatches) else K_n
        x = np.append(x, target_choice[:matches + 1])  # the matching drafts, then the target's own token
        n += matches + 1
        stats.record_tokens("accepted", matches)
        stats.record_tokens("corrected" if matches < K_n else "bonus" if K_n else "target")
        progress(matches + 1)
        K = K + 2 if matches == K_n else max(1, K - 1)
    return x


# ---- what they call, in call order: checks, drafts, probabilities, the paper's two primitives --------


def check_K(K):
    if not is_integer(K) or K < 1:
        raise ValueError(f"K must be an integer >= 1, got {K!r}")


def prepare(x, N, models, rng, stats, progress):
    """Check the inputs once, before any model call; return x as int64 and the defaults filled in."""
    x = np.asarray(x)
    if x.ndim != 1 or len(x) == 0 or not (np.issubdtype(x.dtype, np.integer)):
        raise ValueError("x must be a non-empty 1-D sequence of token ids (start an empty prompt from <|endoftext|>)")
    if not is_integer(N) or N < 0:
        raise ValueError(f"N must be an integer >= 0, got {N!r}")
    vocab_sizes = {model.n_vocab for model in models if hasattr(model, "n_vocab")}
    if len(vocab_sizes) > 1:
        raise ValueError(f"the draft and the target must share a vocabulary, got sizes {sorted(vocab_sizes)}")
    for model in models:
        if hasattr(model, "n_vocab") and (x.min() < 0 or x.max() >= model.n_vocab):
            raise ValueError(f"token ids must lie in [0, {model.n_vocab}), got {x.min()}..{x.max()}")
        if hasattr(model, "n_ctx") and len(x) + N > model.n_ctx:
            raise ValueError(f"{len(x)} prompt tokens + {N} new ones exceed the model's context of {model.n_ctx}")
    rng = as_generator(rng)
    stats = SpeculativeStats() if stats is None else stats
    progress = progress or (lambda n_new: None)
    return x.astype(np.int64), rng, stats, progress


def as_generator(rng):
    """An int seed or None (fresh entropy) becomes a Generator; a Generator (anything with random()) is kept."""
    if rng is None or is_integer(rng):
        if rng is not None and rng < 0:
            raise ValueError(f"an rng seed must be an integer >= 0, got {rng!r}")
        return np.random.default_rng(rng)
    if not hasattr(rng, "random"):
        raise ValueError(f"rng must be a numpy.random.Generator, an integer seed or None, got {rng!r}")
    return rng


def draw_drafts(draft_model, x, K, settings, rng, stats):  # -> drafts [K_n <= K], p [K_n, n_vocab]
    """K tokens drawn auto-regressively from the draft model, with the distributions p they came from.

    A model with a `draft` method (the JAX model) takes all K steps in one device call, from uniform
    numbers we give it; the others take one call per token. A draft with a `propose` method
    (speedup/drafts.py, costs.AutoK) proposes at most K tokens with their p: maybe fewer, or none.
    """
    if hasattr(draft_model, "propose"):
        return checked_drafts(*draft_model.propose(x, K, settings, rng, stats))
    if hasattr(draft_model, "draft") and K > 0:
        start = time.perf_counter()
        # the model reads the uniforms as float32, where values this close to 1 would round up to 1
        uniforms = np.minimum(rng.random(K), FLOAT32_BELOW_ONE)
        drafts, p = draft_model.draft(x, K, uniforms, settings.temperature, settings.top_k, settings.top_p)
        stats.record_call("draft", time.perf_counter() - start, steps=K)
        return checked_drafts(np.asarray(drafts, dtype=np.int64), np.asarray(p, dtype=np.float32))
    x_draft, p = x, []
    for _ in range(K):
        p.append(timed_probs(draft_model, x_draft, 1, settings, stats, "draft")[0])
        x_draft = np.append(x_draft, sample(p[-1], rng))
    return x_draft[len(x):], p


def checked_drafts(drafts, p):  # p(x~) enters q/p: a drafter's must be finite and in (0, 1] (float32 rounding aside)
    for t, token in enumerate(drafts):
        if not 0 < float(p[t][token]) <= 1 + 1e-6:  # nan fails this too
            raise ValueError(f"a draft's p must be finite and in (0, 1] at its token, got {float(p[t][token])}")
    return drafts, p


def timed_probs(model, x, n_last, settings, stats, role):
    """next_token_probs, with the call and its time recorded under role "draft" or "target"."""
    start = time.perf_counter()
    probs = next_token_probs(model, x, n_last, settings)
    stats.record_call(role, time.perf_counter() - start)
    return probs


def next_token_probs(model, x, n_last, settings):  # -> [n_last, n_vocab] float32
    """The distributions of the tokens after each of the last n_last positions of x, either contract."""
    if hasattr(model, "logits"):
        return logits_to_probs(model.logits(x, n_last), settings)
    probs = np.asarray(model(x), dtype=np.float32)[-n_last:]
    if settings.is_identity():
        return probs
    with np.errstate(divide="ignore"):  # log(0) = -inf is right: the token stays impossible
        return logits_to_probs(np.log(probs), settings)


def logits_to_probs(logits, settings=SamplingSettings()):  # [..., n_vocab] -> [..., n_vocab] float32
    """Temperature, then top-k, then top-p; temperature 0 is a one-hot at the argmax (lowest id on ties)."""
    logits = np.asarray(logits, dtype=np.float32)
    if settings.temperature == 0:
        return one_hot(np.argmax(logits, axis=-1), logits.shape[-1])
    # subtract the max before dividing, so a tiny temperature cannot overflow to inf - inf = nan; below
    # float32's smallest normal number a temperature would round to 0 and give 0 / 0 at the argmax
    temperature = max(settings.temperature, FLOAT32_TINY)
    with np.errstate(over="ignore"):  # a huge scaled logit is -inf: probability 0, as it should be
        scaled = (logits - logits.max(axis=-1, keepdims=True)) / temperature
    if settings.top_k:
        scaled = keep_top_k(scaled, settings.top_k)
    probs = softmax(scaled)
    if settings.top_p < 1:
        probs = keep_top_p(probs, settings.top_p)
    return probs


def one_hot(ids, n):  # [...] -> [..., n] float32
    probs = np.zeros((*np.shape(ids), n), dtype=np.float32)
    np.put_along_axis(probs, np.expand_dims(ids, -1), 1.0, axis=-1)
    return probs


def keep_top_k(scores, k):  # [..., n] -> [..., n], -inf outside the k highest scores
    if k >= scores.shape[-1]:
        return scores
    kth_highest = np.partition(scores, -k, axis=-1)[..., -k, None]
    return np.where(scores < kth_highest, -np.inf, scores)


def keep_top_p(probs, top_p):  # [..., n] -> [..., n], renormalised over the nucleus
    """Keep a token when the tokens ranked above it hold less than top_p of the mass: the fewest most likely
    tokens holding at least top_p, ties ranked by id (a stable sort)."""
    rows = probs.reshape(-1, probs.shape[-1])  # [n_rows, n]
    row_index = np.arange(len(rows))[:, None]
    order = np.argsort(-rows, axis=-1, kind="stable")  # most likely first
    sorted_probs = rows[row_index, order]
    mass_above = sorted_probs.cumsum(axis=-1, dtype=np.float64) - sorted_probs
    keep = np.empty(rows.shape, dtype=bool)
    keep[row_index, order] = mass_above < top_p
    kept = np.where(keep, rows, 0).reshape(probs.shape)
    return kept / kept.sum(axis=-1, keepdims=True)


def accepts(r, q, p, token):  # the paper's test: keep x~ if r < min(1, q(x~) / p(x~)); strict: r = 0 keeps no q = 0
    return r < min(1.0, float(q[token]) / float(p[token]))


def sample(probs, rng):  # [n_vocab] -> a token id
    """Draw a token by inverse CDF with one uniform number, never one of probability zero: the CDF is summed in
    float64 and scaled by its total, so rounding cannot fall off its end, and searchsorted(side="right") gives the
    first token whose cumulative mass exceeds u. A one-hot row (temperature 0) has a one-step CDF: it skips the
    sum, but draws its uniform all the same, so the uniforms after it are those the general case would see."""
    rng = as_generator(rng)
    if np.count_nonzero(probs) == 1:
        rng.random()
        return int(np.argmax(probs))
    u = rng.random()
    if hasattr(u, "inverse_cdf"):  # classroom/exact_law.py's symbolic uniform branches over the tokens itself
        return u.inverse_cdf(probs)
    cdf = probs.cumsum(dtype=np.float64)
    u = u * cdf[-1]
    token = int(np.searchsorted(cdf, u, side="right"))
    if token == len(cdf):  # u rounded up to the total itself
        token = int(np.flatnonzero(probs)[-1])
    return token


def max_fn(x, fallback=None):  # [n_vocab] -> [n_vocab]
    """The paper's (f)+ = max(0, f) / sum(max(0, f)), used on f = q - p. Where nothing is positive (q equals p
    up to rounding, so the rejection was a rounding accident), `fallback` (q) is the right distribution."""
    positive = np.maximum(x, 0)
    total = np.sum(positive)
    if total > 0:
        return positive / total
    if fallback is None:
        raise ValueError("max_fn: no entry is positive and no fallback was given")
    return fallback
