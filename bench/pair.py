"""The bundled pair on held-out text: perplexity, acceptance rate and speedup against K.

Prompts are windows of the held-out split of the training corpus (documents the models never saw):
--n_prompts windows of --prompt_tokens tokens, spread evenly over the held-out text. For every K, each
prompt is decoded greedily (temperature 0) autoregressively and speculatively with KV caches; the
speculative tokens must equal the autoregressive ones. Times are summed over all prompts, so the
speedup is total autoregressive time / total speculative time; the autoregressive run is timed again
just before each K's speculative run, since a shared machine's speed drifts over minutes.

    python bench/pair.py                                   # the committed pair, held-out text from build/
    python bench/pair.py --heldout tests/fixtures/heldout_sample.txt --n_prompts 8

Prints one JSON object as its last line.
"""

import os

# One BLAS thread unless the caller chose otherwise: on the 2-core machines we measured, a second OpenBLAS
# thread made a GPT-2 124M decode step 22% faster when idle, 1.7x slower with one other busy process (README).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpt2  # noqa: E402
import sampling  # noqa: E402
import utils  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--draft", default="teach-draft")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--heldout", default="build/corpus/heldout.txt", help="held-out text (tools/build_corpus.py)")
    parser.add_argument("--n_prompts", type=int, default=24)
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--n_tokens", type=int, default=64, help="tokens generated per prompt")
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

    def run(decoder, *models, **kwargs):  # -> (outputs, total seconds, stats summed over the prompts)
        stats, outputs, total = sampling.SpeculativeStats(), [], 0.0
        for prompt in prompts:
            for model in models:
                model.reset()  # every prompt starts from empty caches
            start = time.perf_counter()
            outputs.append(decoder(prompt, *models, args.n_tokens, rng=np.random.default_rng(0), temperature=0,
                                   stats=stats, **kwargs))
            total += time.perf_counter() - start
        return outputs, total, stats

    reference, ar_seconds, ar_stats = run(sampling.autoregressive_sampling, target)
    result = {"draft": args.draft, "target": args.target, "heldout": args.heldout, "n_prompts": args.n_prompts,
              "prompt_tokens": args.prompt_tokens, "n_tokens": args.n_tokens,
              "autoregressive_seconds": ar_seconds,
              "target_step_ms": 1000 * ar_stats.target_seconds / ar_stats.target_calls, "by_K": []}
    for K in [int(k) for k in args.K.split(",")]:
        _, ar_seconds_now, _ = run(sampling.autoregressive_sampling, target)  # again: the machine's speed drifts
        outputs, seconds, stats = run(sampling.speculative_sampling, draft, target, K=K)
        if any(not np.array_equal(a, b) for a, b in zip(outputs, reference)):
            raise SystemExit(f"K={K}: greedy speculative tokens differ from autoregressive ones")
        row = {"K": K, "acceptance_rate": stats.acceptance_rate, "tokens_per_target_call": stats.tokens_per_target_call,
               "cost_ratio": stats.cost_ratio, "verify_ms": 1000 * stats.target_seconds / stats.target_calls,
               "expected_speedup": stats.expected_speedup, "seconds": seconds,
               "autoregressive_seconds": ar_seconds_now, "speedup": ar_seconds_now / seconds}
        result["by_K"].append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    scored = tokens[:args.perplexity_tokens + 1]
    result.update(perplexity_tokens=len(scored) - 1,
                  target_perplexity=gpt2.perplexity(scored, target_params, target_hparams),
                  draft_perplexity=gpt2.perplexity(scored, draft_params, draft_hparams))
    best = max(result["by_K"], key=lambda row: row["speedup"])
    result.update(best_K=best["K"], best_speedup=best["speedup"],
                  acceptance_rate_K4=next((r["acceptance_rate"] for r in result["by_K"] if r["K"] == 4), None),
                  machine={"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "numpy": np.__version__, "load_average": os.getloadavg()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
