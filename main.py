"""Decode one prompt autoregressively and speculatively, and compare.

    python main.py --K 4 --temperature 0           # the bundled teaching pair (models/teach-*)
    python main.py --draft_model_size 124M --target_model_size 1558M \
        --prompt "Alan Turing theorized that computers would one day become"   # the paper's GPT-2 pair
    python main.py --prompt "def fibonacci(n):" --n_tokens_to_generate 64 --decoder speculative,assisted
    python main.py --json        # one JSON object as the last line of stdout

Every decoder starts from the same prompt, the same seed and empty caches. The speculative text is
coloured by where each token came from (on a terminal): a draft token the target accepted, the
target's correction after a rejection, or the bonus token the target adds when it accepts all K.
Bad input gets `error: ...` on stderr and exit status 2, before any model is loaded where possible.
"""

import os

# One BLAS thread unless the caller chose otherwise: on the 2-core machines we measured, a second OpenBLAS
# thread made a GPT-2 124M decode step 22% faster when idle, 1.7x slower with one other busy process (README).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json as jsonlib
import sys
import time

import numpy as np
from tqdm import tqdm

import backends
import sampling
import utils
from encoder import get_encoder

DECODERS = ("autoregressive", "speculative", "assisted")
FLAGS = ("prompt", "n_tokens_to_generate", "draft_model_size", "target_model_size", "models_dir", "K",
         "temperature", "top_k", "top_p", "seed", "decoder", "json", "color", "backend", "dtype")
STRING_FLAGS = ("prompt", "draft_model_size", "target_model_size", "models_dir", "decoder", "backend", "dtype")
COLOURS = {"accepted": "\x1b[32m", "corrected": "\x1b[31m", "bonus": "\x1b[34m"}  # green, red, blue
LEGEND = {"accepted": "accepted draft", "corrected": "target correction", "bonus": "bonus token"}
RESET = "\x1b[0m"


def main(prompt="The :mod:`json` module", n_tokens_to_generate=64, draft_model_size="teach-draft",
         target_model_size="teach-target", models_dir="models", K=4, temperature=0.0, top_k=0,
         top_p=1.0, seed=123, decoder="autoregressive,speculative", json=False, color=None, backend="numpy",
         dtype="float32"):
    """Run the chosen decoders on one prompt and print texts, times, speedup and statistics.

    decoder: comma-separated names among autoregressive, speculative and assisted (greedy assisted
    generation, temperature 0 only; it adapts its own K from 5, as Hugging Face does, and ignores K). color: None colours on a terminal, True or False forces it.
    backend: numpy or jax; dtype: float32, or bfloat16 (JAX only) for the models' compute.
    Returns the result dict that --json prints.
    """
    decoders = parse_decoders(decoder)
    check_flags(n_tokens_to_generate, K, seed, decoders, temperature, backend, dtype)
    sampling.SamplingSettings(temperature, top_k, top_p)  # raises on a bad temperature, top_k or top_p
    prompt = str(prompt)
    for name in (draft_model_size, target_model_size):
        check_context_early(prompt, n_tokens_to_generate, str(name), models_dir)

    encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(str(draft_model_size), models_dir)
    target_encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params(str(target_model_size),
                                                                                          models_dir)
    check_same_vocabulary(encoder, target_encoder, draft_hparams, target_hparams)
    prompt_ids = encode_prompt(encoder, prompt)
    check_context(len(prompt_ids), n_tokens_to_generate, draft_hparams, target_hparams)
    draft = backends.make_model(draft_params, draft_hparams, backend, dtype)
    target = backends.make_model(target_params, target_hparams, backend, dtype)

    result = {"prompt": prompt, "draft": str(draft_model_size), "target": str(target_model_size), "K": K,
              "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
              "n_tokens": n_tokens_to_generate, "backend": backend, "dtype": dtype}
    stats = {}
    for name in DECODERS:
        result[name] = None
        if name in decoders:
            run = lambda: run_decoder(name, prompt_ids, draft, target, encoder, n_tokens_to_generate, K, temperature,
                                      top_k, top_p, seed)
            if backend != "numpy":
                run()  # untimed: let JAX compile what this decoder needs
            result[name], stats[name] = run()
    add_speedups(result)

    if json:
        print(jsonlib.dumps(result))
    else:
        print_report(result, stats, encoder.decode, use_colour=sys.stdout.isatty() if color is None else bool(color))
    return result


# ---- checks, before anything is loaded -------------------------------------------------------


def parse_decoders(decoder):
    names = decoder.split(",") if isinstance(decoder, str) else list(decoder)  # a list from Python callers
    names = [str(name).strip() for name in names if str(name).strip()]
    unknown = [name for name in names if name not in DECODERS]
    if unknown or not names:
        raise ValueError(f"unknown decoder {', '.join(unknown) or repr(decoder)}: choose from {', '.join(DECODERS)}")
    return names


def check_flags(n_tokens, K, seed, decoders, temperature, backend, dtype):
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
    if "assisted" in decoders and sampling.is_real(temperature) and temperature != 0:
        raise ValueError(f"the assisted decoder is greedy: it needs --temperature 0, got {temperature!r}")


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
    with progress_bar(name, N) as bar:
        start = time.perf_counter()
        if name == "autoregressive":
            x = sampling.autoregressive_sampling(prompt_ids, target, N, rng, **settings, stats=stats,
                                                 progress=bar.update)
        elif name == "speculative":
            x = sampling.speculative_sampling(prompt_ids, draft, target, N, K, rng, **settings, stats=stats,
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


def add_speedups(result):
    autoregressive = result["autoregressive"]
    for name in ("speculative", "assisted"):
        if result[name] is not None:
            result[name]["speedup"] = autoregressive["seconds"] / result[name]["seconds"] if autoregressive else None
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
          f"top_k {result['top_k']}, top_p {result['top_p']}, seed {result['seed']}, {result['n_tokens']} tokens")
    for name in DECODERS:
        run = result[name]
        if run is None:
            continue
        print(f"\n{name}: {run['seconds']:.2f} s, {run['target_calls']} target calls, "
              f"{1000 * run['seconds'] / len(run['tokens']):.1f} ms/token")
        text = run["text"]
        if use_colour and name != "autoregressive":
            text = coloured_text(run["tokens"], stats[name].origins, decode)
        print(result["prompt"] + text)
        if name != "autoregressive":
            if use_colour:
                print("legend: " + "  ".join(COLOURS[key] + LEGEND[key] + RESET for key in COLOURS))
            print(f"  {run['drafted']} drafted, {run['accepted']} accepted (acceptance rate "
                  f"{fmt(run['acceptance_rate'], '.3f')}), {fmt(run['tokens_per_target_call'], '.2f')} tokens per "
                  f"target call, {run['draft_calls']} draft calls; {run['draft_seconds']:.2f} s in the draft, "
                  f"{run['target_seconds']:.2f} s in the target (cost ratio {fmt(run['cost_ratio'], '.3f')})")
            print(f"  speedup {fmt(run['speedup'], '.2f')}x measured, {fmt(run['expected_speedup'], '.2f')}x expected "
                  "by the formula from the acceptance rate and cost ratio, if a target call cost one decode step")


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


def quote_string_flags(argv):
    """Quote the values of string flags so fire keeps them as typed ('a, b' would become a tuple, '42' an int)."""
    quoted, i = [], 0
    while i < len(argv):
        arg, name = argv[i], flag_name(argv[i])
        if name in STRING_FLAGS and "=" in arg:
            flag, value = arg.split("=", 1)
            arg = f"{flag}={value!r}"
        elif name in STRING_FLAGS and i + 1 < len(argv):
            quoted.append(arg)
            i += 1
            arg = repr(argv[i])
        quoted.append(arg)
        i += 1
    return quoted


def check_flag_names(argv):
    """Refuse unknown flags before anything runs (fire would run main first, then complain)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return
        name = flag_name(arg)
        follows_string_flag = i > 0 and flag_name(argv[i - 1]) in STRING_FLAGS and "=" not in argv[i - 1]
        if name is None or follows_string_flag or name in ("help", "h"):
            continue
        if name not in FLAGS and not (name.startswith("no") and name[2:] in FLAGS):
            raise ValueError(f"unknown flag {arg.split('=', 1)[0]}: the flags are --{', --'.join(FLAGS)}")


if __name__ == "__main__":
    import fire  # only the command line needs fire

    try:
        check_flag_names(sys.argv[1:])
        fire.Fire(main, command=quote_string_flags(sys.argv[1:]), serialize=lambda result: None)
    except (ValueError, OSError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
