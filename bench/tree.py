"""What scoring a token tree of drafts costs, beside a chain of as many drafts and a decode step.

SpecInfer (Miao et al. 2023), Medusa and EAGLE score a tree of n drafted tokens in one target call:
GPT2Model.tree_logits feeds x's last token and the n nodes, at positions by depth, through one mask built from
the tree's ancestry per call (kvcache/tree.py). Speculative sampling's chain feeds the same n + 1 rows,
logits(x + chain, n_last=n + 1), so the bar is a tree of n nodes at most 1.1 times a chain of n. keep_tree_path,
which moves the accepted path's keys and values into place, is timed apart, for the deepest path.

GPT-2 124M-shaped random weights (gpt2.init_params), float32, batch 1, GPT2Model in the layout it measures and
chooses on this machine, after a --prefix-token prefix; a bushy tree, three chains from the root (n = 4: 2, 1, 1).
Each repeat times every n's decode step, chain, tree and keep, in an order rotated from repeat to repeat, after
one warm-up round; the times are medians over the repeats with their min and max, each ratio the median (min, max)
of the repeats' own ratios, so that a shared machine's drift hits both sides of a ratio alike.

    python bench/tree.py                  # n = 4, 8, 16, 124M shape, 15 repeats
    python bench/tree.py --repeats 3      # quick
    python bench/tree.py --small          # a tiny model: that it runs, not how fast (tests/test_bench.py)

Prints one JSON object as its last line.
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

import engine
import gpt2
from bench.machine import blas_info, cpu_model

HPARAMS_124M = dict(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12)
HPARAMS_SMALL = dict(n_vocab=97, n_ctx=128, n_embd=32, n_head=4, n_layer=2)
BAR = 1.1  # a tree of n nodes costs at most this many chains of n tokens


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,8,16", help="comma-separated numbers of tree nodes (and chain tokens)")
    parser.add_argument("--prefix", type=int, default=64, help="tokens cached before each call")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--small", action="store_true", help="a tiny model instead of the 124M shape")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(n) for n in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes takes comma-separated integers, got {args.sizes!r}")
    if min(args.sizes) < 1 or args.prefix < 1 or args.repeats < 1:
        parser.error("--sizes, --prefix and --repeats must be positive")
    return args


def three_chains(n):  # -> parents [n]: three chains from the root, the first the longest, node by node chain by chain
    parents = []
    for length in (n // 3 + (i < n % 3) for i in range(3)):
        parents += [-1] + [len(parents) + i for i in range(length - 1)] if length else []
    return parents


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(values, scale=1.0, digits=3):
    return {"median": round(scale * statistics.median(values), digits), "min": round(scale * min(values), digits),
            "max": round(scale * max(values), digits)}


def measure(model, x, n, repeats, rng):
    """The four calls for n, repeats times in rotated order after a warm-up: -> {name: [seconds per repeat]}."""
    chain, tokens = rng.integers(0, model.n_vocab, n), rng.integers(0, model.n_vocab, n)
    parents = three_chains(n)
    deepest = list(range(max(1, -(-n // 3))))  # the first chain, root down
    calls = {"decode": lambda: model.logits(np.append(x, chain[0]), n_last=1),  # one new token after x
             "chain": lambda: model.logits(np.concatenate([x, chain]), n_last=n + 1),  # x's last token and n more
             "tree": lambda: model.tree_logits(x, tokens, parents),  # the same n + 1 rows, as a tree
             "keep": lambda: model.keep_tree_path(deepest)}
    names = ["decode", "chain", "tree"]
    times = {name: [] for name in calls}
    for repeat in range(repeats + 1):  # the first round warms up and is not kept
        for name in names[repeat % 3:] + names[:repeat % 3]:
            seconds = timed(calls[name])
            if name == "tree":  # keep_tree_path must follow its tree_logits call
                keep_seconds = timed(calls["keep"])
                if repeat:
                    times["keep"].append(keep_seconds)
            if repeat:
                times[name].append(seconds)
    return parents, times


def row(n, parents, times):
    ratio = lambda a, b: [ta / tb for ta, tb in zip(times[a], times[b])]
    tree_and_keep = [tree + keep for tree, keep in zip(times["tree"], times["keep"])]
    return {"n": n, "parents": parents,
            **{f"{name}_ms": spread(times[name], 1e3) for name in ("decode", "chain", "tree", "keep")},
            "tree_over_chain": spread(ratio("tree", "chain")),
            "tree_and_keep_over_chain": spread([a / b for a, b in zip(tree_and_keep, times["chain"])]),
            "chain_over_decode": spread(ratio("chain", "decode")),
            "tree_over_decode": spread(ratio("tree", "decode"))}


def main(argv=None):
    args = parse_args(argv)
    load_at_start = os.getloadavg()
    hparams = HPARAMS_SMALL if args.small else HPARAMS_124M
    if args.prefix + max(args.sizes) > hparams["n_ctx"]:
        raise SystemExit(f"error: --prefix plus the largest size must be at most {hparams['n_ctx']}")
    rng = np.random.default_rng(args.seed)
    model = engine.fast_model(gpt2.init_params(hparams, rng), hparams)  # the layout measured and chosen here
    x = rng.integers(0, hparams["n_vocab"], args.prefix)
    model.logits(x)  # the prefix, cached once: every timed call feeds only x's last token and what is new
    rows = [row(n, *measure(model, x, n, args.repeats, rng)) for n in args.sizes]
    blas = blas_info()
    result = {
        "benchmark": f"token tree against chain, {'tiny' if args.small else 'GPT-2 124M'} shape, random weights, "
                     f"float32, batch 1, CPU",
        "hparams": hparams, "small": args.small, "prefix": args.prefix, "repeats": args.repeats,
        "layout_plan": model.plan.summary() if model.plan is not None else "plain",
        "by_n": rows,
        "statistic": f"median (min, max) over {args.repeats} repeats after one warm-up; decode: logits of one new "
                     f"token; chain: logits(x + chain, n_last=n + 1); tree: tree_logits of three chains from the "
                     f"root; keep: keep_tree_path of the first (deepest) chain; ratios of each repeat's own times",
        "bar": {f"tree_over_chain<={BAR}": all(r["tree_over_chain"]["median"] <= BAR for r in rows)},
        "machine": {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "numpy": np.__version__,
                    "numpy_threads": blas["threads"], "blas": blas, "python": platform.python_version(),
                    "load_average_1_5_15min_at_start": load_at_start,
                    "load_average_1_5_15min_at_end": os.getloadavg()},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
