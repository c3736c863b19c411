"""The verifiers beyond Algorithm 2 on the bundled pair: tokens per target call, alpha and wall-clock speedup.

For each temperature, every prompt and seed is decoded autoregressively once, then by every verifier at every K, from
empty caches, back to back, so that a shared machine's drift touches them alike. The bench chooses nothing: its
prompts are --n_prompts open prompts of the held-out text's test split (bench/prompts/test.json,
bench/spec_splits.py; their first --prompt_tokens tokens), named in the JSON's "prompts" with their split.
Verifiers (names for --verifiers):

- token: Algorithm 2's token-by-token verification (sampling.speculative_sampling);
- block: block verification (verifiers/block.py, Sun et al. 2024);
- multiN: N drafts by recursive rejection, drawn without replacement (verifiers/multi_draft.py, RSD), run by
  the tree's loop (the same tokens as treeN); multiNr: drawn with replacement (SpecInfer);
- treeN (treeNr): the same N drafts as one token tree, scored in one target call (verifiers/tree.py);
- topkN: a tree of the draft's N most likely tokens at every node, to depth K (EAGLE's drafts, one-hot rule).

`tokens_per_target_call` pools every run (the gain a verifier buys per target call); `median_speedup` is the
median over prompts and seeds of autoregressive seconds / the verifier's seconds; at temperature 0 every
verifier's tokens must equal the autoregressive ones. `gains` compares, at each temperature and K, block
with token verification and N drafts with one.

    python bench/verifier_gains.py                                     # T 0 and 1, K 2, 4, 8, 16 prompts x 2 seeds
    python bench/verifier_gains.py --temperature 1 --K 4 --verifiers token,block,multi3

Prints one JSON line per temperature and K as it goes, then one JSON object as its last line.
"""

import argparse
import functools
import json
import os
import statistics
import time

import numpy as np

import engine
import sampling
import utils
from bench.machine import blas_info, cpu_model
from bench import spec_splits
from bench.pair import spread
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling
from verifiers.multi_draft import multi_draft_speculative_sampling
from verifiers.tree import tree_speculative_sampling

DEFAULT_VERIFIERS = "token,block,multi2,multi3,multi3r,tree3,topk2"
MAX_TREE_NODES = 64  # a top-k tree grows as N^K: larger ones are left out (2 children to depth 8: 510 nodes)


def decoder_for(name):  # a verifier's name -> a decoder with speculative_sampling's signature
    if name == "token":
        return sampling.speculative_sampling
    if name == "block":
        return block_speculative_sampling
    for prefix, decoder, keywords in (("multi", multi_draft_speculative_sampling, {}),
                                      ("tree", tree_speculative_sampling, {"drafts": "sampled"}),
                                      ("topk", tree_speculative_sampling, {"drafts": "top_k"})):
        count = name[len(prefix):].removesuffix("r") if prefix != "topk" else name[len(prefix):]
        if name.startswith(prefix) and count.isdigit() and int(count) >= 1:
            replacement = {"replacement": name.endswith("r")} if prefix != "topk" else {}
            return functools.partial(decoder, n_drafts=int(count), **replacement, **keywords)
    raise ValueError(f"unknown verifier {name!r}: token, block, or multiN, treeN (an r after N: drafts drawn with "
                     f"replacement), topkN, with N >= 1")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--draft", default="teach-draft")
    parser.add_argument("--target", default="teach-target")
    spec_splits.add_prompts_dir_argument(parser)
    parser.add_argument("--n_prompts", type=int, default=16)
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=2, help="seeds per prompt (0, 1, ...)")
    parser.add_argument("--n_tokens", type=int, default=64, help="tokens generated per run")
    parser.add_argument("--temperature", default="0,1", help="comma-separated temperatures")
    parser.add_argument("--K", default="2,4,8", help="comma-separated drafts per loop")
    parser.add_argument("--verifiers", default=DEFAULT_VERIFIERS)
    args = parser.parse_args(argv)
    try:
        args.temperature = [float(value) for value in args.temperature.split(",")]
        args.K = [int(value) for value in args.K.split(",")]
        args.verifiers = {name: decoder_for(name) for name in args.verifiers.split(",")}
    except ValueError as error:
        parser.error(str(error))
    if min(args.K) < 1 or min(args.n_prompts, args.seeds, args.n_tokens, args.prompt_tokens) < 1:
        parser.error("--K values, --n_prompts, --seeds, --n_tokens and --prompt_tokens must be positive")
    if min(args.temperature) < 0:
        parser.error("temperatures must be >= 0")
    return args


def timed_run(decoder, prompt, draft, target, N, K, seed, temperature):  # -> (tokens, seconds, stats)
    for model in (draft, target):
        model.reset()  # every run starts from empty caches
    stats = SpeculativeStats()
    start = time.perf_counter()
    if decoder is sampling.autoregressive_sampling:
        out = decoder(prompt, target, N, rng=seed, temperature=temperature, stats=stats)
    else:
        out = decoder(prompt, draft, target, N, K, rng=seed, temperature=temperature, stats=stats)
    return out, time.perf_counter() - start, stats


def tree_nodes(name, K):  # a top-k tree's size: N + N^2 + ... + N^K nodes; the other verifiers' trees are small
    return sum(int(name[4:]) ** depth for depth in range(1, K + 1)) if name.startswith("topk") else 0


def measure(temperature, prompts, draft, target, args):  # -> {(verifier, K): row}
    runs = {(name, K): {"stats": SpeculativeStats(), "speedups": []}
            for name in args.verifiers for K in args.K if tree_nodes(name, K) <= MAX_TREE_NODES}
    for prompt in prompts:
        for seed in range(args.seeds):
            reference, ar_seconds, _ = timed_run(sampling.autoregressive_sampling, prompt, draft, target,
                                                 args.n_tokens, None, seed, temperature)
            for (name, K), pooled in runs.items():
                out, seconds, stats = timed_run(args.verifiers[name], prompt, draft, target, args.n_tokens, K, seed,
                                                temperature)
                if temperature == 0 and not np.array_equal(out, reference):
                    raise SystemExit(f"{name}, K={K}: greedy tokens differ from autoregressive ones")
                pooled["speedups"].append(ar_seconds / seconds)
                for counter in ("loops", "target_calls", "draft_calls", "drafted", "accepted"):
                    setattr(pooled["stats"], counter, getattr(pooled["stats"], counter) + getattr(stats, counter))
                pooled["stats"].origins += stats.origins
    rows = {}
    for (name, K), pooled in runs.items():
        stats = pooled["stats"]
        rows[name, K] = {"temperature": temperature, "verifier": name, "K": K,
                         "tokens_per_target_call": stats.tokens_per_target_call,
                         "accepted_per_loop": stats.accepted_per_loop, "acceptance_rate": stats.acceptance_rate,
                         "draft_steps_per_token": stats.draft_calls / stats.generated,
                         "median_speedup": statistics.median(pooled["speedups"]),
                         "speedup_range": spread(pooled["speedups"])}
    return rows


def gains(rows):
    """Tokens per target call of block over token verification, and of N drafts (or a tree) over one."""
    out = {}
    for (name, K), row in rows.items():
        if name != "token" and ("token", K) in rows:
            ratio = row["tokens_per_target_call"] / rows["token", K]["tokens_per_target_call"]
            out[f"{name}_over_token_K{K}"] = round(ratio, 4)
    return out


def main(argv=None):
    args = parse_args(argv)
    prompts, record = spec_splits.bench_prompts(args, "test")
    _, target_hparams, target_params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
    target, draft = engine.fast_model(target_params, target_hparams), engine.fast_model(draft_params, draft_hparams)
    result = {"benchmark": "verifiers beyond Algorithm 2 on the bundled pair", "draft": args.draft,
              "target": args.target, "split": "test", "prompts": record, "n_prompts": args.n_prompts,
              "seeds": args.seeds, "prompt_tokens": args.prompt_tokens, "n_tokens": args.n_tokens, "rows": [],
              "gains": {}}
    for temperature in args.temperature:
        rows = measure(temperature, prompts, draft, target, args)
        for row in rows.values():
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        result["rows"] += list(rows.values())
        result["gains"][f"T{temperature:g}"] = gains(rows)
    result["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "numpy": np.__version__, "blas": blas_info(),
                         "load_average": os.getloadavg()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
