"""The untrained early exit (drafters/early_exit.py) on the bundled target, greedy: alpha, tokens per target call and c
for several exit layers; c, and the target's verification after K drafts as the method pays it (the rows the draft fed
start at the exit) beside the recomputing path (every row through every block), in decode steps timed in the same
rounds; and Leviathan et al.'s expected speedup at the measured c and the paid v(K + 1).

    python bench/early_exit.py [--exit_layers 1,2,4,6] [--K 4] [--n_prompts 4] [--n_tokens 48] [--rounds 50]

The exit layer is chosen on one split and judged on another (bench/spec_splits.py): "chosen_exit_layer" is the
layer of the highest expected speedup at its alpha on --n_prompts open prompts of the development split
("choice", split dev), and every row of "by_exit_layer" is measured on as many open prompts of the test split (split
test), the chosen layer's among them. c and v are the costs of calls of the same shapes whatever their tokens: timed
once per layer, on the first test prompt, they price both splits' alphas. Every speculative run's tokens must equal
autoregressive decoding's. Prints one JSON object.
"""

import argparse
import json
import statistics
import time

import numpy as np

import engine
import sampling
import utils
from bench import spec_splits
from bench.heldout import add_greedy_run_arguments, greedy_acceptance, greedy_references
from bench.machine import machine_line
from drafters.early_exit import EarlyExit
from speedup.stats import SpeculativeStats, expected_speedup


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--exit_layers", default="1,2,4,6")
    parser.add_argument("--rounds", type=int, default=50, help="timed rounds of a loop's calls (draft, verifications)")
    add_greedy_run_arguments(parser)
    spec_splits.add_prompts_dir_argument(parser)
    args = parser.parse_args(argv)
    args.exit_layers = [int(layer) for layer in args.exit_layers.split(",")]
    return args


def time_loop_calls(target, draft, prompt, K, rounds):  # -> median seconds of each call, over the rounds
    """The calls of a loop after the prompt, timed round by round so that the machine's drift touches them alike: the
    draft proposing K tokens (draft_step: per token), the target verifying them reused (the rows the draft fed start
    at the exit: drafters/early_exit.ExitDraft); the same proposal verified recomputed (the target forgets what the
    draft left and runs every row through every block, as before the reuse); a decode step (one new token after the
    cached prefix); the readout alone (the verification's rows through forward() entering after the last block: ln_f
    and the unembedding, the part no exit covers; fed into the slots past the target's record, which hold nothing it
    keeps). What a verification costs beyond its readout, its blocks and logits()' bookkeeping, is counted as its
    blocks. The first round warms up."""
    n_layer, n_embd = target.hparams["n_layer"], target.hparams["n_embd"]
    target.reset()
    target.logits(prompt)

    def timed(call, *args):  # -> seconds, what call returned
        started = time.perf_counter()
        result = call(*args)
        return time.perf_counter() - started, result

    def one_round():
        seconds = {"draft_step": 0.0}
        for path in ("reused", "recomputed"):
            proposing, (drafts, _) = timed(draft.propose, prompt, K, sampling.GREEDY, np.random.default_rng(0),
                                           SpeculativeStats())
            seconds["draft_step"] += proposing / (2 * K)
            if path == "recomputed":
                target.exit_draft = None
            seconds[path], _ = timed(target.logits, np.append(prompt, drafts), K + 1)
        seconds["decode_step"], _ = timed(target.logits, np.append(prompt, drafts[:1]), 1)
        entering = np.zeros((K + 1, n_embd), np.float32)  # any state: only the call's shape matters to its time
        seconds["readout"], _ = timed(lambda: target.forward(np.zeros(K + 1, np.int64), len(target.cached_tokens),
                                                             first_layer=n_layer, x=entering))
        return seconds

    measured = [one_round() for _ in range(rounds + 1)][1:]
    return {name: statistics.median(seconds[name] for seconds in measured) for name in measured[0]}


def verification_work(n_layer, exit_layer, K, seconds):  # -> the target's work per verification, reused and recomputed
    """In decode steps (measured) and in block rows (one row through one block: K + 1 rows, all fed by the draft, so
    all skip the exit's blocks; tests/test_drafters_early_exit.py counts them). The time splits into the readout,
    which no exit covers, and the blocks (the rest): their time alone, and what one block costs in each call."""
    rows = {"reused": (K + 1) * (n_layer - exit_layer), "recomputed": (K + 1) * n_layer}
    in_steps = {path: seconds[path] / seconds["decode_step"] for path in (*rows, "readout")}
    blocks = {path: in_steps[path] - in_steps["readout"] for path in rows}
    return {"decode_steps": {path: in_steps[path] for path in rows}, "block_rows": rows,
            "readout_decode_steps": in_steps["readout"], "blocks_decode_steps": blocks,
            "one_block_decode_steps": {path: blocks[path] * (K + 1) / rows[path] for path in rows},
            "fall_in_time": 1 - seconds["reused"] / seconds["recomputed"],
            "fall_in_block_time": 1 - blocks["reused"] / blocks["recomputed"],
            "fall_in_block_rows": 1 - rows["reused"] / rows["recomputed"],
            "exit_layer_share": exit_layer / n_layer}


def measure_exit(target, exit_layer, splits, K, N, rounds):  # -> the row for one exit layer, its alpha on dev
    """splits: {split: (prompts, autoregressive decoding's tokens after each)}."""
    draft = EarlyExit(target, exit_layer)
    seconds = time_loop_calls(target, draft, splits["test"][0][0], K, rounds)
    work = verification_work(target.hparams["n_layer"], exit_layer, K, seconds)
    c, v = seconds["draft_step"] / seconds["decode_step"], work["decode_steps"]["reused"]
    by_split = {}
    for split, (prompts, expected) in splits.items():
        total = greedy_acceptance(target, draft, prompts, expected, K, N, f"exit layer {exit_layer}, {split}")
        by_split[split] = {"exit_layer": exit_layer, "split": split, "alpha": total.acceptance_rate,
                           "tokens_per_target_call": total.tokens_per_target_call,
                           "expected_speedup": expected_speedup(total.acceptance_rate, c, K, v)}
    return {**by_split["test"], "decode_step_ms": 1000 * seconds["decode_step"], "c": c, "v_K_plus_1": v,
            "v_K_plus_1_recomputed": work["decode_steps"]["recomputed"], "verification": work}, by_split["dev"]


def main(argv=None):
    args = parse_args(argv)
    splits = {split: spec_splits.bench_prompts(args, split) for split in spec_splits.SPLITS}
    _, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(params, hparams)
    runs = {split: (prompts, greedy_references(target, prompts, args.n_tokens))
            for split, (prompts, _) in splits.items()}
    rows, on_dev = zip(*(measure_exit(target, layer, runs, args.K, args.n_tokens, args.rounds)
                         for layer in args.exit_layers))
    chosen = max(on_dev, key=lambda row: row["expected_speedup"])["exit_layer"]
    print(json.dumps({"machine": machine_line(), "target": args.target, "n_layer": target.hparams["n_layer"], "K": args.K,
                      "prompts": {split: record for split, (_, record) in splits.items()}, "n_prompts": args.n_prompts,
                      "prompt_tokens": args.prompt_tokens, "n_tokens": args.n_tokens, "rounds": args.rounds,
                      "temperature": 0, "chosen_exit_layer": chosen,
                      "choice": {"split": "dev", "rule": "the highest expected speedup", "by_exit_layer": on_dev},
                      "split": "test", "by_exit_layer": rows}))


if __name__ == "__main__":
    main()
