"""main.py's report, which leads with the answer: first the run in one line, then for each faster decoder the
speedup and its range, whether its tokens are the autoregressive ones, alpha and tokens per target call, and what
Leviathan et al.'s formula expects; then each decoder's time and the text, printed once where decoders wrote the
same tokens, coloured by where each token came from. --verbose adds each run's counts and costs in decode steps,
the costs measured before the runs (with this machine's break-even alpha) and the engine. A batch's report gives
each decoder's tokens per second and the speedup, then every row.

Every number it prints is also in the result dict that --json prints; the report only words them. Every line the
report writes itself fits in WIDTH characters; the generated text is printed as it is.
"""

import os
import sys
import textwrap

from cli.flags import DECODERS
from speedup import costs, drafts

WIDTH = 100

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


def say(text, indent="", file=None):
    """Print text wrapped at WIDTH characters, its later lines indented two spaces more than its first."""
    print(textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ", break_long_words=False,
                        break_on_hyphens=False), file=file)


def describe_pair(flags):
    """Who drafts for whom, with K and the sampling: "teach-draft drafting for teach-target, K 4, temperature 0"."""
    filters = (f", top_k {flags['top_k']}" if flags["top_k"] else "") + (
        f", top_p {flags['top_p']}" if flags["top_p"] != 1 else "")
    return (f"{flags['draft']} drafting for {flags['target']}, K {flags['K']}, temperature {flags['temperature']}"
            + filters)


def announce(run, stream=None):
    """What is about to run, in one line on stderr at once (before the models load), where stderr is a terminal,
    as the progress bars are."""
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        rows = f" in each of {len(run.prompts)} rows" if run.batch else ""
        say(f"Decoding {run.flags['n_tokens']} tokens{rows} with {describe_pair(run.flags)}; "
            f"{1 + run.flags['repeats']} runs of each decoder ...", file=stream)
        stream.flush()


def print_report(result, stats, decode, use_colour, verbose=False):
    """The report of main.py's result (a batch's too); stats: each decoder's, for the tokens' origins."""
    if "batch_size" in result:
        return print_batch_report(result, stats, decode, use_colour, verbose)
    say(f"{describe_pair(result)}, seed {result['seed']}, {result['n_tokens']} tokens; {timed_runs(result)}")
    for name in ("speculative", "assisted"):
        if result[name] is not None:
            print_answer(name, result, verbose)
    print()
    print_texts(result, stats, decode, use_colour)
    if verbose:
        print_machine(result)


def timed_runs(result):
    return f"{result['repeats']} timed run{'s' if result['repeats'] != 1 else ''} each"


def print_answer(name, result, verbose):
    """A faster decoder's answer: its speedup, its tokens against autoregressive decoding's, alpha, tokens per
    target call and the formula; with verbose, its counts and costs."""
    run = result[name]
    verifier = result["verifier"] if name == "speculative" else "token"  # assisted: Algorithm 2's rule
    say(f"{name}: {speedup_words(run, result['repeats'])}")
    if "same_text_as_autoregressive" in run:
        say(same_text_words(run, result["temperature"]), "  ")
    alpha = "n/a" if run["acceptance_rate"] is None else f"{run['acceptance_rate']:.3f}"
    say(f"acceptance rate alpha {alpha} = accepted / (accepted + rejected); {run['tokens_per_target_call']:.2f} "
        "tokens per target call", "  ")
    for line in formula_words(name, run, result, verifier):
        say(line, "  ")
    if "K_chosen" in run:
        chosen = {K: run["K_chosen"].count(K) for K in sorted(set(run["K_chosen"]))}
        say("K chosen by --K auto, loop by loop: " + ", ".join(f"{K} ({n} loops)" for K, n in chosen.items())
            + (" (0: a plain step, where no K pays at the alpha so far)" if 0 in chosen else ""), "  ")
    if result["draft"] == drafts.PROMPT_LOOKUP:  # so that a continuation looping on itself is never sold as speed
        say(f"{100 * run['copied_fraction']:.0f}% of the continuation's 4-grams are copied from the prompt", "  ")
    if verbose:
        print_counts(run, verifier, result["n_drafts"], result["tree_drafts"])
        print_costs(run, result["autoregressive"] is not None, verifier)


def speedup_words(run, repeats):
    if run["speedup"] is None:
        return "speedup not measured (add autoregressive to --decoder to measure it)"
    low, high = run["speedup_range"]
    return f"speedup {run['speedup']:.2f}x measured (median of {repeats} paired runs, {low:.2f}-{high:.2f}x)"


def formula_words(name, run, result, verifier):
    """Leviathan et al.'s expected speedup beside the measured one, and why the two need not agree."""
    if verifier != "token":
        return ["Leviathan et al.'s formula models token verification, not this verifier"]
    if run["expected_speedup"] is None:  # the JAX backend's device loop: one call runs draft and target alike
        return ["no formula: the device loop runs the draft and the target in one call, so neither is timed apart"]
    before = ""
    if result["costs"] and name == "speculative" and result["K"] != "auto" and run["acceptance_rate"] is not None:
        measured = measured_costs(result)
        if result["K"] <= measured.K_max:
            before = f", {measured.expected_speedup(run['acceptance_rate'], result['K']):.2f}x at those measured before"
    return [f"the formula expects {run['expected_speedup']:.2f}x at this run's alpha and costs{before}",
            "it prices a loop as K draft steps and one target call, leaving out the loop's own work and noise"]


def measured_costs(result):
    """The costs measured before the runs (costs.py), from the result's record of them."""
    record = result["costs"]
    return costs.MeasuredCosts(record["decode_step_seconds"], record["draft_step_seconds"],
                               tuple(record["verify_steps"]))


def same_text_words(run, temperature):
    if run["same_text_as_autoregressive"]:
        return "the same tokens as autoregressive decoding" + (" (at temperature 0 they must be)" if temperature == 0
                                                               else "")
    if temperature == 0:
        return ("warning: not the autoregressive tokens, which at temperature 0 they must be (a near-tie between two "
                "logits, rounded differently by the two paths, can do this)")
    return "other tokens than autoregressive decoding: each is a sample of the target's distribution"


def print_texts(result, stats, decode, use_colour):
    """Each decoder's time, and the text: once for decoders that wrote the same tokens, under the last of them
    (a speculative decoder's, coloured by where its tokens came from)."""
    ran = [name for name in DECODERS if result[name] is not None]
    for i, name in enumerate(ran):
        run = result[name]
        heading = f"speculative ({verifier_words(result)}, K {result['K']})" if name == "speculative" else name
        say(f"{heading}: {run['seconds']:.3f} s, {run['target_calls']} target calls, "
            f"{1000 * run['seconds'] / len(run['new_tokens']):.1f} ms/token")
        if any(result[later]["new_tokens"] == run["new_tokens"] for later in ran[i + 1:]):
            continue  # printed once, under the later decoder
        coloured = use_colour and name != "autoregressive"
        print(result["prompt"] + (coloured_text(run["new_tokens"], stats[name].origins, decode) if coloured
                                  else run["text"]))
        if name != ran[-1]:
            print()
    if use_colour and ran != ["autoregressive"]:
        print_legend()


def print_machine(result):
    """--verbose's last lines: the costs measured before the runs, and the engine."""
    print()
    if result.get("costs"):  # timed apart from the runs: its c and v need not equal the runs' own
        say("measured before the runs (costs.py, a median of short calls: the break-even alpha and --K auto use "
            "it): " + "; ".join(costs.describe(measured_costs(result))))
    engine = result["engine"]
    layouts = f"; the target's products: {engine['target_layouts']}" if engine["target_layouts"] else ""
    say(f"engine: {engine['threads']} thread(s) (engine/threads.py){layouts}; peak memory "
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
    if result["tree_drafts"] == "dynamic":  # the budget is an upper bound: K, --n_drafts and the context cap the tree
        held = result["speculative"]["tree_nodes_per_loop"]
        held = "none grown" if held is None else f"{held:.1f} held per loop on average"
        return (f"a token tree grown by {result['draft']} within a budget of {result['tree_nodes']} nodes ({held}), "
                f"up to {n} children a node")
    return "a token tree of " + {"sampled": f"{drafts_of} {how}", "top_k": f"the draft's {n} likeliest tokens per node",
                                 "lookup": f"{n} prompt-lookup matches"}[result["tree_drafts"]]


def print_legend():
    print("legend: " + "  ".join(COLOURS[key] + LEGEND[key] + RESET for key in COLOURS))


def print_counts(run, verifier="token", n_drafts=1, tree_drafts=None):
    """--verbose: what was drafted and kept, where the tokens came from, and what alpha counts."""
    if verifier == "token":
        never_judged = run["drafted"] - run["accepted"] - run["rejected"]
        say(f"{run['drafted']} drafted: {run['accepted']} accepted, {run['rejected']} rejected, {never_judged} never "
            "judged (a loop stops at its first rejection)", "  ")
    elif verifier == "block":
        say(f"{run['drafted']} drafted: {run['accepted']} kept, {run['drafted'] - run['accepted']} dropped; in "
            f"{run['rejected']} loops the block was not kept whole (block verification judges it as a whole)", "  ")
    else:
        say(f"{drafted_words(run['drafted'], n_drafts, tree_drafts)}, {run['draft_steps_per_token']:.2f} draft steps "
            f"per new token): {run['accepted']} accepted, {run['rejected']} loops ended by rejecting every candidate",
            "  ")
    say(f"the {len(run['new_tokens'])} tokens: {run['accepted']} accepted drafts, {run['corrected']} corrections after "
        f"a rejection, {run['bonus']} bonus tokens (every draft of their loop accepted)"
        + (f", {run['plain_steps']} plain target steps (no drafts)" if run["plain_steps"] else ""), "  ")
    meaning = {"token": "Leviathan et al.'s alpha, the chance that a draft the target judges is accepted",
               "block": "for block verification not Algorithm 2's per-draft acceptance (verifiers/block.py)"}
    several = "per position over all its candidates, not one draft's acceptance"  # multi and tree
    say(f"alpha here is {meaning.get(verifier, several)}", "  ")


def drafted_words(drafted, n_drafts, tree_drafts):
    """What multi and tree drafted, in their own unit: sampled drafts' tokens, or the nodes of a tree whose
    --n_drafts is its children per node (top_k, dynamic) or its prompt-lookup matches."""
    if tree_drafts in ("top_k", "dynamic"):
        return f"{drafted} tree nodes drafted (up to {n_drafts} children a node"
    if tree_drafts == "lookup":
        return f"{drafted} tree nodes drafted (up to {n_drafts} prompt-lookup matches per loop"
    return f"{drafted} drafted tokens (up to {n_drafts} draft{'s' if n_drafts != 1 else ''} per loop"


def print_costs(run, autoregressive_ran, verifier="token"):
    """--verbose: this run's costs in decode steps, and the formula were a verification one decode step."""
    if run["cost_ratio"] is None:  # the JAX backend's device loop: one call runs draft and target alike
        say(f"{run['draft_calls']} draft calls; the draft and the target are not timed apart (the whole loop runs in "
            "one device call), so there is no cost ratio", "  ")
    else:
        decode_step = ("the autoregressive run's time per token" if autoregressive_ran
                       else "costs.py's, measured before the runs")
        say(f"this run's costs: a target decode step {1000 * run['decode_step_seconds']:.2f} ms ({decode_step}),",
            "  ")
        say(f"a draft step {1000 * run['draft_step_seconds']:.2f} ms, so c = {run['cost_ratio']:.3f} (draft step / "
            "decode step in these runs),", "  ")
        say(f"a target call scoring {SCORED[verifier]} {1000 * run['verify_seconds']:.2f} ms = {run['verify_steps']:.2f} "
            "decode steps", "  ")
    if verifier == "multi":
        say("the drafts' rows are scored one after the other on the CPU (one call in a batched engine), counted as "
            "one target call: the wall-clock time is not what an accelerator would see", "  ")
    if run["expected_speedup"] is not None:
        say(f"the formula expects {run['expected_speedup_one_step']:.2f}x if a verification cost one decode step "
            "(Leviathan et al.'s idealisation)", "  ")


def print_batch_report(result, stats, decode, use_colour, verbose=False):
    """The batch's report: the speedup and alpha over all rows, each decoder's time and tokens per second, then
    row by row (the speculative rows' texts, coloured by origin as for one sequence)."""
    B = result["batch_size"]
    say(f"a batch of {B} rows: {describe_pair(result)}, seeds {result['seed']}..{result['seed'] + B - 1}, "
        f"{result['n_tokens']} tokens each")
    speculative = result["speculative"]
    if speculative:
        alpha = "n/a" if speculative["acceptance_rate"] is None else f"{speculative['acceptance_rate']:.3f}"
        say(f"{speedup_words(speculative, result['repeats'])}; alpha {alpha} over all rows")
    for name in ("autoregressive", "speculative"):
        run = result[name]
        if run is None:
            continue
        say(f"{name}: {run['seconds']:.3f} s, {run['tokens_per_second']:.0f} tokens/s over all rows, "
            f"{run['target_calls']} batched target calls")
        if verbose and name == "speculative":
            say(f"the rows alone: {sum(row['target_calls'] for row in run['rows'])} target calls", "  ")
    shown = "speculative" if speculative else "autoregressive"
    for i, (prompt, row) in enumerate(zip(result["prompt"], result[shown]["rows"])):
        header = f"row {i} (seed {result['seed'] + i}), {shown}"
        if shown == "speculative":
            alpha = "n/a" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.3f}"
            header += f": alpha {alpha}, {row['target_calls']} target calls"
            if result["autoregressive"]:
                same = row["new_tokens"] == result["autoregressive"]["rows"][i]["new_tokens"]
                header += "; the same tokens as autoregressive" if same else "; other tokens than autoregressive"
        print()
        say(header)
        if verbose and shown == "speculative":
            say(f"{row['drafted']} drafted, {row['accepted']} accepted, {row['rejected']} rejected", "  ")
        coloured = use_colour and shown == "speculative"
        print(prompt + (coloured_text(row["new_tokens"], stats[shown].rows[i].origins, decode) if coloured
                        else row["text"]))
    if use_colour and shown == "speculative":
        print_legend()
    if verbose:
        print_machine(result)
