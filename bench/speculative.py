"""Speculative against autoregressive decoding at temperature 0, for K = 1..8: the measured speedup beside
the acceptance rate, the cost ratio and the speedup the formula expects from them.

The pair: by default random-weight GPT-2s of the shapes --draft_shape and --target_shape ("n_layer,n_embd,
n_head", sharing --n_vocab and --n_ctx); or, with --draft and --target, two model folders under
--models_dir that utils.load_encoder_hparams_and_params can load (OpenAI's checkpoints, the bundled pair).
Random weights make random text: what they measure is the cost side (the cost ratio c, and what a target
call scoring K + 1 tokens costs against a decode step); the acceptance rate of a real pair is a property
of that pair.

Two ways of decoding, each timed for autoregressive decoding and for speculative sampling at every K:
- cached, the project's way: both models keep KV caches, the target scores all K + 1 positions in one call;
- uncached, as jaymody/speculative-sampling (on picoGPT) decodes: both models recompute the whole sequence
  on every call.
Every speculative run must reproduce the autoregressive tokens exactly (greedy), which is checked.

    python bench/speculative.py [--n_tokens 64] [--K 1,2,3,4,5,6,7,8] [--skip_uncached]
    python bench/speculative.py --models_dir models --draft 124M --target 355M

The expected speedup is Leviathan et al.'s formula, sampling.expected_speedup(a, c, K, v), with a the
run's acceptance rate, c its mean draft call over an autoregressive decode step, and v = verify_cost, what a
target call scoring K + 1 tokens costs in decode steps (1 in the paper's model, expected_speedup_one_step;
1.2-3 on the CPUs we measured, depending on the CPU, its BLAS kernels and the weight layout, engine/layouts.py).
Prints one JSON object as its last line.
"""

import os


import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import gpt2
import sampling
from cli import backends

PROMPT = "Alan Turing theorized that computers would one day become"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models", help="where --draft and --target live")
    parser.add_argument("--draft", help="a model folder name under --models_dir (instead of a random shape)")
    parser.add_argument("--target", help="a model folder name under --models_dir (instead of a random shape)")
    parser.add_argument("--draft_shape", default="2,256,4", help="random draft: n_layer,n_embd,n_head")
    parser.add_argument("--target_shape", default="12,768,12", help="random target: n_layer,n_embd,n_head")
    parser.add_argument("--n_vocab", type=int, default=50257, help="random pair's vocabulary")
    parser.add_argument("--n_ctx", type=int, default=1024, help="random pair's context")
    parser.add_argument("--weight_scale", type=float, default=1.0, help="random pair: block weights x this")
    parser.add_argument("--n_tokens", type=int, default=64, help="tokens generated per run")
    parser.add_argument("--prompt_len", type=int, default=16, help="random pair: tokens in the random prompt")
    parser.add_argument("--prompt", default=PROMPT, help="named pair: the prompt's text")
    parser.add_argument("--K", default="1,2,3,4,5,6,7,8", help="comma-separated draft lengths")
    parser.add_argument("--repeats", type=int, default=1, help="runs per measurement; the fastest counts")
    parser.add_argument("--skip_uncached", action="store_true", help="skip the uncached way (whole-sequence recompute)")
    parser.add_argument("--backend", default="numpy", choices=backends.BACKENDS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if (args.draft is None) != (args.target is None):
        parser.error("name both --draft and --target, or neither (random shapes)")
    try:
        args.K = [int(k) for k in args.K.split(",")]
        args.draft_shape, args.target_shape = parse_shape(args.draft_shape), parse_shape(args.target_shape)
    except ValueError as error:
        parser.error(str(error))
    if min(args.K) < 1 or args.n_tokens < 2 or args.prompt_len < 1 or args.repeats < 1:
        parser.error("--K values, --prompt_len and --repeats must be positive, --n_tokens at least 2")
    if args.backend != "numpy" and not args.skip_uncached:
        parser.error("the uncached way is measured with the numpy backend only (add --skip_uncached)")
    return args


def parse_shape(text):
    n_layer, n_embd, n_head = (int(part) for part in text.split(","))
    if n_embd % n_head:
        raise ValueError(f"shape {text}: n_embd must be a multiple of n_head")
    return {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head}


def load_pair(args):
    """-> (draft (params, hparams), target (params, hparams), prompt ids, a description of the pair)."""
    if args.draft:
        import utils

        encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
        _, target_hparams, target_params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
        prompt = encoder.encode(args.prompt)
        names = {"draft": args.draft, "target": args.target}
    else:
        rng = np.random.default_rng(args.seed)
        common = {"n_vocab": args.n_vocab, "n_ctx": args.n_ctx}
        draft_hparams, target_hparams = {**common, **args.draft_shape}, {**common, **args.target_shape}
        draft_params = random_params(draft_hparams, rng, args.weight_scale)
        target_params = random_params(target_hparams, rng, args.weight_scale)
        prompt = rng.integers(args.n_vocab, size=args.prompt_len).tolist()
        names = {"draft": "random", "target": "random", "weight_scale": args.weight_scale}
    if len(prompt) + args.n_tokens > min(draft_hparams["n_ctx"], target_hparams["n_ctx"]):
        sys.exit(f"error: {len(prompt)} prompt tokens + {args.n_tokens} exceed the context")
    description = {**names, "draft_hparams": draft_hparams, "target_hparams": target_hparams,
                   "draft_params": n_params(draft_params), "target_params": n_params(target_params)}
    return (draft_params, draft_hparams), (target_params, target_hparams), prompt, description


def random_params(hparams, rng, weight_scale):
    params = gpt2.init_params(hparams, rng)
    for block in params["blocks"]:
        for layer in [*block["attn"].values(), *block["mlp"].values()]:
            layer["w"] *= weight_scale
    return params


def n_params(params):
    if isinstance(params, dict):
        return sum(n_params(value) for value in params.values())
    if isinstance(params, list):
        return sum(n_params(value) for value in params)
    return int(params.size)


def make_model(params_and_hparams, backend, use_cache):
    params, hparams = params_and_hparams
    if use_cache:
        return backends.make_model(params, hparams, backend, layout="auto")  # this machine's fastest layouts
    return gpt2.GPT2Model(params, hparams, use_cache=False)


# ------------------------------------------------------------------------------------------ measuring


def measure(draft, target, prompt, n_tokens, Ks, repeats):
    """Autoregressive decoding, then speculative sampling for each K, all greedy, from empty caches.

    Each measurement is the fastest of `repeats` runs (the one least disturbed by other processes).
    """
    def fastest(decode):
        runs = []
        for _ in range(repeats):
            draft.reset()
            target.reset()
            stats = sampling.SpeculativeStats()
            start = time.perf_counter()
            tokens = decode(stats)
            runs.append((time.perf_counter() - start, tokens, stats))
        seconds, tokens, stats = min(runs, key=lambda run: run[0])
        return tokens, seconds, stats

    sampling.speculative_sampling(prompt, draft, target, 4, 2, temperature=0)  # warm up (fresh models)
    expected, ar_seconds, _ = fastest(
        lambda stats: sampling.autoregressive_sampling(prompt, target, n_tokens, temperature=0, stats=stats))
    step_seconds = ar_seconds / n_tokens
    autoregressive = {"seconds": ar_seconds, "ms_per_token": 1000 * step_seconds}
    print(f"  autoregressive: {ar_seconds:.2f} s, {1000 * step_seconds:.1f} ms/token", file=sys.stderr)
    runs = []
    for K in Ks:
        tokens, seconds, stats = fastest(lambda stats: sampling.speculative_sampling(
            prompt, draft, target, n_tokens, K, np.random.default_rng(0), temperature=0, stats=stats))
        stats.decode_step_seconds = step_seconds  # the unit of c and of the verification's cost
        run = {"K": K, "seconds": seconds, "speedup": ar_seconds / seconds,
               "acceptance_rate": stats.acceptance_rate, "cost_ratio": stats.cost_ratio,
               "verify_cost": stats.verify_steps, "expected_speedup": stats.expected_speedup,
               "expected_speedup_one_step": stats.expected_speedup_one_step,
               "tokens_per_target_call": stats.tokens_per_target_call,
               "draft_ms_per_call": 1000 * stats.draft_step_seconds, "loop_ms": 1000 * seconds / stats.loops,
               "target_ms_per_call": 1000 * stats.verify_seconds,
               "same_tokens": bool(np.array_equal(tokens, expected))}
        runs.append(run)
        print(f"  K={K}: speedup {run['speedup']:.2f}x (expected {run['expected_speedup']:.2f}x at the measured "
              f"verification cost, {run['expected_speedup_one_step']:.2f}x if it cost one step), acceptance "
              f"{run['acceptance_rate']:.2f}, c {run['cost_ratio']:.3f}, target call = {run['verify_cost']:.2f} "
              f"decode steps, same tokens: {run['same_tokens']}", file=sys.stderr)
    return {"autoregressive": autoregressive, "speculative": runs}


def machine():
    cpu = platform.processor() or "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = {name: os.environ.get(name) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    return {"cpu": cpu, "cores": os.cpu_count(), "numpy": np.__version__, "python": platform.python_version(),
            "blas_threads_env": threads}


def main():
    args = parse_args()
    load_start = os.getloadavg()
    draft_weights, target_weights, prompt, pair = load_pair(args)
    result = {"benchmark": "speculative", "machine": machine(), "backend": args.backend, "pair": pair,
              "temperature": 0, "n_tokens": args.n_tokens, "prompt_len": len(prompt), "repeats": args.repeats}
    for way, use_cache in [("cached", True), ("uncached", False)]:
        if way == "uncached" and args.skip_uncached:
            result[way] = None
            continue
        print(f"{way}:", file=sys.stderr)
        draft, target = make_model(draft_weights, args.backend, use_cache), make_model(target_weights, args.backend,
                                                                                       use_cache)
        result[way] = measure(draft, target, prompt, args.n_tokens, args.K, args.repeats)
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
