"""Is a speculative decoder lossless? `check_lossless(decoder)` answers on problems whose answer is exact.

Speculative sampling promises that its tokens follow the target distribution q exactly, whatever the
draft (Chen et al. 2023; Leviathan et al. 2023, Appendix A). A plausible bug breaks that
promise silently: the text still reads well. This module tests the promise the way a statistician would:

- small problems built from next-token tables (a vocabulary of four or five tokens, a draft and a target
  whose next-token logits depend on the last two tokens, zeros in both where the other has mass), where
  the exact distribution of the first generated tokens under the target is a finite product;
- the decoder run thousands of times on each, with several K, temperatures, top-k and top-p, through both
  of sampling.py's model contracts: plain callables (probabilities for every position) and cached models
  (`logits(x, n_last)`, with a position-indexed cache that resumes through kvcache.contract.cache_resume, the
  decision every cached model takes, so cache bookkeeping bugs show up here too);
- Pearson's chi-square test of the joint counts of the first two or three generated tokens against the
  exact joint distribution, one test per problem, combined by Bonferroni's rule: the decoder passes when
  every p-value exceeds ALPHA / (number of tests), and the reported p-value is the smallest one times the
  number of tests (at most 1). A sequence of probability zero, a greedy run that differs from
  autoregressive greedy decoding, or an output of the wrong length fails outright (p-value 0).

`decoder` has sampling.speculative_sampling's signature: decoder(x, draft_model, target_model, N, K, rng,
*, temperature, top_k, top_p) -> x followed by N new tokens. At the default sample size (8,700 runs) the
check takes 4 to 10 seconds on a 2-core CPU and detects a deviation of 0.05 in total variation from any one
problem's joint distribution (notebook 7 measures its power). `check_tokens_per_call` checks the speed
side: with a draft equal to the target every draft is accepted, so a loop must yield K + 1 tokens, the
formula's (1 - a^(K+1)) / (1 - a) at a = 1.
"""

import math
import time
from dataclasses import dataclass, field, replace
from itertools import product

import numpy as np

import sampling
from kvcache.contract import CachedModel
from kvcache.tree import check_tree

ALPHA = 1e-3  # the family-wise false-alarm rate: a lossless decoder fails one seed in a thousand

# ---- Pearson's chi-square test, without scipy -------------------------------------------------------


def regularized_upper_gamma(a, x):
    """Q(a, x) = Gamma(a, x) / Gamma(a): a power series for P = 1 - Q below a + 1, a continued fraction above."""
    if x <= 0:
        return 1.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # P(a, x) = e^-x x^a / Gamma(a + 1) * sum_n x^n / ((a + 1) ... (a + n))
        term = total = 1.0 / a
        n = 0
        while abs(term) > 1e-17 * abs(total):
            n += 1
            term *= x / (a + n)
            total += term
        return 1.0 - math.exp(log_prefactor) * total
    # Q(a, x) = e^-x x^a / Gamma(a) / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...)), by Lentz's method
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    fraction = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        fraction *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_prefactor) * fraction


def chi2_sf(statistic, df):
    """P(X >= statistic) for X ~ chi-square with df degrees of freedom."""
    return regularized_upper_gamma(df / 2, statistic / 2)


def chi_square_test(counts, probs, min_expected=5.0):  # -> (statistic, degrees of freedom, p-value)
    """Pearson's test of counts against probabilities; cells expected fewer than min_expected times are pooled.

    Cells of probability zero must be checked apart (a count there is an outright failure): they are skipped.
    """
    counts, probs = np.asarray(counts, dtype=np.float64), np.asarray(probs, dtype=np.float64)
    possible = probs > 0
    counts, expected = counts[possible], probs[possible] / probs[possible].sum() * counts.sum()
    small = expected < min_expected
    observed_cells = np.append(counts[~small], counts[small].sum())
    expected_cells = np.append(expected[~small], expected[small].sum())
    if expected_cells[-1] < min_expected:  # too little left to pool: fold it into the largest cell
        largest = np.argmax(expected_cells[:-1])
        observed_cells[largest] += observed_cells[-1]
        expected_cells[largest] += expected_cells[-1]
        observed_cells, expected_cells = observed_cells[:-1], expected_cells[:-1]
    statistic = float(np.sum((observed_cells - expected_cells) ** 2 / expected_cells))
    df = len(expected_cells) - 1
    return statistic, df, chi2_sf(statistic, df)


# ---- table models -----------------------------------------------------------------------------------

NEVER = -np.inf  # the logit of a token of probability zero


class ContextTable:
    """Next-token logits that depend on the last two tokens: table[two back, previous] -> [n_vocab]."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float32)  # [n_vocab, n_vocab, n_vocab]
        self.n_vocab = self.table.shape[-1]

    def logits_at(self, tokens, positions):  # the logits after each of tokens[positions]: [len(positions), n_vocab]
        previous = np.asarray(tokens)[positions]
        two_back = np.asarray(tokens)[np.maximum(positions - 1, 0)]  # the first position stands in for its own past
        return self.table[two_back, previous]


class TableCallable:
    """jaymody/speculative-sampling's model contract: model(x) -> probabilities [len(x), n_vocab]."""

    def __init__(self, table):
        self.context, self.n_vocab = table, table.n_vocab

    def __call__(self, x):
        return sampling.softmax(self.context.logits_at(x, np.arange(len(x))))


class CachedTableModel(CachedModel):
    """The project's model contract (logits(x, n_last), n_vocab, n_ctx, reset()) with a real cache.

    The cache holds what each position was fed (a transformer would hold its keys and values there), and
    a position's logits read the cache at that position and the one before it, so a stale or misplaced
    entry changes them, as it would change attention. Which positions to feed, and where, is the decision of
    kvcache.contract.cache_resume (CachedModel.resume), looked up at every call as GPT2Model's. A token tree
    (tree_logits, keep_tree_path) follows GPT2Model's contract: node i's logits read its slot and its parent's.
    """

    def __init__(self, table, n_ctx=64):
        self.context, self.n_vocab, self.n_ctx = table, table.n_vocab, n_ctx
        self.reset()

    def reset(self):
        self.cache = np.zeros(self.n_ctx, dtype=np.int64)
        super().reset()

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab] float32
        x = np.array(x, dtype=np.int64)
        start, new_tokens = self.resume(x, n_last)
        end = start + len(new_tokens)
        if not (0 <= start and end <= self.n_ctx):
            raise ValueError(f"positions {start}..{end} lie outside the cache of {self.n_ctx}")
        self.cache[start:end] = new_tokens
        self.cached_tokens = x
        return self.context.logits_at(self.cache, np.arange(start, end))[-n_last:]

    def tree_logits(self, x, tokens, parents):  # [n_seq], [n], [n] -> [n + 1, n_vocab] float32
        """The logits after x, then after each node's path: the nodes go to slots len(x).. as scratch, and node i's
        logits read its slot and its parent's (x's last position for a child of the root)."""
        tokens, parents = check_tree(tokens, parents, self.n_vocab)
        if len(x) == 0 or len(x) + len(tokens) > self.n_ctx:
            raise ValueError(f"a tree of {len(tokens)} nodes after {len(x)} tokens overruns the cache of {self.n_ctx}")
        after_x = self.logits(x, n_last=1)  # caches x, as GPT2Model's call does
        slots = len(self.cached_tokens) + np.arange(len(tokens))
        self.cache[slots] = tokens
        parent_slots = np.where(parents < 0, len(self.cached_tokens) - 1, len(self.cached_tokens) + parents)
        self.tree = (self.cached_tokens, tokens, parents)
        return np.concatenate([after_x, self.context.table[self.cache[parent_slots], self.cache[slots]]])

    def keep_tree_path(self, nodes):
        """Move the accepted path's entries (node indices, root down) from their slots to their depths' slots."""
        x, tokens, nodes = self.take_tree_path(nodes)
        self.cache[len(x):len(x) + len(nodes)] = self.cache[len(x) + nodes]
        self.cached_tokens = np.concatenate([x, tokens[nodes]])


# ---- the problems -----------------------------------------------------------------------------------


def random_context_table(n_vocab, seed, spread=1.5, zeros=0.25):
    """Logits ~ N(0, spread), about `zeros` of them impossible; a context left with fewer than two tokens keeps all."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0, spread, (n_vocab, n_vocab, n_vocab))
    impossible = rng.random(table.shape) < zeros
    impossible[(~impossible).sum(axis=-1) < 2] = False  # a next token that is certain would test nothing
    return ContextTable(np.where(impossible, NEVER, table))


@dataclass(frozen=True)
class Problem:
    """One setting of the decoder's inputs, with the exact distribution of its first n_joint new tokens."""

    name: str
    draft: ContextTable
    target: ContextTable
    prompt: tuple
    N: int
    K: int
    settings: sampling.SamplingSettings
    cached: bool  # the project's cached models, or plain callables
    n_samples: int
    n_joint: int = 3

    def models(self):
        kind = CachedTableModel if self.cached else TableCallable
        return kind(self.draft), kind(self.target)

    def exact_joint(self):  # -> [n_vocab ** n_joint], float64, in product order
        """P(first n_joint new tokens), each factor the target's processed distribution given its context."""
        joint = []
        for tokens in product(range(self.target.n_vocab), repeat=self.n_joint):
            sequence = np.array([*self.prompt, *tokens])
            positions = np.arange(len(self.prompt) - 1, len(sequence) - 1)
            q = sampling.logits_to_probs(self.target.logits_at(sequence, positions), self.settings)
            joint.append(math.prod(float(q[i, token]) for i, token in enumerate(tokens)))
        return np.array(joint)


def default_problems():
    """Problems chosen so that each known bug moves the joint distribution a long way (notebook 7 shows how far)."""
    target, draft, unlike = (random_context_table(4, seed) for seed in (1, 2, 3))
    target5, draft5 = random_context_table(5, 4), random_context_table(5, 5)
    settings = sampling.SamplingSettings
    return [
        Problem("plain callables, K=2", draft, target, (2, 0), 3, 2, settings(), False, 1500),
        Problem("cached, K=3, temperature 0.6", draft, target, (1, 3), 4, 3, settings(0.6), True, 1500),
        Problem("cached, K=1, temperature 1.7, top-k 3, top-p 0.8", unlike, target, (0, 1), 3, 1,
                settings(1.7, 3, 0.8), True, 1500),
        Problem("plain callables, K=4 > N, temperature 0.8, top-p 0.9", draft, target, (3, 2), 3, 4,
                settings(0.8, top_p=0.9), False, 1500),
        Problem("cached, draft = target, K=2", target, target, (2, 2), 4, 2, settings(), True, 1200),
        Problem("cached, 5 tokens, K=2, temperature 1.3, top-k 4", draft5, target5, (4, 0, 1), 3, 2,
                settings(1.3, 4), True, 1500, n_joint=2),
    ]


# ---- the check ------------------------------------------------------------------------------------


@dataclass
class SubTest:
    name: str
    p_value: float
    statistic: float = math.nan  # Pearson's statistic, with df degrees of freedom; nan for checks of certainty
    df: int = 0
    detail: str = ""


@dataclass
class LosslessCheck:
    """What check_lossless found: the verdict, the Bonferroni-adjusted p-value, and every sub-test."""

    passed: bool
    p_value: float  # the smallest sub-test p-value times the number of tests, at most 1
    statistic: float  # the chi-square statistic of the sub-test with the smallest p-value (nan if it had none)
    report: str
    subtests: list = field(default_factory=list)
    seconds: float = 0.0

    def __repr__(self):
        return f"LosslessCheck(passed={self.passed}, p_value={self.p_value:.3g}, statistic={self.statistic:.1f})"


def run_decoder(decoder, problem, draft, target, rng):
    """One run from fresh caches -> its new tokens; raises AssertionError if the output is malformed."""
    settings = problem.settings
    for model in (draft, target):
        if hasattr(model, "reset"):
            model.reset()
    out = decoder(np.array(problem.prompt), draft, target, problem.N, problem.K, rng,
                  temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    out = np.asarray(out)
    prompt = np.array(problem.prompt)
    if out.ndim != 1 or len(out) != len(prompt) + problem.N:
        raise AssertionError(f"returned {len(out)} tokens for a prompt of {len(prompt)} and N={problem.N}")
    if not np.array_equal(out[:len(prompt)], prompt):
        raise AssertionError(f"the output does not start with the prompt: {out[:len(prompt)].tolist()}")
    if not np.issubdtype(out.dtype, np.integer) or out.min() < 0 or out.max() >= problem.target.n_vocab:
        raise AssertionError(f"the output holds something other than token ids: {out.tolist()}")
    return out[len(prompt):]


def distribution_test(decoder, problem, rng, n_samples):
    """Counts of the first n_joint new tokens over n_samples runs, against the exact joint distribution."""
    draft, target = problem.models()
    n_vocab = problem.target.n_vocab
    counts = np.zeros(n_vocab ** problem.n_joint, dtype=np.int64)
    for _ in range(n_samples):
        new = run_decoder(decoder, problem, draft, target, rng)
        counts[np.ravel_multi_index(tuple(new[:problem.n_joint]), (n_vocab,) * problem.n_joint)] += 1
    joint = problem.exact_joint()
    impossible = counts[joint == 0].sum()
    if impossible:
        return SubTest(problem.name, 0.0, math.inf, 0, f"{impossible} of {n_samples} runs began with a sequence "
                                                          f"of probability zero under the target"), counts
    statistic, df, p_value = chi_square_test(counts, joint)
    tv = 0.5 * np.abs(counts / n_samples - joint).sum()
    return SubTest(problem.name, p_value, statistic, df, f"{n_samples} runs, total variation {tv:.3f}"), counts


def greedy_test(decoder, problems):
    """At temperature 0 the decoder must give exactly autoregressive greedy decoding's tokens."""
    mismatches = []
    for problem in problems:
        for K in (1, 2, 3, 5):
            for prompt in (problem.prompt, (0,), (3, 3, 1)):
                case = replace(problem, prompt=prompt, N=6, K=K, settings=sampling.GREEDY, n_samples=1)
                draft, target = case.models()
                expected = sampling.autoregressive_sampling(np.array(prompt), target, case.N, 0, temperature=0)
                got = run_decoder(decoder, case, draft, target, np.random.default_rng(K))
                if not np.array_equal(got, expected[len(prompt):]):
                    mismatches.append(f"{problem.name}, K={K}, prompt {list(prompt)}: {got.tolist()} instead of "
                                      f"{expected[len(prompt):].tolist()}")
    detail = f"{len(mismatches)} greedy runs differ, e.g. {mismatches[0]}" if mismatches else "all equal"
    return SubTest("temperature 0 equals autoregressive greedy", 0.0 if mismatches else 1.0, detail=detail)


def guarded(name, run):
    """run() -> SubTest; a malformed output or a crash of the decoder is a failed sub-test, reported, not raised."""
    try:
        return run()
    except AssertionError as error:
        return SubTest(name, 0.0, math.inf, detail=f"malformed output: {error}")
    except Exception as error:
        return SubTest(name, 0.0, math.inf, detail=f"raised {type(error).__name__}: {error}")


def check_lossless(decoder, *, seed=0, sample_scale=1.0, problems=None, stop_at_failure=False):
    """Run decoder on problems whose exact answer is known -> LosslessCheck(passed, p_value, statistic, report).

    decoder: a function with sampling.speculative_sampling's signature. seed: the runs' random numbers
    (the verdict for a given seed is deterministic). sample_scale multiplies every problem's sample size:
    the power to see a small deviation grows with it, and so does the time. stop_at_failure: stop at the
    first sub-test that fails the decoder whatever the others say (the verdict is the same, found sooner;
    the report then lists only the sub-tests run).
    """
    if not callable(decoder):
        raise ValueError(f"decoder must be a function like sampling.speculative_sampling, got {decoder!r}")
    if not sample_scale > 0:
        raise ValueError(f"sample_scale must be positive, got {sample_scale!r}")
    problems = default_problems() if problems is None else list(problems)
    if not problems:
        raise ValueError("problems must hold at least one Problem (None gives the default six)")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    tests = [("temperature 0 equals autoregressive greedy", lambda: greedy_test(decoder, problems[:2]))]
    for problem in problems:
        n_samples = max(1, round(problem.n_samples * sample_scale))
        run = lambda problem=problem, n_samples=n_samples: distribution_test(decoder, problem, rng, n_samples)[0]
        tests.append((problem.name, run))
    subtests = []
    for name, run in tests:
        subtests.append(guarded(name, run))
        if stop_at_failure and subtests[-1].p_value * len(tests) <= ALPHA:
            break
    worst = min(subtests, key=lambda subtest: subtest.p_value)
    p_value = min(1.0, worst.p_value * len(tests))  # Bonferroni: m is every planned test, run or not
    passed = p_value > ALPHA
    lines = [f"{'PASSED' if passed else 'FAILED'}: smallest p-value {worst.p_value:.3g} ({worst.name}), "
             f"{p_value:.3g} after Bonferroni's correction for {len(tests)} tests (pass above {ALPHA:g})"]
    for subtest in subtests:
        chi = f"chi2 {subtest.statistic:.1f} on {subtest.df} df, " if subtest.df else ""
        lines.append(f"  {'ok  ' if subtest.p_value * len(tests) > ALPHA else 'FAIL'} {subtest.name}: "
                     f"{chi}p {subtest.p_value:.3g}; {subtest.detail}")
    if len(subtests) < len(tests):
        lines.append(f"  stopped at the first failure: {len(tests) - len(subtests)} more tests not run")
    return LosslessCheck(passed, p_value, worst.statistic, "\n".join(lines), subtests, time.perf_counter() - start)


@dataclass
class SpeedCheck:
    passed: bool
    target_calls: int
    expected_calls: int
    report: str


def check_tokens_per_call(decoder, *, N=24, K=3):
    """With a draft identical to the target every draft is accepted: a loop must yield K + 1 tokens.

    That is (1 - a^(K+1)) / (1 - a) tokens per target call at a = 1, so N tokens take ceil(N / (K + 1))
    target calls; a decoder that drops the bonus token, a bug no distribution shows, needs more.
    """
    if not (sampling.is_integer(N) and sampling.is_integer(K) and N >= 1 and K >= 1):
        raise ValueError(f"N and K must be integers >= 1, got N={N!r}, K={K!r}")
    table = random_context_table(4, seed=1)
    calls = [0]

    class CountedTarget(TableCallable):
        def __call__(self, x):
            calls[0] += 1
            return super().__call__(x)

    prompt = np.array([2, 0])
    out = decoder(prompt, TableCallable(table), CountedTarget(table), N, K, np.random.default_rng(0),
                  temperature=1.0, top_k=0, top_p=1.0)
    expected = -(-N // (K + 1))
    passed = len(out) == len(prompt) + N and calls[0] == expected
    report = (f"{'PASSED' if passed else 'FAILED'}: a perfect draft, N={N}, K={K}: {calls[0]} target calls "
              f"({N / max(calls[0], 1):.2f} tokens each) where the formula (1 - a^(K+1)) / (1 - a) at a = 1 "
              f"gives K + 1 = {K + 1} tokens per call, {expected} calls")
    return SpeedCheck(passed, calls[0], expected, report)
