"""What bench/spec_bench.py reports of a set of runs: each run is (tokens, seconds, SpeculativeStats, loops), a loop
(accepted, judged, drafted) as Recorded reads it back: the drafts it accepted, the depth down to which the target
judged them, the nodes of the tree (a chain's drafts) it proposed.

Mean accepted tokens per target call comes in two conventions, both reported, each under its name:
- Spec-Bench's (Xia et al. 2024) mean accepted tokens: tokens generated per target call, counting the token the
  target adds to each loop (the correction or the bonus): 1.00 for plain decoding;
- SpecForge's (sgl-project/SpecForge) simulated acceptance length, a_1 + a_1 a_2 + a_1 a_2 a_3 + ... with a_d the
  acceptance at depth d (alpha_per_depth): the drafts a loop accepts, without that token.
"""

import statistics

import numpy as np

import sampling
from verifiers.tree import TokenTree


def add_chain(tree, drafts_drawn):  # a chain of drafts into a TokenTree, sharing the nodes of the prefix it shares
    node = -1
    for token in drafts_drawn:
        node = tree.add_choice(node, token)
    return tree


class Recorded:
    """A drafter that keeps the tree each loop proposed (a chain as a one-path tree; the drafts of a sampled tree,
    proposed from the same x, merged into one), so that each loop's accepted, judged and drafted can be read back."""

    def __init__(self, model):
        self.model, self.proposals = model, []
        for name in ("n_vocab", "n_ctx"):  # what sampling.prepare checks against the target
            if hasattr(model, name):
                setattr(self, name, getattr(model, name))

    def propose(self, x, K, settings, rng, stats):  # sampling.draw_drafts' contract
        proposed, p = sampling.draw_drafts(self.model, x, K, settings, rng, stats)
        if self.proposals and self.proposals[-1][0] == len(x):  # another draft of this loop: x only grows by loops
            add_chain(self.proposals[-1][1], proposed)
        else:
            self.proposals.append((len(x), add_chain(TokenTree(), proposed)))
        return proposed, p

    def draft_tree(self, x, K, n_drafts, settings, stats):  # verifiers/tree.py's drafts="dynamic"
        tree = self.model.draft_tree(x, K, n_drafts, settings, stats)
        self.proposals.append((len(x), tree))
        return tree

    def loops(self, origins):  # -> [(accepted, judged, drafted)], one per loop, from a run's stats.origins
        """A loop's tokens are its accepted drafts, then one token that ends it (origins' "corrected" where a draft
        was judged and refused: judged is accepted + 1; "bonus" or "target" where none was refused). Read from the
        decoder's own record, not replayed through the tree: a sampled candidate's token can come out of the
        residual after its rejection. drafted: the nodes of the loop's tree."""
        ends = [i for i, origin in enumerate(origins) if origin != "accepted"]
        if len(ends) != len(self.proposals):
            raise AssertionError(f"{len(ends)} loops decoded, {len(self.proposals)} proposed")
        rows, start = [], 0
        for end, (_, tree) in zip(ends, self.proposals):
            rows.append((end - start, end - start + (origins[end] == "corrected"), len(tree.tokens)))
            start = end + 1
        return rows


def total(runs, name):  # a SpeculativeStats counter summed over runs' stats
    return sum(getattr(stats, name) for _, _, stats, _ in runs)


def loops_of(runs):  # every loop of these runs
    return [loop for *_, per_run in runs for loop in per_run]


def alpha(runs):  # accepted drafts / drafts judged (None where none was judged)
    judged = total(runs, "accepted") + total(runs, "rejected")
    return total(runs, "accepted") / judged if judged else None


def decode_step(runs):  # seconds per target call in these runs (autoregressive runs: the decode step)
    return total(runs, "target_seconds") / total(runs, "target_calls")


def draft_step_cost(runs, decode_seconds):  # c: a draft step over a decode step (0 where nothing was drafted)
    steps = total(runs, "draft_calls")
    return total(runs, "draft_seconds") / steps / decode_seconds if steps else 0.0


def predict(loops, c, steps_per_loop, verify_steps):
    """The formula at these loops: tokens per loop / (c x draft steps per loop + verify_steps), in decode steps."""
    return statistics.mean(1 + accepted for accepted, _, _ in loops) / (c * steps_per_loop + verify_steps)


def machine_v(loops, measured):  # v(drafted + 1) of this machine's measured costs (speedup/costs.py), over the loops
    return statistics.mean(measured.v(min(drafted + 1, measured.K_max + 1)) for _, _, drafted in loops)


def formula_terms(runs, decode_seconds):  # -> (c, draft steps per loop, verification), each in decode steps
    steps = total(runs, "draft_calls") / total(runs, "loops")
    return draft_step_cost(runs, decode_seconds), steps, decode_step(runs) / decode_seconds


def acceptance_by_depth(loops):  # -> [{"depth", "judged", "accepted"}]: the histogram alpha_per_depth divides
    """At depth d: the loops whose target judged a draft at depth d, and those that accepted it (at least d drafts)."""
    rows, depth = [], 1
    while judged := sum(j >= depth for _, j, _ in loops):
        rows.append({"depth": depth, "judged": judged, "accepted": sum(a >= depth for a, _, _ in loops)})
        depth += 1
    return rows


def alpha_per_depth(loops):  # -> [alpha_1, ...]: loops accepting >= d drafts / loops judging a draft at depth d
    return [row["accepted"] / row["judged"] for row in acceptance_by_depth(loops)]


def accepted_length_counts(loops):  # -> [loops accepting 0 drafts, 1, ...]
    counts = [0] * (1 + max((accepted for accepted, _, _ in loops), default=0))
    for accepted, _, _ in loops:
        counts[accepted] += 1
    return counts


def specforge_acceptance_length(alphas):  # a_1 + a_1 a_2 + ...: drafts accepted per loop, the bonus token left out
    length, product = 0.0, 1.0
    for alpha_d in alphas:
        product *= alpha_d
        length += product
    return length


def mean_accepted_tokens(runs):  # -> both conventions, named
    return {"spec_bench": total(runs, "generated") / total(runs, "target_calls"),
            "specforge_simulated": specforge_acceptance_length(alpha_per_depth(loops_of(runs)))}


def summary(values):  # -> median with its range, mean and standard deviation (0 for a single value)
    return {"median": statistics.median(values), "low": min(values), "high": max(values),
            "mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def per_prompt(runs):  # -> [[accepted, judged, generated, target calls]] a prompt: what a paired comparison resamples
    return [[stats.accepted, stats.accepted + stats.rejected, stats.generated, stats.target_calls]
            for _, _, stats, _ in runs]


def paired_margin(ours, theirs, measure, draws=2000, seed=0):  # per_prompt rows of two drafters on the same prompts
    """How far ours is from theirs on `measure` ("alpha": the difference of accepted over judged; "tokens_per_call":
    the ratio of generated over target calls), with the 95% interval of that margin over paired bootstrap resamples of
    the prompts (a resample draws prompts, both drafters' runs on each): "level" where the interval holds no margin."""
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    columns, combine, none = {"alpha": ((0, 1), np.subtract, 0.0), "tokens_per_call": ((2, 3), np.divide, 1.0)}[measure]
    picks = np.vstack([np.arange(len(ours)), np.random.default_rng(seed).integers(0, len(ours), (draws, len(ours)))])

    def pooled(rows):  # [resamples]: each resample's sum of the numerator over its sum of the denominator
        return rows[picks, columns[0]].sum(axis=1) / rows[picks, columns[1]].sum(axis=1)

    margins = combine(pooled(ours), pooled(theirs))
    low, high = np.percentile(margins[1:], [2.5, 97.5])
    verdict = "level" if low <= none <= high else ("ahead" if low > none else "behind")
    return {"measure": measure, "margin": float(margins[0]), "interval_95": [float(low), float(high)],
            "prompts": len(ours), "verdict": verdict}
