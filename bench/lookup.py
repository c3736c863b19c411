"""Prompt lookup where the text repeats itself: a function followed by its first lines again.

The setting prompt-lookup drafts are made for (Saxena's prompt-lookup-decoding, Hugging Face's
prompt_lookup_num_tokens): a file being rewritten, whose earlier part holds the code being written. Each
prompt is a function from NumPy's own sources (Python the bundled pair never saw), then a blank line, then
the function's first --restart_lines lines again. If the target copies from its context, as real language
models do, its greedy continuation reproduces the rest of the function, and prompt lookup proposes exactly
those tokens.

Beside every speedup stand the acceptance rate, the accepted lengths, and two measures of copying, so that a
continuation looping on itself is never sold as speed: `copied_fraction`, the share of the continuation's
4-grams found in the prompt (drafts.copied_fraction), and `function_reproduced`, the share of the rest of
the function's 4-grams that the continuation reproduces. With --n_tokens 0 each prompt is continued for as many
tokens as the rest of its function holds, so that all of it can be reproduced; each row then also gives the
median speedup over the prompts whose continuation reproduces at least half of the function.

    python bench/lookup.py [--n_prompts 8] [--n_tokens 96] [--K 2,4,8]
    python bench/lookup.py --n_prompts 32 --n_tokens 0 --K 4      # room to reproduce each function whole

Temperature 0: speculative tokens must equal the autoregressive ones. Prints one JSON object as its last line.
"""

import os


import argparse
import ast
import json
import statistics
import time
from pathlib import Path

import numpy as np

import engine
import sampling
import utils
from bench.machine import blas_info, cpu_model
from speedup import costs, drafts
from speedup.stats import SpeculativeStats


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--draft", default="teach-draft", help="a model draft measured beside prompt lookup ('' to skip)")
    parser.add_argument("--n_prompts", type=int, default=8)
    parser.add_argument("--n_tokens", type=int, default=96,
                        help="greedy tokens per prompt; 0: as many as the rest of each function holds")
    parser.add_argument("--restart_lines", type=int, default=2, help="the function's first lines, repeated")
    parser.add_argument("--K", default="2,4,8")
    args = parser.parse_args(argv)
    if args.n_tokens < 0:
        parser.error(f"--n_tokens must be 0 (the rest of each function) or more, got {args.n_tokens}")
    args.K = [int(K) for K in args.K.split(",")]
    return args


def numpy_functions(encoder, n, max_tokens):
    """n functions from NumPy's own modules (tests left out), spread over them, each 8 to 40 lines long and at
    most max_tokens tokens: -> [source text]."""
    root = Path(np.__file__).parent
    paths = sorted(p for p in root.rglob("*.py") if not {"tests", "testing"} & set(p.relative_to(root).parts[:-1]))
    found = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and 8 <= node.end_lineno - node.lineno + 1 <= 40:
                source = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"
                if len(encoder.encode(source)) <= max_tokens:
                    found.append(source)
    return [found[i * len(found) // n] for i in range(min(n, len(found)))]


def repeat_prompt(encoder, function, restart_lines):
    """(prompt, rest): the tokens of the function, a blank line and the function again, cut at the first token
    boundary at or after its first restart_lines lines. Cutting the text there and encoding the pieces apart
    would end the prompt on a lone newline, which the vocabulary otherwise joins to the next line's indentation
    (GPT-2's pre-tokenizer puts a line break and the spaces after it in one piece): a token sequence the target
    never saw in training, after which it starts a new line at column 0 instead of copying."""
    restart = "".join(function.splitlines(keepends=True)[:restart_lines])
    restart_end = len((function + "\n" + restart).encode("utf-8"))  # in bytes, as the tokens hold them
    tokens = encoder.encode(function + "\n" + function)
    ends = np.cumsum([len(encoder.id_to_bytes[token]) for token in tokens])  # where each token's bytes end
    cut = int(np.searchsorted(ends, restart_end)) + 1
    return tokens[:cut], tokens[cut:]


def grams(tokens, n=4):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def main(argv=None):
    args = parse_args(argv)
    encoder, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(params, hparams)
    candidates = {"prompt-lookup": drafts.PromptLookup(hparams["n_vocab"])}
    if args.draft:
        _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)
        candidates[args.draft] = engine.fast_model(draft_params, draft_hparams)
    max_function_tokens = (hparams["n_ctx"] - args.n_tokens) // 2 - 8
    functions = numpy_functions(encoder, args.n_prompts, max_function_tokens)
    prompts, rests = zip(*(repeat_prompt(encoder, function, args.restart_lines) for function in functions))
    n_new_tokens = [args.n_tokens or len(rest) for rest in rests]  # --n_tokens 0: room for the whole rest

    result = {"target": args.target, "n_prompts": len(prompts), "n_tokens": args.n_tokens,
              "restart_lines": args.restart_lines, "numpy_version": np.__version__, "by_draft": {}}
    for name, draft in candidates.items():
        rows = []
        for K in args.K:
            per_prompt = []
            for prompt, rest, n_new in zip(prompts, rests, n_new_tokens):
                timed = {}
                for decoder in ("autoregressive", "speculative"):
                    draft.reset()
                    target.reset()
                    stats = SpeculativeStats()
                    start = time.perf_counter()
                    if decoder == "autoregressive":
                        out = sampling.autoregressive_sampling(prompt, target, n_new, temperature=0, stats=stats)
                    else:
                        out = sampling.speculative_sampling(prompt, draft, target, n_new, K, temperature=0, stats=stats)
                    timed[decoder] = (out, time.perf_counter() - start, stats)
                (reference, ar_seconds, _), (out, seconds, stats) = timed["autoregressive"], timed["speculative"]
                if not np.array_equal(out, reference):
                    raise SystemExit(f"{name}, K={K}: greedy speculative tokens differ from autoregressive ones")
                continuation = out[len(prompt):].tolist()
                rest_grams = set(grams(rest))
                per_prompt.append({"speedup": ar_seconds / seconds, "acceptance_rate": stats.acceptance_rate,
                                   "accepted_lengths": costs.accepted_lengths(stats.origins),
                                   "copied_fraction": drafts.copied_fraction(prompt, continuation),
                                   "function_reproduced": len(rest_grams & set(grams(continuation))) / len(rest_grams)})
            speedups = [row["speedup"] for row in per_prompt]
            alphas = [row["acceptance_rate"] for row in per_prompt if row["acceptance_rate"] is not None]
            where_copied = [row["speedup"] for row in per_prompt if row["function_reproduced"] >= 0.5]
            row = {"K": K, "median_speedup": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
                   "median_acceptance_rate": statistics.median(alphas) if alphas else None,
                   "accepted_length_counts": np.bincount([n for r in per_prompt for n in r["accepted_lengths"]]
                                                         or [0]).tolist(),
                   "median_copied_fraction": statistics.median(r["copied_fraction"] for r in per_prompt),
                   "median_function_reproduced": statistics.median(r["function_reproduced"] for r in per_prompt),
                   "prompts_reproducing_half": len(where_copied),
                   "median_speedup_where_reproducing_half": statistics.median(where_copied) if where_copied else None}
            rows.append(row)
            print(json.dumps({"draft": name, **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}}),
                  flush=True)
        result["by_draft"][name] = rows
    target.reset()
    sample = sampling.autoregressive_sampling(prompts[0], target, n_new_tokens[0], temperature=0)
    result["sample"] = {"prompt": encoder.decode(prompts[0]), "continuation": encoder.decode(sample[len(prompts[0]):].tolist())}
    result["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "numpy": np.__version__, "blas": blas_info(),
                         "load_average": os.getloadavg()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
