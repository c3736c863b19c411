"""What FR-Spec's frequency-ranked draft vocabulary (drafters/frspec.py) buys EAGLE's trained head on the bundled
target: for each size, the draft step's cost c, the share of the target's greedy next tokens inside the vocabulary,
alpha at temperature 0 (chain, K 4) and Leviathan et al.'s expected speedup at the measured c and v(K + 1).

    python bench/frspec_vocabulary.py [--sizes 4096,2048,1024,512]

Each vocabulary is the size ids most frequent in the training split (--tokens, as tools/train_heads.py caches it);
the full vocabulary is measured twice: EagleTree itself (the target's unembedding, in the target's layout) and
ReducedVocabularyEagle over all 4,096 ids (what slicing and spreading the logits cost at no reduction). The size is
chosen on one split of the held-out text and judged on another (bench/spec_splits.py): "chosen" is the vocabulary of
the highest expected speedup at its alpha on --n_prompts open prompts of the development split ("choice", split dev);
every row is measured on the test split (split test): alpha on as many of its open prompts, the coverage over every
position of --coverage_prompts of them (their first --prompt_tokens tokens, each read by the target in one call).
Every speculative run's tokens must equal autoregressive decoding's. c and v, the costs of calls of the same shapes
whatever their tokens, are timed on the first test prompt and price both splits' alphas. c is measured by
speedup/costs.measure_costs, --repeats times per drafter, the drafters interleaved (the order rotating from repeat
to repeat): medians and ranges. One thread by default, so that a busy neighbour on the other core does not stall the
products. Prints one JSON object.
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
from bench.features import spread
from bench.heldout import add_greedy_run_arguments, greedy_acceptance, greedy_references
from bench.machine import machine_line
from drafters.eagle2 import EagleTree
from drafters.frspec import ReducedVocabularyEagle, coverage, draft_vocabulary
from drafters.heads import load_head
from engine.threads import THREADS
from speedup import costs
from speedup.stats import expected_speedup
from tools.draft_vocabulary import TOKENS, training_counts

N_NODES = 8  # EagleTree's budget; the chain (propose) never reads it


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--head", default="models/teach-eagle", help="the trained EAGLE head's folder")
    parser.add_argument("--tokens", default=TOKENS, help="the training split's token ids, a .npy array")
    parser.add_argument("--sizes", default="4096,2048,1024,512")
    parser.add_argument("--coverage_prompts", type=int, default=64, help="test prompts the coverage is over")
    add_greedy_run_arguments(parser)
    spec_splits.add_prompts_dir_argument(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    return args


def greedy_next_tokens(target, prompts):  # -> the target's argmax after every position of every prompt, [tokens]
    chosen = []
    for prompt in prompts:
        target.reset()
        chosen.append(target.logits(prompt, len(prompt)).argmax(axis=-1))
    target.reset()
    return np.concatenate(chosen)


def readout_seconds(drafter, calls=200):  # -> the median time of one readout of one predicted feature
    predicted = np.random.default_rng(0).standard_normal((1, drafter.target.hparams["n_embd"])).astype(np.float32)
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        drafter.readout(predicted)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def measure(target, drafters, prompt, K, repeats):  # -> {name: {"c", "v", "readout_us", "step_ms"}: a list each}
    """Each drafter's c, v(K + 1) (the target's, measured beside it), readout and draft step, once per repeat, the
    drafters interleaved in an order that rotates from repeat to repeat."""
    measured = {name: {"c": [], "v": [], "readout_us": [], "step_ms": []} for name in drafters}
    names = list(drafters)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            step = costs.measure_costs(target, drafters[name], prompt, sampling.GREEDY, max_scored=K + 1,
                                       budget_seconds=0.5)
            for key, value in (("c", step.cost_ratio), ("v", step.v(K + 1)), ("step_ms", 1e3 * step.draft_step_seconds),
                               ("readout_us", 1e6 * readout_seconds(drafters[name]))):
                measured[name][key].append(value)
    return measured


def main(argv=None):
    args = parse_args(argv)
    splits = {split: spec_splits.bench_prompts(args, split) for split in spec_splits.SPLITS}
    THREADS.set(args.threads)
    _, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(params, hparams)
    head, info = load_head(args.head, drafter="eagle")
    counts = training_counts(args.tokens, hparams["n_vocab"])
    vocabularies = {size: draft_vocabulary(counts, size) for size in args.sizes}
    drafters = {"full": EagleTree(target, head, N_NODES),
                **{size: ReducedVocabularyEagle(target, head, N_NODES, ids) for size, ids in vocabularies.items()}}

    coverage_args = argparse.Namespace(**{**vars(args), "n_prompts": args.coverage_prompts})
    texts, coverage_record = spec_splits.bench_prompts(coverage_args, "test")
    tokens = np.concatenate(texts)
    greedy_counts = np.bincount(greedy_next_tokens(target, texts), minlength=hparams["n_vocab"])
    text_counts = np.bincount(tokens, minlength=hparams["n_vocab"])
    runs = {split: (prompts, greedy_references(target, prompts, args.n_tokens))
            for split, (prompts, _) in splits.items()}

    load_before = os.getloadavg()
    measured = measure(target, drafters, runs["test"][0][0], args.K, args.repeats)
    v = statistics.median(value for name in drafters for value in measured[name]["v"])  # the target's, pooled
    rows, on_dev = [], []
    for name, drafter in drafters.items():
        ids = vocabularies.get(name, np.arange(hparams["n_vocab"]))
        c = statistics.median(measured[name]["c"])
        alphas = {}
        for split, (prompts, expected) in runs.items():
            stats = greedy_acceptance(target, drafter, prompts, expected, args.K, args.n_tokens,
                                      f"vocabulary {name}, {split}")
            alphas[split] = {"drafter": type(drafter).__name__, "size": len(ids), "split": split,
                             "alpha": stats.acceptance_rate, "tokens_per_target_call": stats.tokens_per_target_call,
                             "expected_speedup": expected_speedup(stats.acceptance_rate, c, args.K, v)}
        on_dev.append(alphas["dev"])
        rows.append({**alphas["test"], "training_coverage": coverage(counts, ids),
                     "greedy_next_token_coverage": coverage(greedy_counts, ids),
                     "heldout_text_coverage": coverage(text_counts, ids),
                     **{key: spread(values) for key, values in measured[name].items() if key != "v"}})
    chosen = max(on_dev, key=lambda row: row["expected_speedup"])
    training = info["training"]
    print(json.dumps({
        "machine": machine_line(), "load_average_1min": [load_before[0], os.getloadavg()[0]],
        "target": args.target, "unembedding_laid_out": target.unembedding is not None, "threads": args.threads,
        "head": {"folder": args.head, "steps_done": training["steps_done"], "steps": training["recipe"]["steps"],
                 "last_eval": training["evals"][-1] if training["evals"] else None},
        "prompts": {split: record for split, (_, record) in splits.items()},
        "coverage_prompts": {**coverage_record, "tokens": len(tokens)}, "training_tokens": int(counts.sum()),
        "K": args.K, f"v_{args.K + 1}": v, "temperature": 0, "n_prompts": args.n_prompts,
        "prompt_tokens": args.prompt_tokens, "n_tokens": args.n_tokens, "repeats": args.repeats,
        "chosen": {"drafter": chosen["drafter"], "size": chosen["size"]},
        "choice": {"split": "dev", "rule": "the highest expected speedup", "by_vocabulary": on_dev},
        "split": "test", "by_vocabulary": rows}, indent=1))


if __name__ == "__main__":
    main()
