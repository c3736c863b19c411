"""FR-Spec's frequency-ranked draft vocabulary for the bundled target (drafters/frspec.py): the ids most frequent in
the training split.

    python tools/train_heads.py eagle                 # once: caches the training split's tokens
    python tools/draft_vocabulary.py --size 1024      # -> models/teach-eagle-vocabulary.json

Counts the tokens of the training split as tools/train_heads.py caches them (--tokens: build/corpus/train.txt
encoded with the target's vocabulary, uint16); the held-out split is never read. Writes the --size ids of highest
count, sorted, with the share of the counted tokens they cover.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from checkpoints.atomic import write_atomically
from drafters.frspec import coverage, draft_vocabulary

TOKENS = "~/.cache/speculative-sampling-kit/train_heads/eagle/train_tokens.npy"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--tokens", default=TOKENS, help="the training split's token ids, a .npy array")
    parser.add_argument("--out", default=None, help="default: <models_dir>/teach-eagle-vocabulary.json")
    return parser.parse_args(argv)


def training_counts(tokens_file, n_vocab):  # -> [n_vocab]: how often each id occurs in the training split
    tokens_file = Path(tokens_file).expanduser()
    if not tokens_file.is_file():
        raise SystemExit(f"draft_vocabulary: no training tokens at {tokens_file}: python tools/train_heads.py eagle "
                         "caches them")
    return np.bincount(np.load(tokens_file), minlength=n_vocab)


def main(argv=None):
    args = parse_args(argv)
    n_vocab = json.loads((Path(args.models_dir) / args.target / "hparams.json").read_text())["n_vocab"]
    counts = training_counts(args.tokens, n_vocab)
    try:
        ids = draft_vocabulary(counts, args.size)
    except ValueError as error:
        raise SystemExit(f"draft_vocabulary: {error}") from None
    info = {"target": args.target, "n_vocab": n_vocab, "size": args.size,
            "counted": "the training split, build/corpus/train.txt, as tools/train_heads.py encodes it",
            "counted_tokens": int(counts.sum()), "coverage": round(coverage(counts, ids), 6), "ids": ids.tolist()}
    out = Path(args.out or Path(args.models_dir) / "teach-eagle-vocabulary.json")
    lines = ",\n".join(f" {json.dumps(key)}: {json.dumps(value)}" for key, value in info.items())  # a key a line
    write_atomically(out, ("{\n" + lines + "\n}\n").encode())
    print(f"wrote {out}: {args.size} ids covering {info['coverage']:.4f} of {info['counted_tokens']:,} training tokens")


if __name__ == "__main__":
    main()
