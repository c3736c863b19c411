"""main.py's measurements: the decoders run on one prompt, or on a batch of rows, and compared.

Every decoder starts from the same prompt, the same seed and empty caches. `compare` runs each decoder
once untimed (to warm the models' memory and caches, and to let JAX compile), then --repeats timed runs of
all decoders interleave, so a drift in the machine's speed touches them alike; a decoder's result is its
median run, with every run's seconds, and the speedup is the median of the paired ratios. One sequence
decodes with sampling's decoders (or sampling_jax's device loops); a batch (--batch_size B, or --prompt
given several times) with sampling_batched's or sampling_jax's batched loops, row i with the Generator of
seed + i, so row 0 is exactly the one-sequence run with --seed. `compare_decoders` is main.py's one entry for
both. On a terminal, tqdm bars on stderr count the runs and each run's tokens.

--json's vocabulary, the same for one sequence and for each row of a batch: `tokens` the prompt and the
new tokens (as the decoders return them), `new_tokens` the new ones only, `text` their text.
"""

import functools
import os
import resource
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

import sampling
from cli.flags import DECODERS
from batching import sampling_batched
from engine.threads import THREADS
from cli import backends
from speedup import costs, drafts
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling
from verifiers.multi_draft import multi_draft_speculative_sampling
from verifiers.tree import tree_speculative_sampling

AUTO_K_MAX = 12  # --K auto considers K = 0 .. 12
# OpenBLAS's x86 kernels for AVX-512 (its OPENBLAS_CORETYPE names)
AVX512_CORETYPES = ("skylakex", "cooperlake", "sapphirerapids")
ROW_COUNTERS = ("loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "acceptance_rate",
                "tokens_per_target_call")


def compare_decoders(run, rows, draft, target, encoder):
    """The run's decoders on its rows (token ids), compared: -> (the result dict that --json prints, each decoder's
    stats). One row decodes as one sequence; several as a batch, with batched models."""
    explain_backend(run.flags["backend"], run.flags["dtype"])
    explain_blas_kernels(run.flags["backend"])
    explain_verifier(run.flags["verifier"], run.flags["backend"])
    if run.batch:
        return compare_batch(run, rows, draft, target, encoder)
    return compare_one_sequence(run, rows[0], draft, target, encoder)


def compare(names, decode, repeats):
    """decode(name) -> (result, stats) for each decoder named: one untimed run, then `repeats` interleaved timed
    runs. -> ({name: the median run's result with every run's seconds}, {name: its stats}).

    Every run decodes the same tokens (same seed, empty caches); only the times differ. The median run
    (the lower of the two middle ones for an even count) gives the seconds and the draft and target times.
    """
    timed = {name: [] for name in names}
    with progress_bar("runs", len(names) * (1 + repeats), unit="run", position=0) as bar:
        for name in names:
            decode(name)  # untimed warm-up: the first run pays for touching the weights and, with JAX, for compiling
            bar.update()
        for _ in range(repeats):
            for name in names:  # interleaved: a change in the machine's speed touches every decoder alike
                timed[name].append(decode(name))
                bar.update()
    results, stats = {}, {}
    for name in names:
        result, stats[name] = sorted(timed[name], key=lambda run: run[0]["seconds"])[(len(timed[name]) - 1) // 2]
        results[name] = {**result, "seconds_per_run": [run[0]["seconds"] for run in timed[name]]}
    return results, stats


def add_speedups(result):
    """Each faster decoder's speedup: the median over repeats of autoregressive seconds / its seconds.

    The runs of one repeat ran back to back, so each ratio compares the decoders at the same moment.
    """
    autoregressive = result["autoregressive"]
    for name in ("speculative", "assisted"):
        if result.get(name) is None:
            continue
        if autoregressive is None:
            result[name].update(speedup=None, speedup_range=None)
            continue
        ratios = [ar_seconds / seconds for ar_seconds, seconds in
                  zip(autoregressive["seconds_per_run"], result[name]["seconds_per_run"])]
        result[name].update(speedup=statistics.median(ratios), speedup_range=[min(ratios), max(ratios)])
    result["speedup"] = result["speculative"]["speedup"] if result["speculative"] else None


def progress_bar(name, total, unit="tok", position=1):
    """A tqdm bar on stderr on a terminal; elsewhere a disabled one, which ignores updates. position 1 (a decoder's
    tokens) sits below position 0 (compare's runs)."""
    return tqdm(total=total, desc=name, unit=unit, leave=False, position=position, disable=not sys.stderr.isatty())


def token_lists(prompt, x, encoder):
    """A decoder's output x (the prompt, then the new tokens) in --json's words: tokens, new_tokens, text."""
    new_tokens = [int(token) for token in x[len(prompt):]]
    return {"tokens": [int(token) for token in x], "new_tokens": new_tokens, "text": encoder.decode(new_tokens)}


# ---- one sequence ------------------------------------------------------------------------------------


def compare_one_sequence(run, prompt_ids, draft, target, encoder):
    """The decoders on one prompt: -> (the result dict, {decoder: its stats or None}), costs and speedups added."""
    flags, K = run.flags, run.flags["K"]
    # this machine's costs, before the runs: the report's explanation, and --K auto's choices (JAX's device
    # loops time no single step, so they are measured there only for --K auto, which runs on the host)
    measured = (costs.measure_costs(target, draft, prompt_ids, run.settings)
                if flags["backend"] == "numpy" or K == "auto" else None)
    speculative_draft = costs.AutoK(draft, measured) if K == "auto" else draft
    speculative = verifier_decoder(flags["verifier"], flags["n_drafts"], flags["replacement"], flags["tree_drafts"])
    results, stats = compare(run.decoders, lambda name: run_decoder(
        name, prompt_ids, draft, speculative_draft, target, encoder, flags["n_tokens"],
        AUTO_K_MAX if K == "auto" else K, run.settings, flags["seed"], speculative), flags["repeats"])
    result = {"prompt": run.prompts[0], **flags, "costs": describe_costs(measured),
              **{name: results.get(name) for name in DECODERS}}
    stats = {name: stats.get(name) for name in DECODERS}  # the report follows this order
    add_run_costs(result, stats, measured)
    if flags["tree_drafts"] == "dynamic" and result["speculative"]:
        result["speculative"]["tree_nodes_per_loop"] = mean_tree_nodes(result["speculative"])
    add_speedups(result)
    result["engine"] = describe_engine(target)  # threads, the target's layouts, peak memory
    return result, stats


def mean_tree_nodes(run):  # -> the nodes of a tree the drafter grew, on average over its loops; None: it grew none
    """A dynamic tree holds what K, --n_drafts and the context left allow, often fewer nodes than --tree_nodes. Its
    nodes are what the run counts as drafted; a loop whose tree was empty is a plain target step."""
    trees = run["loops"] - run["plain_steps"]
    return run["drafted"] / trees if trees else None


def verifier_decoder(verifier, n_drafts=1, replacement=False, tree_drafts=None):
    """--verifier's decoder, with speculative_sampling's signature (rng passed by keyword: multi and tree take
    n_drafts before it); None for token verification, whose decoder the backend picks (sampling, or
    sampling_jax's device loop). The others are the host's loops in verifiers/, on either backend's models."""
    if verifier == "token":
        return None
    if verifier == "block":
        return block_speculative_sampling
    if verifier == "multi":
        return functools.partial(multi_draft_speculative_sampling, n_drafts=n_drafts, replacement=replacement)
    return functools.partial(tree_speculative_sampling, n_drafts=n_drafts, replacement=replacement, drafts=tree_drafts)


def run_decoder(name, prompt_ids, draft, speculative_draft, target, encoder, N, K, settings, seed, verifier=None):
    """One decoder from empty caches and a fresh Generator: -> (its result dict, its stats).

    speculative_draft is what speculative sampling drafts with (the draft, or costs.AutoK around it for --K
    auto); the assisted decoder adapts its own K and drafts with the draft itself. verifier: the speculative
    decoder (verifier_decoder's), or None for Algorithm 2.
    """
    for model in (draft, speculative_draft, target):
        model.reset()
    stats = SpeculativeStats()
    rng = np.random.default_rng(seed)
    keywords = {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}
    # sampling, or with --backend jax and two JAX models sampling_jax: whole loops on the device
    decoders = backends.decoders(target, speculative_draft)
    with progress_bar(name, N) as bar:
        start = time.perf_counter()
        if name == "autoregressive":
            x = decoders.autoregressive_sampling(prompt_ids, target, N, rng, **keywords, stats=stats,
                                                 progress=bar.update)
        elif name == "speculative":
            speculative = verifier or decoders.speculative_sampling
            x = speculative(prompt_ids, speculative_draft, target, N, K, rng=rng, **keywords, stats=stats,
                            progress=bar.update)
        else:
            x = sampling.greedy_assisted_generation(prompt_ids, draft, target, N, stats=stats, progress=bar.update)
        seconds = time.perf_counter() - start
    result = {**token_lists(prompt_ids, x, encoder), "seconds": seconds, "target_calls": stats.target_calls,
              "tokens_per_target_call": stats.tokens_per_target_call}
    if name != "autoregressive":
        result.update({origin: stats.origins.count(origin) for origin in ("corrected", "bonus")},
                      plain_steps=stats.origins.count("target"), draft_steps_per_token=stats.draft_calls / N,
                      copied_fraction=drafts.copied_fraction(prompt_ids, result["new_tokens"]))
        if name == "speculative" and isinstance(speculative_draft, costs.AutoK):
            result["K_chosen"] = list(speculative_draft.chosen)
    return result, stats


def describe_engine(target=None):
    """What ran the products: the threads (engine/threads.py), the target's layouts where the NumPy engine measured
    them (engine/layouts.py), and the process's peak resident memory so far."""
    plan = getattr(target, "plan", None)
    return {"threads": THREADS.count, "target_layouts": plan.summary() if hasattr(plan, "summary") else None,
            "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: kilobytes


def describe_costs(measured):
    """costs.py's measurement for the JSON, with the lowest alpha at which some K pays here (None: none can)."""
    if measured is None:
        return None
    alpha, K = measured.lowest_break_even(AUTO_K_MAX)
    return {**measured.as_dict(), "break_even_alpha": alpha, "break_even_K": K}


def add_run_costs(result, stats, measured):
    """The speculative decoders' costs in decode steps, and the formula's expectations from them.

    A decode step is the autoregressive run's own when it ran (the same process, the same minutes), else
    costs.py's measurement; the draft step and the verification are the decoder's own run's.
    """
    autoregressive = stats["autoregressive"]
    decode_step = (autoregressive.verify_seconds if autoregressive and autoregressive.verify_seconds
                   else measured.decode_step_seconds if measured else None)
    for name in ("speculative", "assisted"):
        if stats[name] is None:
            continue
        stats[name].decode_step_seconds = decode_step
        result[name].update(stats[name].as_dict())
        result[name].pop("generated")
        if name == "speculative" and result["verifier"] != "token":  # the formula models Algorithm 2's loop
            result[name].update(expected_speedup=None, expected_speedup_one_step=None)
        if result["autoregressive"] is not None:
            result[name]["same_text_as_autoregressive"] = (result[name]["new_tokens"]
                                                           == result["autoregressive"]["new_tokens"])


# ---- a batch of rows ---------------------------------------------------------------------------------


def compare_batch(run, rows, draft, target, encoder):
    """B rows, one per prompt, decoded at once with each decoder (batched models) and compared.
    -> (the result dict, {decoder: its BatchStats})."""
    flags = run.flags
    results, stats = compare(run.decoders, lambda name: decode_batch(
        name, rows, draft, target, encoder, flags["n_tokens"], flags["K"], run.settings, flags["seed"]),
        flags["repeats"])
    result = {"prompt": run.prompts, "batch_size": len(rows), **flags,
              **{name: results.get(name) for name in ("autoregressive", "speculative")}}
    add_speedups(result)
    result["engine"] = describe_engine()
    return result, stats


def decode_batch(name, rows, draft, target, encoder, N, K, settings, seed):
    """One decoder over the batch, from empty caches and fresh Generators: -> (its result dict, its BatchStats)."""
    draft.reset(), target.reset()
    B = len(rows)
    stats = sampling_batched.BatchStats(B)
    rngs = [np.random.default_rng(seed + i) for i in range(B)]
    keywords = {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}
    decoders = backends.batched_decoders(target)
    with progress_bar(name, B * N) as bar:
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
    """A row as --json gives it: tokens, new_tokens and text (as for one sequence), and its own counters."""
    result = token_lists(prompt, row, encoder)
    if not speculative:
        return {**result, "target_calls": stats.target_calls}
    counters = {name: getattr(stats, name) for name in ROW_COUNTERS}
    return {**result, **counters, **{origin: stats.origins.count(origin) for origin in ("corrected", "bonus")}}


# ---- notes on stderr, before a slow surprise ---------------------------------------------------------


def explain_backend(backend, dtype):
    """One line on stderr for each slow surprise of the JAX backend, before it happens."""
    if backend != "jax":
        return
    import jax  # backends.make_model has imported it already

    print("note: --backend jax compiles each decoder during its untimed first run: this can take several seconds",
          file=sys.stderr)
    if dtype == "bfloat16" and jax.default_backend() == "cpu":
        print("note: bfloat16 is emulated on CPUs: slower than float32, and its rounding can change the text "
              "(and so the speedup) from float32's", file=sys.stderr)


def explain_verifier(verifier, backend):
    """One line on stderr where --verifier runs the host's loop on the JAX models."""
    if backend == "jax" and verifier != "token":
        print(f"note: --verifier {verifier} runs its loop on the host (verifiers/), calling the JAX models step by "
              "step: only token verification has a device loop", file=sys.stderr)


def explain_blas_kernels(backend, cpuinfo_path="/proc/cpuinfo"):
    """One line on stderr where the environment pins OpenBLAS to kernels older than the CPU (docs/SPEED.md)."""
    coretype = os.environ.get("OPENBLAS_CORETYPE", "")
    if backend != "numpy" or not coretype or coretype.lower() in AVX512_CORETYPES:
        return
    try:
        with open(cpuinfo_path) as f:
            has_avx512 = "avx512f" in next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return
    if has_avx512:
        print(f"note: OPENBLAS_CORETYPE={coretype} makes NumPy's OpenBLAS run pre-AVX-512 kernels on this AVX-512 CPU; "
              "with them scoring K+1 tokens can cost 2-3 decode steps, and speculative decoding gains little. "
              "`env -u OPENBLAS_CORETYPE python main.py` lets OpenBLAS choose", file=sys.stderr)
