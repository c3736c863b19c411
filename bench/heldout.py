"""The held-out text the benchmarks draw their prompts from: tools/build_corpus.py builds it (build/corpus/heldout.txt,
never committed); tests/fixtures/heldout_sample.txt is a small sample of it."""

import sys
from pathlib import Path

import numpy as np

import engine
import utils


def require_heldout(path):
    """A one-line error and exit status 2 where the held-out text is missing: it is built, not committed."""
    if not Path(path).is_file():
        print(f"error: no held-out text at {path}: build it with `python tools/build_corpus.py` "
              "(tests/fixtures/heldout_sample.txt is a small sample of it)", file=sys.stderr)
        raise SystemExit(2)


def held_out_tokens(encoder, path):
    text = Path(path).read_text(encoding="utf-8")
    return np.asarray(encoder.encode(text.replace("<|endoftext|>", "\n")), dtype=np.int64)


def held_out_prompts(encoder, path, n_prompts, prompt_tokens):  # -> n_prompts windows of prompt_tokens tokens
    """Windows evenly spaced over the held-out text, so that the prompts sample all of it."""
    tokens = held_out_tokens(encoder, path)
    stride = (len(tokens) - prompt_tokens) // n_prompts
    return [tokens[i * stride:i * stride + prompt_tokens] for i in range(n_prompts)]


def target_and_prompts(args):  # -> (the target in engine.fast_model's layout, held_out_prompts' windows)
    """What a benchmark on held-out prompts reads from its flags: --models_dir, --target, --heldout (exit status 2
    where it is missing), --n_prompts and --prompt_tokens."""
    require_heldout(args.heldout)
    encoder, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    prompts = held_out_prompts(encoder, args.heldout, args.n_prompts, args.prompt_tokens)
    return engine.fast_model(params, hparams), prompts
