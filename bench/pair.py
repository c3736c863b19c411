"""The bundled pair on held-out text: acceptance rate, measured and expected speedup against K, and --K auto.

Prompts are open prompts of the held-out split of the training corpus (documents the models never saw), committed in
bench/prompts (bench/spec_splits.py): --n_prompts of each split, spread over its file's, their first --prompt_tokens
tokens. For every K (an integer, or auto: costs.AutoK choosing K every loop from this machine's measured costs and
the alpha so far), each prompt is decoded autoregressively and then speculatively, both with KV caches, from the same
seed; at temperature 0 the speculative tokens must equal the autoregressive ones. Each prompt's two runs follow each
other, so that a shared machine's drift hits both alike: `median_speedup` is the median over the prompts of their
autoregressive time / speculative time.

The best K is chosen on one split and judged on another: every fixed K runs on the development split first
("calibration", split dev), `best_K` is the K of the highest median speedup there, and every row of `by_K` (split
test), `best_median_speedup` (best_K's row) and `auto_over_best_fixed` are measured on the test split. The costs
auto reads are measured on the first development prompt; the perplexities are over --perplexity_prompts whole open
prompts of the test split, each scored on its own.

Beside it stands Leviathan et al.'s formula, each prompt's from its own runs: tokens per loop at the run's
alpha and mean K, over K c + v, with c the run's draft step and v its target call, both in the prompt's
autoregressive decode steps (SpeculativeStats.expected_speedup); `median_measured_over_expected` says how
well the formula predicts. `expected_speedup_one_step` is the same with v = 1, the paper's idealisation.

    python bench/pair.py                                   # K = 1..12 and auto, 24 prompts of each split
    python bench/pair.py --temperature 1 --K 4,auto        # alpha when sampling
    python bench/pair.py --draft prompt-lookup --K 2,4,8   # drafts copied from the text (speedup/drafts.py)

Prints one JSON line per K and split as it goes, then one JSON object as its last line.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np

import engine
import sampling
import utils
from bench import spec_splits
from bench.machine import blas_info, cpu_model
from bench.text_quality import total_nats
from speedup import costs, drafts
from speedup.stats import SpeculativeStats

AUTO_K_MAX = 12


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--draft", default="teach-draft", help="a model folder, or prompt-lookup")
    parser.add_argument("--target", default="teach-target")
    spec_splits.add_prompts_dir_argument(parser)
    parser.add_argument("--n_prompts", type=int, default=24, help="open prompts of each split")
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--n_tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--K", default="1,2,3,4,5,6,8,10,12,auto", help="comma-separated integers and auto")
    parser.add_argument("--perplexity_prompts", type=int, default=64, help="whole test prompts scored for perplexity")
    args = parser.parse_args(argv)
    try:
        args.K = [K if K == "auto" else int(K) for K in args.K.split(",")]
    except ValueError:
        parser.error(f"--K takes comma-separated integers and auto, got {args.K!r}")
    if any(K != "auto" and K < 1 for K in args.K) or args.n_prompts < 1 or args.n_tokens < 1:
        parser.error("--K values, --n_prompts and --n_tokens must be positive")
    return args


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def perplexity_over(prompts, params, hparams):  # -> exp(mean nats per predicted token), each prompt scored on its own
    nats = sum(total_nats(prompt, params, hparams) for prompt in prompts)
    return float(np.exp(nats / sum(len(prompt) - 1 for prompt in prompts)))


def measure_K(K, prompts, draft, target, measured, args):
    """Each prompt's autoregressive and speculative runs, back to back: -> (the row for K, per-prompt rows)."""
    ar_total, total = SpeculativeStats(), SpeculativeStats()
    per_prompt, chosen = [], []
    for prompt in prompts:
        runs = {}
        speculative_draft = costs.AutoK(draft, measured) if K == "auto" else draft  # alpha from this run alone
        for name in ("autoregressive", "speculative"):
            for model in (speculative_draft, target):
                model.reset()  # every run starts from empty caches
            stats = SpeculativeStats()
            rng = np.random.default_rng(0)
            start = time.perf_counter()
            if name == "autoregressive":
                out = sampling.autoregressive_sampling(prompt, target, args.n_tokens, rng,
                                                       temperature=args.temperature, stats=stats)
            else:
                out = sampling.speculative_sampling(prompt, speculative_draft, target, args.n_tokens,
                                                    AUTO_K_MAX if K == "auto" else K, rng,
                                                    temperature=args.temperature, stats=stats)
            runs[name] = (out, time.perf_counter() - start, stats)
        (reference, ar_seconds, ar_stats), (out, seconds, stats) = runs["autoregressive"], runs["speculative"]
        if args.temperature == 0 and not np.array_equal(out, reference):
            raise SystemExit(f"K={K}: greedy speculative tokens differ from autoregressive ones")
        stats.decode_step_seconds = ar_stats.verify_seconds  # this prompt's own decode step
        continuation = out[len(prompt):].tolist()
        per_prompt.append({"speedup": ar_seconds / seconds, "expected_speedup": stats.expected_speedup,
                           "expected_speedup_one_step": stats.expected_speedup_one_step,
                           "acceptance_rate": stats.acceptance_rate, "cost_ratio": stats.cost_ratio,
                           "verify_steps": stats.verify_steps, "tokens_per_target_call": stats.tokens_per_target_call,
                           "copied_fraction": drafts.copied_fraction(prompt.tolist(), continuation),
                           "accepted_lengths": costs.accepted_lengths(stats.origins)})
        if K == "auto":
            chosen += speculative_draft.chosen
        for pooled, run_stats in ((ar_total, ar_stats), (total, stats)):
            for name in ("loops", "target_calls", "draft_calls", "drafted", "accepted", "target_seconds",
                         "draft_seconds"):
                setattr(pooled, name, getattr(pooled, name) + getattr(run_stats, name))
            pooled.origins += run_stats.origins
    total.decode_step_seconds = ar_total.verify_seconds
    known = lambda key: [row[key] for row in per_prompt if row[key] is not None]
    row = {"K": K, "acceptance_rate": total.acceptance_rate, "tokens_per_target_call": total.tokens_per_target_call,
           "decode_step_ms": 1000 * total.decode_step_seconds, "draft_step_ms": 1000 * total.draft_step_seconds
           if total.draft_step_seconds is not None else None, "verify_ms": 1000 * total.verify_seconds,
           "cost_ratio": total.cost_ratio, "verify_steps": total.verify_steps,
           "median_speedup": statistics.median(known("speedup")), "speedup_range": spread(known("speedup")),
           "median_expected_speedup": statistics.median(known("expected_speedup")) if known("expected_speedup") else None,
           "median_expected_speedup_one_step": statistics.median(known("expected_speedup_one_step"))
           if known("expected_speedup_one_step") else None,
           "median_measured_over_expected": statistics.median(
               [row["speedup"] / row["expected_speedup"] for row in per_prompt if row["expected_speedup"]])
           if known("expected_speedup") else None,
           "median_copied_fraction": statistics.median(known("copied_fraction")),
           "accepted_length_counts": np.bincount([n for row in per_prompt for n in row["accepted_lengths"]]).tolist()}
    if K == "auto":
        row["K_chosen_counts"] = {str(k): chosen.count(k) for k in sorted(set(chosen))}
    return row, per_prompt


def main(argv=None):
    args = parse_args(argv)
    splits = {split: spec_splits.bench_prompts(args, split) for split in spec_splits.SPLITS}  # before the loading
    scored, scored_record = spec_splits.bench_prompts(
        argparse.Namespace(**{**vars(args), "n_prompts": args.perplexity_prompts, "prompt_tokens": None}), "test")
    _, target_hparams, target_params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(target_params, target_hparams)
    if args.draft == drafts.PROMPT_LOOKUP:
        draft, draft_params = drafts.PromptLookup(target_hparams["n_vocab"]), None
    else:
        _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
        draft = engine.fast_model(draft_params, draft_hparams)
    settings = sampling.SamplingSettings(temperature=args.temperature)
    measured = costs.measure_costs(target, draft, splits["dev"][0][0], settings)  # for auto, and the record
    plan = target.plan  # what engine.fast_model chose for the target

    result = {"draft": args.draft, "target": args.target, "n_prompts": args.n_prompts,
              "prompt_tokens": args.prompt_tokens, "n_tokens": args.n_tokens, "temperature": args.temperature,
              "prompts": {split: record for split, (_, record) in splits.items()}, "costs": measured.as_dict(),
              "layout_plan": plan.summary(), "calibration": {"split": "dev", "by_K": []}, "split": "test", "by_K": []}
    fixed_K = [K for K in args.K if K != "auto"]
    for split, Ks in (("dev", fixed_K), ("test", args.K)):
        for K in Ks:
            row, _ = measure_K(K, splits[split][0], draft, target, measured, args)
            row = {"split": split, **row}
            (result["calibration"] if split == "dev" else result)["by_K"].append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    result.update(perplexity_prompts=scored_record, target_perplexity=perplexity_over(scored, target_params,
                                                                                      target_hparams),
                  draft_perplexity=None if draft_params is None else perplexity_over(scored, draft_params,
                                                                                     draft_hparams))
    if fixed_K:
        best = max(result["calibration"]["by_K"], key=lambda row: row["median_speedup"])
        on_test = next(row for row in result["by_K"] if row["K"] == best["K"])
        result.update(best_K=best["K"], best_median_speedup=on_test["median_speedup"])
    auto = next((row for row in result["by_K"] if row["K"] == "auto"), None)
    if auto and fixed_K:
        result["auto_over_best_fixed"] = auto["median_speedup"] / result["best_median_speedup"]
    predicted = [row["median_measured_over_expected"] for row in result["by_K"]
                 if row["K"] != "auto" and row["median_measured_over_expected"]]
    if predicted:
        result["measured_over_expected_range"] = [min(predicted), max(predicted)]
    result["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "numpy": np.__version__, "blas": blas_info(),
                         "load_average": os.getloadavg()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
