"""What one speculative run did, call by call: notebook 3's timeline, acceptance strip and KV-cache table.

`RecordingModel` (calls.py) wraps a gpt2.GPT2Model and gives the decoders the same logits, while it appends one `Call`
per forward pass to a list shared by the draft and the target: when it started and ended, how many positions
it scored, and what the KV cache did (how many tokens it held, the prefix it kept, how many tokens it fed).
SpeculativeStats keeps only totals; these records let a class see each loop of Algorithm 2 (Chen et al. 2023):
K draft steps, one verification, the tokens kept (`split_loops`, `plot_timeline`); where the acceptance rate
alpha comes from, token by token (`plot_acceptance_strip`, `acceptance_runs`, `acceptance_pattern`); and the
cache rolling back after a rejection (`cache_rows`, `format_cache_table`).
"""

from dataclasses import dataclass

import numpy as np
from matplotlib.patches import Patch, Rectangle

from classroom.calls import Call, RecordingModel  # noqa: F401 (notebook 3 wraps its models in timeline's)

ORIGIN_COLOURS = {"accepted": "#9be39b", "corrected": "#ffb27a", "bonus": "#8cc4ff", "target": "#cdb4f0"}
CALL_COLOURS = {"draft": "#999999", "target": "#444444"}
LOOP_ENDS = ("corrected", "bonus", "target")  # each loop ends with exactly one token of these origins


@dataclass
class Loop:
    draft_calls: list  # the K draft steps (none for a last loop that drafts nothing)
    target_call: Call  # the verification
    origins: list  # of the tokens it kept: accepted drafts, then one corrected, bonus or target token


def split_loops(calls, origins):
    """The calls of one speculative_sampling run and its stats.origins, loop by loop: every target call
    closes a loop, and every loop's tokens end with one corrected, bonus or target token."""
    ends = [i for i, origin in enumerate(origins) if origin in LOOP_ENDS]
    if sum(call.role == "target" for call in calls) != len(ends) or calls and calls[-1].role != "target":
        raise ValueError("the calls and the origins disagree on the number of loops: were they of one run?")
    loops, draft_calls, start = [], [], 0
    for call in calls:
        if call.role == "draft":
            draft_calls.append(call)
            continue
        end = ends[len(loops)] + 1
        loops.append(Loop(draft_calls, call, origins[start:end]))
        draft_calls, start = [], end
    return loops


def median_seconds(calls, role):
    return float(np.median([call.seconds for call in calls if call.role == role]))


def plot_timeline(ax, loops, decode_step_seconds, tokens=None, label=str):
    """One row per loop, time from the loop's start in target decode steps: the draft steps (width c each),
    the verification (width v), and below them the tokens the loop kept, one decode step each: what
    autoregressive decoding would have paid for them. label(token) names a token inside its box."""
    position = 0
    for row, loop in enumerate(loops):
        y = -2 * row
        loop_start = (loop.draft_calls or [loop.target_call])[0].start
        for call in loop.draft_calls + [loop.target_call]:
            left, width = (call.start - loop_start) / decode_step_seconds, call.seconds / decode_step_seconds
            ax.add_patch(Rectangle((left, y - 0.4), width, 0.8, color=CALL_COLOURS[call.role], linewidth=0))
        for i, origin in enumerate(loop.origins):
            ax.add_patch(Rectangle((i, y - 1.4), 1, 0.8, facecolor=ORIGIN_COLOURS[origin], edgecolor="white"))
            if tokens is not None:
                ax.text(i + 0.5, y - 1.0, label(tokens[position + i]), ha="center", va="center", fontsize=7,
                        clip_on=True)
        position += len(loop.origins)
    ax.set_yticks([-2 * row - 0.5 for row in range(len(loops))], [f"loop {row + 1}" for row in range(len(loops))])
    ax.set(xlabel="time since the loop began, in target decode steps", ylim=(-2 * len(loops) + 0.4, 0.6))
    ax.autoscale(axis="x")
    calls = [Patch(color=CALL_COLOURS[role], label=name) for role, name in (("draft", "draft step"),
                                                                             ("target", "verification"))]
    kept = [Patch(color=ORIGIN_COLOURS[name], label=f"{name} token") for name in ("accepted", "corrected", "bonus")]
    ax.legend(handles=calls + kept, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, fontsize=7)


def plot_acceptance_strip(ax, origins, width=32, title=""):
    """One cell per generated token, in rows of width, coloured by its origin; the title above on the left."""
    for i, origin in enumerate(origins):
        ax.add_patch(Rectangle((i % width, -(i // width)), 1, 1, facecolor=ORIGIN_COLOURS[origin], edgecolor="white"))
    rows = -(-len(origins) // width)
    ax.set(xlim=(0, width), ylim=(-rows + 1, 1), aspect="equal")
    ax.axis("off")
    ax.text(0, 1.05, title, ha="left", va="bottom")
    ax.legend(handles=[Patch(color=colour, label=name) for name, colour in ORIGIN_COLOURS.items() if name in origins],
              ncol=4, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=7)


def judged(origins):
    """The drafts the target judged, in order: True accepted, False rejected (bonus and target tokens were
    never drafts, and drafts after a rejection are never judged)."""
    return [origin == "accepted" for origin in origins if origin in ("accepted", "corrected")]


def acceptance_runs(origins):
    """The number of drafts accepted between one rejection and the next (runs continue across a bonus token,
    which no draft competes for); the accepted drafts after the last rejection are left out."""
    runs, current = [], 0
    for accepted in judged(origins):
        if accepted:
            current += 1
        else:
            runs.append(current)
            current = 0
    return runs


def acceptance_pattern(origins):
    """alpha, and what independent acceptance (the geometric model behind Leviathan et al.'s formulas)
    predicts beside what happened: drafts judged per rejection, mean against 1/(1 - alpha) (equal by
    construction, but for the drafts accepted after the last rejection); and the acceptance rate right after
    an accepted draft and right after a rejected one, both alpha under the model, with the standard error of
    their difference under the model. A difference of several standard errors: acceptances come in runs."""
    verdicts = judged(origins)
    alpha = np.mean(verdicts)
    after = {previous: [now for before, now in zip(verdicts, verdicts[1:]) if before == previous]
             for previous in (True, False)}
    if not after[True] or not after[False]:
        raise ValueError("acceptance_pattern needs accepted and rejected drafts, each followed by a judged one")
    return {"alpha": float(alpha), "judged_per_rejection": float(np.mean(acceptance_runs(origins)) + 1),
            "geometric_mean": float(1 / (1 - alpha)), "after_accepted": float(np.mean(after[True])),
            "after_rejected": float(np.mean(after[False])),
            "difference_se": float(np.sqrt(alpha * (1 - alpha) * (1 / len(after[True]) + 1 / len(after[False]))))}


def cache_rows(loops):
    """Per loop, what each model's KV cache did: the draft's first step (its catch-up) and the verification."""
    rows = []
    for loop in loops:
        target, K_n = loop.target_call, len(loop.draft_calls)
        first = loop.draft_calls[0] if loop.draft_calls else None
        rows.append({"n": target.kept + target.fed - K_n, "K": K_n, "accepted": loop.origins.count("accepted"),
                     "ends": loop.origins[-1],
                     "draft_cached": first and first.cached_before, "draft_kept": first and first.kept,
                     "draft_fed": first and first.fed, "target_cached": target.cached_before,
                     "target_kept": target.kept, "target_fed": target.fed,
                     "target_after": target.kept + target.fed})
    return rows


def format_cache_table(rows):
    """cache_rows as text: n tokens before the loop; each model's cache before the call, the prefix it kept
    (its rollback point), the tokens it fed."""
    lines = ["loop    n  ends with       | draft's first step: cached kept fed | target's verification: "
             "cached kept fed -> after"]
    for number, row in enumerate(rows, 1):
        ending = f"{row['ends']} ({row['accepted']}/{row['K']})"
        draft = ("(no draft steps)" if row["draft_fed"] is None else
                 f"{row['draft_cached']:6d} {row['draft_kept']:4d} {row['draft_fed']:3d}")
        lines.append(f"{number:4d} {row['n']:4d}  {ending:15s} | {draft:>35s} | {row['target_cached']:29d} "
                     f"{row['target_kept']:4d} {row['target_fed']:3d} -> {row['target_after']}")
    return "\n".join(lines)
