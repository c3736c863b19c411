"""Autoregressive and speculative sampling over B sequences at once, each row exactly as sampling.py decodes it.

Put sampling.py beside this file: `autoregressive_sampling` is its Algorithm 1 and `speculative_sampling`
its Algorithm 2, in the same names (x, n, T, K, p, q), for a list of rows. Every model call feeds all the
rows that need it in one batched forward pass (gpt2_batched.BatchedGPT2Model), which reads the weights once
for all of them; everything a row decides, it decides alone:

- Each row has its own numpy Generator and consumes it in sampling.py's order (per loop: one uniform
  per draft as it is drawn, one r per judged draft, one for the correction or the bonus token), so row
  i gives exactly the tokens and statistics that sampling.py gives with row i's Generator.
- Each row drafts its own K_n = min(K, T_i - n_i - 1), accepts its own prefix, then takes its own
  correction or bonus token, and stops at its own length T_i. A row's rejection never cuts another
  row's drafts: the rows only share the model calls.

Where it differs from sampling.py, and why: the draft's step t feeds only the rows still drafting (near
its end a row drafts fewer than K); the target scores every unfinished row in one call, each at its
own K_n + 1 positions; finished rows leave the batch and cost nothing. Logits of a batched product can
differ from a single row's in the last bits of float32, so a draw that falls within rounding of a
boundary could differ from the batch-1 run's; the tests compare tokens and counts exactly.

Statistics: a `BatchStats` holds one SpeculativeStats (speedup/stats.py) per row (row i's counters and origins
equal the batch-1 run's; each row's target_calls counts the batched calls it took part in, and the
seconds of those calls) and the batch's own totals: how many batched calls were made, and their time.
"""

import time

import numpy as np

import sampling
from sampling import SamplingSettings, accepts, is_integer, logits_to_probs, max_fn, sample
from speedup.stats import SpeculativeStats


class BatchStats:
    """Per-row statistics (`rows`, a SpeculativeStats each) and the batch's own calls and time."""

    def __init__(self, batch_size):
        self.rows = [SpeculativeStats() for _ in range(batch_size)]
        self.loops = 0  # batched loops (speculative): each drafts for, and scores, every unfinished row
        self.target_calls = 0  # batched calls of the target, each scoring every unfinished row
        self.draft_calls = 0  # batched steps of the draft, each drawing one token for every row still drafting
        self.target_seconds = 0.0
        self.draft_seconds = 0.0

    def record_call(self, role, seconds, rows):
        """One batched call: the batch counts it once, each row that took part counts it (and its time)."""
        if role == "draft":
            self.draft_calls += 1
            self.draft_seconds += seconds
        else:
            self.target_calls += 1
            self.target_seconds += seconds
        for row in rows:
            self.rows[row].record_call(role, seconds)

    def total(self, name):  # a counter summed over the rows
        return sum(getattr(row, name) for row in self.rows)

    @property
    def generated(self):
        return self.total("generated")

    @property
    def acceptance_rate(self):  # the rows' alpha pooled: all accepted / all judged
        judged = self.total("accepted") + self.total("rejected")
        return self.total("accepted") / judged if judged else None

    @property
    def tokens_per_target_call(self):  # new tokens of all rows per batched target call
        return self.generated / self.target_calls if self.target_calls else None

    def as_dict(self):
        totals = {name: self.total(name) for name in ("drafted", "accepted", "rejected", "generated")}
        return {"loops": self.loops, "target_calls": self.target_calls, "draft_calls": self.draft_calls,
                "target_seconds": self.target_seconds, "draft_seconds": self.draft_seconds, **totals,
                "acceptance_rate": self.acceptance_rate, "tokens_per_target_call": self.tokens_per_target_call}


def timed_probs(model, xs, rows, n_last, settings, stats, role):  # -> [len(rows), max(n_last), n_vocab]
    """One batched call: the distributions after each row's last n_last positions, right-aligned (row i's
    are [i, -n_last_i:]), recorded under role "draft" or "target"."""
    start = time.perf_counter()
    probs = logits_to_probs(model.logits(xs, n_last, rows), settings)
    stats.record_call(role, time.perf_counter() - start, rows)
    return probs


def prepare_rows(xs, N, models, rngs, stats, progress):
    """sampling.prepare for every row: -> (x: the rows as int64 arrays, T per row, Generators, stats, progress).

    N: new tokens for every row, or one count per row. rngs: one Generator or int seed per row (None:
    fresh entropy for every row).
    """
    if not len(xs) or any(np.ndim(row) != 1 for row in xs):
        raise ValueError("xs must be a non-empty list of token sequences, one per row")
    B = len(xs)
    for model in models:
        if hasattr(model, "batch_size") and B > model.batch_size:
            raise ValueError(f"{B} rows exceed the model's batch of {model.batch_size}")
    Ns = [N] * B if is_integer(N) else list(N)
    if hasattr(rngs, "random") or is_integer(rngs):  # one Generator or seed for all rows would tie them together
        raise ValueError(f"rngs must hold one Generator or seed per row, got {rngs!r}")
    rngs = [None] * B if rngs is None else list(rngs)
    if len(Ns) != B or len(rngs) != B:
        raise ValueError(f"need one N and one Generator (or seed) per row: {B} rows, {len(Ns)} N, {len(rngs)} rngs")
    stats = BatchStats(B) if stats is None else stats
    if len(stats.rows) != B:
        raise ValueError(f"stats holds {len(stats.rows)} rows for a batch of {B}")
    x, T = [], []
    for i in range(B):
        row, rngs[i], _, _ = sampling.prepare(xs[i], Ns[i], models, rngs[i], stats.rows[i], None)
        x.append(row)
        T.append(len(row) + Ns[i])
    if len({id(rng) for rng in rngs}) < B:
        raise ValueError("every row needs its own Generator: rows sharing one would not decode as they do alone")
    return x, T, rngs, stats, progress or (lambda n_new: None)


def extended(x, tokens):  # [n] int64, a list of ids -> [n + len(tokens)] int64 (np.append would make [] float64)
    return np.concatenate([x, np.asarray(tokens, dtype=np.int64)])


def unfinished(x, T):  # the rows still short of their length T_i, in order
    return [i for i in range(len(x)) if len(x[i]) < T[i]]


# ---- the decoders -------------------------------------------------------------------------------


def autoregressive_sampling(xs, model, N, rngs=None, *, temperature=1.0, top_k=0, top_p=1.0, stats=None,
                            progress=None):
    """Algorithm 1 for every row: one batched target call per step, until each row has its N new tokens.

    -> a list of int64 arrays, row i being xs[i] followed by its N (or N[i]) new tokens.
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    x, T, rngs, stats, progress = prepare_rows(xs, N, [model], rngs, stats, progress)
    while rows := unfinished(x, T):
        q = timed_probs(model, [x[i] for i in rows], rows, 1, settings, stats, "target")[:, 0]  # q(x | x_1..x_n)
        for i, q_row in zip(rows, q):
            x[i] = np.append(x[i], sample(q_row, rngs[i]))  # sample x_{n+1} ~ q(x | x_1..x_n), each row with its rng
            stats.rows[i].record_tokens("target")
        progress(len(rows))
    return x


def speculative_sampling(xs, draft_model, target_model, N, K, rngs=None, *, temperature=1.0, top_k=0, top_p=1.0,
                         stats=None, progress=None):
    """Algorithm 2 for every row: per loop, the rows draft together, the target scores them in one call,
    and each row keeps its own accepted prefix and its own correction or bonus token.

    -> a list of int64 arrays, row i being xs[i] followed by its N (or N[i]) new tokens.
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    sampling.check_K(K)
    x, T, rngs, stats, progress = prepare_rows(xs, N, [draft_model, target_model], rngs, stats, progress)
    while rows := unfinished(x, T):
        K_n = {i: min(K, T[i] - len(x[i]) - 1) for i in rows}  # each row's own room, as in sampling.py
        stats.loops += 1
        drafts, p = draw_drafts(draft_model, x, rows, K_n, settings, rngs, stats)
        x_draft = [extended(x[i], drafts[i]) for i in rows]
        # every row's K_n + 1 distributions q(x | x_1..x_n), ..., q(x | x_1..x_n, x~_1..x~_K_n) in one call
        q = timed_probs(target_model, x_draft, rows, [K_n[i] + 1 for i in rows], settings, stats, "target")
        q = {i: q[row, q.shape[1] - K_n[i] - 1:] for row, i in enumerate(rows)}
        n_before = sum(len(x[i]) for i in rows)
        for i, (new_tokens, accepted) in zip(rows, judge_rows(rows, drafts, p, q, rngs)):
            x[i] = extended(x[i], new_tokens)
            row_stats = stats.rows[i]
            row_stats.loops += 1
            row_stats.drafted += K_n[i]
            row_stats.record_tokens("accepted", accepted)
            row_stats.record_tokens("corrected" if accepted < K_n[i] else "bonus" if K_n[i] else "target")
        progress(sum(len(x[i]) for i in rows) - n_before)
    return x


def draw_drafts(draft_model, x, rows, K_n, settings, rngs, stats):  # -> drafts {row: [K_n]}, p {row: [K_n, n_vocab]}
    """Each row's K_n drafts, drawn auto-regressively from the draft model as sampling.draw_drafts draws them.

    Step t is one batched call for the rows still drafting (K_n > t); each row draws its token from its
    own p with one uniform from its own Generator, and that p is the one that enters its ratio q/p.
    """
    drafts, p = {i: [] for i in rows}, {i: [] for i in rows}
    for t in range(max(K_n.values())):
        drafting = [i for i in rows if K_n[i] > t]
        p_t = timed_probs(draft_model, [extended(x[i], drafts[i]) for i in drafting], drafting, 1, settings, stats,
                          "draft")[:, 0]
        for i, p_row in zip(drafting, p_t):
            drafts[i].append(sample(p_row, rngs[i]))
            p[i].append(p_row)
    return drafts, p


def judge_rows(rows, drafts, p, q, rngs):  # -> per row (its new tokens, how many drafts it accepted)
    return [judge(drafts[i], p[i], q[i], rngs[i]) for i in rows]


def judge(drafts, p, q, rng):  # one row's drafts [K_n], p [K_n, n_vocab], q [K_n + 1, n_vocab]
    """sampling.speculative_sampling's acceptance loop for one row: -> (its new tokens, drafts accepted).

    Accept x~_t with probability min(1, q(x~_t) / p(x~_t)) until the first rejection, which is replaced by
    a token from max_fn(q - p) = (q - p)+; if all K_n are accepted, add one from q(x | .., x~_K_n).
    """
    for t, token in enumerate(drafts):
        r = rng.random()  # r ~ U[0, 1]
        if not accepts(r, q[t], p[t], token):  # reject: x_{n+t+1} ~ (q - p)+, stop
            return [*drafts[:t], sample(max_fn(q[t] - p[t], fallback=q[t]), rng)], t
    return [*drafts, sample(q[len(drafts)], rng)], len(drafts)  # all accepted: the bonus token
