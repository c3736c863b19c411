"""GPT-2 124M drafting for 355M, 774M and 1558M on this CPU, GPT-2's real shapes, random weights.

124M -> 1558M is the pair of the reference re-implementation, jaymody/speculative-sampling (Chen et al. drafted for
Chinchilla 70B with a 4B model). Like the paper's, it pairs a small draft with a target many times its size; on
a CPU the target's decode step is bound by reading its weights from memory, so scoring K + 1 tokens can cost about
one step. This measures, with no download (random weights of OpenAI's shapes, float32), for each target at one
thread and at every core:

- the target's decode step against the read roofline (its weights over the fastest any way of multiplying
  reads one row through an 8192 x 8192 matrix with the same threads, measured in the same process);
- v(m), m = 1..9, what scoring m new tokens after a 64-token cached prefix costs in decode steps, and c, the
  draft's step over the target's (costs.measure_costs, as main.py measures them);
- the formula's expected speedup for alpha 0.6-0.9 and K 1-8 at those costs, and the layouts and threads
  chosen (measure.measure_plan);
- peak resident memory of the pair against its float32 weights;
- transformers' decode step and v(m) at the same shapes and threads (torch, CPU, cached), and the formula at
  its costs.

Each configuration runs in a process of its own, so its peak memory and its plans are its own. About 10 minutes
on 2 cores for everything; prints one JSON object as its last line (and writes it to --out).

    python bench/paper_shapes.py [--targets 355M,774M,1558M] [--threads 1,all] [--skip_hf] [--out FILE]
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import gpt2
from bench.decode import params_nbytes
from bench.machine import blas_info, cpu_model
from engine import fast_model, layouts
from checkpoints.atomic import write_atomically
from engine.threads import THREADS, usable_cores
from speedup import costs

REPO = Path(__file__).resolve().parents[1]

SHAPES = {"124M": (768, 12, 12), "355M": (1024, 24, 16), "774M": (1280, 36, 20), "1558M": (1600, 48, 25)}
PREFIX = 64  # tokens cached before the costs are measured
MAX_SCORED = 9  # v(m) for m = 1..9: K up to 8
ALPHAS = (0.6, 0.7, 0.8, 0.9)


def hparams_of(size):
    n_embd, n_layer, n_head = SHAPES[size]
    return {"n_vocab": 50257, "n_ctx": 1024, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer}


class Float32Normals:
    """A Generator whose standard_normal draws float32 directly: a float64 draw of GPT-2 1558M's wte would pass
    643 MB through memory on its way to float32."""

    def __init__(self, rng):
        self.rng = rng

    def standard_normal(self, shape):
        return self.rng.standard_normal(shape, dtype=np.float32)


def random_params(hparams, rng):
    """gpt2.init_params' tree, drawn in float32 directly."""
    return gpt2.init_params(hparams, Float32Normals(rng))


def read_gbps(threads, rng, repeats=7, k=8192, n=8192):
    """The fastest one row is read through an 8192 x 8192 float32 matrix in any layout, on `threads` threads (split
    by us or, for the plain layouts, by BLAS: every way measure.measure_plan may choose)."""
    w = rng.standard_normal((k, n), dtype=np.float32)
    x = rng.standard_normal((1, k), dtype=np.float32)
    best = 0.0
    for name in layouts.ways(threads):
        product = layouts.multiplier(layouts.laid_out(w, layouts.layout_and_threads(name)[0]), name)
        THREADS.use_blas_threads(layouts.on_blas_threads(name))
        for _ in range(repeats):
            start = time.perf_counter()
            x @ product
            best = max(best, w.nbytes / (time.perf_counter() - start) / 1e9)
        del product
    return best


def expected_speedups(measured):
    return {str(alpha): {str(K): round(measured.expected_speedup(alpha, K), 3) for K in range(1, MAX_SCORED)}
            for alpha in ALPHAS}


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports kilobytes


def run_numpy(target_size, threads, seed=0):
    """One configuration: the kit's GPT2Model (layout auto) at `threads` threads."""
    THREADS.set(threads)
    rng = np.random.default_rng(seed)
    models, nbytes, plans = {}, {}, {}
    for role, size in (("draft", "124M"), ("target", target_size)):
        hparams = hparams_of(size)
        params = random_params(hparams, rng)
        nbytes[role] = params_nbytes(params)
        models[role] = fast_model(params, hparams, in_place=True)  # the checkpoint's matrices freed as laid out
        plans[role] = models[role].plan.summary()
        del params
    x = rng.integers(0, 50257, PREFIX).tolist()
    measured = costs.measure_costs(models["target"], models["draft"], x, max_scored=MAX_SCORED, budget_seconds=10.0)
    step, peak = measured.decode_step_seconds, peak_rss_bytes()
    gbps = read_gbps(threads, rng)  # after the peak is read: its 8192 x 8192 matrices are not the pair's memory
    roofline = nbytes["target"] / (gbps * 1e9)
    return {"engine": "gpt2.GPT2Model, layout auto", "target": target_size, "threads": threads,
            "decode_step_ms": round(1e3 * step, 2), "draft_step_ms": round(1e3 * measured.draft_step_seconds, 2),
            "read_GBps": round(gbps, 2), "roofline_ms": round(1e3 * roofline, 2),
            "roofline_fraction": round(roofline / step, 3), "step_GBps": round(nbytes["target"] / step / 1e9, 2),
            "v": [round(v, 3) for v in measured.verify_steps], "c": round(measured.cost_ratio, 4),
            "expected_speedup": expected_speedups(measured),
            "weights_bytes": nbytes["draft"] + nbytes["target"], "peak_rss_bytes": peak,
            "peak_over_weights": round(peak / (nbytes["draft"] + nbytes["target"]), 3),
            "layout_plan": plans}


def run_transformers(target_size, threads, seed=0, rounds=4):
    """The same shapes in transformers' GPT2LMHeadModel (random init), cached, torch at `threads` threads."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    torch.manual_seed(seed)

    def model_of(size):
        hp = hparams_of(size)
        config = transformers.GPT2Config(vocab_size=hp["n_vocab"], n_positions=hp["n_ctx"], n_embd=hp["n_embd"],
                                         n_head=hp["n_head"], n_layer=hp["n_layer"], activation_function="gelu_new")
        return transformers.GPT2LMHeadModel(config).eval()

    models = {"draft": model_of("124M"), "target": model_of(target_size)}
    x = torch.randint(0, 50257, (1, PREFIX))
    new = torch.randint(0, 50257, (1, MAX_SCORED))
    with torch.no_grad():
        caches = {role: model(x, use_cache=True).past_key_values for role, model in models.items()}

        def timed(role, m):  # m new tokens after the cached prefix, then the cache cut back to it
            start = time.perf_counter()
            models[role](new[:, :m], past_key_values=caches[role], use_cache=True)
            seconds = time.perf_counter() - start
            caches[role].crop(-m)  # transformers 5 crops by the number of tokens to remove
            assert caches[role].get_seq_length() == PREFIX
            return seconds

        times = {m: [] for m in range(1, MAX_SCORED + 1)}
        draft_times = []
        for round_ in range(rounds + 1):  # the first round warms up
            for m in times:
                draft_seconds, target_seconds = timed("draft", 1), timed("target", m)
                if round_:
                    draft_times.append(draft_seconds)
                    times[m].append(target_seconds)
    step = statistics.median(times[1])
    measured = costs.MeasuredCosts(step, statistics.median(draft_times),
                                   tuple(statistics.median(times[m]) / step for m in times))
    return {"engine": f"transformers {transformers.__version__}, torch {torch.__version__}", "target": target_size,
            "threads": threads, "decode_step_ms": round(1e3 * step, 2),
            "draft_step_ms": round(1e3 * measured.draft_step_seconds, 2),
            "v": [round(v, 3) for v in measured.verify_steps], "c": round(measured.cost_ratio, 4),
            "expected_speedup": expected_speedups(measured), "peak_rss_bytes": peak_rss_bytes()}


def run_child(args):
    run = run_transformers if args.engine == "transformers" else run_numpy
    print(json.dumps(run(args.one, args.threads_one)))


def run_all(args):
    targets = args.targets.split(",")
    thread_counts = sorted({usable_cores() if t == "all" else int(t) for t in args.threads.split(",")})
    engines = ["numpy"] + ([] if args.skip_hf else ["transformers"])
    results = []
    for target in targets:
        for threads in thread_counts:
            for engine in engines:
                command = [sys.executable, __file__, "--one", target, "--threads_one", str(threads), "--engine", engine]
                done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
                if done.returncode:
                    raise SystemExit(f"{' '.join(command[1:])} failed:\n{done.stderr[-2000:]}")
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"{engine} {target} at {threads} thread(s): step {results[-1]['decode_step_ms']} ms, "
                      f"v {results[-1]['v']}", file=sys.stderr, flush=True)
    for result in results:  # the kit's formula at K 4, alpha 0.8, against transformers' at the same shape and threads
        if result["engine"].startswith("transformers"):
            continue
        hf = [r for r in results if r["engine"].startswith("transformers") and r["target"] == result["target"]
              and r["threads"] == result["threads"]]
        if hf:
            result["speedup_alpha_0.8_K_4_over_transformers"] = round(
                result["expected_speedup"]["0.8"]["4"] / hf[0]["expected_speedup"]["0.8"]["4"], 3)
            result["decode_step_over_transformers"] = round(result["decode_step_ms"] / hf[0]["decode_step_ms"], 3)
    summary = {"benchmark": "GPT-2 124M drafting for larger GPT-2 shapes, random float32 weights, batch 1, CPU",
               "statistic": f"costs.measure_costs after a {PREFIX}-token prefix: medians of interleaved rounds "
                            "(10 s or more per configuration); read_GBps the best of 7 per way of multiplying",
               "results": results,
               "machine": {"cpu": cpu_model(), "cores": usable_cores(), "numpy": np.__version__, "blas": blas_info(),
                           "python": platform.python_version(), "load_average_at_end": os.getloadavg()}}
    text = json.dumps(summary)
    if args.out:
        write_atomically(Path(args.out), (json.dumps(summary, indent=1) + "\n").encode())
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="355M,774M,1558M")
    parser.add_argument("--threads", default="1,all", help="thread counts to measure; 'all': every usable core")
    parser.add_argument("--skip_hf", action="store_true", help="leave transformers out")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one target ...
    parser.add_argument("--threads_one", type=int, help=argparse.SUPPRESS)  # ... at one thread count ...
    parser.add_argument("--engine", default="numpy", help=argparse.SUPPRESS)  # ... with one engine
    args = parser.parse_args()
    if args.one:
        if args.one not in SHAPES:
            parser.error(f"unknown target {args.one}")
        run_child(args)
    else:
        unknown = [t for t in args.targets.split(",") if t not in SHAPES]
        if unknown:
            parser.error(f"unknown targets {unknown}: choose from {', '.join(SHAPES)}")
        run_all(args)


if __name__ == "__main__":
    main()
