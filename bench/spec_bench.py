"""Spec-Bench in miniature (Xia et al. 2024, arXiv 2401.07851): every drafter of the kit on held-out prompts of three
kinds, at temperatures 0 and 1, each at the K (or tree) chosen on a development split, timed against autoregressive
decoding on a test split that nothing was chosen on, with Leviathan et al.'s formula beside every measured speedup.

Drafters (--drafters): draft (the distilled teach-draft model), prompt-lookup (speedup/drafts.py), eagle-chain and
eagle-tree (EAGLE's head drafting a chain; EAGLE-2's dynamic tree), eagle3-chain and eagle3-tree (EAGLE-3's draft, the
same two ways), medusa-chain and medusa-tree (Medusa's heads; their sparse tree), early-exit (the target's first
layers, untrained) and kangaroo (that exit with its trained adapter). A drafter whose head is not in --models_dir
(tools/train_heads.py writes them) is left out, the reason in "skipped".
A tree is judged two ways (a row's tree_rule): eagle-tree, eagle3-tree and medusa-tree choose their nodes, each judged
by the one-hot rule; eagle-sampled-tree and medusa-sampled-tree draw three drafts from the same head's p, independently
(SpecInfer; RSD's distinct first tokens would make EAGLE's second draft read a feature the target has not computed),
merged into one tree and judged against that p by recursive rejection (verifiers/tree.py, drafts="sampled"). At
temperature 0 p is one-hot and the three drafts one chain: the sampled trees have rows at temperatures above 0 only.

Prompts: bench/prompts/dev.json and test.json (bench/spec_splits.py cuts them from the held-out text, each held-out
document in one split by a hash of its name), per split and category: open (windows spread evenly: text to
continue), copy (a held-out function given whole, then its first two lines again: the continuation is a copy),
structured (in each of equal shares of the split, the window whose span repeats its own 4-grams the most). The bench
takes --prompts of each category, spread over the file's (and --k4_prompts for at_K4).

For each temperature and category:
1. Calibration, on --prompts development prompts: every choice of every drafter's grid (a chain: K = 1..8, each K
   its own runs, since a chain's c falls with K: a loop's fixed work, such as EAGLE's head reading the accepted
   tokens' features, is shared by fewer draft steps at small K; a tree: each size of its grid), one run per prompt,
   with autoregressive decoding before and after each drafter's runs. The choice kept is the one of the highest
   measured speedup on these prompts (their autoregressive seconds over the choice's, pooled): it prices all a loop
   costs, the Python of each loop too, which the formula leaves out and which weighs most at small K. Beside each
   choice stands the formula at its own runs' loops, c and verification (calibration[] in the rows).
2. Measured runs, on --prompts test prompts, --repeats rounds: for every prompt, autoregressive decoding, each
   drafter at its choice (in an order rotated from prompt to prompt), autoregressive decoding again; a drafter's
   speedup is the mean of the two autoregressive times over its own: median with its range, mean and standard
   deviation over prompts x rounds. Seeds are fixed per prompt, so rounds repeat the same tokens and differ only in
   time. The prompt is fed to the target and the drafter before the clock starts: the formula prices the decoding
   after it.
Each row gives, from the measured runs: alpha (accepted / judged drafts), alpha per depth and its histogram (loops
that judged a draft at depth d, and those that accepted it), loops by accepted length, mean accepted tokens per target
call in Spec-Bench's convention and SpecForge's (bench/spec_stats.py), c, and predicted_speedup, the formula at the
measured loops, c and verification cost (each in the rounds' autoregressive decode steps, as bench/pair.py);
predicted_speedup_machine_v the same with v(n) measured apart (speedup/costs.measure_costs; a tree of n nodes costs
about a chain of n, bench/tree.py). "at_K4" (temperature 0) sets the distilled draft beside the trained heads'
chains (EAGLE's, EAGLE-3's, Medusa's and Kangaroo's, those of --drafters) at K = 4, and EAGLE's and EAGLE-3's
dynamic trees at depth 4 with drafters/load.py's default budget and the larger budgets an accelerator would verify
for about a step's cost (16 and 32 nodes), on --k4_prompts prompts per category of the test split (more than the
timed rows: it counts tokens, not time); "at_K4_margins" sets each against the draft on the same prompts (each chain
in alpha, each tree in tokens per target call), and every other head's chain against EAGLE's in alpha, with the 95%
interval of a paired bootstrap over the prompts, and says "level" where that interval holds no margin. A head's
recipe is judged on the development split instead: --at_K4_only --at_K4_split dev. At temperature 0 every run's
tokens must equal autoregressive decoding's: same_tokens_as_autoregressive.

    python bench/spec_bench.py --out drafters.json                     # tens of minutes: bench/README.md
    python bench/spec_bench.py --at_K4_only --at_K4_split dev --drafters draft,eagle-chain,eagle-tree  # a recipe
    python bench/spec_bench.py --quick --drafters draft,prompt-lookup  # seconds: that it runs

Prints one JSON line per row as it goes (to stderr), then the JSON object as its last line.
"""

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

import engine
import gpt2
import sampling
import utils
from bench import spec_splits
from bench.heldout import spread
from bench.machine import machine_line
from bench.spec_stats import (Recorded, accepted_length_counts, acceptance_by_depth, alpha, alpha_per_depth,
                              decode_step, formula_terms, loops_of, machine_v, mean_accepted_tokens, paired_margin,
                              per_prompt, predict, summary, total)
from checkpoints.atomic import write_atomically
from drafters.kangaroo import CONFIDENCE_THRESHOLD
from drafters.load import DEFAULT_N_NODES, load_drafter
from speedup import costs, drafts
from speedup.stats import SpeculativeStats
from verifiers.tree import tree_speculative_sampling

DRAFTERS = ("draft", "prompt-lookup", "eagle-chain", "eagle-tree", "eagle-sampled-tree", "eagle3-chain",
            "eagle3-tree", "medusa-chain", "medusa-tree", "medusa-sampled-tree", "early-exit", "kangaroo")
K4_HEADS = ("eagle3-chain", "medusa-chain", "kangaroo")  # trained heads at_K4 sets against EAGLE-1's too
K4_CHAINS, K4_TREES = ("draft", "eagle-chain", *K4_HEADS), ("eagle-tree", "eagle3-tree")  # at_K4's drafters
CATEGORIES = spec_splits.CATEGORIES
CHAIN_KS = tuple(range(1, 9))  # a chain is calibrated at each of these K, each with its own runs
EAGLE_TREES = ((2, 4), (4, 4), (4, 8), (6, 8), (6, 12))  # (depth, nodes): small, a CPU prices n nodes as a chain of n
MEDUSA_TREE_NODES = (4, 8, 12)  # Medusa's depth is its number of heads
CHILDREN = 3  # a tree's n_drafts: the children a node may get; a sampled tree's drafts
SAMPLED_TREE_DEPTHS = (1, 2, 4)  # a sampled tree of CHILDREN drafts of K tokens: at most 3, 6 and 12 nodes
K4_TREE_NODES = (DEFAULT_N_NODES, 16, 32)  # at_K4's tree budgets: the CLI's default, then an accelerator's sizes
QUICK = {"prompts": 1, "new_tokens": 8, "repeats": 1, "k4_prompts": 1}
# 8 prompts x 3 rounds per timed cell; at_K4 counts tokens, not time: enough prompts that the bars' α, a few
# thousandths apart, stay put between draws
FULL = {"prompts": 8, "new_tokens": 48, "repeats": 3, "k4_prompts": 64}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK}, K 1..3 and the smallest trees: a smoke test")
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--draft", default="teach-draft", help="the draft model's folder (drafter 'draft')")
    spec_splits.add_prompts_dir_argument(parser)
    parser.add_argument("--prompts", type=int, help=f"prompts per category, on each split (default {FULL['prompts']})")
    parser.add_argument("--new_tokens", type=int, help=f"tokens generated per run (default {FULL['new_tokens']})")
    parser.add_argument("--repeats", type=int, help=f"measured rounds (default {FULL['repeats']})")
    parser.add_argument("--k4_prompts", type=int, help=f"at_K4's prompts per category (default {FULL['k4_prompts']})")
    parser.add_argument("--at_K4_split", choices=spec_splits.SPLITS, default="test",
                        help="the split at_K4 reads: test to report, dev to judge a head's recipe")
    parser.add_argument("--at_K4_only", action="store_true", help="at_K4 alone: no calibration, no timed rows")
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
    counts = (args.prompts, args.new_tokens, args.repeats, args.k4_prompts)
    if not all(temperature >= 0 for temperature in args.temperatures) or min(counts) < 1:
        parser.error("temperatures must be >= 0; --prompts, --new_tokens, --repeats and --k4_prompts positive")
    return args


class Drafter:
    """A drafter as the benchmark runs it: its name, the target it verifies with, the model, the (K, n_nodes) its
    calibration tries (n_nodes None but for a tree the drafter grows), and how verifiers/tree.py grows its tree
    (`drafts`: None for a chain)."""

    def __init__(self, name, target, model, choices, drafts=None):
        self.name, self.target, self.model, self.choices, self.drafts = name, target, model, tuple(choices), drafts
        self.tree_rule = {None: None, "dynamic": "one-hot", "sampled": "sampled"}[drafts]  # how its nodes are judged


def own_target(target):  # -> the same weights in the same layouts, with a cache and taps of its own
    """Each drafter verifies with its own view of the target, as a user's run builds it: a head's taps (EAGLE reads
    blocks 1..6) would otherwise stop the early exit's and Kangaroo's reuse of their shallow layers, and each drafter
    would pay for streams others keep."""
    own = gpt2.GPT2Model(target.params, target.hparams, unembedding=target.unembedding)
    own.plan = getattr(target, "plan", None)  # engine.fast_model's layouts; None: the plain path
    return own


def build_drafter(name, target, draft_model, args):  # -> Drafter, or a ValueError saying why it cannot be built
    chain, target = [(K, None) for K in (CHAIN_KS[:3] if args.quick else CHAIN_KS)], own_target(target)
    if name == "draft":
        return Drafter(name, target, draft_model, chain)
    if name == "prompt-lookup":
        return Drafter(name, target, drafts.PromptLookup(target.n_vocab), chain)
    model = load_drafter(name if name == "early-exit" else name.split("-")[0], target, args.models_dir,
                         confidence_threshold=args.confidence_threshold)
    if name in ("eagle-tree", "eagle3-tree"):  # EAGLE-3 grows EAGLE-2's tree
        return Drafter(name, target, model, EAGLE_TREES[:1] if args.quick else EAGLE_TREES, "dynamic")
    if name == "medusa-tree":
        sizes = MEDUSA_TREE_NODES[:1 if args.quick else None]
        return Drafter(name, target, model, [(model.n_heads, n) for n in sizes], "dynamic")
    if name == "eagle-sampled-tree":
        return Drafter(name, target, model, [(K, None) for K in SAMPLED_TREE_DEPTHS[:1 if args.quick else None]],
                       "sampled")
    if name == "medusa-sampled-tree":
        return Drafter(name, target, model, [(model.n_heads, None)], "sampled")
    return Drafter(name, target, model, [(model.n_heads, None)] if name == "medusa-chain" else chain)


def build_drafters(target, draft_model, args):  # -> ([Drafter], [{"drafter", "why"}])
    built, skipped = [], []
    for name in args.drafters:
        try:
            built.append(build_drafter(name, target, draft_model, args))
        except ValueError as error:  # a head not trained yet, or trained on another target
            skipped.append({"drafter": name, "why": str(error)})
    return built, skipped


def feed_prompt(target, model, prompt):
    """The prompt into the drafter's caches and the target's, off the clock (the drafter first: an early exit and its
    adapter rewrite the target's first layers and cut its record back)."""
    if hasattr(model, "propose"):
        model.propose(prompt, 1, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    elif hasattr(model, "logits"):
        model.logits(prompt, 1)
    target.logits(prompt, 1)


def run(target, drafter, choice, prompt, N, temperature, seed):  # -> (tokens, seconds, stats, loops)
    """One decoding from empty caches, timed after the prompt is fed; drafter None: autoregressive decoding on target,
    else the drafter's own target."""
    target = drafter.target if drafter else target
    target.reset()
    model = drafter.model if drafter else None
    if model is not None:
        model.reset()
        if drafter.drafts == "dynamic":
            model.n_nodes = choice[1]
    feed_prompt(target, model, prompt)
    stats, recorded, K = SpeculativeStats(), Recorded(model), choice[0]
    start = time.perf_counter()
    if drafter is None:
        out = sampling.autoregressive_sampling(prompt, target, N, seed, temperature=temperature, stats=stats)
    elif drafter.drafts:  # a sampled tree's drafts independent (SpecInfer): each drawn from x, whose features exist
        out = tree_speculative_sampling(prompt, recorded, target, N, K, seed, n_drafts=CHILDREN, drafts=drafter.drafts,
                                        replacement=True, temperature=temperature, stats=stats)
    else:
        out = sampling.speculative_sampling(prompt, recorded, target, N, K, seed, temperature=temperature, stats=stats)
    seconds = time.perf_counter() - start
    return out, seconds, stats, recorded.loops(stats.origins) if drafter else []  # plain decoding has no loops


def rotated(items, shift):
    shift %= len(items)
    return items[shift:] + items[:shift]


AUTOREGRESSIVE = (None, (0, None))  # run()'s drafter and choice for plain decoding


def calibrate(drafters, prompts, target, N, temperature):  # -> {drafter name: its calibration}
    """On the development prompts: per prompt, autoregressive decoding, then each drafter's runs at every choice of its
    grid and autoregressive decoding again, so that each drafter's runs sit between two autoregressive runs."""
    runs = {(drafter.name, choice): [] for drafter in drafters for choice in drafter.choices}
    reference_seconds, reference_runs = {drafter.name: [] for drafter in drafters}, []
    for i, prompt in enumerate(prompts):
        before = run(target, *AUTOREGRESSIVE, prompt, N, temperature, 1000 + i)
        reference_runs.append(before)
        for drafter in rotated(drafters, i):
            for choice in drafter.choices:
                runs[drafter.name, choice].append(run(target, drafter, choice, prompt, N, temperature, 1000 + i))
            after = run(target, *AUTOREGRESSIVE, prompt, N, temperature, 1000 + i)
            reference_runs.append(after)
            reference_seconds[drafter.name].append((before[1] + after[1]) / 2)
            before = after
    decode_seconds = decode_step(reference_runs)
    return {drafter.name: calibration(drafter, runs, sum(reference_seconds[drafter.name]), decode_seconds)
            for drafter in drafters}


def calibration(drafter, runs, reference_seconds, decode_seconds):  # -> {"kept": an entry of by_choice, "by_choice"}
    """Each choice's own runs: its measured speedup (autoregressive seconds over its seconds, pooled over the prompts)
    and the formula at its loops, c and verification; the choice of the highest measured speedup is kept."""
    by_choice = []
    for choice in drafter.choices:
        choice_runs = runs[drafter.name, choice]
        c, steps, verify = formula_terms(choice_runs, decode_seconds)
        by_choice.append({"K": choice[0], "n_nodes": choice[1], "c": c, "alpha": alpha(choice_runs),
                          "tokens_per_call": total(choice_runs, "generated") / total(choice_runs, "target_calls"),
                          "speedup": reference_seconds / sum(seconds for _, seconds, _, _ in choice_runs),
                          "predicted_speedup": predict(loops_of(choice_runs), c, steps, verify)})
    return {"kept": max(by_choice, key=lambda entry: entry["speedup"]), "by_choice": by_choice}


def measure(drafters, choices, prompts, target, args, temperature):  # -> runs, autoregressive runs, speedups, same
    """The measured rounds: per prompt, autoregressive decoding on both sides of the drafters' runs."""
    runs, reference_runs, speedups = {d.name: [] for d in drafters}, [], {d.name: [] for d in drafters}
    same = {d.name: True for d in drafters}
    for round_ in range(args.repeats):
        for i, prompt in enumerate(prompts):
            before = run(target, *AUTOREGRESSIVE, prompt, args.new_tokens, temperature, i)
            timed = {d.name: run(target, d, choices[d.name], prompt, args.new_tokens, temperature, i)
                     for d in rotated(drafters, round_ * len(prompts) + i)}
            after = run(target, *AUTOREGRESSIVE, prompt, args.new_tokens, temperature, i)
            reference_runs += [before, after]
            for name, result in timed.items():
                runs[name].append(result)
                speedups[name].append((before[1] + after[1]) / 2 / result[1])
                same[name] &= bool(np.array_equal(result[0], before[0]))
    return runs, reference_runs, speedups, same


def row(drafter, category, temperature, calibrated, runs, speedups, same, decode_seconds, measured, rounds):
    """A drafter's row: what its measured runs did, and the formula at their loops, c and verification cost (that of
    these runs, in their autoregressive decode steps, as bench/pair.py; and this machine's v measured apart)."""
    loops, kept = loops_of(runs), calibrated["kept"]
    c, steps, verify = formula_terms(runs, decode_seconds)
    return {"drafter": drafter.name, "category": category, "temperature": int(temperature) if temperature.is_integer()
            else temperature, "K": kept["K"], "n_nodes": kept["n_nodes"], "tree_rule": drafter.tree_rule, "c": c,
            "split": "test", "prompts": len(runs) // rounds, "rounds": rounds,
            "alpha": alpha(runs), "alpha_per_depth": alpha_per_depth(loops),
            "acceptance_by_depth": acceptance_by_depth(loops), "accepted_length_counts": accepted_length_counts(loops),
            "tokens_per_call": total(runs, "generated") / total(runs, "target_calls"),
            "mean_accepted_tokens": mean_accepted_tokens(runs), "speedup": summary(speedups),
            "predicted_speedup": predict(loops, c, steps, verify),
            "same_tokens_as_autoregressive": same if temperature == 0 else None,
            "predicted_speedup_machine_v": predict(loops, c, steps, machine_v(loops, measured)),
            "calibrated_speedup": kept["speedup"], "calibrated_prediction": kept["predicted_speedup"],
            "calibration": calibrated["by_choice"], "draft_steps_per_loop": steps, "verify_steps": verify,
            "runs": len(runs)}


def bench_category(drafters, category, prompts, target, args, temperature, measured):  # -> rows
    """Calibrated on the category's development prompts, timed on its test prompts."""
    # at temperature 0 p is one-hot: a sampled tree's drafts would all be one chain
    drafters = [drafter for drafter in drafters if drafter.drafts != "sampled" or temperature > 0]
    calibrated = calibrate(drafters, prompts["dev"], target, args.new_tokens, temperature)
    choices = {name: (entry["kept"]["K"], entry["kept"]["n_nodes"]) for name, entry in calibrated.items()}
    runs, reference_runs, speedups, same = measure(drafters, choices, prompts["test"], target, args, temperature)
    rows = []
    for drafter in drafters:
        rows.append(row(drafter, category, temperature, calibrated[drafter.name], runs[drafter.name],
                        speedups[drafter.name], same[drafter.name], decode_step(reference_runs), measured,
                        args.repeats))
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()
                          if k != "calibration"}), file=sys.stderr, flush=True)
    return rows


def at_K4(drafters, prompts_by_category, target, new_tokens, split):  # -> rows: draft vs heads at K = 4, temperature 0
    """Alpha and tokens per target call of the draft and the heads' chains at K = 4 (K4_CHAINS), and of EAGLE's and
    EAGLE-3's EAGLE-2 trees at depth 4 within each of K4_TREE_NODES, one greedy run per prompt, per category and over
    all of them."""
    compared = [(d, (4, None)) for d in drafters if d.name in K4_CHAINS]
    compared += [(d, (4, n_nodes)) for d in drafters if d.name in K4_TREES for n_nodes in K4_TREE_NODES]
    rows, by_prompt = [], {}
    for drafter, choice in compared:
        every = []
        for category, prompts in prompts_by_category.items():
            runs = [run(target, drafter, choice, prompt, new_tokens, 0.0, i) for i, prompt in enumerate(prompts)]
            every += runs
            rows.append(k4_row(drafter, choice, category, runs, split))
        rows.append(k4_row(drafter, choice, "all", every, split))
        by_prompt[drafter.name if choice[1] is None else f"{drafter.name} {choice[1]}"] = per_prompt(every)
    return rows, k4_margins(by_prompt)


def k4_margins(by_prompt):  # -> the bars' comparisons, each with its paired interval
    """Each chain against the draft in alpha, each tree against it in tokens per target call (the bar: 1.2 times);
    every other head's chain against EAGLE's (what EAGLE-3 changed, or another method, on the same prompts) in alpha
    and, keyed "..., tokens per call", in tokens per target call: a chain that stops early (Kangaroo's) is judged on
    fewer drafts, so its alpha alone does not compare."""
    pairs = {f"{name} / draft": (name, "draft", "alpha" if name in K4_CHAINS else "tokens_per_call")
             for name in by_prompt if name != "draft" and "draft" in by_prompt}
    for name in (name for name in K4_HEADS if {name, "eagle-chain"} <= set(by_prompt)):
        pairs[f"{name} / eagle-chain"] = (name, "eagle-chain", "alpha")
        pairs[f"{name} / eagle-chain, tokens per call"] = (name, "eagle-chain", "tokens_per_call")
    return {key: paired_margin(by_prompt[name], by_prompt[base], measure)
            for key, (name, base, measure) in pairs.items()}


def k4_row(drafter, choice, category, runs, split):
    return {"drafter": drafter.name, "category": category, "K": choice[0], "n_nodes": choice[1], "split": split,
            "prompts": len(runs), "alpha": alpha(runs), "tokens_per_call": total(runs, "generated") /
            total(runs, "target_calls"), "mean_accepted_tokens": mean_accepted_tokens(runs)}


def runs_at_K4(args):  # at_K4 is greedy: it runs where temperature 0 does, or alone
    return args.at_K4_only or 0.0 in args.temperatures


def chosen_prompts(files, args, n_ctx, vocabulary):  # -> {(split, use): {category: [prompt]}}, their record
    """The prompts each use reads, spread over each committed file's, and what the JSON records of them: the files'
    sha256 and cut, and the ids read. A file cut with another vocabulary, or a prompt with no room for new_tokens
    within n_ctx, is refused."""
    uses = {} if args.at_K4_only else {("dev", "calibration"): args.prompts, ("test", "timed"): args.prompts}
    if runs_at_K4(args):
        uses[args.at_K4_split, "at_K4"] = args.k4_prompts
    prompts, record = {}, {}
    for (split, use), n in uses.items():
        content = files[split]
        spec_splits.check_vocabulary(content, vocabulary, args.target)
        picked = {category: spread(content["categories"][category], n) for category in args.categories}
        longest = max(len(prompt["tokens"]) for chosen in picked.values() for prompt in chosen)
        if longest + args.new_tokens > n_ctx:
            raise ValueError(f"a {split} prompt of {longest} tokens leaves no room for {args.new_tokens} new tokens "
                             f"within n_ctx {n_ctx}")
        prompts[split, use] = {category: [np.asarray(prompt["tokens"], dtype=np.int64) for prompt in chosen]
                               for category, chosen in picked.items()}
        record.setdefault(split, {key: content[key] for key in ("command", "rule", "heldout", "settings")})
        record[split][use] = {category: [prompt["id"] for prompt in chosen] for category, chosen in picked.items()}
    return prompts, record


def main(argv=None):
    started = time.perf_counter()
    args = parse_args(argv)
    try:
        files = {split: spec_splits.load(split, args.prompts_dir) for split in spec_splits.SPLITS}
        _, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
        vocabulary = spec_splits.target_vocabulary(args.models_dir, args.target)
        prompts, prompt_record = chosen_prompts(files, args, hparams["n_ctx"], vocabulary)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)
    for split in prompt_record:
        prompt_record[split]["sha256"] = spec_splits.sha256_of(Path(args.prompts_dir) / f"{split}.json")
    target = engine.fast_model(params, hparams)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
    draft_model = engine.fast_model(draft_params, draft_hparams)
    drafters, skipped = build_drafters(target, draft_model, args)
    command = shlex.join(["python", "bench/spec_bench.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"machine": machine_line(), "command": command,
              "settings": {"target": args.target, "draft": args.draft, "prompts": args.prompts,
                           "new_tokens": args.new_tokens, "repeats": args.repeats, "k4_prompts": args.k4_prompts,
                           "at_K4_split": args.at_K4_split, "temperatures": args.temperatures,
                           "categories": args.categories, "confidence_threshold": args.confidence_threshold,
                           "drafters": args.drafters,
                           "choices": {d.name: d.choices for d in drafters}, "tree_children": CHILDREN,
                           "prompt_files": prompt_record}, "rows": [], "skipped": skipped}
    if not args.at_K4_only:
        first = prompts["test", "timed"][args.categories[0]][0]
        measured = costs.measure_costs(target, draft_model, first, budget_seconds=0.3 if args.quick else 2.0)
        result["settings"]["costs"], result["target_decode_ms"] = measured.as_dict(), 1000 * measured.decode_step_seconds
        for temperature in args.temperatures:
            for category in args.categories:
                by_split = {"dev": prompts["dev", "calibration"][category], "test": prompts["test", "timed"][category]}
                result["rows"] += bench_category(drafters, category, by_split, target, args, temperature, measured)
    if runs_at_K4(args):
        result["at_K4"], result["at_K4_margins"] = at_K4(drafters, prompts[args.at_K4_split, "at_K4"], target,
                                                         args.new_tokens, args.at_K4_split)
    result["wall_seconds"] = time.perf_counter() - started
    text = json.dumps(result)
    if args.out:
        write_atomically(Path(args.out), (text + "\n").encode())
    print(text)


if __name__ == "__main__":
    main()
