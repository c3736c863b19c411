"""This machine's costs of speculative sampling, measured, and the K they call for.

Leviathan et al.'s expected speedup, E[tokens per loop] / (K c + v(K + 1)), needs two numbers the paper
treats as given: c, a draft step over a target decode step, and v(m), what the target's call scoring m new
tokens after a cached prefix costs, in decode steps (Leviathan et al.'s Theorem 3.8 prices the verification at
one step; Chen et al. report it at about one decode step on an accelerator at small batch, for large models; 1.2
to 3 on the CPUs we measured, docs/SPEED.md). `measure_costs` times both for the models at
hand (about a second); `MeasuredCosts` turns them into the expected speedup for any alpha and K, the K that
maximises it, and the alpha below which no K pays. `AutoK` is a draft that chooses K before every loop from
the alpha measured so far in the run (main.py --K auto), and proposes nothing (a plain step) when no K pays.
"""

import statistics
import time
from dataclasses import dataclass

import numpy as np

import sampling
from speedup.stats import SpeculativeStats, expected_speedup

MAX_SCORED = 16  # v(m) is measured for m = 1 .. 16 new tokens, so K can go up to 15
# AutoK's settings, chosen with bench/auto_k.py, which replays the bundled pair's acceptances on 24 held-out prompts
# through AutoK (at temperature 0 a draft is accepted exactly when the draft's greedy token is the target's; at
# temperature 1, independently with alpha about 0.72), priced at the loop costs bench/pair.py measured on an AMD
# Zen 3, and then measured for real with bench/pair.py (docs/SPEED.md):
# - the prior on alpha before any draft is judged, Beta(PRIOR_ACCEPTED, PRIOR_REJECTED): mean 0.8, worth one
#   judged draft, so that the run's own evidence takes over at once;
PRIOR_ACCEPTED, PRIOR_REJECTED = 0.8, 0.2
# - how much the evidence still counts after each token generated since: acceptance can change along a text
#   (a repeated line, boilerplate; notebook 3's acceptance strip tests for runs), and while the loops are plain
#   steps, which judge nothing, the evidence fades
#   (by half in 23 tokens) and alpha grows uncertain again, so that a draft is tried anew (memory per judged draft
#   instead would leave a run that stopped drafting stopped for good);
MEMORY = 0.97
# - K is chosen at an optimistic alpha, the posterior mean plus OPTIMISM standard deviations: where the evidence
#   is thin, a draft is worth trying; where it is ample, the mean decides;
OPTIMISM = 0.25
# - the least expected speedup worth drafting for: the formula leaves out each loop's own bookkeeping and the
#   draft's catching up on the tokens it missed during plain steps (bench/pair.py: measured / expected 0.92-1.0
#   for the pair).
WORTH_DRAFTING = 1.05


@dataclass(frozen=True)
class MeasuredCosts:
    """What a target decode step, a draft step and the target's scoring of m tokens cost on this machine."""

    decode_step_seconds: float  # the target: one new token after a cached prefix, to its probabilities
    draft_step_seconds: float  # the draft likewise (0 for a draft that is not a model: a lookup costs microseconds)
    verify_steps: tuple  # v(m) for m = 1, 2, ...: m new tokens in one target call, in decode steps (v(1) = 1)

    @property
    def cost_ratio(self):  # Leviathan et al.'s c
        return self.draft_step_seconds / self.decode_step_seconds

    @property
    def K_max(self):
        return len(self.verify_steps) - 1

    def v(self, m):
        return self.verify_steps[m - 1]

    def expected_speedup(self, alpha, K):
        """The formula at this machine's c and v(K + 1); K = 0 is autoregressive decoding itself, 1x."""
        return expected_speedup(alpha, self.cost_ratio, K, self.v(K + 1)) if K else 1.0

    def best_K(self, alpha, K_max=None):
        """The K in 0 .. K_max with the highest expected speedup (the smallest on ties); 0 when none beats 1x."""
        K_max = self.K_max if K_max is None else min(K_max, self.K_max)
        return max(range(K_max + 1), key=lambda K: (self.expected_speedup(alpha, K), -K))

    def break_even_alpha(self, K):
        """The alpha at which K drafts per loop start to pay (expected speedup 1), or None if even alpha = 1 loses.

        The expected speedup grows with alpha, so bisection finds it."""
        if self.expected_speedup(1.0, K) <= 1:
            return None
        low, high = 0.0, 1.0
        for _ in range(50):
            middle = (low + high) / 2
            low, high = (middle, high) if self.expected_speedup(middle, K) <= 1 else (low, middle)
        return high

    def lowest_break_even(self, K_max=None):
        """(alpha, K): the lowest alpha at which some K pays and that K; (None, None) if no K pays at any alpha."""
        K_max = self.K_max if K_max is None else min(K_max, self.K_max)
        candidates = [(self.break_even_alpha(K), K) for K in range(1, K_max + 1)]
        candidates = [(alpha, K) for alpha, K in candidates if alpha is not None]
        return min(candidates) if candidates else (None, None)

    def as_dict(self):
        return {"decode_step_seconds": self.decode_step_seconds, "draft_step_seconds": self.draft_step_seconds,
                "cost_ratio": self.cost_ratio, "verify_steps": list(self.verify_steps)}


def measure_costs(target, draft, x, settings=sampling.SamplingSettings(), max_scored=MAX_SCORED, budget_seconds=1.0,
                  min_rounds=3):
    """Time, on this machine, the target scoring m = 1 .. max_scored new tokens after the prefix x and a draft
    step after x, as speculative sampling calls them (through sampling.next_token_probs, cache rolled back).

    target, draft: models with `logits` (gpt2.GPT2Model, gpt2_jax.JaxGPT2Model); a drafter made from the target
    with only `propose` (drafters/: EAGLE's and Medusa's heads, reading the target's features) is timed proposing
    one token after x; any other draft (a prompt-lookup draft) costs 0. The calls interleave round by round, so
    that the machine's drift touches them alike, after one warm-up round; rounds go on until budget_seconds are
    spent (at least min_rounds), and each cost is a median. The models' caches are reset afterwards.
    """
    x = [int(token) for token in x]
    max_scored = min(max_scored, target.n_ctx - len(x))
    if max_scored < 2:
        raise ValueError(f"measuring needs room for 2 new tokens after the {len(x)}-token prefix (context {target.n_ctx})")
    new_tokens = (x * max_scored)[:max_scored]  # any tokens will do: the cost does not depend on which
    # The draft steps on another token than the target's next: the target would start an early exit's row at the exit
    # (drafters/early_exit.ExitDraft), and its decode step and v would be cheaper than a plain step's.
    draft_step = [(new_tokens[0] + 1) % target.n_vocab]
    draft_is_model = hasattr(draft, "logits") or is_head_drafter(draft)

    def timed(model, m, tokens=new_tokens):  # one call scoring m new tokens after x; n_last = m rolls the cache back
        start = time.perf_counter()
        if is_head_drafter(model):  # its step is a proposal: the head after x's features, one token
            model.propose(x, 1, settings, np.random.default_rng(0), SpeculativeStats())
        else:
            sampling.next_token_probs(model, x + tokens[:m], m, settings)
        return time.perf_counter() - start

    target_times = {m: [] for m in range(1, max_scored + 1)}
    draft_times = []
    started, rounds = time.perf_counter(), 0
    while rounds <= min_rounds or time.perf_counter() - started < budget_seconds:
        kept = rounds > 0  # the first round warms up
        for m in target_times:
            if draft_is_model:  # a draft step between the target's calls, as in the loop, where the target's
                draft_seconds = timed(draft, 1, draft_step)  # weights pass through the cache in between
                draft_times += [draft_seconds] * kept
            target_times[m] += [timed(target, m)] * kept
        rounds += 1
    for model in (target, draft):
        if hasattr(model, "reset"):
            model.reset()
    decode_step = statistics.median(target_times[1])
    return MeasuredCosts(decode_step_seconds=decode_step,
                         draft_step_seconds=statistics.median(draft_times) if draft_is_model else 0.0,
                         verify_steps=tuple(statistics.median(target_times[m]) / decode_step for m in target_times))


def is_head_drafter(draft):
    """A drafter made from the target that is not a model (no `logits`): a head reading the target's features."""
    return not hasattr(draft, "logits") and hasattr(draft, "propose") and hasattr(draft, "target")


class AutoK:
    """A draft that chooses its K before every loop: the K that maximises the expected speedup at this machine's
    measured costs and the alpha measured so far in the run, or none (a plain autoregressive step) when no K pays.

    alpha comes from a Beta posterior: the prior Beta(PRIOR_ACCEPTED, PRIOR_REJECTED) plus the run's accepted and
    rejected drafts (read from SpeculativeStats before every loop), each weighted by MEMORY for every
    token generated after it, so that the estimate follows the text's easy and hard stretches, and fades during
    plain steps. K is chosen at the posterior mean plus OPTIMISM standard deviations, and must promise
    WORTH_DRAFTING (1.05x); otherwise the loop is a plain step. A run that stopped drafting thus tries again once
    the evidence against it has faded (on the Zen 3's costs, 35 plain steps after a rejection ended a stretch of
    alpha 0.8, 78 when the run's first draft was rejected); where no K pays even at alpha = 1, it never drafts. The
    settings are the module's constants unless given. Choosing K from the past only changes speed, never the
    output distribution: each loop is still Algorithm 2 with that loop's K. `chosen` lists the K of every loop.
    Pass it to a decoder as the draft, with K the largest K to consider.
    """

    def __init__(self, draft, costs, prior_accepted=PRIOR_ACCEPTED, prior_rejected=PRIOR_REJECTED, memory=MEMORY,
                 optimism=OPTIMISM, worth_drafting=WORTH_DRAFTING):
        self.draft, self.costs, self.prior, self.memory = draft, costs, (prior_accepted, prior_rejected), memory
        self.optimism, self.least_speedup = optimism, worth_drafting
        for name in ("n_vocab", "n_ctx"):  # what sampling.prepare checks against the target
            if hasattr(draft, name):
                setattr(self, name, getattr(draft, name))
        self.reset()

    def reset(self):
        """A new sequence: forget the evidence and the K chosen (the draft model forgets its cache)."""
        self.chosen, self.evidence, self.counted = [], (0.0, 0.0), None
        if hasattr(self.draft, "reset"):
            self.draft.reset()

    def observe(self, stats):
        """Add the drafts judged since the last loop to the evidence, after weighting the older evidence by
        MEMORY once for every token generated since."""
        now = (stats.generated, stats.accepted, stats.rejected)
        if self.counted is None:  # the run's first loop: what stats held before it is another run's
            self.counted = now
        tokens, accepted, rejected = (a - b for a, b in zip(now, self.counted))
        fade = self.memory ** tokens
        self.evidence = (fade * self.evidence[0] + accepted, fade * self.evidence[1] + rejected)
        self.counted = now

    def alpha(self):
        """The posterior mean of alpha."""
        accepted, rejected = self.prior[0] + self.evidence[0], self.prior[1] + self.evidence[1]
        return accepted / (accepted + rejected)

    def optimistic_alpha(self):
        """The posterior mean plus OPTIMISM standard deviations (below 1)."""
        mean, weight = self.alpha(), sum(self.prior) + sum(self.evidence)
        return min(mean + self.optimism * np.sqrt(mean * (1 - mean) / (weight + 1)), 0.999)

    def worth_drafting(self, K):
        """The best K up to K at the optimistic alpha, or 0 where drafting is not worth it."""
        alpha = self.optimistic_alpha()
        best = self.costs.best_K(alpha, K_max=K)
        return best if self.costs.expected_speedup(alpha, best) >= self.least_speedup else 0

    def propose(self, x, K, settings, rng, stats):  # sampling.draw_drafts' contract for a draft with propose
        self.observe(stats)
        K_n = self.worth_drafting(K)
        self.chosen.append(K_n)
        return sampling.draw_drafts(self.draft, x, K_n, settings, rng, stats)


def break_even_words(costs, alpha, K):
    """The break-even alpha at K in words. A loop measured cheaper than one decode step (K c + v(K + 1) < 1, so that
    alpha 0 would pay) is timing noise around one step, not a free verification: said as such, never as "from 0"."""
    loop = K * costs.cost_ratio + costs.v(K + 1)
    if loop >= 1:
        return f"{alpha:.2f} (at K = {K})"
    return (f"{alpha:.2f} at K = {K} only because a loop measured {loop:.2f} decode steps, less than one: timing noise "
            "around one step, so read the bar as about K c")


def describe(costs, K=None):
    """Sentences for a report: the costs, and whether and from which alpha speculation can pay here."""
    lines = [f"a target decode step {1e3 * costs.decode_step_seconds:.2f} ms, a draft step "
             f"{1e3 * costs.draft_step_seconds:.2f} ms (c = {costs.cost_ratio:.2f}); scoring K + 1 tokens costs "
             + ", ".join(f"{costs.v(m):.2f}" for m in (2, 3, 5, 9) if m <= len(costs.verify_steps))
             + " decode steps for K = " + ", ".join(str(m - 1) for m in (2, 3, 5, 9) if m <= len(costs.verify_steps))]
    alpha, best = costs.lowest_break_even()
    if alpha is None:
        lines.append("on this machine no K can pay at any alpha: even a draft that is always accepted yields K + 1 "
                     "tokens for K c + v(K + 1) steps, which is more here (so --K auto decodes autoregressively)")
    else:
        lines.append(f"speculation pays here only when alpha exceeds {break_even_words(costs, alpha, best)}; below "
                     "that, every loop costs more than the tokens it yields")
    if K is not None and 1 <= K <= costs.K_max and costs.break_even_alpha(K) is not None:
        lines[-1] += f"; at K = {K} from alpha {costs.break_even_alpha(K):.2f}"
    return lines


def geometric_accepted_lengths(alpha, K):
    """P(a loop accepts exactly j drafts), j = 0 .. K, when each is accepted independently with probability alpha."""
    return np.array([alpha**j * (1 - alpha) for j in range(K)] + [alpha**K])


def accepted_lengths(origins):
    """The drafts each speculative loop accepted, from a run's origins: a run of "accepted" ended by a
    "corrected" or "bonus" token is one loop; a "target" token (a loop with no drafts) is no speculation."""
    lengths, run = [], 0
    for origin in origins:
        if origin == "accepted":
            run += 1
        elif origin in ("corrected", "bonus"):
            lengths.append(run)
            run = 0
    return lengths
