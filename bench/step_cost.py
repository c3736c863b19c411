"""What sets the cost of a draft step, measured: the weights a step reads, and NumPy's fixed cost per operation.

Four steps of one token after a cached prefix, NumPy's plain path, one thread: the target's decode step, the distilled
draft model's (teach-draft), EAGLE's head step (one block over the head's cache, then the readout through the target's
unembedding) and the untrained early exit's (the target's first L blocks, ln_f and the readout). Each is timed twice:
as it is, and as a twin of width 18 with the same layers, heads and vocabulary, whose weights are nearly nothing, so
that its time is the step's fixed part, what NumPy costs per operation whatever the arrays hold.

The model it tests: a step costs its fixed part plus its matrix weights times one cost per weight, the target's
(its time less its twin's, over its weights). The JSON gives, for each step, c measured (its time over the target's),
c by the weights alone (its matrix weights over the target's: notebook 11's count), c by the model (its twin's time
plus its weights at the target's cost per weight, over the target's time), and the fixed share of its time.

    python bench/step_cost.py [--rounds 30] [--calls 20] [--exit_layer 2] [--out step_cost.json]

Rounds rotate the order of the steps; each round keeps the median of `calls` calls of each step, and a step's time is
the median over the rounds. Prints one JSON object (and writes it to --out, atomically, if given).
"""

import argparse
import functools
import json
import os
import statistics
import time

import numpy as np

import gpt2
import utils
from bench.machine import machine_line
from checkpoints.atomic import write_atomically
from classroom.drafter_exercises import matrix_weights
from drafters.eagle import EagleDraft, init_head
from drafters.early_exit import EarlyExit
from drafters.heads import load_head
from engine.threads import THREADS

TWIN_WIDTH = 18  # the narrowest width the bundled models' 6 heads divide: 3 dimensions a head


def twin(params, hparams, rng):  # -> random params and hparams of the same depth, heads and vocabulary at TWIN_WIDTH
    hparams = {**hparams, "n_embd": TWIN_WIDTH}
    return gpt2.init_params(hparams, rng), hparams


def steps_of(params, hparams, draft_params, draft_hparams, head, exit_layer, x):  # -> {step: (call, weights)}
    """One call of each step, feeding x's last token after the rest (cached before the clock starts)."""
    target, draft = gpt2.GPT2Model(params, hparams), gpt2.GPT2Model(draft_params, draft_hparams)
    eagle, early_exit = EagleDraft(target, head), EarlyExit(target, exit_layer)
    for model in (target, draft):
        model.logits(x, 1)
    features = target.features[len(x) - 2:len(x) - 1].copy()  # f_{n-2}, what the head reads beside x's last token
    eagle_step = functools.partial(eagle.head_logits, features, x[-1:], len(x) - 2)
    readout = params["wte"].size
    return {"target": (functools.partial(target.logits, x, 1), matrix_weights(params["blocks"]) + readout),
            "draft model": (functools.partial(draft.logits, x, 1),
                            matrix_weights(draft_params["blocks"]) + draft_params["wte"].size),
            "eagle head": (eagle_step, matrix_weights({"fc": head["fc"], "block": head["block"]}) + readout),
            f"early exit ({exit_layer} layers)": (functools.partial(early_exit.logits, x, 1),
                                                   matrix_weights(params["blocks"][:exit_layer]) + readout)}


def time_steps(steps, rounds, calls):  # {name: call} -> {name: median ms over rounds of each round's median}
    ms = {name: [] for name in steps}
    names = list(steps)
    for step in steps.values():
        step()  # a first call's allocations out of the way
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                steps[name]()
                times.append(1000 * (time.perf_counter() - started))
            ms[name].append(statistics.median(times))
    return {name: statistics.median(values) for name, values in ms.items()}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--exit_layer", type=int, default=2)
    parser.add_argument("--prompt_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    THREADS.set(1)
    rng = np.random.default_rng(0)
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", args.models_dir)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params("teach-draft", args.models_dir)
    head, _ = load_head(os.path.join(args.models_dir, "teach-eagle"), drafter="eagle")
    head = {"fc": head["fc"], "block": head["block"]}  # a draft step reads these; the fusion applies at true positions
    x = rng.integers(0, hparams["n_vocab"], args.prompt_tokens)
    real = steps_of(params, hparams, draft_params, draft_hparams, head, args.exit_layer, x)
    (twin_params, twin_hparams), (twin_draft, twin_draft_hparams) = twin(params, hparams, rng), twin(
        draft_params, draft_hparams, rng)
    narrow = steps_of(twin_params, twin_hparams, twin_draft, twin_draft_hparams, init_head(twin_hparams, rng),
                      args.exit_layer, x)
    load_before = os.getloadavg()[0]
    ms = time_steps({**{name: call for name, (call, _) in real.items()},
                     **{f"{name}, width {TWIN_WIDTH}": call for name, (call, _) in narrow.items()}},
                    args.rounds, args.calls)
    per_weight_ms = (ms["target"] - ms[f"target, width {TWIN_WIDTH}"]) / real["target"][1]
    rows = {}
    for name, (_, weights) in real.items():
        fixed = ms[f"{name}, width {TWIN_WIDTH}"]
        rows[name] = {"ms": ms[name], "fixed_ms": fixed, "fixed_share": fixed / ms[name], "matrix_weights": weights,
                      "c_measured": ms[name] / ms["target"], "c_by_weights": weights / real["target"][1],
                      "c_by_model": (fixed + weights * per_weight_ms) / ms["target"]}
    result = {"machine": machine_line(), "load_average_1min": [load_before, os.getloadavg()[0]],
              "command": "python bench/step_cost.py " + " ".join(argv or []), "threads": 1,
              "prompt_tokens": args.prompt_tokens, "rounds": args.rounds, "calls_per_round": args.calls,
              "twin_width": TWIN_WIDTH, "target_ms_per_weight": per_weight_ms, "steps": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        write_atomically(args.out, (text + "\n").encode())
    print(text)


if __name__ == "__main__":
    main()
