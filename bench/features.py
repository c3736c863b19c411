"""What keeping the target's features costs the plain path: gpt2.GPT2Model's forward, which writes the state after ln_f
of every slot it feeds (GPT2Model.features), against the same forward without that write (the logits alone); with
--backend jax, JaxGPT2Model's jitted step (jax_backend/gpt2_jax.feed_block, which writes DeviceCache.states) against
gpt2.gpt2_with_cache jitted alone, on the same padded block at the same position.

    python bench/features.py [--backend numpy] [--model teach-target] [--layout plain] [--threads 1] [--rounds 30]

Two calls, each repeated on the same cached prefix so that every repeat does the same work: a decode step (one new
token) and a verification (5 new tokens, K = 4). Rounds alternate which model goes first; each round times `calls`
calls of each, one by one, and keeps their median (a call that another process interrupted is one outlier among
them). Reports each model's median milliseconds per call over the rounds, and the ratio with features / without,
paired round by round, as a median with its range. Both models must return the same logits bit for bit. One thread
by default (main.py's, engine/threads.py), so that a busy neighbour on the other core does not stall the products.
Prints one JSON object.
"""

import argparse
import functools
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


def jax_steps(params, hparams, x, n_last):  # -> {name: one call of the jitted step feeding x's last n_last tokens}
    import jax
    import jax.numpy as jnp
    from jax import lax

    from jax_backend import gpt2_jax

    @functools.partial(jax.jit, static_argnames=("n_head", "n_out"), donate_argnames=("layers",))
    def logits_only(params, layers, tokens, start, n_head, n_out):  # feed_block before it kept features
        with jax.default_matmul_precision("highest"):
            logits, layers = gpt2.gpt2_with_cache(tokens, **params, n_head=n_head, cache=layers, start=start)
        return lax.dynamic_slice_in_dim(logits, 0, n_out).astype(jnp.float32), layers

    model = gpt2_jax.JaxGPT2Model(params, hparams)
    model.logits(x[:-n_last])
    block, start, n_head = np.zeros(gpt2_jax.bucket_size(n_last, model.n_ctx), np.int32), len(x) - n_last, model.n_head
    block[:n_last] = x[-n_last:]
    n_out = 1 if n_last == 1 else len(block)  # as JaxGPT2Model._feed asks
    caches = {"with_features": model.cache, "logits_only": jax.tree.map(jnp.copy, model.cache.layers)}  # both donated

    def with_features():
        rows, caches["with_features"] = gpt2_jax.feed_block(model.params, caches["with_features"], block, start,
                                                            np.int32(0), n_head=n_head, n_out=n_out)
        return np.asarray(rows)

    def without():
        rows, caches["logits_only"] = logits_only(model.params, caches["logits_only"], block, start, n_head=n_head,
                                                  n_out=n_out)
        return np.asarray(rows)

    return {"with_features": with_features, "logits_only": without}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("numpy", "jax"), default="numpy")
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--model", default="teach-target")
    parser.add_argument("--layout", default="plain", help="engine.fast_model's layout: plain (the default), auto, ...")
    parser.add_argument("--threads", type=int, default=1, help="threads for the products (engine/threads.py)")
    parser.add_argument("--prompt_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20)
    return parser.parse_args(argv)


def median_call_ms(call, calls):
    ms = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        ms.append(1000 * (time.perf_counter() - started))
    return statistics.median(ms)


def spread(values):  # the median, with the range beside it
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def numpy_steps(models, x, n_last):  # -> {name: one call feeding x's last n_last tokens after the cached rest}
    for model in models.values():
        model.reset()
        model.logits(x, n_last)  # the prefix cached, and a first call's allocations out of the way
    return {name: functools.partial(model.logits, x, n_last) for name, model in models.items()}


def compare(steps, rounds, calls):  # -> each step's median ms per call, and the paired ratio
    outputs = [step() for step in steps.values()]  # compiled, if jitted
    if not np.array_equal(*outputs):
        raise AssertionError("the feature write changed the logits")
    ms = {name: [] for name in steps}
    for round_ in range(rounds):
        for name in (list(steps) if round_ % 2 == 0 else list(steps)[::-1]):
            ms[name].append(median_call_ms(steps[name], calls))
    ratios = [with_ / without for with_, without in zip(ms["with_features"], ms["logits_only"])]
    return {**{f"{name}_ms": statistics.median(values) for name, values in ms.items()}, "ratio": spread(ratios)}


def main(argv=None):
    args = parse_args(argv)
    THREADS.set(args.threads)
    _, hparams, params = utils.load_encoder_hparams_and_params(args.model, args.models_dir)
    x = np.random.default_rng(0).integers(0, hparams["n_vocab"], args.prompt_tokens + VERIFIED)
    if args.backend == "jax":
        steps = functools.partial(jax_steps, params, hparams)
    else:
        _, laid_out, unembedding = engine.lay_out(params, args.layout)
        models = {"with_features": gpt2.GPT2Model(laid_out, hparams, unembedding=unembedding),
                  "logits_only": LogitsOnly(laid_out, hparams, unembedding=unembedding)}
        steps = functools.partial(numpy_steps, models)
    load_before = os.getloadavg()
    results = {"decode_step": compare(steps(x[:args.prompt_tokens + 1], 1), args.rounds, args.calls),
               f"verify_{VERIFIED}": compare(steps(x, VERIFIED), args.rounds, args.calls)}
    print(json.dumps({"machine": machine_line(), "load_average_1min": [load_before[0], os.getloadavg()[0]],
                      "backend": args.backend, "model": args.model,
                      **({"layout": args.layout} if args.backend == "numpy" else {}), "threads": args.threads,
                      "blas_threads": blas_info()["threads"], "prompt_tokens": args.prompt_tokens,
                      "rounds": args.rounds, "calls_per_round": args.calls, "logits_identical": True, **results},
                     indent=1))


if __name__ == "__main__":
    main()
