"""Spec-Bench in miniature (Xia et al. 2024, arXiv 2401.07851): every drafter of the kit on held-out prompts of three
kinds, at temperatures 0 and 1, each at the K (or tree) this machine's measured costs call for, timed against
autoregressive decoding, with Leviathan et al.'s formula beside every measured speedup.

Drafters (--drafters): draft (the distilled teach-draft model), prompt-lookup (speedup/drafts.py), eagle-chain and
eagle-tree (EAGLE's head drafting a chain; EAGLE-2's dynamic tree), medusa-chain and medusa-tree (Medusa's heads; their
sparse tree), early-exit (the target's first layers, untrained) and kangaroo (that exit with its trained adapter). A
drafter whose head is not in --models_dir (tools/train_heads.py writes them) is left out, the reason in "skipped".

Categories (--categories), all cut from the held-out text by bench/heldout.py: open (windows spread evenly over it:
text to continue), copy (a held-out function given whole, then its first two lines again: the continuation is a
copy), structured (in each of --prompts equal shares of the text, the window whose span, the prompt and what the text
goes on with, repeats its own 4-grams the most: listings of reST directives, tables, runs of similar calls).

For each temperature and category:
1. Calibration: every prompt decoded autoregressively (which times the target's decode step here), then by
   every drafter once, a chain at its largest K, a tree at every size of its grid. Each loop's accepted drafts, how
   many it drafted, and c, the drafter's time per draft step over the decode step, give the formula's speedup:
   tokens per loop / (c x draft steps per loop + v(drafted + 1)), v(n) the target's cost of scoring n tokens in
   decode steps, measured with a draft model's step between its calls as in a loop (speedup/costs.measure_costs; a
   tree of n nodes costs about a chain of n, bench/tree.py).
   A chain's loops cut at K predict every K up to the largest; the K or tree of the highest prediction is kept.
   With per-loop counts this is Leviathan et al.'s Equation 1 with alpha per depth: 1 + sum_d prod_{i<=d} alpha_i.
2. Measured runs, --repeats rounds: for every prompt, autoregressive decoding, each drafter at its choice (in an
   order rotated from prompt to prompt), autoregressive decoding again; a drafter's speedup is the mean of the two
   autoregressive times over its own; the median, min and max over prompts and rounds. Seeds are fixed per prompt,
   so rounds repeat the same tokens and differ only in time. The prompt is fed to the target and the drafter before
   the clock starts: the formula prices the decoding after it.
Each row gives, from the measured runs: alpha (accepted / judged drafts), alpha per depth (loops accepting at least d
drafts over loops that judged a draft at depth d), tokens per target call, c, and predicted_speedup, the formula at
the measured loops, c and verification cost (each in the rounds' autoregressive decode steps, as bench/pair.py);
predicted_speedup_machine_v the same with v(n) measured apart; calibrated_prediction what the calibration expected.
"at_K4" (temperature 0) sets the distilled draft beside EAGLE's chain at K = 4 and its dynamic tree at depth 4 with
drafters/load.py's default budget and the larger budgets an accelerator would verify for about a step's cost (16 and
32 nodes), all on the same --k4_prompts prompts per category (more than the timed rows: it counts tokens, not
time). At temperature 0 every run's tokens must equal
autoregressive decoding's: same_tokens_as_autoregressive.

    python bench/spec_bench.py --out drafters.json                     # minutes: bench/README.md says how many
    python bench/spec_bench.py --quick --drafters draft,prompt-lookup  # seconds: that it runs

Prints one JSON line per row as it goes (to stderr), then the JSON object as its last line.
"""

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import engine
import sampling
import utils
from bench import heldout
from bench.machine import machine_line
from checkpoints.atomic import write_atomically
from drafters.kangaroo import CONFIDENCE_THRESHOLD
from drafters.load import DEFAULT_N_NODES, load_drafter
from speedup import costs, drafts
from speedup.stats import SpeculativeStats
from verifiers.tree import TokenTree, tree_speculative_sampling

DRAFTERS = ("draft", "prompt-lookup", "eagle-chain", "eagle-tree", "medusa-chain", "medusa-tree", "early-exit",
            "kangaroo")
CATEGORIES = ("open", "copy", "structured")
CHAIN_K_MAX = 8  # a chain is calibrated at this K; its loops cut at K = 1..8 predict the others
EAGLE_TREES = ((2, 4), (4, 4), (4, 8), (6, 8), (6, 12))  # (depth, nodes): small, a CPU prices n nodes as a chain of n
MEDUSA_TREE_NODES = (4, 8, 12)  # Medusa's depth is its number of heads
CHILDREN = 3  # a tree's n_drafts: the children a node may get
K4_TREE_NODES = (DEFAULT_N_NODES, 16, 32)  # at_K4's tree budgets: the CLI's default, then an accelerator's sizes
QUICK = {"prompts": 1, "new_tokens": 8, "repeats": 1, "k4_prompts": 1}
# at_K4 counts tokens, not time: enough prompts that the bars' α, a few thousandths apart, stay put between draws
FULL = {"prompts": 3, "new_tokens": 48, "repeats": 3, "k4_prompts": 64}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} and the smallest K and trees: a smoke test")
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--draft", default="teach-draft", help="the draft model's folder (drafter 'draft')")
    parser.add_argument("--heldout", default="build/corpus/heldout.txt", help="held-out text (tools/build_corpus.py)")
    parser.add_argument("--prompts", type=int, help=f"prompts per category (default {FULL['prompts']})")
    parser.add_argument("--prompt_tokens", type=int, default=64, help="tokens of an open or structured prompt")
    parser.add_argument("--new_tokens", type=int, help=f"tokens generated per run (default {FULL['new_tokens']})")
    parser.add_argument("--repeats", type=int, help=f"measured rounds (default {FULL['repeats']})")
    parser.add_argument("--k4_prompts", type=int, help=f"at_K4's prompts per category (default {FULL['k4_prompts']})")
    parser.add_argument("--drafters", default=",".join(DRAFTERS))
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--confidence_threshold", type=float, default=CONFIDENCE_THRESHOLD,
                        help="kangaroo's early stop of the chain (Kangaroo's code: 0.6; 0 never stops)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    args.drafters, args.categories = args.drafters.split(","), args.categories.split(",")
    for given, known, flag in ((args.drafters, DRAFTERS, "--drafters"), (args.categories, CATEGORIES, "--categories")):
        if unknown := sorted(set(given) - set(known)):
            parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    try:
        args.temperatures = [float(value) for value in args.temperatures.split(",")]
    except ValueError:
        parser.error(f"--temperatures takes comma-separated numbers, got {args.temperatures!r}")
    if not 0 <= args.confidence_threshold <= 1:
        parser.error(f"--confidence_threshold must be a number in [0, 1], got {args.confidence_threshold}")
    counts = (args.prompts, args.prompt_tokens, args.new_tokens, args.repeats, args.k4_prompts)
    if not all(temperature >= 0 for temperature in args.temperatures) or min(counts) < 1:
        parser.error("temperatures must be >= 0; --prompts, --prompt_tokens, --new_tokens, --repeats and --k4_prompts "
                     "positive")
    return args


class Drafter:
    """A drafter as the benchmark runs it: its name, the model, and the (K, n_nodes) its calibration tries (a chain:
    one, its largest K, n_nodes None)."""

    def __init__(self, name, model, choices):
        self.name, self.model, self.choices = name, model, tuple(choices)
        self.is_tree = self.choices[0][1] is not None


def build_drafter(name, target, draft_model, args):  # -> Drafter, or a ValueError saying why it cannot be built
    chain_K = 3 if args.quick else CHAIN_K_MAX
    if name == "draft":
        return Drafter(name, draft_model, [(chain_K, None)])
    if name == "prompt-lookup":
        return Drafter(name, drafts.PromptLookup(target.n_vocab), [(chain_K, None)])
    model = load_drafter(name if name == "early-exit" else name.split("-")[0], target, args.models_dir,
                         confidence_threshold=args.confidence_threshold)
    if name == "eagle-tree":
        return Drafter(name, model, EAGLE_TREES[:1] if args.quick else EAGLE_TREES)
    if name == "medusa-tree":
        return Drafter(name, model, [(model.n_heads, n) for n in MEDUSA_TREE_NODES[:1 if args.quick else None]])
    return Drafter(name, model, [(model.n_heads if name == "medusa-chain" else chain_K, None)])


def build_drafters(target, draft_model, args):  # -> ([Drafter], [{"drafter", "why"}])
    built, skipped = [], []
    for name in args.drafters:
        try:
            built.append(build_drafter(name, target, draft_model, args))
        except ValueError as error:  # a head not trained yet, or trained on another target
            skipped.append({"drafter": name, "why": str(error)})
    return built, skipped


def chain_tree(drafts_drawn):  # a chain of drafts as a one-path TokenTree, so chains and trees are replayed alike
    tree, node = TokenTree(), -1
    for token in drafts_drawn:
        node = tree.add_choice(node, token)
    return tree


class Recorded:
    """A drafter that keeps, for each loop, where the loop started and what it proposed, so that the output can be
    replayed through it: how many drafts each loop accepted and at which depth it judged one."""

    def __init__(self, model):
        self.model, self.proposals = model, []
        for name in ("n_vocab", "n_ctx"):  # what sampling.prepare checks against the target
            if hasattr(model, name):
                setattr(self, name, getattr(model, name))

    def propose(self, x, K, settings, rng, stats):  # sampling.draw_drafts' contract
        proposed, p = sampling.draw_drafts(self.model, x, K, settings, rng, stats)
        self.proposals.append((len(x), chain_tree(proposed)))
        return proposed, p

    def draft_tree(self, x, K, n_drafts, settings, stats):  # verifiers/tree.py's drafts="dynamic"
        tree = self.model.draft_tree(x, K, n_drafts, settings, stats)
        self.proposals.append((len(x), tree))
        return tree

    def loops(self, out):  # -> [(accepted, judged, drafted)], one per loop
        """Down each loop's tree along the tokens that followed it: the nodes matched were accepted (a correction
        never equals a rejected candidate, whose q' was zeroed); judged adds the next depth when the last node
        matched has children."""
        rows = []
        for start, tree in self.proposals:
            node, accepted = -1, 0
            for token in out[start:]:
                if (node, int(token)) not in tree.index:
                    break
                node, accepted = tree.index[node, int(token)], accepted + 1
            rows.append((accepted, accepted + bool(tree.candidates[node]), len(tree.tokens)))
        return rows


def feed_prompt(target, model, prompt):
    """The prompt into the drafter's caches and the target's, off the clock (the drafter first: an early exit and its
    adapter rewrite the target's first layers and cut its record back)."""
    if hasattr(model, "propose"):
        model.propose(prompt, 1, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    elif hasattr(model, "logits"):
        model.logits(prompt, 1)
    target.logits(prompt, 1)


def run(target, drafter, choice, prompt, N, temperature, seed):  # -> (tokens, seconds, stats, loops)
    """One decoding from empty caches, timed after the prompt is fed; drafter None: autoregressive decoding."""
    target.reset()
    model = drafter.model if drafter else None
    if model is not None:
        model.reset()
        if drafter.is_tree:
            model.n_nodes = choice[1]
    feed_prompt(target, model, prompt)
    stats, recorded, K = SpeculativeStats(), Recorded(model), choice[0]
    start = time.perf_counter()
    if drafter is None:
        out = sampling.autoregressive_sampling(prompt, target, N, seed, temperature=temperature, stats=stats)
    elif drafter.is_tree:
        out = tree_speculative_sampling(prompt, recorded, target, N, K, seed, n_drafts=CHILDREN, drafts="dynamic",
                                        temperature=temperature, stats=stats)
    else:
        out = sampling.speculative_sampling(prompt, recorded, target, N, K, seed, temperature=temperature, stats=stats)
    return out, time.perf_counter() - start, stats, recorded.loops(out)


def total(runs, name):  # a SpeculativeStats counter summed over runs' stats
    return sum(getattr(stats, name) for _, _, stats, _ in runs)


def loops_of(runs):  # every loop of these runs, as Recorded.loops gives them
    return [loop for *_, per_run in runs for loop in per_run]


def alpha(runs):  # accepted drafts / drafts judged (None where none was judged)
    judged = total(runs, "accepted") + total(runs, "rejected")
    return total(runs, "accepted") / judged if judged else None


def draft_step_cost(runs, decode_seconds):  # c: a draft step over a decode step (0 where nothing was drafted)
    steps = total(runs, "draft_calls")
    return total(runs, "draft_seconds") / steps / decode_seconds if steps else 0.0


def predict(loops, c, steps_per_loop, verify_steps):
    """The formula at these loops: tokens per loop / (c x draft steps per loop + verify_steps), in decode steps."""
    return statistics.mean(1 + accepted for accepted, _, _ in loops) / (c * steps_per_loop + verify_steps)


def machine_v(loops, measured):  # v(drafted + 1) of this machine's measured costs, over the loops
    return statistics.mean(measured.v(min(drafted + 1, measured.K_max + 1)) for _, _, drafted in loops)


def cut(loops, K):  # a chain's loops as a chain of K would have judged them
    return [(min(accepted, K), min(judged, K), min(drafted, K)) for accepted, judged, drafted in loops]


def alpha_per_depth(loops):  # -> [alpha_1, ...]: loops accepting >= d drafts / loops judging a draft at depth d
    alphas, depth = [], 1
    while judged := sum(j >= depth for _, j, _ in loops):
        alphas.append(sum(a >= depth for a, _, _ in loops) / judged)
        depth += 1
    return alphas


def calibrate(drafter, prompts, target, N, temperature, decode_seconds, measured):  # -> (choice, its prediction)
    """Every prompt once at every choice of the drafter's grid; a chain's loops cut at K = 1..K predict each K."""
    predictions = {}
    for choice in drafter.choices:
        runs = [run(target, drafter, choice, prompt, N, temperature, 1000 + i) for i, prompt in enumerate(prompts)]
        loops, c = loops_of(runs), draft_step_cost(runs, decode_seconds)
        if drafter.is_tree:
            steps = total(runs, "draft_calls") / total(runs, "loops")
            predictions[choice] = predict(loops, c, steps, machine_v(loops, measured))
        for K in [] if drafter.is_tree else range(1, choice[0] + 1):
            chain = cut(loops, K)
            steps = statistics.mean(drafted for *_, drafted in chain)
            predictions[K, None] = predict(chain, c, steps, machine_v(chain, measured))
    best = max(predictions, key=lambda choice: (predictions[choice], -choice[0]))
    return best, predictions[best]


def rotated(items, shift):
    shift %= len(items)
    return items[shift:] + items[:shift]


def measure(drafters, choices, prompts, target, args, temperature):  # -> runs, autoregressive runs, speedups, same
    """The measured rounds: per prompt, autoregressive decoding on both sides of the drafters' runs."""
    runs, reference_runs, speedups = {d.name: [] for d in drafters}, [], {d.name: [] for d in drafters}
    same = {d.name: True for d in drafters}
    for round_ in range(args.repeats):
        for i, prompt in enumerate(prompts):
            before = run(target, None, (0, None), prompt, args.new_tokens, temperature, i)
            timed = {d.name: run(target, d, choices[d.name], prompt, args.new_tokens, temperature, i)
                     for d in rotated(drafters, round_ * len(prompts) + i)}
            after = run(target, None, (0, None), prompt, args.new_tokens, temperature, i)
            reference_runs += [before, after]
            for name, result in timed.items():
                runs[name].append(result)
                speedups[name].append((before[1] + after[1]) / 2 / result[1])
                same[name] &= bool(np.array_equal(result[0], before[0]))
    return runs, reference_runs, speedups, same


def row(drafter, category, temperature, choice, calibrated, runs, speedups, same, decode_seconds, measured):
    """A drafter's row: what its measured runs did, and the formula at their loops, c and verification cost (that of
    these runs, in their autoregressive decode steps, as bench/pair.py; and this machine's v measured apart)."""
    loops, c = loops_of(runs), draft_step_cost(runs, decode_seconds)
    steps, verify = total(runs, "draft_calls") / total(runs, "loops"), decode_step(runs) / decode_seconds
    return {"drafter": drafter.name, "category": category, "temperature": int(temperature) if temperature.is_integer()
            else temperature, "K": choice[0], "n_nodes": choice[1], "c": c,
            "alpha": alpha(runs), "alpha_per_depth": alpha_per_depth(loops),
            "tokens_per_call": total(runs, "generated") / total(runs, "target_calls"),
            "speedup": {"median": statistics.median(speedups), "low": min(speedups), "high": max(speedups)},
            "predicted_speedup": predict(loops, c, steps, verify),
            "same_tokens_as_autoregressive": same if temperature == 0 else None,
            "predicted_speedup_machine_v": predict(loops, c, steps, machine_v(loops, measured)),
            "calibrated_prediction": calibrated, "draft_steps_per_loop": steps, "verify_steps": verify,
            "runs": len(runs)}


def decode_step(runs):  # seconds per target call in these runs (autoregressive runs: the decode step)
    return total(runs, "target_seconds") / total(runs, "target_calls")


def bench_category(drafters, category, prompts, target, args, temperature, measured):  # -> rows
    references = [run(target, None, (0, None), prompt, args.new_tokens, temperature, 1000 + i)
                  for i, prompt in enumerate(prompts)]
    choices, calibrated = {}, {}
    for drafter in drafters:
        choices[drafter.name], calibrated[drafter.name] = calibrate(drafter, prompts, target, args.new_tokens,
                                                                    temperature, decode_step(references), measured)
    runs, reference_runs, speedups, same = measure(drafters, choices, prompts, target, args, temperature)
    rows = []
    for drafter in drafters:
        rows.append(row(drafter, category, temperature, choices[drafter.name], calibrated[drafter.name],
                        runs[drafter.name], speedups[drafter.name], same[drafter.name], decode_step(reference_runs),
                        measured))
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}),
              file=sys.stderr, flush=True)
    return rows


def at_K4(drafters, prompts_by_category, target, new_tokens):  # -> rows: draft vs EAGLE at K = 4, temperature 0
    """Alpha and tokens per target call of the draft and EAGLE's chain at K = 4, and of EAGLE-2's tree at depth 4
    within each of K4_TREE_NODES, one greedy run per prompt, per category and over all of them."""
    compared = [(d, (4, None)) for d in drafters if d.name in ("draft", "eagle-chain")]
    compared += [(d, (4, n_nodes)) for d in drafters if d.name == "eagle-tree" for n_nodes in K4_TREE_NODES]
    rows = []
    for drafter, choice in compared:
        every = []
        for category, prompts in prompts_by_category.items():
            runs = [run(target, drafter, choice, prompt, new_tokens, 0.0, i) for i, prompt in enumerate(prompts)]
            every += runs
            rows.append(k4_row(drafter, choice, category, runs))
        rows.append(k4_row(drafter, choice, "all", every))
    return rows


def k4_row(drafter, choice, category, runs):
    return {"drafter": drafter.name, "category": category, "K": choice[0], "n_nodes": choice[1], "prompts": len(runs),
            "alpha": alpha(runs), "tokens_per_call": total(runs, "generated") / total(runs, "target_calls")}


def category_prompts(encoder, text, tokens, args, n_ctx, n_prompts):  # -> {category: [prompts]}, how they were chosen
    """n_prompts prompts per category cut from the held-out text (and its tokens, encoded once by the caller)."""
    prompts, notes = {}, {}
    if "open" in args.categories:
        prompts["open"] = heldout.open_prompts(tokens, n_prompts, args.prompt_tokens)
    if "copy" in args.categories:
        prompts["copy"] = heldout.copy_prompts(encoder, text, n_prompts, (n_ctx - args.new_tokens) // 2 - 8)
    if "structured" in args.categories:
        prompts["structured"], scores = heldout.structured_prompts(tokens, n_prompts, args.prompt_tokens,
                                                                   args.new_tokens)
        notes["structured_repetition"] = scores
    notes["prompt_lengths"] = {category: [len(prompt) for prompt in chosen] for category, chosen in prompts.items()}
    return {category: prompts[category] for category in args.categories}, notes


def main(argv=None):
    started = time.perf_counter()
    args = parse_args(argv)
    heldout.require_heldout(args.heldout)
    encoder, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(params, hparams)
    try:
        text, tokens = Path(args.heldout).read_text(encoding="utf-8"), heldout.held_out_tokens(encoder, args.heldout)
        prompts, notes = category_prompts(encoder, text, tokens, args, hparams["n_ctx"], args.prompts)
        k4_prompts, _ = category_prompts(encoder, text, tokens, args, hparams["n_ctx"], args.k4_prompts)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
    first = next(iter(prompts.values()))[0]
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
    draft_model = engine.fast_model(draft_params, draft_hparams)
    measured = costs.measure_costs(target, draft_model, first, budget_seconds=0.3 if args.quick else 2.0)
    drafters, skipped = build_drafters(target, draft_model, args)
    command = shlex.join(["python", "bench/spec_bench.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"machine": machine_line(), "command": command,
              "settings": {"target": args.target, "draft": args.draft, "heldout": args.heldout,
                           "prompts": args.prompts, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                           "repeats": args.repeats, "k4_prompts": args.k4_prompts, "temperatures": args.temperatures,
                           "categories": args.categories, "confidence_threshold": args.confidence_threshold,
                           "drafters": args.drafters, "choices": {d.name: d.choices for d in drafters},
                           "tree_children": CHILDREN, "costs": measured.as_dict(), **notes},
              "target_decode_ms": 1000 * measured.decode_step_seconds, "rows": [], "skipped": skipped}
    for temperature in args.temperatures:
        for category, chosen in prompts.items():
            result["rows"] += bench_category(drafters, category, chosen, target, args, temperature, measured)
    if 0.0 in args.temperatures:
        result["at_K4"] = at_K4(drafters, k4_prompts, target, args.new_tokens)
    result["wall_seconds"] = time.perf_counter() - started
    text = json.dumps(result)
    if args.out:
        write_atomically(Path(args.out), (text + "\n").encode())
    print(text)


if __name__ == "__main__":
    main()
