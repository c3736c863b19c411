"""main.py's report: for one sequence (print_report), texts coloured by where each token came from, the
speculative decoder's verifier (--verifier) in its heading, the counts, this run's costs in decode steps beside
the formula's expectations, and this machine's break-even alpha; for a batch (print_batch_report), each decoder's tokens per second and the speedup, then every row.

Every number it prints is also in the result dict that --json prints; the report only words them.
"""

import os
import sys

from speedup import costs, drafts

COLOURS = {"accepted": "\x1b[32m", "corrected": "\x1b[31m", "bonus": "\x1b[34m"}  # green, red, blue
LEGEND = {"accepted": "accepted draft", "corrected": "target correction", "bonus": "bonus token"}
RESET = "\x1b[0m"
# what one target call scores, for each --verifier
SCORED = {"token": "the K + 1 tokens", "block": "the K + 1 tokens", "multi": "every draft", "tree": "the tree"}


def wants_colour(color):
    """--color or --nocolor if given; otherwise colour on a terminal unless NO_COLOR is set (no-color.org)."""
    if color is not None:
        return bool(color)
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def coloured_text(tokens, origins, decode):
    """The text of tokens, each run of tokens of one origin in its colour.

    Runs are decoded as prefixes of the whole text, so a character split across two tokens of
    different origins is still decoded whole (it shows in the colour of the run that completes it).
    """
    pieces, shown, start = [], "", 0
    for end in range(1, len(tokens) + 1):
        if end < len(tokens) and origins[end] == origins[start]:
            continue
        text = decode(tokens[:end])
        if end < len(tokens):
            text = text.rstrip("\ufffd")  # an unfinished character: wait for the bytes of the next run
        if len(text) > len(shown):
            pieces.append(COLOURS.get(origins[start], "") + text[len(shown):] + RESET)
        shown, start = text, end
    return "".join(pieces)


def print_report(result, stats, decode, use_colour, measured=None):
    print(f"draft {result['draft']} -> target {result['target']}, K {result['K']}, temperature {result['temperature']}, "
          f"top_k {result['top_k']}, top_p {result['top_p']}, seed {result['seed']}, {result['n_tokens']} tokens; "
          f"times: the median and range of {result['repeats']} timed runs, after one untimed run of each decoder")
    for name in stats:  # main's decoders, in their order
        run = result[name]
        if run is None:
            continue
        verifier = result["verifier"] if name == "speculative" else "token"  # assisted: Algorithm 2's rule
        heading = f"speculative ({verifier_words(result)}, K {result['K']})" if name == "speculative" else name
        print(f"\n{heading}: {run['seconds']:.3f} s ({min(run['seconds_per_run']):.3f}-{max(run['seconds_per_run']):.3f}), "
              f"{run['target_calls']} target calls, {1000 * run['seconds'] / len(run['new_tokens']):.1f} ms/token")
        text = run["text"]
        if use_colour and name != "autoregressive":
            text = coloured_text(run["new_tokens"], stats[name].origins, decode)
        print(result["prompt"] + text)
        if name == "autoregressive":
            continue
        if use_colour:
            print("legend: " + "  ".join(COLOURS[key] + LEGEND[key] + RESET for key in COLOURS))
        print_counts(run, result["draft"] == drafts.PROMPT_LOOKUP, verifier, result["n_drafts"])
        print_costs_and_speedup(run, result["repeats"], result["autoregressive"] is not None, verifier)
        print_same_text(run, result["temperature"])
    if measured is not None:  # timed apart from the runs: its c and v need not equal the runs' own
        print("\nmeasured before the runs (costs.py, a median of short calls: the break-even alpha and --K auto use "
              "it): " + "; ".join(costs.describe(measured)))
    engine = result.get("engine")
    if engine:
        layouts = f"; the target's products: {engine['target_layouts']}" if engine["target_layouts"] else ""
        print(f"engine: {engine['threads']} thread(s) (engine/threads.py){layouts}; peak memory "
              f"{engine['peak_memory_bytes'] / 1e9:.2f} GB")


def verifier_words(result):
    """The speculative decoder's rule (--verifier), in words."""
    n, verifier = result["n_drafts"], result["verifier"]
    drafts_of = f"{n} draft{'s' if n != 1 else ''}"
    how = "drawn independently" if result["replacement"] else "with distinct first tokens"
    if verifier == "token":
        return "token verification, Algorithm 2"
    if verifier == "block":
        return "block verification"
    if verifier == "multi":
        return f"{drafts_of} by recursive rejection, {how}"
    return "a token tree of " + {"sampled": f"{drafts_of} {how}", "top_k": f"the draft's {n} likeliest tokens per node",
                                 "lookup": f"{n} prompt-lookup matches"}[result["tree_drafts"]]


def print_counts(run, lookup, verifier="token", n_drafts=1):
    if verifier == "token":
        never_judged = run["drafted"] - run["accepted"] - run["rejected"]
        print(f"  {run['drafted']} drafted: {run['accepted']} accepted, {run['rejected']} rejected, {never_judged} "
              "never judged (a loop stops at its first rejection)")
    elif verifier == "block":
        print(f"  {run['drafted']} drafted: {run['accepted']} kept, {run['drafted'] - run['accepted']} dropped; in "
              f"{run['rejected']} loops the block was not kept whole (block verification judges it as a whole)")
    else:
        print(f"  {run['drafted']} drafted tokens (up to {n_drafts} draft{'s' if n_drafts != 1 else ''} per loop, "
              f"{run['draft_steps_per_token']:.2f} draft steps per new token): {run['accepted']} accepted, "
              f"{run['rejected']} loops ended by rejecting every candidate")
    print(f"  the {len(run['new_tokens'])} tokens: {run['accepted']} accepted drafts, {run['corrected']} corrections "
          f"after a rejection, {run['bonus']} bonus tokens (every draft of their loop accepted)"
          + (f", {run['plain_steps']} plain target steps (no drafts)" if run["plain_steps"] else ""))
    alpha = "n/a" if run["acceptance_rate"] is None else f"{run['acceptance_rate']:.3f}"
    meaning = ("Leviathan et al.'s alpha" if verifier == "token" else
               "for block verification not Algorithm 2's per-draft acceptance (verifiers/block.py)"
               if verifier == "block" else "per position over all its candidates, not one draft's acceptance")
    print(f"  acceptance rate alpha {alpha} = accepted / (accepted + rejected), {meaning}; "
          f"{run['tokens_per_target_call']:.2f} tokens per target call")
    if "K_chosen" in run:
        chosen = {K: run["K_chosen"].count(K) for K in sorted(set(run["K_chosen"]))}
        print("  K chosen by --K auto, loop by loop: " + ", ".join(f"{K} ({n} loops)" for K, n in chosen.items())
              + (" (0: a plain step, where no K pays at the alpha so far)" if 0 in chosen else ""))
    if lookup:  # so that a continuation looping on itself is never sold as speed
        print(f"  {100 * run['copied_fraction']:.0f}% of the continuation's 4-grams are copied from the prompt")


def print_costs_and_speedup(run, repeats, autoregressive_ran, verifier="token"):
    if run["cost_ratio"] is None:  # the JAX backend's device loop: one call runs draft and target alike
        print(f"  {run['draft_calls']} draft calls; the draft and the target are not timed apart (the whole loop "
              "runs in one device call), so there is no cost ratio")
    else:
        decode_step = ("the autoregressive run's time per token" if autoregressive_ran
                       else "costs.py's, measured before the runs")
        print(f"  this run's costs: a target decode step {1000 * run['decode_step_seconds']:.2f} ms ({decode_step}), "
              f"a draft step {1000 * run['draft_step_seconds']:.2f} ms, so c = {run['cost_ratio']:.3f} (draft step / "
              f"decode step in these runs); a target call scoring {SCORED[verifier]} {1000 * run['verify_seconds']:.2f} "
              f"ms = {run['verify_steps']:.2f} decode steps")
    if verifier == "multi":
        print("  the drafts' rows are scored one after the other on the CPU (one call in a batched engine), counted as "
              "one target call: the wall-clock time is not what an accelerator would see")
    if run["speedup"] is None:
        measured = "speedup not measured (add autoregressive to --decoder to measure it)"
    else:
        low, high = run["speedup_range"]
        measured = f"speedup {run['speedup']:.2f}x measured (median of {repeats} paired runs, {low:.2f}-{high:.2f}x)"
    if run["expected_speedup"] is None:
        formula = "" if verifier == "token" else "; Leviathan et al.'s formula models token verification, not this"
        print(f"  {measured}{formula}")
    else:
        print(f"  {measured}; the formula expects {run['expected_speedup']:.2f}x from alpha, c and the verification's "
              f"measured cost, and {run['expected_speedup_one_step']:.2f}x if a verification cost one decode step "
              "(Leviathan et al.'s idealisation)")


def print_same_text(run, temperature):
    if "same_text_as_autoregressive" not in run:
        return
    if run["same_text_as_autoregressive"]:
        print("  the same tokens as autoregressive decoding" + (" (at temperature 0 they must be)" if temperature == 0
                                                                 else ""))
    elif temperature == 0:
        print("  warning: not the autoregressive tokens, which at temperature 0 they must be (a near-tie between two "
              "logits, rounded differently by the two paths, can do this)")
    else:
        print("  other tokens than autoregressive decoding: each is a sample of the target's distribution")


def print_batch_report(result, stats, show_text):
    """The batch's report: each decoder's time and tokens per second, the speedup, then row by row.

    show_text(tokens, origins) -> the text to print (coloured by origin on a terminal, as for one sequence).
    """
    B = result["batch_size"]
    print(f"a batch of {B} rows: draft {result['draft']} -> target {result['target']}, K {result['K']}, temperature "
          f"{result['temperature']}, top_k {result['top_k']}, top_p {result['top_p']}, seeds {result['seed']}.."
          f"{result['seed'] + B - 1}, {result['n_tokens']} new tokens per row; times: the median and range of "
          f"{result['repeats']} timed runs, after one untimed run of each decoder")
    for name in ("autoregressive", "speculative"):
        run = result[name]
        if run is None:
            continue
        line = (f"\n{name}: {run['seconds']:.3f} s ({min(run['seconds_per_run']):.3f}-"
                f"{max(run['seconds_per_run']):.3f}), {run['tokens_per_second']:.0f} tokens/s over all rows, "
                f"{run['target_calls']} batched target calls")
        if name == "speculative":
            alone = sum(row["target_calls"] for row in run["rows"])
            alpha = "n/a" if run["acceptance_rate"] is None else f"{run['acceptance_rate']:.3f}"
            line += f" (the rows alone: {alone}); alpha {alpha} over all rows"
        print(line)
    if result["speculative"] and result["speculative"]["speedup"] is not None:
        low, high = result["speculative"]["speedup_range"]
        print(f"speedup {result['speedup']:.2f}x measured (median of {result['repeats']} paired runs, "
              f"{low:.2f}-{high:.2f}x)")
    shown = "speculative" if result["speculative"] else "autoregressive"
    for i, (prompt, row) in enumerate(zip(result["prompt"], result[shown]["rows"])):
        header = f"\nrow {i} (seed {result['seed'] + i}), {shown}"
        if shown == "speculative":
            alpha = "n/a" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.3f}"
            header += (f": {row['drafted']} drafted, {row['accepted']} accepted, {row['rejected']} rejected, "
                       f"alpha {alpha}, {row['target_calls']} target calls")
            if result["autoregressive"]:
                same = row["new_tokens"] == result["autoregressive"]["rows"][i]["new_tokens"]
                header += "; the same tokens as autoregressive" if same else "; other tokens than autoregressive"
        print(header)
        print(prompt + show_text(row["new_tokens"], stats[shown].rows[i].origins))
