"""main.py's command line, read strictly before fire sees it, and its flags checked before any model is loaded.

Every flag takes a value (or none, for the booleans and --help), a text flag's value may start with "-", and
there are no positional arguments. Fire alone would read a flag given no value as True (`--prompt` alone ran
with the prompt "True"), stray words as positional arguments, and a text such as '42' or 'a, b' as a number
or a tuple. `parse_arguments` refuses the first two with a clear error, and `fire_command` quotes text so
that fire keeps it as typed. --prompt may be given several times (a batch of prompts); any other flag keeps
its last value, as fire and argparse do. The checks below (`check_run` gathers those that need no model) then
refuse bad values, a context too short or two vocabularies that differ with `ValueError`, which main.py prints
as `error: ...` with exit status 2.
"""

import dataclasses
import inspect
import os

import sampling
import utils
from encoder import get_encoder
from engine.threads import THREADS, usable_cores
from cli import backends, html_page
from cli.drafter_flags import (TREE_GROWERS, TREE_GROWING_DRAFTERS, WITHOUT_A_MODEL, check_confidence_threshold,
                               check_draft_name, check_drafter)
from drafters.kangaroo import CONFIDENCE_THRESHOLD
from drafters.load import DEFAULT_N_NODES
from speedup import drafts
from verifiers.tree import DRAFTS as TREE_DRAFTS

DECODERS = ("autoregressive", "speculative", "assisted")
BUNDLED_MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")

# every flag of main(), with what its value looks like and what it does (--help prints these)
FLAG_HELP = {
    "prompt": ("TEXT", "the text to continue; an empty prompt starts from <|endoftext|>; given several times, a batch "
                       "of different prompts"),
    "n_tokens_to_generate": ("INT", "new tokens each decoder generates"),
    "draft_model_size": ("NAME", "the draft model: a folder in --models_dir, or 124M, 355M, 774M, 1558M (downloaded), "
                                 "or prompt-lookup (drafts copied from the text so far), or a drafter made from the "
                                 "target: early-exit (its first --exit_layer layers), eagle, eagle3, medusa or "
                                 "kangaroo (a head trained by tools/train_heads.py, in --models_dir)"),
    "target_model_size": ("NAME", "the target model, likewise"),
    "models_dir": ("DIR", "the folder of model folders (a relative path is from the current directory)"),
    "K": ("INT|auto", "tokens the draft proposes per loop, or auto: chosen every loop from this machine's costs and "
                 "the alpha so far, 0 (a plain step) where nothing pays (the assisted decoder adapts its own K)"),
    "temperature": ("FLOAT", "0 is greedy decoding"),
    "top_k": ("INT", "keep the k most likely tokens; 0 keeps all"),
    "top_p": ("FLOAT", "keep the fewest most likely tokens holding this much probability; 1 keeps all"),
    "seed": ("INT", "seed of the random numbers (every decoder starts from it)"),
    "decoder": ("NAMES", "comma-separated, among autoregressive, speculative and assisted (greedy only)"),
    "verifier": ("NAME", "how the speculative decoder keeps drafts: token (Algorithm 2), block (block verification), "
                         "multi (--n_drafts drafts by recursive rejection) or tree (--n_drafts drafts as a token "
                         "tree, one target call)"),
    "n_drafts": ("INT", "drafts per loop: 1 for token and block, any >= 1 for multi and tree"),
    "replacement": (None, "multi and tree's sampled drafts drawn independently (SpecInfer) rather than with distinct "
                          "first tokens (RSD)"),
    "tree_drafts": ("NAME", "how --verifier tree grows its tree: sampled (the drafts of multi), top_k (the draft's "
                            "--n_drafts likeliest tokens at every node, to depth K; not with eagle, eagle3 or medusa), lookup (--n_drafts prompt-lookup "
                            "matches, with --draft_model_size prompt-lookup) or dynamic (grown by the drafter: "
                            "eagle, eagle3, medusa)"),
    "exit_layer": ("INT", "with --draft_model_size early-exit: the target's layers the draft runs before reading out "
                          "through the target's final norm and unembedding, 1 .. n_layer - 1"),
    "tree_nodes": ("INT", "with --tree_drafts dynamic: the budget of nodes of the tree eagle, eagle3 or medusa grows, "
                          "verified in one target call"),
    "confidence_threshold": ("FLOAT", "with --draft_model_size kangaroo: the chain stops after a draft whose top "
                                      "probability is below it (Kangaroo's early stop), 0 .. 1; 0 never stops"),
    "repeats": ("INT", "timed runs of each decoder, after one untimed warm-up run"),
    "json": (None, "print one JSON object instead of the report"),
    "verbose": (None, "add to the report each run's counts and costs, the costs measured before the runs and the "
                      "engine (--json always has them)"),
    "color": (None, "colour the speculative text by where each token came from"),
    "backend": ("NAME", "numpy, or jax (needs jax: pip install -r requirements-jax.txt)"),
    "dtype": ("NAME", "float32, or bfloat16 with --backend jax"),
    "batch_size": ("INT", "sequences decoded at once: B copies of the prompt, row i with seed + i (--prompt given "
                          "several times: one row each)"),
    "html": ("PATH", "also write a page that replays one more speculative run loop by loop, in a browser, with no "
                     "network (classroom/page.py; docs/run.html is the bundled pair's)"),
    "threads": ("INT", "threads a matrix product may be split over, where measured faster (default: every core; 1: "
                       "one thread, as before engine/threads.py)"),
}
FLAGS = tuple(FLAG_HELP)
BOOLEAN_FLAGS = ("json", "color", "replacement", "verbose")
STRING_FLAGS = ("prompt", "draft_model_size", "target_model_size", "models_dir", "decoder", "backend", "dtype",
                "verifier", "tree_drafts", "html")
# fire's one-letter -x names the only flag starting with x; the flags added later take no part, so that -n, -r and
# -v still name --n_tokens_to_generate, --repeats and --verifier
ONE_LETTER_FLAGS = tuple(flag for flag in FLAGS if flag not in ("n_drafts", "replacement", "tree_drafts", "verbose",
                                                                 "exit_layer", "tree_nodes", "confidence_threshold",
                                                                 "html"))
VERIFIERS = ("token", "block", "multi", "tree")
SEVERAL_DRAFTS = ("multi", "tree")  # the verifiers that take --n_drafts > 1
DEFAULT_N_DRAFTS = 3  # multi and tree, when --n_drafts is not given


def flag_name(arg):
    """The parameter an argument names (--name, --name=value, --noname, fire's one-letter -n), or None for a value."""
    if arg.startswith("--"):
        return arg[2:].split("=", 1)[0].replace("-", "_")
    if len(arg) < 2 or not arg.startswith("-") or arg[1].isdigit() or arg[1] == ".":  # -1 and -.5 are values
        return None
    name = arg[1:].split("=", 1)[0]
    matches = [flag for flag in ONE_LETTER_FLAGS if flag.startswith(name)] if len(name) == 1 else []
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
    stray words as positional arguments (`main.py hello 5`). Here --json, --color, --replacement and --help
    take no value (or =true, =false), every other flag takes one, and there are no positional arguments. A text
    flag's value may start with "-" unless it is one of main's flags (--prompt --K 3 lacks a prompt);
    --prompt=--K is a prompt. --prompt given several times gives a list of prompts: a batch.
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
        if name == "prompt" and name in given:  # each --prompt is a row of a batch
            value = [*(given[name] if isinstance(given[name], list) else [given[name]]), value]
        given[name] = value  # any other flag given twice keeps its last value, as fire and argparse do
        i += 1
    return given


def fire_command(given):
    """The flags for fire to read: text quoted, so fire keeps it as typed ('a, b' would become a tuple, '42' an int);
    several prompts as a list of quoted texts."""
    command = []
    for name, value in given.items():
        if name in BOOLEAN_FLAGS:
            command.append(f"--{name}" if value == "true" else f"--no{name}")
        elif name in STRING_FLAGS:
            command.append(f"--{name}={value!r}")
        else:
            command.append(f"--{name}={value}")
    return command


# ---- checks, before anything is loaded --------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """A command line, checked: what the decoders run on, and `flags`, what the result repeats of it (--json)."""

    prompts: list  # the texts to continue, one per row: a single prompt, or a batch
    decoders: list  # names among DECODERS, in the order given
    settings: sampling.SamplingSettings
    models_dir: str
    flags: dict  # draft, target, K, temperature, top_k, top_p, seed, n_tokens, repeats, backend, dtype, verifier...
    html: str = None  # --html's path: the page that replays the run (cli/html_page.py)

    @property
    def batch(self):
        return len(self.prompts) > 1


def check_run(prompt, n_tokens_to_generate, draft_model_size, target_model_size, models_dir, K, temperature, top_k,
              top_p, seed, decoder, repeats, backend, dtype, batch_size, threads, verifier, n_drafts, replacement,
              tree_drafts, exit_layer, tree_nodes, confidence_threshold, html=None, **report_flags):
    """main()'s arguments, every one checked before any model is loaded, and --threads set: -> a Run.

    report_flags (json, color, verbose) only choose how the result is printed."""
    decoders = parse_decoders(decoder)
    check_flags(n_tokens_to_generate, K, seed, repeats, decoders, temperature, backend, dtype)
    settings = sampling.SamplingSettings(temperature, top_k, top_p)  # raises on a bad temperature, top_k or top_p
    n_drafts, tree_drafts = check_verifier(verifier, n_drafts, replacement, tree_drafts, decoders, K, draft_model_size)
    html = html_page.check_html(html, prompt, batch_size, decoders, verifier, backend, K, draft_model_size)
    prompts = list(prompt) if isinstance(prompt, (list, tuple)) else [prompt]
    for text in prompts:
        check_strings(None, prompt=text)
    check_strings(models_dir, draft_model_size=draft_model_size, target_model_size=target_model_size)
    B = batch_rows(batch_size, prompts, decoders, K, draft_model_size, verifier)
    set_threads(threads)
    models_dir = BUNDLED_MODELS_DIR if models_dir is None else models_dir
    exit_layer, tree_nodes = check_drafter(draft_model_size, target_model_size, models_dir, backend, exit_layer,
                                           tree_nodes, tree_drafts)
    confidence_threshold = check_confidence_threshold(confidence_threshold, draft_model_size)
    check_draft_name(draft_model_size, models_dir)
    for name in ([] if draft_model_size in WITHOUT_A_MODEL else [draft_model_size]) + [target_model_size]:
        for text in set(prompts):
            check_context_early(text, n_tokens_to_generate, name, models_dir)
    flags = {"draft": draft_model_size, "target": target_model_size, "K": K, "temperature": temperature,
             "top_k": top_k, "top_p": top_p, "seed": seed, "n_tokens": n_tokens_to_generate, "repeats": repeats,
             "backend": backend, "dtype": dtype, "verifier": verifier, "n_drafts": n_drafts,
             "replacement": replacement, "tree_drafts": tree_drafts, "exit_layer": exit_layer,
             "tree_nodes": tree_nodes, "confidence_threshold": confidence_threshold}
    return Run(prompts * (B // len(prompts)), decoders, settings, models_dir, flags, html)


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


def check_verifier(verifier, n_drafts, replacement, tree_drafts, decoders, K, draft_model_size):
    """--verifier and the flags that go with it, checked together. -> (n_drafts, tree_drafts), defaults filled in.

    n_drafts: 1 for token and block (one draft per loop), DEFAULT_N_DRAFTS for multi and tree when not given.
    tree_drafts: None but for the tree, which grows from prompt-lookup matches with --draft_model_size
    prompt-lookup (there is no draft model to sample from or rank) and from sampled drafts otherwise.
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown --verifier {verifier!r}: choose one of {', '.join(VERIFIERS)}")
    if verifier != "token" and "speculative" not in decoders:
        raise ValueError(f"--verifier {verifier} applies to the speculative decoder: add speculative to --decoder")
    several = verifier in SEVERAL_DRAFTS
    n_drafts = (DEFAULT_N_DRAFTS if several else 1) if n_drafts is None else n_drafts
    if not sampling.is_integer(n_drafts) or n_drafts < 1:
        raise ValueError(f"--n_drafts must be an integer >= 1, got {n_drafts!r}")
    if n_drafts != 1 and not several:
        raise ValueError(f"--verifier {verifier} verifies one draft per loop: --n_drafts {n_drafts} needs --verifier "
                         "multi or tree")
    if tree_drafts is not None and verifier != "tree":
        raise ValueError(f"--tree_drafts applies to --verifier tree, not {verifier}")
    lookup = draft_model_size == drafts.PROMPT_LOOKUP
    if verifier == "tree":
        tree_drafts = ("lookup" if lookup else "sampled") if tree_drafts is None else tree_drafts
        if tree_drafts not in TREE_DRAFTS:
            raise ValueError(f"unknown --tree_drafts {tree_drafts!r}: choose one of {', '.join(TREE_DRAFTS)}")
        if tree_drafts == "dynamic" and draft_model_size not in TREE_GROWING_DRAFTERS:
            raise ValueError(f"--tree_drafts dynamic needs a drafter that grows its own tree: --draft_model_size "
                             f"{TREE_GROWERS}")
        if tree_drafts == "top_k" and draft_model_size in TREE_GROWING_DRAFTERS:
            raise ValueError(f"--tree_drafts top_k ranks a draft model's likeliest tokens at every node, and "
                             f"{draft_model_size} grows a tree of its own: use --tree_drafts dynamic")
        if tree_drafts == "lookup" and not lookup:
            raise ValueError("--tree_drafts lookup needs --draft_model_size prompt-lookup")
        if tree_drafts != "lookup" and lookup:
            raise ValueError(f"--tree_drafts {tree_drafts} needs a draft model; with prompt-lookup the tree grows from "
                             "lookup matches (leave --tree_drafts out)")
    if verifier == "multi" and lookup:
        raise ValueError("--verifier multi with prompt-lookup has one draft per loop (the latest match): --verifier "
                         "tree takes several matches")
    if not isinstance(replacement, bool):
        raise ValueError(f"--replacement takes no value (or =true, =false), got {replacement!r}")
    if replacement and not (several and tree_drafts in (None, "sampled")):
        raise ValueError("--replacement applies to sampled drafts, with --verifier multi or tree (--tree_drafts sampled)")
    if K == "auto" and verifier not in ("token", "block"):
        raise ValueError(f"--K auto chooses one draft's K per loop: it works with --verifier token or block, not "
                         f"{verifier}")
    return n_drafts, tree_drafts


def set_threads(threads):
    """--threads, checked, for every product of the NumPy engine (engine/threads.py); None: every usable core.

    More threads than cores would only take turns on them, and the layouts measured with them would be slower."""
    if threads is not None and (not sampling.is_integer(threads) or threads < 1):
        raise ValueError(f"--threads must be an integer >= 1, got {threads!r}")
    if threads is not None and threads > usable_cores():
        raise ValueError(f"--threads {threads} exceeds the {usable_cores()} cores this process may run on")
    THREADS.set(None if threads is None else int(threads))


def batch_rows(batch_size, prompts, decoders, K, draft_model_size, verifier="token"):
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
        if K == "auto" or draft_model_size in WITHOUT_A_MODEL:
            raise ValueError("a batch drafts with a draft model and a fixed --K (not --K auto, prompt-lookup or "
                             "early-exit, nor eagle, eagle3, medusa or kangaroo)")
        if verifier != "token":
            raise ValueError(f"a batch verifies token by token (Algorithm 2): --verifier {verifier} decodes one "
                             "sequence")
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


def usage(main, examples):
    """What --help prints: main.py's examples, then every flag of main() with its default."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(main).parameters.items()}
    described_defaults = {"models_dir": "models/ beside main.py", "json": "off", "verbose": "off",
                          "color": "on a terminal, unless NO_COLOR is set", "batch_size": "1, or one row per --prompt",
                          "threads": "every usable core", "replacement": "off", "html": "off",
                          "n_drafts": f"1; {DEFAULT_N_DRAFTS} with --verifier multi or tree",
                          "tree_drafts": "sampled; lookup with prompt-lookup",
                          "exit_layer": "a quarter of the target's layers",
                          "confidence_threshold": f"{CONFIDENCE_THRESHOLD} with kangaroo",
                          "tree_nodes": f"{DEFAULT_N_NODES} with --tree_drafts dynamic"}
    lines = ["usage: python main.py [--flag value ...]", "", examples.strip(), "", "flags [default]:"]
    for name, (metavar, description) in FLAG_HELP.items():
        syntax = f"--{name} {metavar}" if metavar else f"--{name}, --no{name}"
        lines.append(f"  {syntax:<32} {description} [{described_defaults.get(name, defaults[name])}]")
    return "\n".join(lines)
