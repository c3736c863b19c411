"""Speculative sampling (Chen et al. 2023), beside the autoregressive sampling it accelerates.

Put the paper next to this file. `autoregressive_sampling` is Algorithm 1 and `speculative_sampling`
is Algorithm 2, with the paper's names: x the token sequence, n its current length, T the length to
reach (the prompt's length plus N), K the number of tokens drafted per loop, p the draft model's
next-token distribution and q the target model's. `greedy_assisted_generation` is Hugging Face's
greedy variant, whose K adapts from loop to loop. Every decoder returns x followed by exactly N new
tokens, as an int64 array.

Two model contracts are accepted, told apart by `hasattr(model, "logits")`:

- The project's models (gpt2.GPT2Model): `model.logits(x, n_last)` gives float32 logits of the last
  n_last positions of x, and `n_vocab`, `n_ctx` say what the model accepts. They keep a KV cache and
  roll it back to the longest prefix of x they have already read, so drafts that were rejected
  simply vanish on the next call; the target scores all K + 1 positions in one call.
- Plain callables, the model contract of jaymody/speculative-sampling (built on jaymody/picoGPT),
  whose function names and arguments this module keeps: `model(x)` gives probabilities
  [len(x), n_vocab] for every position. With the default settings they are used as given: such
  callables usually bake in their own temperature. Other settings are applied to their
  log-probabilities, which is the same as applying them to logits, since
  softmax(log softmax(z) / t) = softmax(z / t).

Logits become probabilities by temperature, then top-k, then top-p (Hugging Face's order), the same
way for p and q, before the rejection rule compares them. Temperature 0 is exact greedy decoding:
all the mass on the argmax, ties going to the lowest id. Drafts are drawn from exactly the p that
enters the ratio q/p, and `sample` never returns a token of probability zero.

Randomness comes only from `rng`, one uniform number per decision, so the same seed gives the same
tokens: a numpy Generator, or as with numpy.random.default_rng an int seed or None (fresh entropy).
Pass a `SpeculativeStats` as `stats` to read the counters and timers of a run; pass `progress`, a function
of the number of new tokens, to follow it (e.g. tqdm's update).
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np

from gpt2 import softmax  # one softmax for the model and the sampler


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


# ---- logits -> probabilities -------------------------------------------------------------------


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
    """Keep a token when the tokens ranked above it hold less than top_p of the mass.

    That is the smallest set of most likely tokens holding at least top_p; the most likely token is
    always kept. Equal probabilities rank by id (a stable sort), so the result is deterministic.
    """
    rows = probs.reshape(-1, probs.shape[-1])  # [n_rows, n]
    row_index = np.arange(len(rows))[:, None]
    order = np.argsort(-rows, axis=-1, kind="stable")  # most likely first
    sorted_probs = rows[row_index, order]
    mass_above = sorted_probs.cumsum(axis=-1, dtype=np.float64) - sorted_probs
    keep = np.empty(rows.shape, dtype=bool)
    keep[row_index, order] = mass_above < top_p
    kept = np.where(keep, rows, 0).reshape(probs.shape)
    return kept / kept.sum(axis=-1, keepdims=True)


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


def next_token_probs(model, x, n_last, settings):  # -> [n_last, n_vocab] float32
    """The distributions of the tokens after each of the last n_last positions of x, either contract."""
    if hasattr(model, "logits"):
        return logits_to_probs(model.logits(x, n_last), settings)
    probs = np.asarray(model(x), dtype=np.float32)[-n_last:]
    if settings.is_identity():
        return probs
    with np.errstate(divide="ignore"):  # log(0) = -inf is right: the token stays impossible
        return logits_to_probs(np.log(probs), settings)


# ---- the two primitives of the paper ---------------------------------------------------------------


def as_generator(rng):
    """rng as numpy.random.default_rng reads it: an int seed or None (fresh entropy) becomes a Generator.

    A Generator, or any object with Generator's random(), is used as given.
    """
    if rng is None or is_integer(rng):
        if rng is not None and rng < 0:
            raise ValueError(f"an rng seed must be an integer >= 0, got {rng!r}")
        return np.random.default_rng(rng)
    if not hasattr(rng, "random"):
        raise ValueError(f"rng must be a numpy.random.Generator, an integer seed or None, got {rng!r}")
    return rng


def sample(probs, rng):  # [n_vocab] -> a token id
    """Draw a token by inverse CDF with one uniform number; a token of probability zero is never drawn.

    rng: a Generator, or an int seed or None as numpy.random.default_rng takes them.

    The CDF is summed in float64 and scaled by its total, so float32 rounding in probs cannot make
    the draw fall off the end. searchsorted(side="right") returns the first token whose cumulative
    mass exceeds u, and such a token adds mass, so its probability is positive.
    """
    cdf = probs.cumsum(dtype=np.float64)
    u = as_generator(rng).random() * cdf[-1]
    token = int(np.searchsorted(cdf, u, side="right"))
    if token == len(cdf):  # u rounded up to the total itself
        token = int(np.flatnonzero(probs)[-1])
    return token


def max_fn(x, fallback=None):  # [n_vocab] -> [n_vocab]
    """The paper's (f)+ = max(0, f) / sum(max(0, f)), used on f = q - p.

    When q equals p, up to rounding, nothing is positive and there is nothing to normalise; then
    rejection itself was a rounding accident and `fallback` (q) is the right distribution.
    """
    positive = np.maximum(x, 0)
    total = np.sum(positive)
    if total > 0:
        return positive / total
    if fallback is None:
        raise ValueError("max_fn: no entry is positive and no fallback was given")
    return fallback


# ---- statistics --------------------------------------------------------------------------------


def expected_tokens_per_loop(a, K):
    """Tokens a loop yields when each draft is accepted with probability a: 1 + a + ... + a^K."""
    return K + 1 if a == 1 else (1 - a ** (K + 1)) / (1 - a)


def expected_speedup(a, c, K, v=1.0):
    """Leviathan et al.'s expected speedup over autoregressive decoding, with the verification's real cost.

    a: acceptance rate; c: a draft step's cost in target *decode steps* (one token after a cached prefix);
    K: drafts per loop; v: what the target's call scoring the K + 1 positions costs, in decode steps.
    A loop costs K c + v decode steps and yields expected_tokens_per_loop(a, K) tokens, where
    autoregressive decoding yields one token per step. v = 1 is the paper's idealisation (verification
    as cheap as one step, true on an accelerator); on a CPU it is often 1.2 to 3 (costs.py measures it).
    """
    if not 0 <= a <= 1 or c < 0 or K < 0 or v <= 0:
        raise ValueError(f"expected_speedup needs 0 <= a <= 1, c >= 0, K >= 0, v > 0; got a={a}, c={c}, K={K}, v={v}")
    return expected_tokens_per_loop(a, K) / (K * c + v)


@dataclass
class SpeculativeStats:
    """What a decoder did: model calls, their time, drafts, and where every new token came from.

    A decoder adds to the counters, so one object can also sum several runs.
    """

    loops: int = 0
    target_calls: int = 0
    draft_calls: int = 0  # forward steps of the draft model, one per drafted token
    drafted: int = 0
    accepted: int = 0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    # the target's decode step (one token after a cached prefix), measured apart from this run by whoever
    # knows it (costs.measure_costs, or an autoregressive run): the unit of the cost ratio and of verify_steps
    decode_step_seconds: float = None
    # per new token: "target" (autoregressive), "accepted" (a draft), "corrected" (resampled after a
    # rejection) or "bonus" (the extra token after all K drafts were accepted)
    origins: list = field(default_factory=list)

    def __repr__(self):  # the counters and alpha; origins, one entry per token, would bury them
        counters = ", ".join(f"{name}={getattr(self, name)}" for name in
                             ["loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "generated"])
        alpha = "None" if self.acceptance_rate is None else f"{self.acceptance_rate:.3f}"
        return (f"SpeculativeStats({counters}, acceptance_rate={alpha}, target_seconds={self.target_seconds:.3f}, "
                f"draft_seconds={self.draft_seconds:.3f})")

    def record_call(self, role, seconds, steps=1):
        if role == "draft":
            self.draft_calls += steps  # a fused call drafting K tokens counts as K calls
            self.draft_seconds += seconds
        else:
            self.target_calls += 1
            self.target_seconds += seconds

    def record_tokens(self, origin, count=1):
        self.origins.extend([origin] * count)
        if origin == "accepted":
            self.accepted += count

    @property
    def generated(self):
        return len(self.origins)

    @property
    def rejected(self):  # drafts the target judged and refused; the drafts after them are never judged
        return self.origins.count("corrected")

    @property
    def acceptance_rate(self):  # None when nothing was judged
        """Leviathan et al.'s alpha: the chance that a draft the target judges is accepted.

        A loop stops at its first rejection and discards the rest of its drafts unjudged, so
        accepted / drafted would understate alpha (and more so the larger K is); accepted /
        (accepted + rejected) is its maximum-likelihood estimate, the a of expected_speedup.
        """
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else None

    @property
    def accepted_per_loop(self):  # the paper's Figure 1 plots this divided by K + 1
        return self.accepted / self.loops if self.loops else None

    @property
    def tokens_per_target_call(self):
        return self.generated / self.target_calls if self.target_calls else None

    @property
    def draft_step_seconds(self):  # a draft step in this run (a lookup, for a draft that is not a model)
        return self.draft_seconds / self.draft_calls if self.draft_calls else None

    @property
    def verify_seconds(self):  # a target call in this run: in a speculative run, the scoring of K + 1 positions
        return self.target_seconds / self.target_calls if self.target_calls else None

    @property
    def cost_ratio(self):  # Leviathan et al.'s c: a draft step / a target decode step
        if self.draft_step_seconds is None or not self.decode_step_seconds:
            return None
        return self.draft_step_seconds / self.decode_step_seconds

    @property
    def verify_steps(self):  # v: a target call of this run, in decode steps (about v(K + 1) of costs.py)
        if self.verify_seconds is None or not self.decode_step_seconds:
            return None
        return self.verify_seconds / self.decode_step_seconds

    @property
    def expected_speedup(self):
        """The formula's speedup from this run's alpha, drafts per loop, c and measured verification cost."""
        if self.acceptance_rate is None or self.cost_ratio is None:
            return None
        return expected_speedup(self.acceptance_rate, self.cost_ratio, self.drafted / self.loops, self.verify_steps)

    @property
    def expected_speedup_one_step(self):
        """The same with verification at one decode step's price (v = 1), the paper's idealisation."""
        if self.acceptance_rate is None or self.cost_ratio is None:
            return None
        return expected_speedup(self.acceptance_rate, self.cost_ratio, self.drafted / self.loops)

    def as_dict(self):
        names = ["loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "target_seconds",
                 "draft_seconds", "generated", "acceptance_rate", "accepted_per_loop", "tokens_per_target_call",
                 "decode_step_seconds", "draft_step_seconds", "verify_seconds", "cost_ratio", "verify_steps",
                 "expected_speedup", "expected_speedup_one_step"]
        return {name: getattr(self, name) for name in names}


def timed_probs(model, x, n_last, settings, stats, role):
    """next_token_probs, with the call and its time recorded under role "draft" or "target"."""
    start = time.perf_counter()
    probs = next_token_probs(model, x, n_last, settings)
    stats.record_call(role, time.perf_counter() - start)
    return probs


def draw_drafts(draft_model, x, K, settings, rng, stats):  # -> drafts [K_n <= K], p [K_n, n_vocab]
    """K tokens drawn auto-regressively from the draft model, with the distributions p they came from.

    A model with a `draft` method (the JAX model) takes all K steps in one device call, drawing each
    token by inverse CDF from the uniform numbers we give it; the others take one call per token.
    Either way every drafted token is drawn from exactly the row of p that enters the ratio q/p.
    A draft with a `propose` method (drafts.py: prompt lookup, K chosen by costs) proposes at most K
    tokens itself, with their p, and records its own time: it may propose fewer, or none.
    """
    if hasattr(draft_model, "propose"):
        return draft_model.propose(x, K, settings, rng, stats)
    if hasattr(draft_model, "draft") and K > 0:
        start = time.perf_counter()
        # the model reads the uniforms as float32, where values this close to 1 would round up to 1
        uniforms = np.minimum(rng.random(K), FLOAT32_BELOW_ONE)
        drafts, p = draft_model.draft(x, K, uniforms, settings.temperature, settings.top_k, settings.top_p)
        stats.record_call("draft", time.perf_counter() - start, steps=K)
        return np.asarray(drafts, dtype=np.int64), np.asarray(p, dtype=np.float32)
    x_draft, p = x, []
    for _ in range(K):
        p.append(timed_probs(draft_model, x_draft, 1, settings, stats, "draft")[0])
        x_draft = np.append(x_draft, sample(p[-1], rng))
    return x_draft[len(x):], p


# ---- input checks ------------------------------------------------------------------------------


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


def check_K(K):
    if not is_integer(K) or K < 1:
        raise ValueError(f"K must be an integer >= 1, got {K!r}")


# ---- the decoders -------------------------------------------------------------------------------


def autoregressive_sampling(x, model, N, rng=None, *, temperature=1.0, top_k=0, top_p=1.0, stats=None,
                            progress=None):
    """Algorithm 1: sample N tokens from the model (the paper's target q), one call per token.

    temperature=1.0 samples from the model's own distribution; main.py's default is 0, greedy.
    """
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
    temperature=1.0 samples from the models' own distributions; main.py's default is 0, greedy.
    """
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
        K_n = len(drafts)  # a draft that is not a model may propose fewer (drafts.py); none makes a plain step
        stats.drafted += K_n
        x_draft = np.append(x, drafts)
        # in parallel, the K + 1 distributions q(x | x_1..x_n), ..., q(x | x_1..x_n, x~_1..x~_K): one call
        q = timed_probs(target_model, x_draft, K_n + 1, settings, stats, "target")
        n_loop_start = n
        for t in range(K_n):
            r = rng.random()  # r ~ U[0, 1]
            token = drafts[t]
            if r < min(1.0, float(q[t][token]) / float(p[t][token])):  # accept: x_{n+1} <- x~_t
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

    The draft proposes its K greedy tokens; the target scores them in one call and keeps the longest
    prefix that matches its own greedy choices, then adds its own next token. K adapts with Hugging
    Face's schedule: it starts at K (5 by default, as there), grows by 2 after a loop that accepted
    every draft and shrinks by 1 (never below 1) otherwise.
    """
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
