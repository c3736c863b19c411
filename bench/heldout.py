"""The held-out text the benchmarks' prompts are cut from: tools/build_corpus.py builds it (build/corpus/heldout.txt,
never committed); tests/fixtures/heldout_sample.txt is a small sample of it. bench/spec_splits.py cuts the committed
prompts of its development and test splits with the rules below; greedy runs on those prompts, checked against
autoregressive decoding, for the drafter benchmarks (bench/early_exit.py, bench/frspec_vocabulary.py).
"""

import ast
import sys
import textwrap
from pathlib import Path

import numpy as np

import sampling
from speedup.stats import SpeculativeStats


def require_heldout(path):
    """A one-line error and exit status 2 where the held-out text is missing: it is built, not committed."""
    if not Path(path).is_file():
        print(f"error: no held-out text at {path}: build it with `python tools/build_corpus.py` "
              "(tests/fixtures/heldout_sample.txt is a small sample of it)", file=sys.stderr)
        raise SystemExit(2)


def held_out_tokens(encoder, path):
    text = Path(path).read_text(encoding="utf-8")
    return np.asarray(encoder.encode(text.replace("<|endoftext|>", "\n")), dtype=np.int64)


# Prompts of three kinds for bench/spec_bench.py (bench/spec_splits.py cuts them), all from the held-out text (never
# from what the pair trained on)

def open_starts(n_tokens, n, prompt_tokens):  # -> where n windows of text to continue start, spread evenly
    stride = (n_tokens - prompt_tokens - 1) // n
    if stride < 1:
        raise ValueError(f"the held-out text is too short for {n} prompts of {prompt_tokens} tokens")
    return [i * stride for i in range(n)]


def held_out_functions(text, min_lines=6, max_lines=40):
    """Every Python function (or method, dedented) of min_lines to max_lines lines in the held-out text: a `def` line
    and the lines after it that are blank or indented deeper, kept where they parse as Python on their own. The text
    mixes reST and source files, so whole documents need not parse; one function does."""
    lines, found = text.replace("<|endoftext|>", "\n").splitlines(), []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("def "):
            continue
        indent, end = len(line) - len(line.lstrip()), i + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        while end > i + 1 and not lines[end - 1].strip():  # trailing blank lines belong to what follows
            end -= 1
        source = textwrap.dedent("\n".join(lines[i:end])) + "\n"
        if min_lines <= end - i <= max_lines and parses(source):
            found.append(source)
    return found


def parses(source):
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def repetition(tokens, n=4):
    """The share of a span's n-grams that already occurred earlier in the same span: 0 for text that never repeats
    itself, near 1 for a listing of near-identical entries."""
    seen, repeated = set(), 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        repeated += gram in seen
        seen.add(gram)
    return repeated / max(len(tokens) - n + 1, 1)


def structured_starts(tokens, n, prompt_tokens, new_tokens):  # -> where the n prompts start, the spans' repetition
    """Structured, repetitive held-out text: the held-out tokens cut into n equal shares, and in each the window whose
    span (the prompt and the new_tokens the held-out text goes on with) repeats its own 4-grams the most (windows
    start every prompt_tokens // 2 tokens). What wins: reST listings of near-identical directives (`.. c:function::`
    entries), option tables, runs of similar calls or assignments; one from each share, so they come from different
    documents."""
    span, step = prompt_tokens + new_tokens, max(prompt_tokens // 2, 1)
    share = len(tokens) // n
    if share < span:
        raise ValueError(f"the held-out text is too short for {n} structured prompts of {span} tokens")
    starts, scores = [], []
    for first in range(0, n * share, share):
        candidates = range(first, first + share - span + 1, step)
        best = max(candidates, key=lambda start: repetition(tokens[start:start + span].tolist()))
        starts.append(best)
        scores.append(repetition(tokens[best:best + span].tolist()))
    return starts, scores


def copy_prompts(encoder, functions, n, max_function_tokens, restart_lines=2):  # -> [(index in functions, prompt)]
    """n of these functions (sources, held_out_functions') spread over those of at most max_function_tokens tokens,
    each given whole, then a blank line and its first restart_lines lines again (bench/lookup.py's prompt): the
    continuation is a copy."""
    from bench.lookup import repeat_prompt  # bench/lookup.py's cut, at the vocabulary's own token boundary

    fitting = [i for i, source in enumerate(functions) if len(encoder.encode(source)) <= max_function_tokens]
    if not fitting:
        raise ValueError(f"the held-out text holds no function of 6 to 40 lines within {max_function_tokens} tokens")
    return [(i, np.asarray(repeat_prompt(encoder, functions[i], restart_lines)[0], dtype=np.int64))
            for i in spread(fitting, n)]


def spread(items, n):  # -> n of the items (all of them where there are fewer), evenly spaced from the first
    return [items[i * len(items) // n] for i in range(n)] if n < len(items) else list(items)


def add_greedy_run_arguments(parser):  # the flags of greedy_acceptance's runs and of the prompts they read
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--n_prompts", type=int, default=4, help="open prompts of each split read")
    parser.add_argument("--prompt_tokens", type=int, default=64, help="the first tokens of each prompt kept")
    parser.add_argument("--n_tokens", type=int, default=48)


def greedy_references(target, prompts, N):  # -> autoregressive decoding's N greedy tokens after each prompt (x, them)
    expected = []
    for prompt in prompts:
        target.reset()
        expected.append(sampling.autoregressive_sampling(prompt, target, N, 0, temperature=0))
    return expected


def greedy_acceptance(target, draft, prompts, expected, K, N, name):  # -> SpeculativeStats over every prompt
    """Speculative sampling at temperature 0 from each prompt; its tokens must be autoregressive decoding's."""
    total = SpeculativeStats()
    for prompt, reference in zip(prompts, expected):
        target.reset()
        x = sampling.speculative_sampling(prompt, draft, target, N, K, 0, temperature=0, stats=total)
        if not np.array_equal(x, reference):
            raise AssertionError(f"{name}: speculative tokens differ from autoregressive decoding")
    return total
