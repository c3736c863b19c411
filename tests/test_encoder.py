"""encoder.py against tiktoken, both reading OpenAI's real GPT-2 vocabulary from local files."""

import hashlib
import json
import random

import numpy as np
import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public
from conftest import GPT2_VOCAB_DIR, REPO

import encoder as bpe_encoder

# GPT-2's pre-tokenizer as released by OpenAI (encoder.py), written out here so a change to
# encoder.PRETOKENIZE_PATTERN cannot silently change the reference too.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The hashes tiktoken itself checks for its "gpt2" encoding: parity is against OpenAI's real
# vocabulary (committed in tests/fixtures/gpt2-vocab), not a stand-in.
VOCAB_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}

TEXTS = [
    "Hello, world! This is GPT-2's tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class A:\n\tdef f(self):\n\t\treturn {'a': [1, 2, 3]}  # tabs\n",
    "a  b   c    d\n\n\nend   \n  \t \n",  # runs of spaces, newlines, trailing spaces
    "   leading spaces and trailing   ",
    "\n",
    "",
    " ",
    "机器学习是人工智能的一个分支。",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε, τι κάνεις;",
    "안녕하세요 세계, 잘 지내세요?",
    "emoji 😀🎉 family 👨‍👩‍👧‍👦 flag 🇫🇷 skin 👍🏽 heart ❤️",
    "I'm sure you'll see they've done it, it's what we'd do. DON'T SHOUT'LL",
    "3.14159 1,000,000 2026-11-22 0x1F 1e-10 42nd",
    "Mixed: naïve café — “quotes” … résumé 日本語 and code `x += 1` 🚀\r\n",
    "<|endoftext|> is ordinary text unless allowed",
]


@pytest.fixture(scope="module")
def ours():
    return bpe_encoder.get_encoder_from_dir(GPT2_VOCAB_DIR)


@pytest.fixture(scope="module")
def reference():
    return tiktoken_gpt2(GPT2_PATTERN)


def tiktoken_gpt2(pattern):
    """tiktoken's GPT-2 encoding, built offline from the local vocabulary files."""
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(GPT2_VOCAB_DIR / "vocab.bpe"), encoder_json_file=str(GPT2_VOCAB_DIR / "encoder.json")
    )
    return tiktoken.Encoding(
        name="gpt2-local", pat_str=pattern, mergeable_ranks=ranks, special_tokens={bpe_encoder.EOT: 50256}
    )


def random_unicode_text(rng, length):
    """ASCII-heavy text with whitespace, accents, combining marks, CJK, emoji and any non-surrogate code point."""
    pools = [
        lambda: chr(rng.randrange(32, 127)),
        lambda: rng.choice(" \t\n\r\x0b\x0c\xa0\u2003\u3000  "),
        lambda: chr(rng.randrange(0xC0, 0x250)),
        lambda: chr(rng.randrange(0x300, 0x370)),
        lambda: chr(rng.randrange(0x4E00, 0x9FFF)),
        lambda: chr(rng.randrange(0x1F300, 0x1FAFF)),
        lambda: rng.choice(["'s", "'ll", "'re", "\u200d", "\ufe0f", "0", "99"]),
        lambda: chr(rng.choice([rng.randrange(0, 0xD800), rng.randrange(0xE000, 0x110000)])),
    ]
    return "".join(rng.choice(pools)() for _ in range(length))


def test_vocab_files_are_openais_and_inside_the_repository(ours):
    assert GPT2_VOCAB_DIR.resolve().is_relative_to(REPO)
    assert "Modified MIT License" in (GPT2_VOCAB_DIR / "LICENSE").read_text(encoding="utf-8")
    for name, expected in VOCAB_SHA256.items():
        assert hashlib.sha256((GPT2_VOCAB_DIR / name).read_bytes()).hexdigest() == expected
    assert ours.n_vocab == 50257
    assert ours.eot_token == 50256


def test_pattern_is_gpt2s(ours):
    """Our pattern is GPT-2's, and tiktoken's own (faster) rewrite of it tokenizes the same."""
    assert bpe_encoder.PRETOKENIZE_PATTERN == GPT2_PATTERN
    tiktoken_rewrite = tiktoken_gpt2(tiktoken_ext.openai_public.r50k_pat_str)
    for text in TEXTS:
        assert ours.encode(text) == tiktoken_rewrite.encode_ordinary(text)


@pytest.mark.parametrize("text", TEXTS)
def test_matches_tiktoken_and_round_trips(ours, reference, text):
    ids = ours.encode(text)
    assert ids == reference.encode_ordinary(text)
    assert ours.decode(ids) == text


def test_random_unicode_matches_tiktoken(ours, reference):
    rng = random.Random(20261122)
    for _ in range(400):
        text = random_unicode_text(rng, rng.randrange(0, 60))
        ids = ours.encode(text)
        assert ids == reference.encode_ordinary(text), repr(text)
        assert ours.decode(ids) == text


def test_random_ids_decode_like_tiktoken(ours, reference):
    """Arbitrary id sequences split characters anywhere; both replace the broken bytes alike."""
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(ours.n_vocab) for _ in range(rng.randrange(1, 12))]
        assert ours.decode(ids) == reference.decode(ids, errors="replace")


def test_decode_of_a_split_character_replaces_it(ours):
    ids = ours.encode("𝔘")  # a rare 4-byte character: several byte-level tokens
    assert len(ids) > 1
    assert ours.decode(ids) == "𝔘"
    assert ours.decode(ids[:1]) == "\ufffd"
    assert ours.decode(ids[1:]).count("\ufffd") >= 1
    byte_e2 = ours.encoder[ours.byte_encoder[0xE2]]  # the first byte of '€' on its own
    assert ours.decode([byte_e2]) == "\ufffd"
    assert ours.decode([]) == ""


def test_eot_is_ordinary_text_unless_allowed(ours, reference):
    text = "first document<|endoftext|>second one\n<|endoftext|>"
    assert ours.encode(text) == reference.encode_ordinary(text)
    with_eot = ours.encode(text, allow_eot=True)
    assert with_eot == reference.encode(text, allowed_special={bpe_encoder.EOT})
    assert with_eot.count(50256) == 2
    assert ours.decode(with_eot) == text


def test_bad_input_gets_clear_errors(ours):
    with pytest.raises(ValueError, match="unknown token id 50257"):
        ours.decode([1, 50257])
    with pytest.raises(ValueError, match="unknown token id -1"):
        ours.decode([-1])
    with pytest.raises(TypeError, match="expects a str"):
        ours.encode(b"bytes")
    with pytest.raises(ValueError, match="lone surrogate at index 1"):
        ours.encode("a\ud800b")


def test_numpy_ids_decode(ours):
    ids = ours.encode("numpy ids")
    assert ours.decode(np.array(ids, dtype=np.int64)) == "numpy ids"


def test_vocabulary_without_eot(tmp_path):
    byte_chars = list(bpe_encoder.bytes_to_unicode().values())
    vocab = {char: i for i, char in enumerate(byte_chars)}
    vocab["hi"] = 256
    (tmp_path / "encoder.json").write_text(json.dumps(vocab))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\nh i\n")
    small = bpe_encoder.get_encoder_from_dir(tmp_path)
    assert small.eot_token is None and small.n_vocab == 257
    assert small.encode("hi hi") == [256, vocab["Ġ"], 256]
    with pytest.raises(ValueError, match="no <\\|endoftext\\|> token"):
        small.encode("x", allow_eot=True)


@pytest.mark.parametrize(
    "merges, message",
    [
        ("#version: 0.2\nh i j\n", "line 2: expected 'first second'"),
        ("#version: 0.2\nh x\n", "missing from encoder.json"),
    ],
)
def test_malformed_vocab_bpe_is_rejected(tmp_path, merges, message):
    byte_chars = list(bpe_encoder.bytes_to_unicode().values())
    vocab = {char: i for i, char in enumerate(byte_chars)} | {"hi": 256}
    (tmp_path / "encoder.json").write_text(json.dumps(vocab))
    (tmp_path / "vocab.bpe").write_text(merges)
    with pytest.raises(ValueError, match=message):
        bpe_encoder.get_encoder_from_dir(tmp_path)
