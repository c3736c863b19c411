"""The held-out text the benchmarks draw their prompts from: tools/build_corpus.py builds it (build/corpus/heldout.txt,
never committed); tests/fixtures/heldout_sample.txt is a small sample of it."""

import sys
from pathlib import Path

import numpy as np


def require_heldout(path):
    """A one-line error and exit status 2 where the held-out text is missing: it is built, not committed."""
    if not Path(path).is_file():
        print(f"error: no held-out text at {path}: build it with `python tools/build_corpus.py` "
              "(tests/fixtures/heldout_sample.txt is a small sample of it)", file=sys.stderr)
        raise SystemExit(2)


def held_out_tokens(encoder, path):
    text = Path(path).read_text(encoding="utf-8")
    return np.asarray(encoder.encode(text.replace("<|endoftext|>", "\n")), dtype=np.int64)
