r"""Decode one prompt autoregressively and speculatively, and compare.

    python main.py --K 4 --temperature 0           # the bundled teaching pair (models/teach-*)
    python main.py --draft_model_size 124M --target_model_size 1558M \
        --prompt "Alan Turing theorized that computers would one day become"   # the paper's GPT-2 pair
    python main.py --prompt "def fibonacci(n):" --n_tokens_to_generate 64 --decoder speculative,assisted
    python main.py --K auto      # K chosen every loop from this machine's measured costs and the alpha so far
    python main.py --draft_model_size prompt-lookup   # drafts copied from the text so far, no second model
    python main.py --json        # one JSON object as the last line of stdout
    python main.py --batch_size 8 --temperature 1     # eight sequences at once (runs.py)
    python main.py --prompt "def add(a, b):" --prompt "class Queue:"   # a batch of two prompts

Every decoder starts from the same prompt, the same seed and empty caches. Each decoder runs once
untimed (to warm the models' memory and caches, and to let JAX compile), then --repeats timed runs of
all decoders interleave, so a drift in the machine's speed touches them alike; times are medians and
the speedup is the median of the paired ratios, printed with their ranges. The speculative text is
coloured by where each token came from (on a terminal, unless NO_COLOR is set): a draft token the
target accepted, the target's correction after a rejection, or the bonus token the target adds when it
accepts all K. Before the runs, costs.py measures what a target decode step, a draft step and the
target's scoring of 1 to 16 tokens cost on this machine (about a second); the report sets the measured
speedup beside what the formula expects from them, and says from which alpha speculation can pay here.
With --batch_size B, or --prompt given several times, the decoders run over a batch (runs.py).
Bad input gets `error: ...` on stderr and exit status 2, before any model is loaded where possible.
`python main.py --help` lists the flags.
"""

import os

# One BLAS thread unless the caller chose otherwise: on the 2-core machines we measured, a second OpenBLAS
# thread made a GPT-2 124M decode step 22% faster when idle, 1.7x slower with one other busy process (README).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import inspect
import json as jsonlib
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

import sampling
import utils
from cli import runs
from cli.flags import FLAG_HELP, fire_command, parse_arguments
from cli.report import coloured_text, print_report, wants_colour
from encoder import get_encoder
from jax_backend import backends
from speedup import costs, drafts

DECODERS = ("autoregressive", "speculative", "assisted")
AUTO_K_MAX = 12  # --K auto considers K = 0 .. 12
# OpenBLAS's x86 kernels for AVX-512 (its OPENBLAS_CORETYPE names)
AVX512_CORETYPES = ("skylakex", "cooperlake", "sapphirerapids")
# The bundled pair's first run: code it writes with accepted stretches and corrections (alpha about 0.7 at
# K=4, temperature 0), where prompts into its loops accept nearly everything and teach nothing
DEFAULT_PROMPT = 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n'
BUNDLED_MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def main(prompt=DEFAULT_PROMPT, n_tokens_to_generate=64, draft_model_size="teach-draft",
         target_model_size="teach-target", models_dir=None, K=4, temperature=0.0, top_k=0, top_p=1.0, seed=123,
         decoder="autoregressive,speculative", repeats=5, json=False, color=None, backend="numpy",
         dtype="float32", batch_size=None):
    """Run the chosen decoders on one prompt and print texts, times, speedup and statistics.

    decoder: comma-separated names among autoregressive, speculative and assisted (greedy assisted
    generation, temperature 0 only; it adapts its own K from 5, as Hugging Face does, and ignores K).
    models_dir: None is the bundled models/ beside this file. repeats: timed runs of each decoder.
    color: None colours on a terminal unless the NO_COLOR environment variable is set; True or False
    forces it. backend: numpy or jax; dtype: float32, or bfloat16 (JAX only) for the models' compute.
    prompt: a text, or a list of texts for a batch; batch_size: None (one row per prompt) or B, the number
    of rows (B copies of a single prompt). A batch runs in runs.py.
    Returns the result dict that --json prints.
    """
    decoders = parse_decoders(decoder)
    check_flags(n_tokens_to_generate, K, seed, repeats, decoders, temperature, backend, dtype)
    settings = sampling.SamplingSettings(temperature, top_k, top_p)  # raises on a bad temperature, top_k or top_p
    prompts = list(prompt) if isinstance(prompt, (list, tuple)) else [prompt]
    for text in prompts:
        check_strings(None, prompt=text)
    check_strings(draft_model_size=draft_model_size, target_model_size=target_model_size, models_dir=models_dir)
    B = batch_rows(batch_size, prompts, decoders, K, draft_model_size)
    models_dir = BUNDLED_MODELS_DIR if models_dir is None else models_dir
    lookup = draft_model_size == drafts.PROMPT_LOOKUP
    for name in ([] if lookup else [draft_model_size]) + [target_model_size]:
        for text in set(prompts):
            check_context_early(text, n_tokens_to_generate, name, models_dir)
    prompt = prompts[0]

    if not lookup:
        draft_encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(draft_model_size, models_dir)
    encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params(target_model_size, models_dir)
    all_hparams = [target_hparams]
    if not lookup:
        check_same_vocabulary(draft_encoder, encoder, draft_hparams, target_hparams)
        all_hparams.append(draft_hparams)
    prompt_ids = encode_prompt(encoder, prompt)
    check_context(len(prompt_ids), n_tokens_to_generate, *all_hparams)
    if B > 1:
        return run_batch(prompts * (B // len(prompts)), (draft_params, draft_hparams), (target_params, target_hparams),
                         encoder, decoders, settings, n_tokens_to_generate, backend, dtype, json, color,
                         {"draft": draft_model_size, "target": target_model_size, "K": K, "temperature": temperature,
                          "top_k": top_k, "top_p": top_p, "seed": seed, "n_tokens": n_tokens_to_generate,
                          "repeats": repeats, "backend": backend, "dtype": dtype})
    target = backends.make_model(target_params, target_hparams, backend, dtype)
    draft = (drafts.PromptLookup(target_hparams["n_vocab"]) if lookup
             else backends.make_model(draft_params, draft_hparams, backend, dtype))
    explain_backend(backend, dtype)
    explain_blas_kernels(backend)

    # this machine's costs, before the runs: the report's explanation, and --K auto's choices (JAX's device
    # loops time no single step, so they are measured there only for --K auto, which runs on the host)
    measured = costs.measure_costs(target, draft, prompt_ids, settings) if backend == "numpy" or K == "auto" else None
    speculative_draft = costs.AutoK(draft, measured) if K == "auto" else draft
    run = lambda name: run_decoder(name, prompt_ids, draft, speculative_draft, target, encoder, n_tokens_to_generate,
                                   AUTO_K_MAX if K == "auto" else K, settings, seed)
    for name in decoders:
        run(name)  # untimed warm-up: the first run pays for touching the weights and, with JAX, for compiling
    timed_runs = {name: [] for name in decoders}
    for _ in range(repeats):
        for name in decoders:  # interleaved: a change in the machine's speed touches every decoder alike
            timed_runs[name].append(run(name))

    result = {"prompt": prompt, "draft": draft_model_size, "target": target_model_size, "K": K,
              "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
              "n_tokens": n_tokens_to_generate, "repeats": repeats, "backend": backend, "dtype": dtype,
              "costs": describe_costs(measured)}
    stats = {}
    for name in DECODERS:
        result[name], stats[name] = summarise_runs(timed_runs[name]) if name in decoders else (None, None)
    add_run_costs(result, stats, measured)
    add_speedups(result)

    if json:
        print(jsonlib.dumps(result))
    else:
        print_report(result, stats, encoder.decode, use_colour=wants_colour(color), measured=measured)
    return result


def run_batch(prompts, draft, target, encoder, decoders, settings, N, backend, dtype, json, color, flags):
    """The batch mode of main: B rows, one per prompt, decoded at once (runs.py). -> the result dict.

    draft, target: (params, hparams) each; flags: what the result repeats of the command line.
    """
    rows = [encode_prompt(encoder, text) for text in prompts]
    check_context(max(len(row) for row in rows), N, draft[1], target[1])
    draft_model, target_model = (backends.make_batched_model(params, hparams, len(rows), backend, dtype)
                                 for params, hparams in (draft, target))
    explain_backend(backend, dtype)
    explain_blas_kernels(backend)
    results, stats = runs.run(decoders, prompts, rows, draft_model, target_model, encoder, N, flags["K"], settings,
                                 flags["seed"], flags["repeats"])
    result = {"prompt": prompts, "batch_size": len(rows), **flags,
              **{name: results.get(name) for name in ("autoregressive", "speculative")}}
    result["speedup"] = runs.add_speedup(results)
    if json:
        print(jsonlib.dumps(result))
    else:
        colour = wants_colour(color)
        runs.print_report(result, stats, lambda tokens, origins: coloured_text(tokens, origins, encoder.decode)
                                if colour else encoder.decode(tokens))
    return result


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


def explain_blas_kernels(backend, cpuinfo_path="/proc/cpuinfo"):
    """One line on stderr where the environment pins OpenBLAS to kernels older than the CPU (README, Speed)."""
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


# ---- checks, before anything is loaded -------------------------------------------------------


def parse_decoders(decoder):
    names = decoder.split(",") if isinstance(decoder, str) else list(decoder)  # a list from Python callers
    names = [str(name).strip() for name in names if str(name).strip()]
    unknown = [name for name in names if name not in DECODERS]
    if unknown or not names:
        raise ValueError(f"unknown decoder {', '.join(unknown) or repr(decoder)}: choose from {', '.join(DECODERS)}")
    return names


def check_flags(n_tokens, K, seed, repeats, decoders, temperature, backend, dtype):
    if backend not in backends.BACKENDS:
        raise ValueError(f"unknown --backend {backend!r}: choose one of {', '.join(backends.BACKENDS)}")
    if dtype not in ("float32", "bfloat16") or (dtype == "bfloat16" and backend != "jax"):
        raise ValueError(f"--dtype must be float32, or bfloat16 with --backend jax; got {dtype!r}")
    if not sampling.is_integer(n_tokens) or n_tokens < 1:
        raise ValueError(f"--n_tokens_to_generate must be an integer >= 1, got {n_tokens!r}")
    if K != "auto" and (not sampling.is_integer(K) or K < 1):
        raise ValueError(f"--K must be an integer >= 1, or auto, got {K!r}")
    if not sampling.is_integer(seed) or seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    if not sampling.is_integer(repeats) or repeats < 1:
        raise ValueError(f"--repeats must be an integer >= 1, got {repeats!r}")
    if "assisted" in decoders and sampling.is_real(temperature) and temperature != 0:
        raise ValueError(f"the assisted decoder is greedy: it needs --temperature 0, got {temperature!r}")


def batch_rows(batch_size, prompts, decoders, K, draft_model_size):
    """How many rows to decode: --batch_size, or one per --prompt; a batch's flags checked before any loading."""
    if batch_size is not None and (not sampling.is_integer(batch_size) or batch_size < 1):
        raise ValueError(f"--batch_size must be an integer >= 1, got {batch_size!r}")
    if not prompts:
        raise ValueError("--prompt must be a text (or several), got an empty list")
    B = len(prompts) if batch_size is None else batch_size
    if len(prompts) > 1 and B != len(prompts):
        raise ValueError(f"--batch_size {batch_size} disagrees with the {len(prompts)} prompts given: give one prompt "
                         "for B copies of it, or one --prompt per row")
    if B > 1:
        if "assisted" in decoders:
            raise ValueError("the assisted decoder has no batched form: a batch decodes with autoregressive and "
                             "speculative (--decoder autoregressive,speculative)")
        if K == "auto" or draft_model_size == drafts.PROMPT_LOOKUP:
            raise ValueError("a batch drafts with a draft model and a fixed --K (not --K auto or prompt-lookup)")
    return B


def check_strings(models_dir, **texts):
    """The text flags must be text (a flag given no value reaches main as True); models_dir may be a path."""
    for name, value in texts.items():
        if not isinstance(value, str):
            raise ValueError(f"--{name} must be text, got {value!r}")
    if models_dir is not None and (not isinstance(models_dir, (str, os.PathLike)) or os.fspath(models_dir) == ""):
        raise ValueError(f"--models_dir must be a folder's path, got {models_dir!r}")


def check_same_vocabulary(encoder, target_encoder, draft_hparams, target_hparams):
    if draft_hparams["n_vocab"] != target_hparams["n_vocab"] or encoder.encoder != target_encoder.encoder:
        raise ValueError(f"the draft and the target have different vocabularies ({draft_hparams['n_vocab']} and "
                         f"{target_hparams['n_vocab']} tokens): speculative sampling compares their distributions "
                         "token by token")


def encode_prompt(encoder, prompt):
    """The prompt's token ids; an empty prompt starts from <|endoftext|>, as GPT-2 does."""
    if prompt:
        return encoder.encode(prompt)
    if encoder.eot_token is None:
        raise ValueError("an empty prompt starts from <|endoftext|>, which this vocabulary lacks")
    return [encoder.eot_token]


def check_context(n_prompt, n_tokens, *all_hparams):  # the final sequence must fit in every model's context
    n_ctx = min(hparams["n_ctx"] for hparams in all_hparams)
    if n_prompt + n_tokens > n_ctx:
        raise ValueError(f"the prompt's {n_prompt} tokens + {n_tokens} new ones exceed the models' context of "
                         f"{n_ctx} tokens: shorten the prompt or --n_tokens_to_generate")


def check_context_early(prompt, n_tokens, model_size, models_dir):
    """check_context from a model folder's small files, before its checkpoint is loaded or downloaded."""
    model_dir = utils.model_directory(model_size, models_dir)  # raises on a bad name
    paths = [os.path.join(model_dir, name) for name in ("hparams.json", "encoder.json", "vocab.bpe")]
    if all(os.path.isfile(path) for path in paths):  # otherwise the check after loading will do
        encoder = get_encoder(paths[1], paths[2])
        check_context(len(encode_prompt(encoder, prompt)), n_tokens, utils.load_hparams(paths[0]))


# ---- decoding ----------------------------------------------------------------------------------


def run_decoder(name, prompt_ids, draft, speculative_draft, target, encoder, N, K, settings, seed):
    """One decoder from empty caches and a fresh Generator: -> (its result dict, its stats).

    speculative_draft is what speculative sampling drafts with (the draft, or costs.AutoK around it for --K
    auto); the assisted decoder adapts its own K and drafts with the draft itself.
    """
    for model in (draft, speculative_draft, target):
        model.reset()
    stats = sampling.SpeculativeStats()
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
            x = decoders.speculative_sampling(prompt_ids, speculative_draft, target, N, K, rng, **keywords,
                                              stats=stats, progress=bar.update)
        else:
            x = sampling.greedy_assisted_generation(prompt_ids, draft, target, N, stats=stats, progress=bar.update)
        seconds = time.perf_counter() - start
    tokens = [int(token) for token in x[len(prompt_ids):]]
    result = {"tokens": tokens, "text": encoder.decode(tokens), "seconds": seconds, "target_calls": stats.target_calls}
    if name != "autoregressive":
        result.update({origin: stats.origins.count(origin) for origin in ("corrected", "bonus")},
                      plain_steps=stats.origins.count("target"),
                      copied_fraction=drafts.copied_fraction(prompt_ids, tokens))
        if name == "speculative" and isinstance(speculative_draft, costs.AutoK):
            result["K_chosen"] = list(speculative_draft.chosen)
    return result, stats


def progress_bar(name, total):
    """A tqdm bar on a terminal; elsewhere a disabled one, which ignores updates."""
    return tqdm(total=total, desc=name, unit="tok", leave=False, disable=not sys.stderr.isatty())


def summarise_runs(runs):
    """A decoder's timed runs [(result, stats), ...] -> (the median run's result with every run's seconds, its stats).

    Every run decodes the same tokens (same seed, empty caches); only the times differ. The median run
    (the lower of the two middle ones for an even count) gives the seconds and the draft and target times.
    """
    result, stats = sorted(runs, key=lambda run: run[0]["seconds"])[(len(runs) - 1) // 2]
    return {**result, "seconds_per_run": [run[0]["seconds"] for run in runs]}, stats


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
        if result["autoregressive"] is not None:
            result[name]["same_text_as_autoregressive"] = result[name]["tokens"] == result["autoregressive"]["tokens"]


def add_speedups(result):
    """Each faster decoder's speedup: the median over repeats of autoregressive seconds / its seconds.

    The runs of one repeat ran back to back, so each ratio compares the decoders at the same moment.
    """
    autoregressive = result["autoregressive"]
    for name in ("speculative", "assisted"):
        if result[name] is None:
            continue
        if autoregressive is None:
            result[name].update(speedup=None, speedup_range=None)
            continue
        ratios = [ar_seconds / seconds for ar_seconds, seconds in
                  zip(autoregressive["seconds_per_run"], result[name]["seconds_per_run"])]
        result[name].update(speedup=statistics.median(ratios), speedup_range=[min(ratios), max(ratios)])
    result["speedup"] = result["speculative"]["speedup"] if result["speculative"] else None


# ---- the report --------------------------------------------------------------------------------


# ---- the command line --------------------------------------------------------------------------


def usage():
    """What --help prints: the examples above, then every flag with its default."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(main).parameters.items()}
    described_defaults = {"models_dir": "models/ beside main.py", "json": "off",
                          "color": "on a terminal, unless NO_COLOR is set", "batch_size": "1, or one row per --prompt"}
    lines = ["usage: python main.py [--flag value ...]", "", __doc__.strip(), "", "flags [default]:"]
    for name, (metavar, description) in FLAG_HELP.items():
        syntax = f"--{name} {metavar}" if metavar else f"--{name}, --no{name}"
        lines.append(f"  {syntax:<28} {description} [{described_defaults.get(name, defaults[name])}]")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        arguments = parse_arguments(sys.argv[1:])
        if arguments.pop("help", "false") == "true":
            print(usage())
            sys.exit(0)
        import fire  # only the command line needs fire

        fire.Fire(main, command=fire_command(arguments), serialize=lambda result: None)
    except (ValueError, OSError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
