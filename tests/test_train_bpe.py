"""tools/train_bpe.py writes GPT-2's formats (proved by tiktoken reading them), learns the frequent
pairs exactly as naive BPE does; tools/build_corpus.py is deterministic and splits by document."""

import hashlib
import json
import random
from collections import Counter

import pytest
import regex
import tiktoken
import tiktoken.load

import encoder as bpe_encoder
from tools import build_corpus, train_bpe

EOT = bpe_encoder.EOT
TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. It's what they'll say, isn't it?\n"
    "def tokenize(text):\n    for word in text.split():\n        yield word.lower()\n\n"
    "\tIndented with a tab; numbers 12345 and 3.14159.\n"
) * 20 + EOT + "A second document: the tokenizer splits at the separator.\n" * 10
UNSEEN_TEXTS = [
    "Completely new words: zymurgy, quixotic, fjord.",
    "机器学习 مرحبا नमस्ते Привет Γειά 안녕하세요",
    "emoji 👨‍👩‍👧‍👦 🇫🇷 👍🏽 and trailing spaces   \n\n",
    "    if x:\n\t\treturn {'a': [1, 2]}  # code",
    "\x00\x01 control bytes \u2028 and \ufeff",
]


def naive_bpe(text, n_merges):
    """Textbook BPE, recounting every pair before each merge: the reference for the incremental trainer."""
    words = Counter()
    for document in text.split(EOT):
        pretokens = regex.findall(bpe_encoder.PRETOKENIZE_PATTERN, document)
        words.update(tuple(bytes([b]) for b in pretoken.encode()) for pretoken in pretokens)
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged = Counter()
        for word, freq in words.items():
            merged[bpe_encoder.merge_pair(word, best)] += freq
        words = merged
    return merges


def tiktoken_from_files(directory, eot_id):
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(directory / "vocab.bpe"), encoder_json_file=str(directory / "encoder.json")
    )
    return tiktoken.Encoding(
        name="trained", pat_str=bpe_encoder.PRETOKENIZE_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: eot_id}
    )


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A 300-token vocabulary trained through the command line."""
    directory = tmp_path_factory.mktemp("bpe300")
    (directory / "train.txt").write_text(TRAINING_TEXT, encoding="utf-8")
    train_bpe.main(["--input", str(directory / "train.txt"), "--vocab_size", "300", "--out_dir", str(directory)])
    return directory


def test_files_have_gpt2s_layout(trained_dir):
    vocab = json.loads((trained_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (trained_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    assert lines[0] == "#version: 0.2" and lines[-1] == ""
    merges = [tuple(line.split(" ")) for line in lines[1:-1]]
    assert len(vocab) == 300 and len(merges) == 300 - 257
    ids = list(vocab.values())
    assert ids == list(range(300))
    assert list(vocab)[:256] == list(bpe_encoder.bytes_to_unicode().values())
    assert list(vocab)[256:-1] == [first + second for first, second in merges]
    assert list(vocab)[-1] == EOT


def test_loads_with_encoder_and_round_trips(trained_dir):
    enc = bpe_encoder.get_encoder_from_dir(trained_dir)
    assert enc.n_vocab == 300 and enc.eot_token == 299
    for text in [TRAINING_TEXT, *UNSEEN_TEXTS]:
        assert enc.decode(enc.encode(text)) == text
    ids = enc.encode(TRAINING_TEXT, allow_eot=True)
    assert ids.count(299) == 1 and enc.decode(ids) == TRAINING_TEXT
    # 43 merges already save over a third of the tokens on the text they were learned from
    assert len(ids) < 0.65 * len(TRAINING_TEXT.encode())


def test_tiktoken_reads_our_files_and_agrees(trained_dir):
    """tiktoken's loader asserts encoder.json and vocab.bpe agree the way GPT-2's do; then both encode alike."""
    reference = tiktoken_from_files(trained_dir, eot_id=299)
    enc = bpe_encoder.get_encoder_from_dir(trained_dir)
    rng = random.Random(3)
    random_texts = ["".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)])) for _ in range(50))
                    for _ in range(50)]
    for text in [TRAINING_TEXT, *UNSEEN_TEXTS, *random_texts]:
        assert enc.encode(text) == reference.encode_ordinary(text)
    assert enc.encode(TRAINING_TEXT, allow_eot=True) == reference.encode(TRAINING_TEXT, allowed_special={EOT})


def test_repeated_word_builds_it_most_frequent_pair_first():
    # " hello" x999 and "hello" x1: the pairs inside "hello" (1000) beat (" ", "h") (999); ties go to
    # the smallest pair in bytes, so "el" < "hel..." and "ell" < "h...", and " hello" comes last.
    merges = train_bpe.train_bpe(["hello" + " hello" * 999], vocab_size=257 + 5)
    assert merges == [(b"e", b"l"), (b"el", b"l"), (b"ell", b"o"), (b"h", b"ello"), (b" ", b"hello")]


def test_incremental_counts_match_naive_recount():
    text = TRAINING_TEXT + "".join(random.Random(0).choice("ab cd\n") for _ in range(3000))
    assert train_bpe.train_bpe([text], vocab_size=257 + 60) == naive_bpe(text, 60)


def test_merges_never_cross_documents_or_words():
    merges = train_bpe.train_bpe([f"ab{EOT}ab{EOT}ab", "ab"], vocab_size=300)
    assert merges == [(b"a", b"b")]  # "ba" across the separator or the file border is never a pair


def test_small_text_stops_early_and_bad_sizes_fail(tmp_path):
    (tmp_path / "tiny.txt").write_text("aaaa")
    train_bpe.main(["--input", str(tmp_path / "tiny.txt"), "--vocab_size", "1000", "--out_dir", str(tmp_path)])
    enc = bpe_encoder.get_encoder_from_dir(tmp_path)
    assert enc.n_vocab == 259 and enc.eot_token == 258  # "aa", then "aaaa": nothing left to merge
    assert enc.encode("aaaa") == [257]
    with pytest.raises(ValueError, match="at least 257"):
        train_bpe.train_bpe(["text"], vocab_size=256)
    with pytest.raises(SystemExit, match="train_bpe: error: .*missing.txt"):
        train_bpe.main(["--input", str(tmp_path / "missing.txt"), "--out_dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder.json", "tiny.txt", "training.json", "vocab.bpe"]


@pytest.fixture
def fake_sources(tmp_path):
    """A small docs tree and a small 'standard library' with the directories the builder must skip."""
    docs, stdlib = tmp_path / "docs", tmp_path / "stdlib"
    for i in range(30):
        path = docs / f"section{i % 3}" / f"page{i:02d}.rst.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"Page {i}\n=======\n\nSome prose about topic {i}. ✓\n", encoding="utf-8")
    for i in range(20):
        (stdlib / "pkg").mkdir(parents=True, exist_ok=True)
        (stdlib / ("pkg" if i % 2 else ".") / f"mod{i:02d}.py").write_text(f"def f{i}():\n    return {i}\n" * (i + 1))
    for skipped_dir in ["test", "site-packages/thirdparty", "pkg/tests", "encodings", "pydoc_data"]:
        (stdlib / skipped_dir).mkdir(parents=True, exist_ok=True)
        (stdlib / skipped_dir / "skipme.py").write_text("SKIPPED = True\n")
    (stdlib / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    (stdlib / "has_eot.py").write_text(f"SEP = '{EOT}'\n")
    return docs, stdlib


def test_build_corpus_is_deterministic_and_splits_by_document(tmp_path, fake_sources):
    docs, stdlib = fake_sources
    options = dict(docs_dir=docs, stdlib_dir=stdlib, max_stdlib_bytes=10**6, heldout_every=4)
    first = build_corpus.build_corpus(out_dir=tmp_path / "a", **options)
    build_corpus.build_corpus(out_dir=tmp_path / "b", **options)
    for name in ["train.txt", "heldout.txt", "manifest.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["heldout.txt", "manifest.json", "train.txt"]

    names = {"train": first["documents"]["train"], "heldout": first["documents"]["heldout"]}
    everything = names["train"] + names["heldout"]
    assert len(everything) == 30 + 20 and len(set(everything)) == 50
    assert all(build_corpus.is_heldout(name, 4) for name in names["heldout"])
    assert not any(build_corpus.is_heldout(name, 4) for name in names["train"])
    assert 0 < len(names["heldout"]) < 25
    assert not any("skipme" in name or "latin1" in name or "has_eot" in name for name in everything)
    assert sorted(s["name"] for s in first["skipped"]) == ["stdlib/has_eot.py", "stdlib/latin1.py"]

    for split in ["train", "heldout"]:
        data = (tmp_path / "a" / f"{split}.txt").read_bytes()
        root_of = {"docs": docs, "stdlib": stdlib}
        expected = EOT.join((root_of[n.split("/")[0]] / n.split("/", 1)[1]).read_text(encoding="utf-8")
                            for n in sorted(names[split]))
        assert names[split] == sorted(names[split])
        assert data.decode("utf-8") == expected
        assert first["outputs"][f"{split}.txt"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert first["total_bytes"] == sum(r["bytes"] for r in first["outputs"].values())
    assert first["sources"][0]["debian_package"] is None  # a temporary directory belongs to no package


def test_build_corpus_caps_library_bytes(tmp_path, fake_sources):
    docs, stdlib = fake_sources
    manifest = build_corpus.build_corpus(out_dir=tmp_path / "out", docs_dir=docs, stdlib_dir=stdlib,
                                         max_stdlib_bytes=400, heldout_every=50)
    library = manifest["sources"][1]
    assert library["files_available"] == 20
    assert 0 < library["files"] < 20 and library["bytes"] <= 400


def test_build_corpus_cli_reports_bad_directories(tmp_path):
    with pytest.raises(SystemExit, match="build_corpus: error: docs_dir .* is not a directory"):
        build_corpus.main(["--docs_dir", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
