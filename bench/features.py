"""What keeping the target's features costs the plain path: gpt2.GPT2Model's forward, which writes the state after ln_f
of every slot it feeds (GPT2Model.features), against the same forward without that write (the logits alone).

    python bench/features.py [--model teach-target] [--layout plain] [--threads 1] [--prompt_tokens 64] [--rounds 30]

Two calls, each repeated on the same cached prefix so that every repeat does the same work: a decode step (one new
token) and a verification (5 new tokens, K = 4). Rounds alternate which model goes first; each round times `calls`
calls of each, one by one, and keeps their median (a call that another process interrupted is one outlier among
them). Reports each model's median milliseconds per call over the rounds, and the ratio with features / without,
paired round by round, as a median with its range. Both models must return the same logits bit for bit. One thread
by default (main.py's, engine/threads.py), so that a busy neighbour on the other core does not stall the products.
Prints one JSON object.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np

import engine
import gpt2
import utils
from bench.machine import blas_info, machine_line
from engine.threads import THREADS

VERIFIED = 5  # K + 1 positions scored by a verification at K = 4, main.py's default


class LogitsOnly(gpt2.GPT2Model):
    """The baseline: GPT2Model's forward as it was before it kept features, gpt2() through the cache."""

    def forward(self, tokens, start=0, positions=None, mask=None):
        return gpt2.gpt2(tokens, **self.params, n_head=self.hparams["n_head"], cache=self.cache, start=start,
                         unembedding=self.unembedding, positions=positions, mask=mask)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--model", default="teach-target")
    parser.add_argument("--layout", default="plain", help="engine.fast_model's layout: plain (the default), auto, ...")
    parser.add_argument("--threads", type=int, default=1, help="threads for the products (engine/threads.py)")
    parser.add_argument("--prompt_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20)
    return parser.parse_args(argv)


def median_call_ms(model, x, n_last, calls):  # the cache holds x but its last n_last tokens: each call feeds those
    ms = []
    for _ in range(calls):
        started = time.perf_counter()
        model.logits(x, n_last)
        ms.append(1000 * (time.perf_counter() - started))
    return statistics.median(ms)


def spread(values):  # the median, with the range beside it
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def compare(models, x, n_last, rounds, calls):  # -> each model's median ms per call, and the paired ratio
    for model in models.values():
        model.reset()
        model.logits(x, n_last)  # the prefix cached, and a first call's allocations out of the way
    ms = {name: [] for name in models}
    for round_ in range(rounds):
        for name in (list(models) if round_ % 2 == 0 else list(models)[::-1]):
            ms[name].append(median_call_ms(models[name], x, n_last, calls))
    ratios = [with_ / without for with_, without in zip(ms["with_features"], ms["logits_only"])]
    return {**{f"{name}_ms": statistics.median(values) for name, values in ms.items()}, "ratio": spread(ratios)}


def main(argv=None):
    args = parse_args(argv)
    THREADS.set(args.threads)
    _, hparams, params = utils.load_encoder_hparams_and_params(args.model, args.models_dir)
    _, laid_out, unembedding = engine.lay_out(params, args.layout)
    models = {"with_features": gpt2.GPT2Model(laid_out, hparams, unembedding=unembedding),
              "logits_only": LogitsOnly(laid_out, hparams, unembedding=unembedding)}
    x = np.random.default_rng(0).integers(0, hparams["n_vocab"], args.prompt_tokens + VERIFIED)
    if not np.array_equal(*(model.logits(x, VERIFIED) for model in models.values())):
        raise AssertionError("the feature write changed the logits")
    load_before = os.getloadavg()
    results = {"decode_step": compare(models, x[:args.prompt_tokens + 1], 1, args.rounds, args.calls),
               f"verify_{VERIFIED}": compare(models, x, VERIFIED, args.rounds, args.calls)}
    print(json.dumps({"machine": machine_line(), "load_average_1min": [load_before[0], os.getloadavg()[0]],
                      "model": args.model, "layout": args.layout, "threads": args.threads,
                      "blas_threads": blas_info()["threads"], "prompt_tokens": args.prompt_tokens,
                      "rounds": args.rounds, "calls_per_round": args.calls, "logits_identical": True, **results},
                     indent=1))


if __name__ == "__main__":
    main()
