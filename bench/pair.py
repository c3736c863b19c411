"""The bundled pair on held-out text: perplexity, acceptance rate and speedup against K.

Prompts are windows of the held-out split of the training corpus (documents the models never saw):
--n_prompts windows of --prompt_tokens tokens, spread evenly over the held-out text. For every K, each
prompt is decoded autoregressively and then speculatively, both with KV caches, from the same seed; at
temperature 0 the speculative tokens must equal the autoregressive ones. Each prompt's two runs follow
each other, so that a shared machine's drift hits both alike: `median_speedup` is the median over the
prompts of their autoregressive time / speculative time, `speedup` the ratio of the totals.

    python bench/pair.py                                   # the committed pair, held-out text from build/
    python bench/pair.py --temperature 1 --K 4             # alpha when sampling
    python bench/pair.py --heldout tests/fixtures/heldout_sample.txt --n_prompts 8

Beside the measured speedup stands Leviathan et al.'s formula (sampling.expected_speedup) fed with this
run's alpha, the draft's step in target steps (c) and what one verification costs in target steps:
tokens per loop / (K c + verification), so a reader sees which term keeps a pair from its 2x.

Prints one JSON object as its last line.
"""

import os

# One BLAS thread unless the caller chose otherwise: on the 2-core machines we measured, a second OpenBLAS
# thread made a GPT-2 124M decode step 22% faster when idle, 1.7x slower with one other busy process (README).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpt2  # noqa: E402
import sampling  # noqa: E402
import utils  # noqa: E402
from bench.machine import blas_info, cpu_model  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--draft", default="teach-draft")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--heldout", default="build/corpus/heldout.txt", help="held-out text (tools/build_corpus.py)")
    parser.add_argument("--n_prompts", type=int, default=24)
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--n_tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--K", default="1,2,3,4,5,6,8,10,12")
    parser.add_argument("--perplexity_tokens", type=int, default=16384, help="held-out tokens scored for perplexity")
    return parser.parse_args()


def held_out_tokens(encoder, path):
    text = Path(path).read_text(encoding="utf-8")
    return np.asarray(encoder.encode(text.replace("<|endoftext|>", "\n")), dtype=np.int64)


def main():
    args = parse_args()
    encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
    _, target_hparams, target_params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    tokens = held_out_tokens(encoder, args.heldout)
    stride = (len(tokens) - args.prompt_tokens) // args.n_prompts
    prompts = [tokens[i * stride:i * stride + args.prompt_tokens] for i in range(args.n_prompts)]
    draft, target = gpt2.GPT2Model(draft_params, draft_hparams), gpt2.GPT2Model(target_params, target_hparams)

    def run(prompt, decoder, *models, **kwargs):  # -> (tokens, seconds); stats summed in kwargs["stats"]
        for model in models:
            model.reset()  # every run starts from empty caches
        start = time.perf_counter()
        out = decoder(prompt, *models, args.n_tokens, rng=np.random.default_rng(0), temperature=args.temperature,
                      **kwargs)
        return out, time.perf_counter() - start

    result = {"draft": args.draft, "target": args.target, "heldout": args.heldout, "n_prompts": args.n_prompts,
              "prompt_tokens": args.prompt_tokens, "n_tokens": args.n_tokens, "temperature": args.temperature,
              "by_K": []}
    for K in [int(k) for k in args.K.split(",")]:
        ar_stats, stats, ar_times, times = sampling.SpeculativeStats(), sampling.SpeculativeStats(), [], []
        for prompt in prompts:
            reference, ar_seconds = run(prompt, sampling.autoregressive_sampling, target, stats=ar_stats)
            out, seconds = run(prompt, sampling.speculative_sampling, draft, target, K=K, stats=stats)
            if args.temperature == 0 and not np.array_equal(out, reference):
                raise SystemExit(f"K={K}: greedy speculative tokens differ from autoregressive ones")
            ar_times.append(ar_seconds)
            times.append(seconds)
        target_step_ms = 1000 * ar_stats.target_seconds / ar_stats.target_calls
        draft_step_ms = 1000 * stats.draft_seconds / stats.draft_calls
        verify_ms = 1000 * stats.target_seconds / stats.target_calls
        c, verify_steps = draft_step_ms / target_step_ms, verify_ms / target_step_ms
        drafts_per_loop = stats.drafted / stats.loops
        row = {"K": K, "acceptance_rate": stats.acceptance_rate, "tokens_per_target_call": stats.tokens_per_target_call,
               "target_step_ms": target_step_ms, "draft_step_ms": draft_step_ms, "verify_ms": verify_ms,
               "draft_over_target_step": c, "verify_steps": verify_steps,
               "formula_speedup": sampling.expected_tokens_per_loop(stats.acceptance_rate, drafts_per_loop)
               / (drafts_per_loop * c + verify_steps),
               "formula_speedup_if_verify_cost_one_step": sampling.expected_speedup(stats.acceptance_rate, c,
                                                                                    drafts_per_loop),
               "seconds": sum(times), "autoregressive_seconds": sum(ar_times),
               "speedup": sum(ar_times) / sum(times),
               "median_speedup": float(np.median(np.array(ar_times) / np.array(times))),
               "speedup_range": [float(np.min(np.array(ar_times) / np.array(times))),
                                 float(np.max(np.array(ar_times) / np.array(times)))]}
        result["by_K"].append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    scored = tokens[:args.perplexity_tokens + 1]
    result.update(perplexity_tokens=len(scored) - 1,
                  target_perplexity=gpt2.perplexity(scored, target_params, target_hparams),
                  draft_perplexity=gpt2.perplexity(scored, draft_params, draft_hparams))
    best = max(result["by_K"], key=lambda row: row["median_speedup"])
    result.update(best_K=best["K"], best_median_speedup=best["median_speedup"],
                  acceptance_rate_K4=next((r["acceptance_rate"] for r in result["by_K"] if r["K"] == 4), None),
                  machine={"cpu": cpu_model(), "cores": os.cpu_count(), "numpy": np.__version__, "blas": blas_info(),
                           "load_average": os.getloadavg()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
