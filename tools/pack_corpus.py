"""Encode the corpus once and pack it, with its vocabulary, into one small folder that can travel.

A machine that trains the pair may reach no package registry, so it cannot rebuild the corpus; and the
text (86 MB) is larger than what travels with a working tree. The token ids are smaller: this writes

    <out_dir>/tokens.npz     train and heldout as uint16 token ids (np.savez_compressed), each document
                             followed by <|endoftext|>, exactly as tools/train_pair.py encodes the text
    <out_dir>/encoder.json, vocab.bpe   the vocabulary they were encoded with (GPT-2's formats)
    <out_dir>/pack.json      token counts, sizes and the sha256 of every input and output

and tools/train_pair.py and tools/distill_draft.py read it with --tokens <out_dir>/tokens.npz.

    python tools/pack_corpus.py [--corpus_dir build/corpus] [--bpe_dir models/teach-target] [--out_dir build/pack]
"""

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from encoder import get_encoder_from_dir
from checkpoints.atomic import write_atomically

REPO = Path(__file__).resolve().parents[1]

SPLITS = ("train", "heldout")
VOCABULARY_FILES = ("encoder.json", "vocab.bpe")


def encode_corpus(text, encoder):
    """Token ids of a corpus file: its documents (joined by <|endoftext|>) and a final <|endoftext|>."""
    if encoder.n_vocab > 1 << 16:
        raise ValueError(f"a vocabulary of {encoder.n_vocab} tokens does not fit in uint16")
    ids = encoder.encode(text, allow_eot=True) + [encoder.eot_token]
    return np.asarray(ids, dtype=np.uint16)


def sha256_file(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def pack_corpus(corpus_dir, bpe_dir, out_dir):
    """Write tokens.npz, the vocabulary and pack.json into out_dir; return pack.json's record."""
    corpus_dir, bpe_dir, out_dir = Path(corpus_dir), Path(bpe_dir), Path(out_dir)
    encoder = get_encoder_from_dir(bpe_dir)
    started = time.perf_counter()
    tokens = {split: encode_corpus((corpus_dir / f"{split}.txt").read_text(encoding="utf-8"), encoder)
              for split in SPLITS}
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / "tokens.tmp.npz"  # np.savez_compressed adds .npz to other names
    np.savez_compressed(partial, **tokens)
    partial.replace(out_dir / "tokens.npz")
    for name in VOCABULARY_FILES:
        shutil.copyfile(bpe_dir / name, out_dir / name)
    record = {
        "description": "The corpus encoded by tools/pack_corpus.py, for tools/train_pair.py --tokens",
        "n_vocab": encoder.n_vocab,
        "tokens": {split: int(len(ids)) for split, ids in tokens.items()},
        "bytes_per_token": {split: (corpus_dir / f"{split}.txt").stat().st_size / len(ids)
                            for split, ids in tokens.items()},
        "tokens_npz_bytes": (out_dir / "tokens.npz").stat().st_size,
        "corpus_sha256": {f"{split}.txt": sha256_file(corpus_dir / f"{split}.txt") for split in SPLITS},
        "vocabulary_sha256": {name: sha256_file(bpe_dir / name) for name in VOCABULARY_FILES},
        "tokens_npz_sha256": sha256_file(out_dir / "tokens.npz"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_atomically(out_dir / "pack.json", (json.dumps(record, indent=1) + "\n").encode())
    return record


def load_packed_tokens(path, bpe_dir):
    """(train, heldout) token arrays from a tokens.npz; the vocabulary packed beside it must be bpe_dir's."""
    path, bpe_dir = Path(path), Path(bpe_dir)
    for name in VOCABULARY_FILES:
        if sha256_file(path.parent / name) != sha256_file(bpe_dir / name):
            raise ValueError(f"{path} was encoded with another vocabulary than {bpe_dir} ({name} differs)")
    n_vocab = get_encoder_from_dir(bpe_dir).n_vocab
    with np.load(path) as packed:
        train, heldout = packed["train"], packed["heldout"]
    for split, ids in [("train", train), ("heldout", heldout)]:
        if ids.dtype != np.uint16 or ids.ndim != 1 or not len(ids):
            raise ValueError(f"{path}: {split} must be a non-empty 1-D uint16 array")
        if int(ids.max()) >= n_vocab:
            raise ValueError(f"{path}: {split} holds token {int(ids.max())}, beyond a vocabulary of {n_vocab}")
    return train, heldout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus_dir", type=Path, default=REPO / "build" / "corpus")
    parser.add_argument("--bpe_dir", type=Path, default=REPO / "models" / "teach-target",
                        help="the vocabulary (encoder.json, vocab.bpe): the bundled pair's unless retrained")
    parser.add_argument("--out_dir", type=Path, default=REPO / "build" / "pack")
    args = parser.parse_args(argv)
    try:
        record = pack_corpus(args.corpus_dir, args.bpe_dir, args.out_dir)
    except (ValueError, OSError) as error:
        sys.exit(f"pack_corpus: error: {error}")
    print(f"{args.out_dir / 'tokens.npz'}: {record['tokens']['train']:,} training and "
          f"{record['tokens']['heldout']:,} held-out tokens, {record['tokens_npz_bytes']:,} bytes")


if __name__ == "__main__":
    main()
