"""main.py's batch mode: several sequences decoded at once (--batch_size B, or --prompt given several times).

    python main.py --batch_size 8 --temperature 1            # eight samples of the prompt, seeds 123 .. 130
    python main.py --prompt "def add(a, b):" --prompt "class Queue:" --json

Row i continues its prompt with the Generator of seed + i, so row 0 is exactly what the one-sequence run
with --seed prints, and at temperature > 0 copies of one prompt differ. The decoders are batched_sampling's
(NumPy) or sampling_jax's batched device loops (--backend jax): every model call feeds all unfinished rows
at once, and each row decodes exactly as it would alone. As for one sequence, each decoder runs once
untimed, then --repeats timed runs interleave; the report gives each decoder's tokens per second (all
rows' new tokens over the seconds), the speedup (the median of the paired ratios), and every row's text
and statistics. --json gives each decoder's `rows`: per row its `tokens` (prompt and new tokens, as the
decoders return them), `new_tokens`, their text and its counters.
"""

import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

from engine import sampling_batched
from jax_backend import backends

ROW_COUNTERS = ("loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "acceptance_rate",
                "tokens_per_target_call")


def run(names, prompts, rows, draft, target, encoder, N, K, settings, seed, repeats):
    """Decode the batch with each decoder named: -> ({name: its result dict}, {name: its BatchStats}).

    prompts: each row's prompt text; rows: their token ids; draft and target: backends.make_batched_model's.
    """
    decode = lambda name: decode_batch(name, rows, draft, target, encoder, N, K, settings, seed)
    for name in names:
        decode(name)  # untimed warm-up: first touches of memory and, with JAX, compiling
    timed = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:  # interleaved: a change in the machine's speed touches every decoder alike
            timed[name].append(decode(name))
    results, stats = {}, {}
    for name in names:
        runs = sorted(timed[name], key=lambda run: run[0]["seconds"])
        results[name], stats[name] = runs[(len(runs) - 1) // 2]  # the median run (all runs decode the same tokens)
        results[name]["seconds_per_run"] = [run[0]["seconds"] for run in timed[name]]
    return results, stats


def decode_batch(name, rows, draft, target, encoder, N, K, settings, seed):
    """One decoder over the batch, from empty caches and fresh Generators: -> (its result dict, its BatchStats)."""
    draft.reset(), target.reset()
    B = len(rows)
    stats = sampling_batched.BatchStats(B)
    rngs = [np.random.default_rng(seed + i) for i in range(B)]
    keywords = {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}
    decoders = backends.batched_decoders(target)
    with tqdm(total=B * N, desc=name, unit="tok", leave=False, disable=not sys.stderr.isatty()) as bar:
        start = time.perf_counter()
        if name == "autoregressive":
            out = decoders.autoregressive_sampling(rows, target, N, rngs=rngs, **keywords, stats=stats,
                                                   progress=bar.update)
        else:
            out = decoders.speculative_sampling(rows, draft, target, N, K, rngs=rngs, **keywords, stats=stats,
                                                progress=bar.update)
        seconds = time.perf_counter() - start
    result = {"seconds": seconds, "tokens_per_second": B * N / seconds, "target_calls": stats.target_calls,
              "rows": [row_result(prompt, row, row_stats, encoder, speculative=name != "autoregressive")
                       for prompt, row, row_stats in zip(rows, out, stats.rows)]}
    if name != "autoregressive":
        result.update(loops=stats.loops, draft_calls=stats.draft_calls, acceptance_rate=stats.acceptance_rate,
                      tokens_per_target_call=stats.tokens_per_target_call,
                      **{total: stats.total(total) for total in ("drafted", "accepted", "rejected")})
    return result, stats


def row_result(prompt, row, stats, encoder, speculative):
    """A row as --json gives it: `tokens`, its prompt and new tokens (as the decoders return them), `new_tokens`
    (as the one-sequence JSON's `tokens`), their text, and its own counters."""
    new_tokens = [int(token) for token in row[len(prompt):]]
    result = {"tokens": [int(token) for token in row], "new_tokens": new_tokens, "text": encoder.decode(new_tokens)}
    if not speculative:
        return {**result, "target_calls": stats.target_calls}
    counters = {name: getattr(stats, name) for name in ROW_COUNTERS}
    return {**result, **counters, **{origin: stats.origins.count(origin) for origin in ("corrected", "bonus")}}


def add_speedup(results):
    """The speculative decoder's speedup: the median over repeats of autoregressive / speculative seconds."""
    if "speculative" not in results:
        return None
    if "autoregressive" not in results:
        results["speculative"].update(speedup=None, speedup_range=None)
        return None
    ratios = [ar / sp for ar, sp in zip(results["autoregressive"]["seconds_per_run"],
                                        results["speculative"]["seconds_per_run"])]
    results["speculative"].update(speedup=statistics.median(ratios), speedup_range=[min(ratios), max(ratios)])
    return results["speculative"]["speedup"]


def print_report(result, stats, show_text):
    """The batch's report: each decoder's time and tokens per second, the speedup, then row by row.

    show_text(tokens, origins) -> the text to print (coloured by origin on a terminal, as main.py does).
    """
    B = result["batch_size"]
    print(f"a batch of {B} rows: draft {result['draft']} -> target {result['target']}, K {result['K']}, temperature "
          f"{result['temperature']}, top_k {result['top_k']}, top_p {result['top_p']}, seeds {result['seed']}.."
          f"{result['seed'] + B - 1}, {result['n_tokens']} new tokens per row; times: the median and range of "
          f"{result['repeats']} timed runs, after one untimed run of each decoder")
    for name in ("autoregressive", "speculative"):
        run = result[name]
        if run is None:
            continue
        line = (f"\n{name}: {run['seconds']:.3f} s ({min(run['seconds_per_run']):.3f}-"
                f"{max(run['seconds_per_run']):.3f}), {run['tokens_per_second']:.0f} tokens/s over all rows, "
                f"{run['target_calls']} batched target calls")
        if name == "speculative":
            alone = sum(row["target_calls"] for row in run["rows"])
            alpha = "n/a" if run["acceptance_rate"] is None else f"{run['acceptance_rate']:.3f}"
            line += f" (the rows alone: {alone}); alpha {alpha} over all rows"
        print(line)
    if result["speculative"] and result["speculative"]["speedup"] is not None:
        low, high = result["speculative"]["speedup_range"]
        print(f"speedup {result['speedup']:.2f}x measured (median of {result['repeats']} paired runs, "
              f"{low:.2f}-{high:.2f}x)")
    shown = "speculative" if result["speculative"] else "autoregressive"
    for i, (prompt, row) in enumerate(zip(result["prompt"], result[shown]["rows"])):
        header = f"\nrow {i} (seed {result['seed'] + i}), {shown}"
        if shown == "speculative":
            alpha = "n/a" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.3f}"
            header += (f": {row['drafted']} drafted, {row['accepted']} accepted, {row['rejected']} rejected, "
                       f"alpha {alpha}, {row['target_calls']} target calls")
            if result["autoregressive"]:
                same = row["tokens"] == result["autoregressive"]["rows"][i]["tokens"]
                header += "; the same tokens as autoregressive" if same else "; other tokens than autoregressive"
        print(header)
        print(prompt + show_text(row["new_tokens"], stats[shown].rows[i].origins))
