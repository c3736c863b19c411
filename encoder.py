"""GPT-2's byte-level BPE tokenizer: text -> token ids -> text.

How GPT-2 turns text into tokens, in three steps:

1. Pre-tokenize: a regular expression cuts the text into words (letters with an optional leading
   space, numbers, punctuation runs, whitespace runs, English contractions). Merges never cross a
   word boundary, so each word can be tokenized, and cached, on its own.
2. Bytes as characters: each word's UTF-8 bytes are spelled with a 256-character alphabet of
   printable characters (`bytes_to_unicode`), so every byte string is a readable str and no text
   is ever "unknown" to the vocabulary.
3. Byte pair encoding: starting from single bytes, repeatedly merge the adjacent pair with the
   lowest rank in vocab.bpe (rank = line number: earlier merges were more frequent in training)
   until no listed pair is left; each resulting piece is a key of encoder.json, whose value is the
   token id.

decode reverses step 2 and 3 (ids -> byte strings -> UTF-8). A token can hold part of a multi-byte
character, so a slice of ids may not be valid UTF-8: decode replaces the broken bytes with U+FFFD
instead of raising, as OpenAI's encoder does.
"""

import functools
import json
import os

import regex

# GPT-2's pre-tokenizer, verbatim. `\s+(?!\S)` leaves the last space of a whitespace run to start
# the next word, so " world" after "hello  " is still the common token "Ġworld".
PRETOKENIZE_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"  # separates documents; GPT-2's last token id
PRETOKEN_CACHE_SIZE = 1 << 18  # distinct words remembered; a 20 MB corpus has a few 100k


def bytes_to_unicode():
    """GPT-2's map from byte value to a printable character, in GPT-2's order.

    Bytes that print as themselves (and are not a space) keep their own code point; the other 68
    (controls, space, NBSP, soft hyphen, ...) are shifted to code points 256, 257, ... The order
    of the dict, printable bytes first, is the order of the 256 byte tokens in encoder.json.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    byte_to_char = {byte: chr(byte) for byte in printable}
    n_shifted = 0
    for byte in range(256):
        if byte not in byte_to_char:
            byte_to_char[byte] = chr(256 + n_shifted)
            n_shifted += 1
    return byte_to_char


def merge_pair(word, pair):
    """Replace every non-overlapping occurrence of `pair`, left to right, by its concatenation."""
    first, second = pair
    merged, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
            merged.append(first + second)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return tuple(merged)


class Encoder:
    def __init__(self, encoder, bpe_merges):
        """encoder: token string -> id (encoder.json); bpe_merges: [(first, second), ...] by rank."""
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {char: byte for byte, char in self.byte_encoder.items()}
        self.encoder = encoder
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(bpe_merges)}
        check_vocabulary(encoder, bpe_merges, self.bpe_ranks, self.byte_decoder)
        # id -> the token's raw bytes, so decode is one join
        self.id_to_bytes = {i: bytes(self.byte_decoder[c] for c in token) for token, i in encoder.items()}
        self.n_vocab = len(encoder)
        self.eot_token = encoder.get(EOT)  # None for a vocabulary without <|endoftext|>
        self.pattern = regex.compile(PRETOKENIZE_PATTERN)
        self.pretoken_ids = functools.lru_cache(maxsize=PRETOKEN_CACHE_SIZE)(self._pretoken_ids)

    def bpe(self, token):
        """A pre-token spelled in the byte alphabet -> its BPE pieces, e.g. 'Ġhello' -> ('Ġhello',)."""
        word = tuple(token)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            best = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if best not in self.bpe_ranks:
                break  # no listed merge applies: done
            word = merge_pair(word, best)
        return word

    def _pretoken_ids(self, pretoken):  # wrapped in an lru_cache: words repeat a lot in real text
        token = "".join(self.byte_encoder[byte] for byte in pretoken.encode("utf-8"))
        return tuple(self.encoder[piece] for piece in self.bpe(token))

    def encode(self, text, allow_eot=False):
        """text -> token ids. With allow_eot, each '<|endoftext|>' becomes the eot id (documents are
        tokenized separately); without it, '<|endoftext|>' is ordinary text, as in GPT-2's encoder."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"text is not valid Unicode: lone surrogate at index {error.start}") from None
        if not allow_eot:
            return self._encode_ordinary(text)
        if self.eot_token is None:
            raise ValueError(f"this vocabulary has no {EOT} token")
        ids = []
        for n, document in enumerate(text.split(EOT)):
            if n > 0:
                ids.append(self.eot_token)
            ids.extend(self._encode_ordinary(document))
        return ids

    def _encode_ordinary(self, text):
        ids = []
        for pretoken in self.pattern.findall(text):
            ids.extend(self.pretoken_ids(pretoken))
        return ids

    def decode(self, ids):
        """token ids -> text. Bytes that are not valid UTF-8 (e.g. half a character) become U+FFFD."""
        try:
            data = b"".join([self.id_to_bytes[i] for i in ids])
        except (KeyError, TypeError) as error:
            bad = error.args[0] if isinstance(error, KeyError) else error
            raise ValueError(f"unknown token id {bad!r}: ids must be integers in [0, {self.n_vocab})") from None
        return data.decode("utf-8", errors="replace")


def check_vocabulary(encoder, bpe_merges, bpe_ranks, byte_decoder):
    """Fail early, with a clear message, on vocabulary files that would break encode or decode."""
    if sorted(encoder.values()) != list(range(len(encoder))):
        raise ValueError("encoder.json: token ids must be the integers 0..n_vocab-1, each used once")
    for token in encoder:
        if any(char not in byte_decoder for char in token):
            raise ValueError(f"encoder.json: token {token!r} is not spelled in GPT-2's byte alphabet")
    missing_bytes = [char for char in byte_decoder if char not in encoder]
    if missing_bytes:
        example = missing_bytes[0]
        raise ValueError(f"encoder.json: missing {len(missing_bytes)} of the 256 byte tokens, e.g. {example!r}")
    if len(bpe_ranks) != len(bpe_merges):
        raise ValueError("vocab.bpe: a merge is listed twice")
    for first, second in bpe_merges:
        if first + second not in encoder:
            raise ValueError(f"vocab.bpe: merge {first!r} {second!r} makes a token missing from encoder.json")


def read_merges(vocab_bpe_text, path="vocab.bpe"):
    """vocab.bpe: an optional '#version: ...' header, then one 'first second' merge per line."""
    lines = vocab_bpe_text.split("\n")
    start = 1 if lines[0].startswith("#version") else 0
    merges = []
    for line_number, line in enumerate(lines[start:], start=start + 1):
        if not line.strip():
            continue  # the trailing newline
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}, line {line_number}: expected 'first second', got {line!r}")
        merges.append(tuple(parts))
    return merges


def get_encoder(encoder_json_path, vocab_bpe_path):
    """Load an Encoder from GPT-2's two vocabulary files."""
    with open(encoder_json_path, encoding="utf-8") as f:
        try:
            encoder = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{encoder_json_path}: not valid JSON ({error})") from None
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        raise ValueError(f"{encoder_json_path}: expected a JSON object mapping token strings to integer ids")
    with open(vocab_bpe_path, encoding="utf-8") as f:
        bpe_merges = read_merges(f.read(), vocab_bpe_path)
    return Encoder(encoder, bpe_merges)


def get_encoder_from_dir(model_dir):
    """Load the Encoder of a model directory holding encoder.json and vocab.bpe (OpenAI's layout)."""
    return get_encoder(os.path.join(model_dir, "encoder.json"), os.path.join(model_dir, "vocab.bpe"))
