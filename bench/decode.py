"""Greedy decoding speed of gpt2.py's cached GPT2Model against the memory roofline and Hugging Face, and what
scoring several new tokens at once costs (speculative sampling's verification).

GPT-2 124M-shaped random weights (gpt2.init_params), float32, batch 1, on this machine's CPU, in the layouts
engine.fast_model measures and chooses here (engine/measure.py; the plan is in the JSON), beside the plain and
column-panel layouts for the cost of scoring several tokens. A decode step
has to read every weight once, so its floor is weights_bytes / read bandwidth, where the bandwidth is the
fastest a single-row product (x[1, k] @ W[k, n], the operation a decode step is made of) reads a weight
matrix here, plain or in column panels, measured in the same run. The kit and transformers run at the same
thread count (--threads, default every usable core: the kit splits its products over them as engine/threads.py
does for main.py, and torch.set_num_threads gets the same number), so that their ratio compares engines, not
cores. Prints one JSON object as its last line.

    python bench/decode.py [--n_tokens 64] [--repeats 3] [--threads 2] [--skip_hf]
    python bench/decode.py --model teach-target --skip_hf     # a model folder under --models_dir instead

ms_per_token is the median of the individual decode steps (each: logits of the newest token from the cache,
then argmax), over --repeats runs of --n_tokens - 1 steps after a prompt of --prompt_len tokens and one warm-up
run; the mean is reported beside it. The machine may be shared: the load averages at the start and end say
how busy it was. With two BLAS threads on two cores, one other busy process can make a step several times
slower (a thread that is descheduled stalls the other), so compare only runs taken on an idle machine.
"""

import os


import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import engine
import gpt2
import utils
from bench.machine import blas_info, cpu_flags, cpu_model
from engine import layouts
from engine.threads import THREADS, usable_cores

HPARAMS_124M = dict(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_tokens", type=int, default=64, help="tokens generated per run (the first comes from the prompt's pass)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (and 5x this many bandwidth and "
                                                               "verify-ratio repetitions)")
    parser.add_argument("--prompt_len", type=int, default=8, help="tokens in the random prompt")
    parser.add_argument("--skip_hf", action="store_true", help="skip the transformers comparison")
    parser.add_argument("--threads", type=int, help="threads for the kit and for torch alike (default: every usable core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="a model folder under --models_dir (default: GPT-2 124M-shaped random weights)")
    parser.add_argument("--models_dir", default=str(Path(__file__).resolve().parents[1] / "models"))
    args = parser.parse_args()
    if args.n_tokens < 1 or args.repeats < 1 or args.prompt_len < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--n_tokens, --repeats, --prompt_len and --threads must be positive")
    return args


# ------------------------------------------------------------------------------------------ measures


class ReadBandwidth:
    """Weight bytes per second of x[1, k] @ W[k, n] in float32 (268 MB for 8192 x 8192): what a decode step does.

    Every layout of engine/layouts.py is timed (row-major, column-major, column panels); the fastest is the roofline's
    bandwidth, so that a layout cannot look closer to the roofline by reading slowly.
    """

    def __init__(self, rng, k=8192, n=8192):
        plain = rng.standard_normal((k, n), dtype=np.float32)
        self.layouts = {layout: layouts.laid_out(plain, layout) for layout in layouts.LAYOUTS}
        self.x = rng.standard_normal((1, k), dtype=np.float32)
        self.samples = {name: [] for name in self.layouts}
        self.measure(1)  # warm-up: page in the matrices

    def measure(self, repeats):
        for _ in range(repeats):
            for name, weights in self.layouts.items():
                seconds = timed(lambda: self.x @ weights)[1]
                self.samples[name].append(weights.nbytes / seconds / 1e9)

    def best_gbps(self):
        return max(max(samples[1:]) for samples in self.samples.values())  # [1:]: not the warm-up

    def best_by_layout(self):
        return {name: round(max(samples[1:]), 2) for name, samples in self.samples.items()}


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def params_nbytes(tree):
    """Bytes of every array in a nested params tree (a PlannedMatrix counts every layout it holds), each once."""
    arrays = {}

    def collect(value):
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)
        elif value is not None:
            arrays[id(value)] = value.nbytes

    collect(tree)
    return sum(arrays.values())


def model_nbytes(model):
    """What a GPT2Model holds in memory: its params (plain or panels) and its output projection."""
    return params_nbytes({"params": model.params, "unembedding": model.unembedding})


def greedy_decode(model, prompt, n_tokens):
    """Greedy tokens and the seconds each decode step took (the prompt's forward pass is not timed)."""
    model.reset()
    tokens = list(prompt)
    tokens.append(int(np.argmax(model.logits(tokens)[-1])))
    step_seconds = []
    for _ in range(n_tokens - 1):
        next_token, seconds = timed(lambda: int(np.argmax(model.logits(tokens)[-1])))
        tokens.append(next_token)
        step_seconds.append(seconds)
    return tokens[len(prompt):], step_seconds


def verify_costs(models, prefix, repeats, block_lengths):
    """What a model call scoring n new tokens costs, in calls scoring 1, after the same prefix, for each model;
    and each model's one-token call in milliseconds.

    Each call goes through GPT2Model.logits as speculative sampling's calls do, rolling the cache back to
    the prefix first. The calls of all models and lengths are interleaved, so that load from other jobs
    and the machine's drift hit them alike; each cost is a ratio of medians.
    """
    new_tokens = list(prefix[:max(block_lengths)])  # any tokens

    def forward(model, n):
        return timed(lambda: model.logits(list(prefix) + new_tokens[:n], n_last=n))[1]

    lengths = sorted({1, *block_lengths})
    times = {(name, n): [] for name in models for n in lengths}
    for round_ in range(repeats + 1):  # the first round warms up and is not kept
        for n in lengths:
            for name, model in models.items():
                seconds = forward(model, n)
                if round_:
                    times[name, n].append(seconds)
    costs = {name: {n: round(statistics.median(times[name, n]) / statistics.median(times[name, 1]), 3)
                    for n in lengths} for name in models}
    return costs, {name: round(1e3 * statistics.median(times[name, 1]), 3) for name in models}


class ProductsTime:
    """A decode step's matrix products alone: one row through every weight matrix of the model, no attention,
    layer norms or other NumPy calls. Sampled beside each decode run, like the bandwidth."""

    def __init__(self, model):
        self.weights = [block[group][layer]["w"] for block in model.params["blocks"]
                        for group, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))]
        self.weights.append(model.params["wte"].T if model.unembedding is None else model.unembedding)
        self.rows = {n_in: np.ones((1, n_in), np.float32) for n_in in {w.shape[0] for w in self.weights}}
        self.samples = []
        self.measure(1)  # warm-up
        self.samples.clear()

    def measure(self, repeats):
        for _ in range(repeats):
            self.samples.append(timed(self.all_products)[1])

    def all_products(self):
        for w in self.weights:
            self.rows[w.shape[0]] @ w

    def median_ms(self):
        return 1e3 * statistics.median(self.samples)


# ------------------------------------------------------------------------------------ Hugging Face


def hf_model(params, hparams):
    """transformers' GPT2LMHeadModel holding the same weights (the inverse of the tests' conversion)."""
    import torch
    import transformers

    config = transformers.GPT2Config(
        vocab_size=hparams["n_vocab"], n_positions=hparams["n_ctx"], n_embd=hparams["n_embd"],
        n_head=hparams["n_head"], n_layer=hparams["n_layer"], activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    state = {"transformer." + utils.hf_name(path): utils.leaf_at(params, path)
             for path, _ in utils.param_leaves(hparams["n_layer"])}
    model = transformers.GPT2LMHeadModel(config).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    return model


def hf_greedy_decode(model, prompt, n_tokens):
    """model.generate's greedy tokens and the seconds between consecutive decode steps.

    A logits processor stamps the time whenever generate has new logits; the first stamp follows the
    prompt's forward pass, so the n_tokens - 1 gaps between stamps are decode steps only (each: forward on
    one token with the cache, the processors and the argmax), matching what greedy_decode times.
    """
    import torch
    import transformers

    stamps = []

    class Stamp(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    with torch.no_grad():
        output = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                do_sample=False, use_cache=True, max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                                logits_processor=transformers.LogitsProcessorList([Stamp()]),
                                pad_token_id=0)
    assert len(stamps) == n_tokens
    return output[0, len(prompt):].tolist(), np.diff(stamps).tolist()


# ----------------------------------------------------------------------------------------------- main


def median_ms(step_seconds):
    return 1e3 * float(statistics.median(step_seconds))


def main():
    args = parse_args()
    load_at_start = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    if args.model:
        _, hparams, params = utils.load_encoder_hparams_and_params(args.model, args.models_dir)
    else:
        hparams = HPARAMS_124M
        params = gpt2.init_params(hparams, rng)
    if args.prompt_len + args.n_tokens + 16 > hparams["n_ctx"]:  # 16: the longest verification block
        raise SystemExit(f"error: --prompt_len + --n_tokens must be at most {hparams['n_ctx'] - 16}")
    prompt = rng.integers(0, hparams["n_vocab"], size=args.prompt_len).tolist()
    weights_bytes = params_nbytes(params)
    threads = args.threads or usable_cores()
    THREADS.set(threads)  # the kit's products split over `threads` cores where that measures faster (main.py's default)
    blas = blas_info()

    # NumPy first: torch's OpenMP threads can keep spinning after it returns and steal the two cores.
    bandwidth = ReadBandwidth(rng)
    model = engine.fast_model(params, hparams)  # the layouts measured and chosen on this machine
    plan = model.plan
    greedy_decode(model, prompt, min(8, args.n_tokens))  # warm-up
    products = ProductsTime(model)
    steps, tokens = [], None
    for _ in range(args.repeats):  # interleaved, so that load from other jobs hits both alike
        bandwidth.measure(5)
        products.measure(5)
        tokens, step_seconds = greedy_decode(model, prompt, args.n_tokens)
        steps += step_seconds
    read_gbps = bandwidth.best_gbps()
    plain = gpt2.GPT2Model(params, hparams)
    panels = engine.fast_model(params, hparams, layout="panels")
    costs, one_token_ms = verify_costs({"chosen": model, "plain": plain, "panels": panels}, prompt + tokens,
                                       5 * args.repeats, range(1, 17))
    matmul_ms = products.median_ms()

    ms_per_token = median_ms(steps)
    roofline_ms = 1e3 * weights_bytes / (read_gbps * 1e9)
    result = {
        "benchmark": f"greedy decode, {args.model or 'GPT-2 124M shape, random weights'}, float32, batch 1, CPU",
        "hparams": hparams,
        "threads": threads,
        "ms_per_token": round(ms_per_token, 3),
        "ms_per_token_statistic": f"median of {len(steps)} decode steps ({args.repeats} runs x "
                                  f"{args.n_tokens - 1} steps after a {args.prompt_len}-token prompt)",
        "ms_per_token_mean": round(1e3 * statistics.mean(steps), 3),
        "weights_bytes": weights_bytes,
        "layout_plan": {**plan.as_dict(), "summary": plan.summary(),
                        "statistic": "measure.measure_plan: each role of the model's own matrices (up to 16 MB of "
                                     "each), 1-16 rows, three layouts and every role interleaved, medians of 3 rounds "
                                     "(one row: 9) in one row's time in the layout the matrix lies in"},
        "model_bytes": {"chosen": model_nbytes(model), "plain": model_nbytes(plain), "panels": model_nbytes(panels)},
        "model_bytes_over_weights": round(model_nbytes(model) / weights_bytes, 3),
        "read_GBps": round(read_gbps, 2),
        "read_GBps_by_layout": bandwidth.best_by_layout(),
        "read_GBps_statistic": f"best of {5 * args.repeats} per layout (5 before each decode run), x[1, 8192] @ "
                               f"W[8192, 8192] float32, W in each layout of layouts.py",
        "roofline_ms_per_token": round(roofline_ms, 3),
        "roofline_fraction": round(roofline_ms / ms_per_token, 3),
        # against the plain layout's read speed alone, as this benchmark measured before column panels existed
        "roofline_fraction_plain_read": round(1e3 * weights_bytes / (bandwidth.best_by_layout()["row-major"] * 1e9)
                                              / ms_per_token, 3),
        "products_ms": round(matmul_ms, 3),
        "products_statistic": f"median of {len(products.samples)} (5 before each decode run): one row through "
                              f"every weight's column panels, the step's matrix products alone",
        "products_roofline_fraction": round(roofline_ms / matmul_ms, 3),
        "one_token_call_ms": one_token_ms,
        "verify_cost": costs["chosen"],
        "verify_cost_plain_layout": costs["plain"],
        "verify_cost_panels_layout": costs["panels"],
        "verify_cost_statistic": f"median time of GPT2Model.logits scoring n new tokens / scoring 1, after "
                                 f"{args.prompt_len + args.n_tokens} cached, {5 * args.repeats} interleaved "
                                 f"repetitions; chosen: engine.fast_model's measured layouts, plain and panels: "
                                 f"gpt2.GPT2Model and engine.fast_model(layout='panels'); "
                                 f"one_token_call_ms: the "
                                 f"median one-token call of each, interleaved",
    }
    if not args.skip_hf:
        import torch

        torch.set_num_threads(threads)  # the kit's thread count: a ratio between engines, not between core counts
        hf = hf_model(params, hparams)
        hf_greedy_decode(hf, prompt, min(8, args.n_tokens))  # warm-up
        hf_steps, hf_tokens = [], None
        for _ in range(args.repeats):
            hf_tokens, step_seconds = hf_greedy_decode(hf, prompt, args.n_tokens)
            hf_steps += step_seconds
        result["hf_ms_per_token"] = round(median_ms(hf_steps), 3)
        result["hf_ms_per_token_mean"] = round(1e3 * statistics.mean(hf_steps), 3)
        result["speedup_vs_hf"] = round(median_ms(hf_steps) / ms_per_token, 3)
        result["greedy_tokens_match_hf"] = hf_tokens == tokens
        result["torch_threads"] = torch.get_num_threads()
        result["torch_version"] = torch.__version__
    result["targets_met"] = {"verify_cost[5]<=1.3": costs["chosen"][5] <= 1.3,
                             "verify_cost[8]<=1.6": costs["chosen"][8] <= 1.6,
                             "roofline_fraction>=0.85 (AVX-512) or 0.7 (AVX2)": result["roofline_fraction"] >= (
                                 0.85 if "avx512f" in cpu_flags() else 0.7)}
    result["machine"] = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "numpy": np.__version__,
                         "numpy_threads": threads, "blas": blas, "python": platform.python_version(),
                         "load_average_1_5_15min_at_start": load_at_start,
                         "load_average_1_5_15min_at_end": os.getloadavg()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
