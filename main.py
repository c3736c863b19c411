r"""Decode one prompt autoregressively and speculatively, and compare.

    python main.py --K 4 --temperature 0           # the bundled teaching pair (models/teach-*)
    python main.py --draft_model_size 124M --target_model_size 1558M \
        --prompt "Alan Turing theorized that computers would one day become"   # the paper's GPT-2 pair
    python main.py --prompt "def fibonacci(n):" --n_tokens_to_generate 64 --decoder speculative,assisted
    python main.py --json        # one JSON object as the last line of stdout

Every decoder starts from the same prompt, the same seed and empty caches. Each decoder runs once
untimed (to warm the models' memory and caches, and to let JAX compile), then --repeats timed runs of
all decoders interleave, so a drift in the machine's speed touches them alike; times are medians and
the speedup is the median of the paired ratios, printed with their ranges. The speculative text is
coloured by where each token came from (on a terminal, unless NO_COLOR is set): a draft token the
target accepted, the target's correction after a rejection, or the bonus token the target adds when it
accepts all K. Bad input gets `error: ...` on stderr and exit status 2, before any model is loaded
where possible. `python main.py --help` lists the flags.
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

import backends
import sampling
import utils
from encoder import get_encoder

DECODERS = ("autoregressive", "speculative", "assisted")
# OpenBLAS's x86 kernels for AVX-512 (its OPENBLAS_CORETYPE names)
AVX512_CORETYPES = ("skylakex", "cooperlake", "sapphirerapids")
# The bundled pair's first run: code it writes with accepted stretches and corrections (alpha about 0.7 at
# K=4, temperature 0), where prompts into its loops accept nearly everything and teach nothing
DEFAULT_PROMPT = 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n'
BUNDLED_MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
# every flag of main(), with what its value looks like and what it does (--help prints these)
FLAG_HELP = {
    "prompt": ("TEXT", "the text to continue; an empty prompt starts from <|endoftext|>"),
    "n_tokens_to_generate": ("INT", "new tokens each decoder generates"),
    "draft_model_size": ("NAME", "the draft model: a folder in --models_dir, or 124M, 355M, 774M, 1558M (downloaded)"),
    "target_model_size": ("NAME", "the target model, likewise"),
    "models_dir": ("DIR", "the folder of model folders (a relative path is from the current directory)"),
    "K": ("INT", "tokens the draft proposes per loop (the assisted decoder adapts its own, starting from 5)"),
    "temperature": ("FLOAT", "0 is greedy decoding"),
    "top_k": ("INT", "keep the k most likely tokens; 0 keeps all"),
    "top_p": ("FLOAT", "keep the fewest most likely tokens holding this much probability; 1 keeps all"),
    "seed": ("INT", "seed of the random numbers (every decoder starts from it)"),
    "decoder": ("NAMES", "comma-separated, among autoregressive, speculative and assisted (greedy only)"),
    "repeats": ("INT", "timed runs of each decoder, after one untimed warm-up run"),
    "json": (None, "print one JSON object instead of the report"),
    "color": (None, "colour the speculative text by where each token came from"),
    "backend": ("NAME", "numpy, or jax (needs jax: pip install -r requirements-jax.txt)"),
    "dtype": ("NAME", "float32, or bfloat16 with --backend jax"),
}
FLAGS = tuple(FLAG_HELP)
BOOLEAN_FLAGS = ("json", "color")
STRING_FLAGS = ("prompt", "draft_model_size", "target_model_size", "models_dir", "decoder", "backend", "dtype")
COLOURS = {"accepted": "\x1b[32m", "corrected": "\x1b[31m", "bonus": "\x1b[34m"}  # green, red, blue
LEGEND = {"accepted": "accepted draft", "corrected": "target correction", "bonus": "bonus token"}
RESET = "\x1b[0m"


def main(prompt=DEFAULT_PROMPT, n_tokens_to_generate=64, draft_model_size="teach-draft",
         target_model_size="teach-target", models_dir=None, K=4, temperature=0.0, top_k=0, top_p=1.0, seed=123,
         decoder="autoregressive,speculative", repeats=5, json=False, color=None, backend="numpy",
         dtype="float32"):
    """Run the chosen decoders on one prompt and print texts, times, speedup and statistics.

    decoder: comma-separated names among autoregressive, speculative and assisted (greedy assisted
    generation, temperature 0 only; it adapts its own K from 5, as Hugging Face does, and ignores K).
    models_dir: None is the bundled models/ beside this file. repeats: timed runs of each decoder.
    color: None colours on a terminal unless the NO_COLOR environment variable is set; True or False
    forces it. backend: numpy or jax; dtype: float32, or bfloat16 (JAX only) for the models' compute.
    Returns the result dict that --json prints.
    """
    decoders = parse_decoders(decoder)
    check_flags(n_tokens_to_generate, K, seed, repeats, decoders, temperature, backend, dtype)
    sampling.SamplingSettings(temperature, top_k, top_p)  # raises on a bad temperature, top_k or top_p
    check_strings(prompt=prompt, draft_model_size=draft_model_size, target_model_size=target_model_size,
                  models_dir=models_dir)
    models_dir = BUNDLED_MODELS_DIR if models_dir is None else models_dir
    for name in (draft_model_size, target_model_size):
        check_context_early(prompt, n_tokens_to_generate, name, models_dir)

    encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(draft_model_size, models_dir)
    target_encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params(target_model_size,
                                                                                          models_dir)
    check_same_vocabulary(encoder, target_encoder, draft_hparams, target_hparams)
    prompt_ids = encode_prompt(encoder, prompt)
    check_context(len(prompt_ids), n_tokens_to_generate, draft_hparams, target_hparams)
    draft = backends.make_model(draft_params, draft_hparams, backend, dtype)
    target = backends.make_model(target_params, target_hparams, backend, dtype)
    explain_backend(backend, dtype)
    explain_blas_kernels(backend)

    run = lambda name: run_decoder(name, prompt_ids, draft, target, encoder, n_tokens_to_generate, K, temperature,
                                   top_k, top_p, seed)
    for name in decoders:
        run(name)  # untimed warm-up: the first run pays for touching the weights and, with JAX, for compiling
    timed_runs = {name: [] for name in decoders}
    for _ in range(repeats):
        for name in decoders:  # interleaved: a change in the machine's speed touches every decoder alike
            timed_runs[name].append(run(name))

    result = {"prompt": prompt, "draft": draft_model_size, "target": target_model_size, "K": K,
              "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
              "n_tokens": n_tokens_to_generate, "repeats": repeats, "backend": backend, "dtype": dtype}
    stats = {}
    for name in DECODERS:
        result[name], stats[name] = summarise_runs(timed_runs[name]) if name in decoders else (None, None)
    add_speedups(result)

    if json:
        print(jsonlib.dumps(result))
    else:
        print_report(result, stats, encoder.decode, use_colour=wants_colour(color))
    return result


def wants_colour(color):
    """--color or --nocolor if given; otherwise colour on a terminal unless NO_COLOR is set (no-color.org)."""
    if color is not None:
        return bool(color)
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


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
    if not sampling.is_integer(K) or K < 1:
        raise ValueError(f"--K must be an integer >= 1, got {K!r}")
    if not sampling.is_integer(seed) or seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    if not sampling.is_integer(repeats) or repeats < 1:
        raise ValueError(f"--repeats must be an integer >= 1, got {repeats!r}")
    if "assisted" in decoders and sampling.is_real(temperature) and temperature != 0:
        raise ValueError(f"the assisted decoder is greedy: it needs --temperature 0, got {temperature!r}")


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


def run_decoder(name, prompt_ids, draft, target, encoder, N, K, temperature, top_k, top_p, seed):
    """One decoder from empty caches and a fresh Generator: -> (its result dict, its stats)."""
    draft.reset()
    target.reset()
    stats = sampling.SpeculativeStats()
    rng = np.random.default_rng(seed)
    settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    decoders = backends.decoders(target)  # sampling, or with --backend jax sampling_jax: whole loops on the device
    with progress_bar(name, N) as bar:
        start = time.perf_counter()
        if name == "autoregressive":
            x = decoders.autoregressive_sampling(prompt_ids, target, N, rng, **settings, stats=stats,
                                                 progress=bar.update)
        elif name == "speculative":
            x = decoders.speculative_sampling(prompt_ids, draft, target, N, K, rng, **settings, stats=stats,
                                              progress=bar.update)
        else:
            x = sampling.greedy_assisted_generation(prompt_ids, draft, target, N, stats=stats, progress=bar.update)
        seconds = time.perf_counter() - start
    tokens = [int(token) for token in x[len(prompt_ids):]]
    result = {"tokens": tokens, "text": encoder.decode(tokens), "seconds": seconds, "target_calls": stats.target_calls}
    if name != "autoregressive":
        result.update({key: value for key, value in stats.as_dict().items() if key not in ("target_calls", "generated")})
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


def coloured_text(tokens, origins, decode):
    """The text of tokens, each run of tokens of one origin in its colour.

    Runs are decoded as prefixes of the whole text, so a character split across two tokens of
    different origins is still decoded whole (it shows in the colour of the run that completes it).
    """
    pieces, shown, start = [], "", 0
    for end in range(1, len(tokens) + 1):
        if end < len(tokens) and origins[end] == origins[start]:
            continue
        text = decode(tokens[:end])
        if end < len(tokens):
            text = text.rstrip("\ufffd")  # an unfinished character: wait for the bytes of the next run
        if len(text) > len(shown):
            pieces.append(COLOURS.get(origins[start], "") + text[len(shown):] + RESET)
        shown, start = text, end
    return "".join(pieces)


def print_report(result, stats, decode, use_colour):
    fmt = lambda value, spec: "n/a" if value is None else format(value, spec)
    print(f"draft {result['draft']} -> target {result['target']}, K {result['K']}, temperature {result['temperature']}, "
          f"top_k {result['top_k']}, top_p {result['top_p']}, seed {result['seed']}, {result['n_tokens']} tokens; "
          f"times: the median and range of {result['repeats']} timed runs, after one untimed run of each decoder")
    for name in DECODERS:
        run = result[name]
        if run is None:
            continue
        print(f"\n{name}: {run['seconds']:.3f} s ({min(run['seconds_per_run']):.3f}-{max(run['seconds_per_run']):.3f}), "
              f"{run['target_calls']} target calls, {1000 * run['seconds'] / len(run['tokens']):.1f} ms/token")
        text = run["text"]
        if use_colour and name != "autoregressive":
            text = coloured_text(run["tokens"], stats[name].origins, decode)
        print(result["prompt"] + text)
        if name == "autoregressive":
            continue
        if use_colour:
            print("legend: " + "  ".join(COLOURS[key] + LEGEND[key] + RESET for key in COLOURS))
        never_judged = run["drafted"] - run["accepted"] - run["rejected"]
        print(f"  {run['drafted']} drafted: {run['accepted']} accepted, {run['rejected']} rejected, {never_judged} never "
              "judged (a loop stops at its first rejection)")
        print(f"  acceptance rate alpha {fmt(run['acceptance_rate'], '.3f')} = accepted / (accepted + rejected), "
              f"Leviathan et al.'s alpha; {fmt(run['tokens_per_target_call'], '.2f')} tokens per target call")
        if run["cost_ratio"] is None:  # the JAX backend's device loop: one call runs draft and target alike
            print(f"  {run['draft_calls']} draft calls; the draft and the target are not timed apart (the whole loop "
                  "runs in one device call), so there is no cost ratio")
        else:
            print(f"  {run['draft_calls']} draft calls; {run['draft_seconds']:.3f} s in the draft, "
                  f"{run['target_seconds']:.3f} s in the target (cost ratio {run['cost_ratio']:.3f})")
        if run["speedup"] is None:
            measured = "speedup not measured (add autoregressive to --decoder to measure it)"
        else:
            low, high = run["speedup_range"]
            measured = (f"speedup {run['speedup']:.2f}x measured (median of {result['repeats']} paired runs, "
                        f"{low:.2f}-{high:.2f}x)")
        if run["expected_speedup"] is None:
            print(f"  {measured}")
        else:
            print(f"  {measured}; {run['expected_speedup']:.2f}x expected by the formula from alpha and the cost "
                  "ratio, if a target call cost one decode step")


# ---- the command line --------------------------------------------------------------------------


def flag_name(arg):
    """The parameter an argument names (--name, --name=value, --noname, fire's one-letter -n), or None for a value."""
    if arg.startswith("--"):
        return arg[2:].split("=", 1)[0].replace("-", "_")
    if len(arg) < 2 or not arg.startswith("-") or arg[1].isdigit() or arg[1] == ".":  # -1 and -.5 are values
        return None
    name = arg[1:].split("=", 1)[0]
    matches = [flag for flag in FLAGS if flag.startswith(name)] if len(name) == 1 else []
    return matches[0] if len(matches) == 1 else name  # fire's -x names the only flag starting with x


def split_flag(arg):
    """--name=value, --name, --noname or -n -> (a name in FLAGS or "help", the value after '=' or None).

    None when arg is a value rather than a flag; an unknown flag raises.
    """
    name = flag_name(arg)
    if name is None:
        return None
    value = arg.split("=", 1)[1] if "=" in arg else None
    if name in ("help", "h") or name in FLAGS:
        return ("help" if name == "h" else name), value
    if name.startswith("no") and name[2:] in BOOLEAN_FLAGS and value is None:
        return name[2:], "false"
    raise ValueError(f"unknown flag {arg.split('=', 1)[0]}: the flags are --{', --'.join(FLAGS)}")


def is_known_flag(arg):
    try:
        return split_flag(arg) is not None
    except ValueError:
        return False


def parse_arguments(argv):
    """The command line -> {flag name: its value as typed}, refusing what fire would silently misread.

    Fire would read a flag given no value as True (`--prompt` alone ran with the prompt "True") and
    stray words as positional arguments (`main.py hello 5`). Here --json, --color and --help take no
    value (or =true, =false), every other flag takes one, and there are no positional arguments. A text
    flag's value may start with "-" unless it is one of main's flags (--prompt --K 3 lacks a prompt);
    --prompt=--K is a prompt.
    """
    given, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        flag = split_flag(arg)
        if flag is None:
            raise ValueError(f"unexpected argument {arg!r}: every value follows its flag, as in --prompt {arg!r} "
                             "(python main.py --help lists the flags)")
        name, value = flag
        if name in BOOLEAN_FLAGS or name == "help":
            value = "true" if value is None else value.lower()
            if value not in ("true", "false"):
                raise ValueError(f"--{name} takes no value (or =true, =false), got {arg!r}")
        elif value is None:
            follows = argv[i + 1] if i + 1 < len(argv) else None
            is_flag = is_known_flag if name in STRING_FLAGS else (lambda arg: flag_name(arg) is not None)
            if follows is None or is_flag(follows):
                raise ValueError(f"--{name} needs a value ({FLAG_HELP[name][0]})")
            value, i = follows, i + 1
        elif value == "" and name not in STRING_FLAGS:
            raise ValueError(f"--{name} needs a value ({FLAG_HELP[name][0]})")
        given[name] = value  # a flag given twice keeps its last value, as fire and argparse do
        i += 1
    return given


def fire_command(given):
    """The flags for fire to read: text quoted, so fire keeps it as typed ('a, b' would become a tuple, '42' an int)."""
    command = []
    for name, value in given.items():
        if name in BOOLEAN_FLAGS:
            command.append(f"--{name}" if value == "true" else f"--no{name}")
        elif name in STRING_FLAGS:
            command.append(f"--{name}={value!r}")
        else:
            command.append(f"--{name}={value}")
    return command


def usage():
    """What --help prints: the examples above, then every flag with its default."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(main).parameters.items()}
    described_defaults = {"models_dir": "models/ beside main.py", "json": "off",
                          "color": "on a terminal, unless NO_COLOR is set"}
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
