"""The JAX backend on an accelerator: decode latency against the memory roofline, verification cost,
speculative loop time against K, and transformers on the same device.

Written for one H100; `--small` runs tiny shapes and fewer K on any device (a CPU smoke check).
Random weights at GPT-2's scale (normal, std 0.02) are drawn on the device, in GPT-2 124M's and 1558M's
shapes. Parts (`--parts`, comma-separated; all by default):

- bandwidth: a large device array read and written once (x + 1), bytes read + written / seconds, best of
  repeats. The roofline of a decode step is weights_bytes / that bandwidth.
- decode: per-token greedy decode latency through JaxGPT2Model.logits (what a decoder sees: dispatch,
  the device, the logits row back to the host), median of the steps, in float32 and bfloat16; beside it
  the jitted step alone dispatched back to back (device time when dispatch keeps up).
  Beside it the same greedy decode as one device call (sampling_jax: the whole loop in a lax.while_loop),
  ms per token from (seconds for N tokens - seconds for 2) / (N - 2), so the prompt's pass drops out.
- verify: the time to score 5 and 8 new tokens divided by the time to score 1, after the same cached prefix.
- loop: one speculative loop (the draft's K tokens in one fused call, then the target scoring K + 1)
  against K for a 124M -> 1558M pair; the cost ratio c; the expected speedup at acceptance rates 0.6 and
  0.8, from Leviathan et al.'s formula with the measured c and from the measured loop time.
- device_loop: the 124M -> 1558M pair through sampling_jax's speculative loop (everything on the
  device, one call for N tokens) against K: ms per loop, and the speedup over the device-loop
  autoregressive decoder at acceptance rates 0.6 and 0.8 (expected tokens per loop x its ms/token / loop ms).
- pair: speculative against autoregressive sampling on the bundled pair (models/teach-*), if present,
  with the host's loops and with the device loops.
- hf: transformers' generate (torch, CUDA) on the same device and shapes, float32.
- tree: a token tree of 16, 32 and 64 nodes scored by the 1558M target in one call (JaxGPT2Model.tree_logits),
  against a chain of as many tokens and a decode step, with bench/tree.py's measurement; last, as it serves
  no bar.

    python bench/gpu.py [--small] [--parts decode,verify] [--n_tokens 64] [--repeats 3] [--budget_s S --out F]

The parts run in order of priority (bandwidth; decode and verification in float32; the device loop; the same
in bfloat16; the host's loop; the pair; transformers; the token tree), each only if it still fits --budget_s
(bench/budget.py: a part expected to overrun is skipped and listed under "skipped"), and --out is rewritten
after every part, so a run stopped at its time limit keeps what it measured. On a lent GPU, first thing:

    python bench/gpu.py --budget_s 330 --out $OUT/gpu.json

Prints one JSON object as its last line.
"""

import argparse
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave device memory for torch's turn

import jax
import jax.numpy as jnp
import numpy as np

import sampling
from bench.budget import Budget, write_json_atomically
from jax_backend import gpt2_jax, sampling_jax
from speedup.stats import SpeculativeStats, expected_speedup, expected_tokens_per_loop

SHAPES = {"124M": dict(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12),
          "1558M": dict(n_vocab=50257, n_ctx=1024, n_embd=1600, n_head=25, n_layer=48)}
SMALL_SHAPES = {"124M": dict(n_vocab=512, n_ctx=128, n_embd=64, n_head=4, n_layer=2),
                "1558M": dict(n_vocab=512, n_ctx=128, n_embd=128, n_head=4, n_layer=4)}
PARTS = ("bandwidth", "decode", "verify", "loop", "device_loop", "pair", "hf", "tree")
DTYPES = ("float32", "bfloat16")
VERIFIED = (1, 5, 8)  # tokens scored in one call: v(5) and v(8) are their cost over one
KS = (1, 2, 3, 4, 5, 6, 7)  # K + 1 <= 8 keeps the target's verification in three programs (2, 4, 8 tokens)
PAIR_KS = (2, 4)
SMALL_KS, SMALL_PAIR_KS = (1, 2, 4), (2,)  # --small: fewer programs to compile, every part still run
ACCEPTANCE_RATES = (0.6, 0.8)
TREE_SIZES, SMALL_TREE_SIZES = (16, 32, 64), (4, 8)  # nodes of a token tree (and tokens of the chain beside it)
HF_H100_MS = {"124M": 6.1, "1558M": 18.8}  # transformers (torch, float32) on one H100, November 2026, when not measured


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes: a smoke run on any device")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, among {', '.join(PARTS)}")
    parser.add_argument("--n_tokens", type=int, default=64, help="tokens generated per run (the first comes from the prompt's pass)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (5x this many for ratios)")
    parser.add_argument("--prompt_len", type=int, default=8)
    parser.add_argument("--loops", type=int, default=20, help="speculative loops timed per K")
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--pair", default="teach-draft,teach-target", help="the bundled draft,target folders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget_s", type=float, default=math.inf,
                        help="seconds for the whole run: a part that would overrun is skipped, and the result says so")
    parser.add_argument("--out", help="also write the result here, after every part (atomically)")
    args = parser.parse_args()
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    args.Ks, args.pair_Ks, args.tree_sizes = ((SMALL_KS, SMALL_PAIR_KS, SMALL_TREE_SIZES) if args.small
                                              else (KS, PAIR_KS, TREE_SIZES))
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}: choose among {', '.join(PARTS)}")
    if not args.budget_s > 0:
        parser.error(f"--budget_s must be positive, got {args.budget_s}")
    if min(args.n_tokens, args.repeats, args.prompt_len, args.loops) < 2:
        parser.error("--n_tokens, --repeats, --prompt_len and --loops must be at least 2")
    return args


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def ms(seconds):
    return round(1e3 * float(seconds), 4)


# ----------------------------------------------------------------------------------------- the device


def copy_bandwidth_GBps(n_bytes, repeats):
    """Bytes read + written per second by x + 1 over a large float32 array, best of repeats."""
    x = jnp.ones(n_bytes // 4, jnp.float32)
    add_one = jax.jit(lambda a: a + 1.0)  # one read and one write of every element, nothing XLA can skip
    add_one(x).block_until_ready()
    best = min(timed(lambda: add_one(x).block_until_ready())[1] for _ in range(repeats))
    return 2 * x.nbytes / best / 1e9


def device_params(hparams, dtype, seed):
    """gpt2.init_params' layout and scale drawn on the device: 1558M in seconds, without a 6 GB upload."""
    keys = iter(jax.random.split(jax.random.key(seed), 2 + 4 * hparams["n_layer"]))
    n_embd, compute_dtype = hparams["n_embd"], gpt2_jax.COMPUTE_DTYPES[dtype]

    def normal(*shape):
        return (0.02 * jax.random.normal(next(keys), shape, jnp.float32)).astype(compute_dtype)

    def dense(n_in, n_out):
        return {"w": normal(n_in, n_out), "b": jnp.zeros(n_out, compute_dtype)}

    def norm():
        return {"g": jnp.ones(n_embd, compute_dtype), "b": jnp.zeros(n_embd, compute_dtype)}

    def block():
        return {"ln_1": norm(), "attn": {"c_attn": dense(n_embd, 3 * n_embd), "c_proj": dense(n_embd, n_embd)},
                "ln_2": norm(), "mlp": {"c_fc": dense(n_embd, 4 * n_embd), "c_proj": dense(4 * n_embd, n_embd)}}

    return {"wte": normal(hparams["n_vocab"], n_embd), "wpe": normal(hparams["n_ctx"], n_embd),
            "blocks": [block() for _ in range(hparams["n_layer"])], "ln_f": norm()}


def nbytes(tree):
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def device_info():
    device = jax.devices()[0]
    return {"platform": device.platform, "kind": device.device_kind, "jax": jax.__version__,
            "python": platform.python_version(), "numpy": np.__version__}


# ------------------------------------------------------------------------------------------ decoding


def greedy_decode_seconds(model, prompt, n_tokens):
    """Seconds of each greedy decode step through model.logits (the prompt's pass is not timed)."""
    model.reset()
    tokens = list(prompt)
    tokens.append(int(np.argmax(model.logits(tokens, n_last=len(tokens))[-1])))  # the block program verify uses
    step_seconds = []
    for _ in range(n_tokens - 1):
        token, seconds = timed(lambda: int(np.argmax(model.logits(tokens)[-1])))
        tokens.append(token)
        step_seconds.append(seconds)
    return step_seconds


def feed(model, n_new, start, n_out):
    """The jitted step alone on n_new tokens at position start, logits left on the device."""
    rows, model.cache = gpt2_jax.feed_block(model.params, model.cache, np.zeros(n_new, np.int32), np.int32(start),
                                            np.int32(0), n_head=model.n_head, n_out=n_out)
    return rows


def pipelined_step_seconds(model, start, n_steps):
    """Seconds per step of n_steps jitted 1-token steps dispatched back to back, waited for once."""
    feed(model, 1, start, 1).block_until_ready()
    _, seconds = timed(lambda: [feed(model, 1, start + i, 1) for i in range(n_steps)][-1].block_until_ready())
    model.reset()  # the cache now holds tokens the model does not know about
    return seconds / n_steps


def decode_report(model, prompt, args, bandwidth_GBps):
    greedy_decode_seconds(model, prompt, min(8, args.n_tokens))  # warm-up: compiles
    steps = [s for _ in range(args.repeats) for s in greedy_decode_seconds(model, prompt, args.n_tokens)]
    weights, step, pipelined = nbytes(model.params), statistics.median(steps), pipelined_step_seconds(
        model, len(prompt), args.n_tokens)
    report = {"ms_per_token": ms(step), "ms_per_token_mean": ms(statistics.mean(steps)),
              "statistic": f"median of {len(steps)} steps ({args.repeats} runs x {args.n_tokens - 1})",
              "step_ms_pipelined": ms(pipelined), "weights_bytes": weights,
              "kv_cache_bytes": nbytes(model.cache.layers)}
    device_loop = device_loop_ms_per_token(model, prompt, args.n_tokens, args.repeats)
    report["device_loop_ms_per_token"] = ms(device_loop)
    if bandwidth_GBps:
        roofline = weights / (bandwidth_GBps * 1e9)
        report["roofline_ms"] = ms(roofline)
        report["roofline_fraction"] = round(roofline / step, 3)
        report["roofline_fraction_pipelined"] = round(roofline / pipelined, 3)
        report["roofline_fraction_device_loop"] = round(roofline / device_loop, 3)
    return report


def device_loop_seconds(model, prompt, N, repeats):
    """Median seconds of one sampling_jax greedy decode of N tokens (one device call), after a warm-up."""
    def decode():
        model.reset()
        return sampling_jax.autoregressive_sampling(prompt, model, N, rng=0, temperature=0)

    return timed_median(decode, repeats)


def device_loop_ms_per_token(model, prompt, n_tokens, repeats):
    """Seconds per token of the device loop, the prompt's pass and the call's fixed costs subtracted (a call
    for n_tokens against one for 2). Where timing noise swamps that difference (tiny models on a CPU), the
    whole call's seconds per token instead, an upper bound, so that the figure is never zero or negative."""
    long, short = (device_loop_seconds(model, prompt, N, 2 * repeats) for N in (n_tokens, 2))
    per_token = (long - short) / (n_tokens - 2) if n_tokens > 2 else 0.0
    return per_token if per_token > 0 else long / n_tokens


def verify_report(model, prompt, repeats):
    """The time to score 5 and 8 new tokens over the time to score 1, after the same prefix: v(5) and v(8) in
    decode steps, through logits() (what a decoder sees) and for the jitted step alone (device time)."""
    model.reset()
    model.logits(prompt, n_last=len(prompt))
    scored = {n: np.append(prompt, 10 * n + np.arange(n)) for n in VERIFIED}  # n_last = n: n tokens fed
    api = {n: [] for n in VERIFIED}
    for _ in range(repeats + 1):  # interleaved; the first round compiles and is dropped
        for n, x in scored.items():
            api[n].append(timed(lambda: model.logits(x, n_last=n))[1])
    device = {n: [] for n in VERIFIED}
    for _ in range(repeats + 1):
        for n in VERIFIED:
            n_block = gpt2_jax.bucket_size(n, model.n_ctx)
            device[n].append(timed(lambda: feed(model, n_block, len(prompt), 1 if n == 1 else n_block)
                                   .block_until_ready())[1])
    model.reset()
    buckets = [gpt2_jax.bucket_size(n, model.n_ctx) for n in VERIFIED]
    report = {"statistic": f"median of {repeats}, interleaved; device: the jitted step alone (n tokens padded to "
                           f"the bucket the model compiles: {buckets})"}
    for name, times in (("", api), ("device_", device)):
        median = {n: statistics.median(seconds[1:]) for n, seconds in times.items()}
        for n in VERIFIED:
            report[f"{name}ms_{n}"] = ms(median[n])
            if n > 1:
                report[f"{name}ratio_{n}_to_1"] = round(median[n] / median[1], 3)
    return report


# ------------------------------------------------------------------------------------ speculative loop


def loop_seconds(draft, target, prompt, K, n_loops, rng, fused=True):
    """Median seconds of a speculative loop: K drafts, then the target scores K + 1 positions.

    Each loop keeps K // 2 drafts and adds one token, as a loop that rejects half way does, so both
    caches roll back and feed what a real run feeds. Acceptance does not change a loop's cost here.
    """
    draft.reset(), target.reset()
    x, seconds = np.asarray(prompt), []
    for _ in range(n_loops + 1):  # the first loop compiles and is dropped
        if len(x) + K + 2 > target.n_ctx:
            x = np.asarray(prompt)
        start = time.perf_counter()
        if fused:
            drafts, _ = draft.draft(x, K, rng.random(K))
        else:  # one draft call per token, sampled on the host
            drafts = np.zeros(0, np.int64)
            for _ in range(K):
                probs = sampling.logits_to_probs(draft.logits(np.append(x, drafts))[0])
                drafts = np.append(drafts, sampling.sample(probs, rng))
        target.logits(np.append(x, drafts), n_last=K + 1)
        seconds.append(time.perf_counter() - start)
        x = np.concatenate([x, drafts[:K // 2], [(int(drafts[0]) + 1) % target.n_vocab]])
    return statistics.median(seconds[1:])


def loop_report(draft, target, prompt, args, rng):
    target_step = statistics.median(greedy_decode_seconds(target, prompt, args.n_tokens))
    draft_step = statistics.median(greedy_decode_seconds(draft, prompt, args.n_tokens))
    rows = []
    for K in args.Ks:
        fused = loop_seconds(draft, target, prompt, K, args.loops, rng)
        unfused = loop_seconds(draft, target, prompt, K, args.loops, rng, fused=False)
        draft_seconds = timed_median(lambda: draft.draft(prompt, K, rng.random(K)), args.loops)
        c = draft_seconds / K / target_step  # a fused draft step's cost over a target decode step
        row = {"K": K, "loop_ms": ms(fused), "loop_ms_unfused_draft": ms(unfused), "fused_draft_ms": ms(draft_seconds),
               "c": round(c, 4)}
        for a in ACCEPTANCE_RATES:
            row[f"expected_speedup_a{a}"] = round(expected_speedup(a, c, K), 3)
            row[f"speedup_from_loop_time_a{a}"] = round(
                expected_tokens_per_loop(a, K) * target_step / fused, 3)
        rows.append(row)
    return {"target_ms_per_token": ms(target_step), "draft_ms_per_token": ms(draft_step),
            "c_unfused": round(draft_step / target_step, 4), "by_K": rows,
            "note": "expected_speedup: Leviathan et al. with the measured c (verification costs one step); "
                    "speedup_from_loop_time: expected tokens per loop x target ms/token / measured loop time"}


def device_loop_report(draft, target, prompt, args):
    """sampling_jax's speculative loop against K, greedy: ms per loop, and the speedup it gives at alpha 0.6 and 0.8.

    The random pair's own acceptance is whatever it is; a loop's cost hardly depends on it (K draft steps
    and one scoring of K + 1 always run), so loop ms x expected loops at alpha is the time at alpha.
    """
    autoregressive_step = device_loop_ms_per_token(target, prompt, args.n_tokens, args.repeats)
    rows = []
    for K in args.Ks:
        def decode(stats):
            draft.reset(), target.reset()
            return sampling_jax.speculative_sampling(prompt, draft, target, args.n_tokens, K, rng=0, temperature=0,
                                                     stats=stats)

        decode(SpeculativeStats())  # warm-up: compiles
        stats = SpeculativeStats()
        seconds = statistics.median(timed(lambda: decode(stats))[1] for _ in range(args.repeats))
        loops = stats.loops // args.repeats
        row = {"K": K, "loop_ms": ms(seconds / loops), "loops": loops, "ms_per_token": ms(seconds / args.n_tokens),
               "acceptance_rate": None if stats.acceptance_rate is None else round(stats.acceptance_rate, 3)}
        for a in ACCEPTANCE_RATES:
            row[f"speedup_a{a}"] = round(expected_tokens_per_loop(a, K) * autoregressive_step
                                         / (seconds / loops), 3)
        rows.append(row)
    return {"autoregressive_ms_per_token": ms(autoregressive_step), "by_K": rows,
            "note": "one device call per decode of N tokens (the prompt's pass included in loop_ms); speedup_a: "
                    "expected tokens per loop at alpha x device-loop autoregressive ms/token / loop ms"}


def timed_median(fn, repeats):
    fn()  # warm-up
    return statistics.median(timed(fn)[1] for _ in range(repeats))


# ---------------------------------------------------------------------------------------- token trees


class KeepBlocks:
    """A JaxGPT2Model whose keep_tree_path waits for the device, so that bench/tree.py times its work, not its
    dispatch (logits and tree_logits wait already: they bring their rows back)."""

    def __init__(self, model):
        self.model, self.n_vocab = model, model.n_vocab

    def logits(self, x, n_last=1):
        return self.model.logits(x, n_last)

    def tree_logits(self, x, tokens, parents):
        return self.model.tree_logits(x, tokens, parents)

    def keep_tree_path(self, nodes):
        self.model.keep_tree_path(nodes)
        jax.block_until_ready(self.model.cache)


def tree_report(model, prompt, sizes, repeats):
    """bench/tree.py's measurement on the device: a token tree of n nodes (three chains from the root) scored by
    JaxGPT2Model.tree_logits in one call, against a chain of n tokens and a decode step after the same prefix."""
    from bench import tree

    model.reset()
    model.logits(prompt)  # cached once: every timed call feeds the prompt's last token and what is new
    rng = np.random.default_rng(0)
    rows = [tree.row(n, *tree.measure(KeepBlocks(model), prompt, n, repeats, rng)) for n in sizes]
    model.reset()
    return {"by_n": rows, "statistic": f"median (min, max) over {repeats} repeats in rotated order after a warm-up "
                                       f"(bench/tree.py's measure); the tree's and chain's n + 1 rows padded to "
                                       f"the bucket the model compiles"}


# ---------------------------------------------------------------------------------- the bundled pair


def pair_report(args):
    import utils

    names = args.pair.split(",")
    missing = [name for name in names if not (Path(args.models_dir) / name / "hparams.json").exists()]
    if len(names) != 2 or missing:
        return {"skipped": f"no bundled pair: {', '.join(missing) or args.pair} not found under {args.models_dir}/"}
    (encoder, draft_hparams, draft_params), (_, target_hparams, target_params) = (
        utils.load_encoder_hparams_and_params(name, args.models_dir) for name in names)
    draft = gpt2_jax.JaxGPT2Model(draft_params, draft_hparams)
    target = gpt2_jax.JaxGPT2Model(target_params, target_hparams)
    prompt = encoder.encode("def fibonacci(n):\n    ")
    N = min(args.n_tokens, target_hparams["n_ctx"] - len(prompt))
    report = {"draft": names[0], "target": names[1], "N": N}
    # the host's loops (sampling), then the device loops (sampling_jax), on the same models
    for module, K, temperature in itertools.product((sampling, sampling_jax), args.pair_Ks, (0.0, 1.0)):
        def autoregressive():
            target.reset()
            return module.autoregressive_sampling(prompt, target, N, np.random.default_rng(0),
                                                  temperature=temperature)

        def speculative(stats):
            draft.reset(), target.reset()
            return module.speculative_sampling(prompt, draft, target, N, K, np.random.default_rng(0),
                                               temperature=temperature, stats=stats)

        autoregressive_s = timed_median(autoregressive, args.repeats)
        speculative(SpeculativeStats())  # warm-up
        stats = SpeculativeStats()
        speculative_s = statistics.median(timed(lambda: speculative(stats))[1] for _ in range(args.repeats))
        suffix = "_device_loop" if module is sampling_jax else ""  # the device loop does not time c
        report[f"K{K}_T{temperature}{suffix}"] = {
            "autoregressive_ms": ms(autoregressive_s), "speculative_ms": ms(speculative_s),
            "speedup": round(autoregressive_s / speculative_s, 3), "acceptance_rate": round(stats.acceptance_rate, 3),
            "cost_ratio": None if stats.cost_ratio is None else round(stats.cost_ratio, 4)}
    return report


# ---------------------------------------------------------------------------------------- transformers


def hf_ms_per_token(hparams, prompt, n_tokens, repeats):
    """transformers' greedy generate on CUDA, float32, random weights: median ms between decode steps."""
    import torch
    import transformers

    if not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}
    config = transformers.GPT2Config(vocab_size=hparams["n_vocab"], n_positions=hparams["n_ctx"],
                                     n_embd=hparams["n_embd"], n_head=hparams["n_head"],
                                     n_layer=hparams["n_layer"], activation_function="gelu_new")
    with torch.device("cuda"):
        model = transformers.GPT2LMHeadModel(config).eval()
    stamps = []

    class Stamp(transformers.LogitsProcessor):  # called once per step, when the step's logits exist
        def __call__(self, input_ids, scores):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return scores

    def generate(n):
        stamps.clear()
        with torch.no_grad():
            model.generate(torch.tensor([prompt], device="cuda"), attention_mask=torch.ones(1, len(prompt),
                           dtype=torch.long, device="cuda"), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                           logits_processor=transformers.LogitsProcessorList([Stamp()]), pad_token_id=0)
        return np.diff(stamps).tolist()

    generate(8)  # warm-up
    steps = [s for _ in range(repeats) for s in generate(n_tokens)]
    del model
    torch.cuda.empty_cache()
    return {"ms_per_token": ms(statistics.median(steps)), "torch": torch.__version__,
            "transformers": transformers.__version__, "statistic": f"median of {len(steps)} decode steps"}


# ------------------------------------------------------------------------------------------------ main


def what_the_device_has():
    """What this machine offers the parts: JAX's platform and, for the transformers part, torch with CUDA."""
    has = {"jax_platform": jax.devices()[0].platform}
    try:
        import torch
        import transformers  # noqa: F401

        has["torch_cuda"] = torch.cuda.is_available()
    except ImportError as error:
        has["torch_cuda"] = False
        has["torch_missing"] = str(error)
    return has


def main():
    args = parse_args()
    shapes = SMALL_SHAPES if args.small else SHAPES
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, shapes["124M"]["n_vocab"], size=args.prompt_len)
    budget = Budget(args.budget_s)
    result = {"benchmark": "JAX backend: decode, verification and speculative loops; random GPT-2-shaped weights",
              "small": args.small, "device": device_info(), "has": what_the_device_has(), "shapes": shapes,
              "budget_s": args.budget_s, "skipped": {}, "part_seconds": {}}
    if result["device"]["platform"] == "cpu" and not args.small:
        print("bench/gpu.py: JAX sees no accelerator; the figures will be the CPU's", file=sys.stderr)
    models = {}

    def model(name, dtype):  # built on first use, kept for the later parts
        if (name, dtype) not in models:
            hparams = shapes[name]
            models[name, dtype] = gpt2_jax.JaxGPT2Model(device_params(hparams, dtype, args.seed), hparams, dtype)
        return models[name, dtype]

    def run(section, key, kind, part):  # one part within the budget; the result so far is written after it
        if section not in args.parts:
            return
        started = budget.elapsed()
        figures = budget.run(kind, part)
        if "skipped" in figures and len(figures) == 1:
            result["skipped"][f"{section} {key}"] = figures["skipped"]
        else:
            result.setdefault(section, {})[key] = figures
            result["part_seconds"][f"{section} {key}"] = round(budget.elapsed() - started, 1)
        result["seconds"] = round(budget.elapsed(), 1)
        write_json_atomically(args.out, result)

    n_bytes = (64 if args.small else 2048) * 2**20
    run("bandwidth", "copy", "bandwidth", lambda: {
        "GBps": round(copy_bandwidth_GBps(n_bytes, 5 * args.repeats), 1),
        "statistic": f"best of {5 * args.repeats}, x + 1 over {n_bytes // 2**20} MiB float32"})
    bandwidth = result.get("bandwidth", {}).get("copy", {}).get("GBps")
    # in order of priority: what the bars need first, float32 before bfloat16, the host's loop after the device's
    for dtype in DTYPES:
        for name in ("1558M", "124M"):
            run("decode", f"{name}_{dtype}", f"decode {name}",
                lambda: decode_report(model(name, dtype), prompt, args, bandwidth))
        for name in ("1558M", "124M"):
            run("verify", f"{name}_{dtype}", f"verify {name}", lambda: verify_report(model(name, dtype), prompt,
                                                                                       5 * args.repeats))
        if dtype == "float32":
            run("device_loop", "124M_to_1558M_float32", "device_loop",
                lambda: device_loop_report(model("124M", dtype), model("1558M", dtype), prompt, args))
    for key in [key for key in models if key[1] != "float32"]:
        del models[key]  # free the bfloat16 models' device memory for the parts after them
    gc.collect()
    run("loop", "124M_to_1558M_float32", "loop",
        lambda: loop_report(model("124M", "float32"), model("1558M", "float32"), prompt, args, rng))
    models.clear()
    gc.collect()
    run("pair", "bundled", "pair", lambda: pair_report(args))
    if result["has"]["torch_cuda"]:
        for name, hparams in shapes.items():
            run("hf", name, f"hf {name}", lambda: hf_ms_per_token(hparams, prompt.tolist(), args.n_tokens,
                                                                  args.repeats))
    elif "hf" in args.parts:
        why = result["has"].get("torch_missing") or "torch sees no CUDA device"
        result["skipped"]["hf"] = f"transformers is timed on CUDA only: {why}"
    run("tree", "1558M_float32", "tree",
        lambda: tree_report(model("1558M", "float32"), prompt, args.tree_sizes, args.repeats))
    models.clear()
    result["targets"] = targets(result, args.small)
    write_json_atomically(args.out, result)
    print(json.dumps(result))


def targets(result, small):
    """The bars on one H100 or H200: 1558M float32 decode through the device loop at >= 0.6 of the memory
    roofline; the 124M -> 1558M device loop >= 1.6x expected at alpha 0.8 with the measured costs; scoring 5
    tokens at most 1.15 decode steps for 1558M; beside them, transformers and the bundled pair."""
    decode = result.get("decode", {}).get("1558M_float32")
    if decode is None:
        return {"skipped": "the decode part did not run"}
    hf = result.get("hf", {}).get("1558M", {})
    hf_ms = hf.get("ms_per_token") or (None if small else HF_H100_MS["1558M"])
    met = {"hf_ms_per_token_used": hf_ms,
           "hf_source": "measured" if "ms_per_token" in hf else "earlier H100 measurement" if hf_ms else None}
    if "roofline_fraction" in decode:
        met["roofline_fraction"] = decode["roofline_fraction"]
        met["roofline_fraction_device_loop"] = decode["roofline_fraction_device_loop"]
        met["roofline_fraction_device_loop>=0.6"] = decode["roofline_fraction_device_loop"] >= 0.6
    verify = result.get("verify", {}).get("1558M_float32")
    if verify:
        met["v5_1558M"] = verify["ratio_5_to_1"]
        met["v5_1558M<=1.15"] = verify["ratio_5_to_1"] <= 1.15
    device_loop = result.get("device_loop", {}).get("124M_to_1558M_float32")
    if device_loop:  # 124M -> 1558M at alpha 0.8, the best K, over the device-loop autoregressive decoder
        met["device_loop_speedup_a0.8"] = max(row["speedup_a0.8"] for row in device_loop["by_K"])
        met["device_loop_speedup_a0.8>=1.6"] = met["device_loop_speedup_a0.8"] >= 1.6
    pair = result.get("pair", {}).get("bundled", {})
    pair_speedups = [run["speedup"] for key, run in pair.items() if key.endswith("_device_loop")]
    if pair_speedups:
        met["bundled_pair_device_loop_best_speedup"] = max(pair_speedups)
    if hf_ms:
        met["speedup_vs_hf"] = round(hf_ms / decode["ms_per_token"], 3)
    return met


if __name__ == "__main__":
    main()
