"""main.py's command line, read strictly before fire sees it: every flag takes a value (or none, for the
booleans and --help), a text flag's value may start with "-", and there are no positional arguments.

Fire alone would read a flag given no value as True (`--prompt` alone ran with the prompt "True"), stray
words as positional arguments, and a text such as '42' or 'a, b' as a number or a tuple. `parse_arguments`
refuses the first two with a clear error, and `fire_command` quotes text so that fire keeps it as typed.
--prompt may be given several times (a batch of prompts, main.py's batch mode); any other flag keeps its
last value, as fire and argparse do.
"""

# every flag of main(), with what its value looks like and what it does (--help prints these)
FLAG_HELP = {
    "prompt": ("TEXT", "the text to continue; an empty prompt starts from <|endoftext|>; given several times, a batch "
                       "of different prompts"),
    "n_tokens_to_generate": ("INT", "new tokens each decoder generates"),
    "draft_model_size": ("NAME", "the draft model: a folder in --models_dir, or 124M, 355M, 774M, 1558M (downloaded), "
                                 "or prompt-lookup (drafts copied from the text so far)"),
    "target_model_size": ("NAME", "the target model, likewise"),
    "models_dir": ("DIR", "the folder of model folders (a relative path is from the current directory)"),
    "K": ("INT|auto", "tokens the draft proposes per loop, or auto: chosen every loop from this machine's costs and "
                 "the alpha so far, 0 (a plain step) where nothing pays (the assisted decoder adapts its own K)"),
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
    "batch_size": ("INT", "sequences decoded at once: B copies of the prompt, row i with seed + i (--prompt given "
                          "several times: one row each)"),
}
FLAGS = tuple(FLAG_HELP)
BOOLEAN_FLAGS = ("json", "color")
STRING_FLAGS = ("prompt", "draft_model_size", "target_model_size", "models_dir", "decoder", "backend", "dtype")


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
