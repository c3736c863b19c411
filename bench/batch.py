"""Batching and speculation: autoregressive and speculative tokens per second against the batch size B.

Both spend the same spare arithmetic. A decode step reads every weight to multiply one row; B rows read
them once, so batching raises tokens per second until the arithmetic of B rows costs more than the
read. Speculative sampling verifies K + 1 tokens per row in one call: (K + 1) B rows per read of the
weights. The larger B, the less spare arithmetic is left for the drafts, so the speculative speedup
shrinks as B grows and turns into a slowdown (as serving systems report; notebook 8 draws the curve).

    python bench/batch.py                          # the bundled pair on this CPU (NumPy), B = 1, 2, 4, 8, 16
    python bench/batch.py --temperature 1 --K 2
    python bench/batch.py --backend jax            # sampling_jax's device loops, GPT-2 124M -> 1558M shapes
    python bench/batch.py --backend jax --small    # the same on tiny shapes: a smoke run on any device

numpy (the default): row i of a batch continues the i-th of the max B open prompts of the held-out text's test
split (bench/prompts/test.json, bench/spec_splits.py: the bench chooses nothing; their first --prompt_tokens tokens),
with Generator seed i; each B has its own batched models (gpt2_batched.BatchedGPT2Model). After one untimed
run of each decoder at each B, --repeats rounds run every B's autoregressive and speculative decodes
back to back, so a drift in the machine's speed touches every B alike. Tokens per second: B x
--n_tokens / seconds, the median over repeats with its range; the speedup: the median of the paired
ratios. Per B also the acceptance rate alpha (pooled over rows), a target decode step and a draft step
(median calls, the prompts' first pass left out), the verification's cost in decode steps of the same
B (v), the draft's (c), and Leviathan et al.'s formula with them, per row as if it ran alone: the batch
also waits for its slowest row (its loops are the most any row needs; tokens_per_loop_per_row shows the
cost). At temperature 0 the speculative rows must equal the autoregressive ones.

jax: random weights at GPT-2's scale (bench/gpu.py's), draft 124M-shaped and target 1558M-shaped, on
JAX's default device (written for a GPU). Random models rarely agree, so alpha is near 0 and the
measured speculative speed says little; beside it stand a loop's cost in decode steps and the
speedup expected at alpha 0.6 and 0.8 from it.

Prints progress lines, then one JSON object as its last line.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np

import gpt2
import utils
from bench import spec_splits
from bench.machine import blas_info, cpu_model
from batching import gpt2_batched, sampling_batched
from speedup.stats import expected_speedup, expected_tokens_per_loop

ACCEPTANCE_RATES = (0.6, 0.8)  # where the jax backend's random pair gives no alpha of its own
# --small: one and two layers, which compile in seconds on a CPU (bench/gpu.py's small shapes take a minute here)
SMALL_SHAPES = {"124M": dict(n_vocab=256, n_ctx=64, n_embd=32, n_head=2, n_layer=1),
                "1558M": dict(n_vocab=256, n_ctx=64, n_embd=64, n_head=4, n_layer=2)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("numpy", "jax"), default="numpy")
    parser.add_argument("--batch_sizes", default="1,2,4,8,16")
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--n_tokens", type=int, default=64, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--draft", default="teach-draft")
    parser.add_argument("--target", default="teach-target")
    spec_splits.add_prompts_dir_argument(parser)
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--small", action="store_true", help="jax: tiny shapes, a smoke run on any device")
    args = parser.parse_args()
    args.batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    if min(args.batch_sizes) < 1 or min(args.K, args.n_tokens, args.repeats, args.prompt_tokens) < 1:
        parser.error("batch sizes, --K, --n_tokens, --repeats and --prompt_tokens must be at least 1")
    return args


def spread(values):  # the median, with the range beside it
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


class TimedModel:
    """A batched model whose logits calls are timed one by one (BatchStats only sums them)."""

    def __init__(self, model):
        self.model, self.seconds = model, []
        self.n_vocab, self.n_ctx, self.batch_size = model.n_vocab, model.n_ctx, model.batch_size

    def logits(self, xs, n_last=1, rows=None):
        start = time.perf_counter()
        logits = self.model.logits(xs, n_last, rows)
        self.seconds.append(time.perf_counter() - start)
        return logits

    def start_run(self):  # empty caches and no recorded calls
        self.model.reset()
        self.seconds = []

    def median_call(self):  # the first call feeds the prompts: left out
        return statistics.median(self.seconds[1:]) if len(self.seconds) > 1 else None


# ------------------------------------------------------------------------------- numpy: the CPU


def numpy_run(args, prompts):
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
    _, target_hparams, target_params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    prompts = [prompt.tolist() for prompt in prompts]
    models = {B: (TimedModel(gpt2_batched.BatchedGPT2Model(draft_params, draft_hparams, B, "auto")),
                  TimedModel(gpt2_batched.BatchedGPT2Model(target_params, target_hparams, B, "auto")))
              for B in args.batch_sizes}
    settings = {"temperature": args.temperature}

    def autoregressive(B):  # -> (seconds, rows, target step seconds)
        draft, target = models[B]
        target.start_run()
        start = time.perf_counter()
        rows = sampling_batched.autoregressive_sampling(prompts[:B], target, args.n_tokens, rngs=range(B), **settings)
        return time.perf_counter() - start, rows, target.median_call()

    def speculative(B):  # -> (seconds, rows, stats, draft step seconds, verification seconds)
        draft, target = models[B]
        draft.start_run(), target.start_run()
        stats = sampling_batched.BatchStats(B)
        start = time.perf_counter()
        rows = sampling_batched.speculative_sampling(prompts[:B], draft, target, args.n_tokens, args.K, rngs=range(B),
                                                     stats=stats, **settings)
        return time.perf_counter() - start, rows, stats, draft.median_call(), target.median_call()

    for B in args.batch_sizes:  # untimed: first touches of memory
        autoregressive(B), speculative(B)
    runs = {B: [] for B in args.batch_sizes}
    for repeat in range(args.repeats):
        for B in args.batch_sizes:  # interleaved: a drift in the machine's speed touches every B alike
            ar_seconds, ar_rows, step = autoregressive(B)
            seconds, rows, stats, draft_step, verify = speculative(B)
            if args.temperature == 0 and any(not np.array_equal(a, b) for a, b in zip(ar_rows, rows)):
                raise SystemExit(f"B={B}: greedy speculative rows differ from the autoregressive ones")
            runs[B].append((ar_seconds, seconds, stats, step, draft_step, verify))
            print(f"B={B:<3} repeat {repeat + 1}/{args.repeats}: autoregressive {B * args.n_tokens / ar_seconds:7.0f} "
                  f"tokens/s, speculative {B * args.n_tokens / seconds:7.0f} tokens/s (alpha "
                  f"{stats.acceptance_rate:.2f}, {stats.loops} loops)", flush=True)
    return [numpy_report(B, runs[B], args) for B in args.batch_sizes]


def numpy_report(B, runs, args):
    ar_seconds, seconds, all_stats, steps, draft_steps, verifies = zip(*runs)
    stats = all_stats[0]  # every repeat decodes the same tokens; only the times differ
    step, draft_step, verify = (statistics.median(values) for values in (steps, draft_steps, verifies))
    c, v, drafts_per_loop = draft_step / step, verify / step, stats.total("drafted") / stats.total("loops")
    alpha = stats.acceptance_rate
    return {"B": B, "autoregressive_tokens_per_s": spread([B * args.n_tokens / s for s in ar_seconds]),
            "speculative_tokens_per_s": spread([B * args.n_tokens / s for s in seconds]),
            "speedup": spread([a / s for a, s in zip(ar_seconds, seconds)]),
            "acceptance_rate": alpha, "loops": stats.loops, "row_loops": stats.total("loops"),
            "tokens_per_loop_per_row": stats.generated / (B * stats.loops),
            "target_step_ms": 1e3 * step, "draft_step_ms": 1e3 * draft_step, "verify_ms": 1e3 * verify,
            "verify_steps": v, "draft_over_target_step": c,
            "formula_speedup": expected_speedup(alpha, c, drafts_per_loop, v) if alpha is not None else None}


# ------------------------------------------------------------------------------- jax: the device


def jax_run(args):
    from jax_backend import gpt2_jax, sampling_jax
    from bench import gpu

    shapes = SMALL_SHAPES if args.small else gpu.SHAPES
    # drawn on the device for the real shapes (no 6 GB upload); tiny ones in NumPy, without a compile per shape
    random_params = ((lambda hparams, seed: gpt2.init_params(hparams, np.random.default_rng(seed))) if args.small
                     else (lambda hparams, seed: gpu.device_params(hparams, "float32", seed)))
    draft = gpt2_jax.JaxGPT2Model(random_params(shapes["124M"], 1), shapes["124M"])
    target = gpt2_jax.JaxGPT2Model(random_params(shapes["1558M"], 2), shapes["1558M"])
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, shapes["124M"]["n_vocab"], args.prompt_tokens).tolist() for _ in
               range(max(args.batch_sizes))]
    settings = {"temperature": args.temperature}

    def autoregressive(B):
        start = time.perf_counter()
        sampling_jax.batched_autoregressive_sampling(prompts[:B], target, args.n_tokens, rngs=range(B), **settings)
        return time.perf_counter() - start

    def speculative(B):
        stats = sampling_batched.BatchStats(B)
        start = time.perf_counter()
        sampling_jax.batched_speculative_sampling(prompts[:B], draft, target, args.n_tokens, args.K, rngs=range(B),
                                                  stats=stats, **settings)
        return time.perf_counter() - start, stats

    reports = []
    for B in args.batch_sizes:  # a B compiles its own programs: warm up, then time its repeats
        autoregressive(B), speculative(B)
        runs = [(autoregressive(B), *speculative(B)) for _ in range(args.repeats)]
        ar_seconds, seconds, all_stats = zip(*runs)
        stats = all_stats[0]
        step, loop = statistics.median(ar_seconds) / args.n_tokens, statistics.median(seconds) / stats.loops
        reports.append({
            "B": B, "autoregressive_tokens_per_s": spread([B * args.n_tokens / s for s in ar_seconds]),
            "speculative_tokens_per_s": spread([B * args.n_tokens / s for s in seconds]),
            "speedup": spread([a / s for a, s in zip(ar_seconds, seconds)]), "acceptance_rate": stats.acceptance_rate,
            "loops": stats.loops, "step_ms": 1e3 * step, "loop_ms": 1e3 * loop, "loop_steps": loop / step,
            **{f"expected_speedup_a{a}": expected_tokens_per_loop(a, args.K) * step / loop
               for a in ACCEPTANCE_RATES}})
        print(f"B={B:<3} autoregressive {reports[-1]['autoregressive_tokens_per_s']['median']:9.0f} tokens/s, a "
              f"speculative loop {loop / step:.2f} decode steps", flush=True)
    return reports, gpu.device_info()


def main():
    args = parse_args()
    result = {"backend": args.backend, "K": args.K, "temperature": args.temperature, "n_tokens": args.n_tokens,
              "repeats": args.repeats}
    if args.backend == "numpy":
        prompts, record = spec_splits.bench_prompts(argparse.Namespace(**vars(args), n_prompts=max(args.batch_sizes)),
                                                    "test")
        result.update(draft=args.draft, target=args.target, split="test", prompts=record,
                      prompt_tokens=args.prompt_tokens)
        reports = numpy_run(args, prompts)
        result["device"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "numpy": np.__version__,
                            "blas": blas_info(), "load_average": os.getloadavg()}
    else:
        reports, result["device"] = jax_run(args)
        result.update(draft="124M-shaped random", target="1558M-shaped random", small=args.small)
    result.update(batch_sizes=args.batch_sizes,
                  autoregressive_tokens_per_s=[row["autoregressive_tokens_per_s"]["median"] for row in reports],
                  speculative_tokens_per_s=[row["speculative_tokens_per_s"]["median"] for row in reports],
                  speedup=[row["speedup"]["median"] for row in reports], by_batch_size=reports)
    first = result["autoregressive_tokens_per_s"][0]  # the smallest B's, the batch-1 figure by default
    result["autoregressive_gain_over_first"] = [tokens / first for tokens in result["autoregressive_tokens_per_s"]]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
