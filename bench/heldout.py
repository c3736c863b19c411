"""The held-out text the benchmarks draw their prompts from: tools/build_corpus.py builds it (build/corpus/heldout.txt,
never committed); tests/fixtures/heldout_sample.txt is a small sample of it. Greedy runs on evenly spaced prompts of it,
checked against autoregressive decoding, for the drafter benchmarks (bench/early_exit.py, bench/eagle3_vocabulary.py).
"""

import sys
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


def add_greedy_run_arguments(parser):  # the flags of greedy_prompts and greedy_acceptance
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--n_prompts", type=int, default=4)
    parser.add_argument("--prompt_tokens", type=int, default=64)
    parser.add_argument("--n_tokens", type=int, default=48)


def greedy_prompts(target, tokens, n_prompts, prompt_tokens, N):  # -> prompts, the target's greedy tokens after each
    """n_prompts evenly spaced stretches of tokens, and autoregressive decoding's N tokens after each (x and them)."""
    stride = (len(tokens) - prompt_tokens) // n_prompts
    prompts = [tokens[i * stride:i * stride + prompt_tokens] for i in range(n_prompts)]
    expected = []
    for prompt in prompts:
        target.reset()
        expected.append(sampling.autoregressive_sampling(prompt, target, N, 0, temperature=0))
    return prompts, expected


def greedy_acceptance(target, draft, prompts, expected, K, N, name):  # -> SpeculativeStats over every prompt
    """Speculative sampling at temperature 0 from each prompt; its tokens must be autoregressive decoding's."""
    total = SpeculativeStats()
    for prompt, reference in zip(prompts, expected):
        target.reset()
        x = sampling.speculative_sampling(prompt, draft, target, N, K, 0, temperature=0, stats=total)
        if not np.array_equal(x, reference):
            raise AssertionError(f"{name}: speculative tokens differ from autoregressive decoding")
    return total
