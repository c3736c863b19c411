"""Train a byte-level BPE vocabulary and write it in GPT-2's formats (encoder.json, vocab.bpe).

The files load unchanged with encoder.get_encoder_from_dir, and with tiktoken's
data_gym_to_mergeable_bpe_ranks, because they keep GPT-2's conventions:

- encoder.json maps each token, spelled in GPT-2's byte alphabet (encoder.bytes_to_unicode), to its
  id: the 256 single bytes first in GPT-2's order, then one token per merge in merge order, then
  '<|endoftext|>' as the last id. So a token's id is also its merge rank, as tiktoken assumes.
- vocab.bpe is a '#version: 0.2' line, then one 'first second' merge per line, earliest first.

Training follows GPT-2: the text is cut into words by GPT-2's pre-tokenizer (documents split at
'<|endoftext|>'; no merge crosses a word), then the most frequent adjacent pair of tokens is merged,
again and again. Words are counted once (word -> frequency), so each merge only revisits the unique
words that hold the pair (a pair -> words index) and updates the pair counts of those words; a heap
finds the next best pair. Ties go to the lexicographically smallest pair of byte strings, so the
result depends only on the input text.

    python tools/train_bpe.py [--input build/corpus/train.txt] [--vocab_size 4096] [--out_dir build/bpe4096]
"""

import argparse
import hashlib
import heapq
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import regex

from encoder import EOT, PRETOKENIZE_PATTERN, bytes_to_unicode, merge_pair
from checkpoints.atomic import write_atomically

REPO = Path(__file__).resolve().parents[1]

VOCAB_SIZE = 4096  # 256 bytes + 3839 merges + <|endoftext|>
INPUT = REPO / "build" / "corpus" / "train.txt"


def count_words(texts):
    """Frequency of each pre-token word, as a tuple of single bytes; documents split at EOT."""
    pattern = regex.compile(PRETOKENIZE_PATTERN)
    counts = Counter()
    for text in texts:
        for document in text.split(EOT):
            counts.update(pattern.findall(document))
    return {tuple(bytes([b]) for b in word.encode("utf-8")): n for word, n in counts.items()}


class PairStats:
    """Weighted counts of adjacent token pairs over the unique words, kept up to date as words change."""

    def __init__(self, words, freqs):
        self.words, self.freqs = words, freqs
        self.counts = Counter()  # (first, second) -> occurrences in the corpus
        self.where = defaultdict(set)  # (first, second) -> indices of the words holding it
        self.heap = []  # (-count, first, second): max count, then smallest pair; stale entries skipped
        for index, word in enumerate(words):
            self._add_word(index, word, changed=None)
        for pair, count in self.counts.items():
            self.heap.append((-count, *pair))
        heapq.heapify(self.heap)

    def _add_word(self, index, word, changed):
        for pair in zip(word, word[1:]):
            self.counts[pair] += self.freqs[index]
            self.where[pair].add(index)
            if changed is not None:
                changed.add(pair)

    def _remove_word(self, index, word, changed):
        for pair in zip(word, word[1:]):
            self.counts[pair] -= self.freqs[index]
            self.where[pair].discard(index)
            changed.add(pair)

    def best_pair(self):
        """The most frequent pair (ties: the smallest), or None when no pair is left."""
        while self.heap:
            negative_count, first, second = self.heap[0]
            if self.counts.get((first, second), 0) == -negative_count:
                return first, second
            heapq.heappop(self.heap)  # stale: the count changed after this entry was pushed
        return None

    def merge(self, pair):
        """Merge `pair` in every word that holds it, updating counts, index and heap."""
        changed = set()
        for index in list(self.where[pair]):  # a copy: the loop edits the index
            old_word = self.words[index]
            new_word = merge_pair(old_word, pair)
            self._remove_word(index, old_word, changed)
            self._add_word(index, new_word, changed)
            self.words[index] = new_word
        for changed_pair in changed:
            count = self.counts[changed_pair]
            if count > 0:
                heapq.heappush(self.heap, (-count, *changed_pair))
            else:
                del self.counts[changed_pair]
                self.where.pop(changed_pair, None)


def train_bpe(texts, vocab_size=VOCAB_SIZE, log=None):
    """Learn vocab_size - 257 merges (256 byte tokens and EOT complete the vocabulary).

    Returns the merges as [(first_bytes, second_bytes)], in order. Each merge makes a new token,
    so a token's id can be 256 + its merge's rank, as GPT-2's format needs. (A pair u, v spelling
    an existing token t = x + y never comes up: while a span keeps its borders it evolves exactly
    as the string t alone does, and t alone became one token when x, y was merged.)
    """
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be at least 257 (256 bytes + {EOT}), got {vocab_size}")
    word_counts = count_words(texts)
    stats = PairStats(list(word_counts), list(word_counts.values()))
    merges = []
    while len(merges) < vocab_size - 257:
        pair = stats.best_pair()
        if pair is None:
            break  # every word is a single token: the text is too small for this vocabulary
        stats.merge(pair)
        merges.append(pair)
        if log and len(merges) % 500 == 0:
            log(f"{len(merges)} merges, last {pair[0] + pair[1]!r}")
    return merges


def gpt2_files(merges):
    """(encoder.json text, vocab.bpe text) for the merges, in GPT-2's alphabet and id order."""
    byte_to_char = bytes_to_unicode()

    def spell(token):
        return "".join(byte_to_char[b] for b in token)

    encoder = {char: i for i, char in enumerate(byte_to_char.values())}  # the 256 bytes, GPT-2's order
    for first, second in merges:
        encoder[spell(first + second)] = len(encoder)
    encoder[EOT] = len(encoder)
    lines = ["#version: 0.2"] + [f"{spell(first)} {spell(second)}" for first, second in merges]
    return json.dumps(encoder, ensure_ascii=False), "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, nargs="+", default=[INPUT], help="UTF-8 text files")
    parser.add_argument("--vocab_size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--out_dir", type=Path, help="default: build/bpe<vocab_size>")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or REPO / "build" / f"bpe{args.vocab_size}"
    start = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr)

    try:
        texts = [path.read_text(encoding="utf-8") for path in args.input]
        merges = train_bpe(texts, args.vocab_size, log)
        encoder_json, vocab_bpe = gpt2_files(merges)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(out_dir / "encoder.json", encoder_json.encode("utf-8"))
        write_atomically(out_dir / "vocab.bpe", vocab_bpe.encode("utf-8"))
    except (ValueError, OSError) as error:  # UnicodeDecodeError is a ValueError
        sys.exit(f"train_bpe: error: {error}")
    record = {
        "inputs": {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in args.input},
        "vocab_size": len(merges) + 257,
        "merges": len(merges),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_atomically(out_dir / "training.json", (json.dumps(record, indent=1) + "\n").encode("utf-8"))
    log(f"wrote {out_dir}: {record['vocab_size']} tokens ({len(merges)} merges)")


if __name__ == "__main__":
    main()
