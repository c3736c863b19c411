"""bench/text_quality.py measures what it says: bits per byte (total nats / ln 2 / UTF-8 bytes) and the
share of distinct 4-grams; and it runs end to end on the bundled pair and the held-out sample."""

import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import gpt2
from conftest import REPO
from encoder import get_encoder_from_dir

TINY = dict(n_vocab=4096, n_ctx=8, n_embd=16, n_head=2, n_layer=1)  # the bundled vocabulary's size
DOCUMENTS = ["The json module encodes café ✓.", "def add(a, b):\n    return a + b\n" * 3]


@pytest.fixture(scope="module")
def text_quality():
    spec = importlib.util.spec_from_file_location("bench_text_quality", REPO / "bench" / "text_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def encoder():
    return get_encoder_from_dir(REPO / "models" / "teach-target")


def test_distinct_ngrams(text_quality):
    assert text_quality.distinct_ngrams([1, 2, 3, 4, 1, 2, 3, 4, 1]) == (4, 6)
    assert text_quality.distinct_ngrams(list(range(10))) == (7, 7)
    assert text_quality.distinct_ngrams([5] * 10) == (1, 7)
    assert text_quality.distinct_ngrams([1, 2, 3]) == (0, 0)


def test_a_uniform_model_scores_log2_vocabulary_bits_per_token(text_quality, encoder):
    params = gpt2.init_params(TINY, np.random.default_rng(0))
    params["wte"][:] = 0  # tied output projection of zeros: every logit is 0
    bpb, n_bytes, n_tokens = text_quality.bits_per_byte(DOCUMENTS, encoder, params, TINY)
    assert n_bytes == sum(len(d.encode("utf-8")) for d in DOCUMENTS) and n_bytes > sum(len(d) for d in DOCUMENTS)
    assert n_tokens == sum(len(encoder.encode(d)) for d in DOCUMENTS)
    assert bpb == pytest.approx(n_tokens * math.log2(4096) / n_bytes, rel=1e-6)


def test_bits_per_byte_sums_every_tokens_nats_from_the_separator(text_quality, encoder):
    params = gpt2.init_params(TINY, np.random.default_rng(1))
    params["wte"] *= 40  # far from uniform
    nats = 0.0
    for document in DOCUMENTS:
        tokens = [encoder.eot_token] + encoder.encode(document)
        for start in range(0, len(tokens) - 1, TINY["n_ctx"]):  # windows of n_ctx predictions, context restarting
            window = tokens[start:start + TINY["n_ctx"] + 1]
            logits = gpt2.gpt2(np.array(window[:-1]), **params, n_head=TINY["n_head"]).astype(np.float64)
            log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
                - logits.max(-1, keepdims=True)
            nats -= sum(log_probs[i, token] for i, token in enumerate(window[1:]))
    n_bytes = sum(len(d.encode("utf-8")) for d in DOCUMENTS)
    bpb, _, _ = text_quality.bits_per_byte(DOCUMENTS, encoder, params, TINY)
    assert bpb == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-6)
    n_tokens = sum(len(encoder.encode(d)) for d in DOCUMENTS)
    assert bpb > 12 * n_tokens / n_bytes  # worse than uniform: the comparison above is not trivially met


def test_unseen_python_is_numpys_own_source(text_quality):
    sources, names = text_quality.numpy_sources(5, 500)
    assert len(sources) == len(names) == 5 and all(0 < len(s) <= 500 for s in sources)
    assert all(name.startswith("numpy/") and "/tests/" not in name and name.endswith(".py") for name in names)


def test_text_quality_bench_runs_on_the_held_out_sample(tmp_path):
    """The sample as two documents, named so that the split rule puts the first in test and the second in dev: the
    bits per byte are the test document's alone."""
    lines = (REPO / "tests" / "fixtures" / "heldout_sample.txt").read_text().splitlines(keepends=True)
    documents = {"heldout_sample.txt:1": "".join(lines[:62]), "heldout_sample.txt:125": "".join(lines[124:186])}
    (tmp_path / "heldout.txt").write_text("<|endoftext|>".join(documents.values()))
    (tmp_path / "manifest.json").write_text(json.dumps({"documents": {"heldout": list(documents)}}))
    command = [sys.executable, str(REPO / "bench" / "text_quality.py"), "--heldout", str(tmp_path / "heldout.txt"),
               "--doc_chars", "400", "--numpy_files", "2", "--n_prompts", "2", "--n_tokens", "24", "--samples", "1"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["heldout_split"] == "test" and result["heldout_documents"] == 1
    assert result["heldout_bytes"] == len(documents["heldout_sample.txt:1"][:400].encode())  # the test document's
    uniform = math.log2(4096) * result["heldout_tokens"] / result["heldout_bytes"]
    for key in ["target_bits_per_byte", "draft_bits_per_byte"]:
        assert 0.5 < result[key] < 0.7 * uniform  # far better than guessing (perplexity ~200 of 4096)
    assert 0.5 < result["target_bits_per_byte_numpy"] < 8
    assert result["target_bits_per_byte"] < result["draft_bits_per_byte"] + 0.1
    assert 0 < result["distinct_4grams"] <= 1 and 0 < result["distinct_4grams_pooled"] <= 1
    assert len(result["samples"]) == 1 and result["samples"][0]["continuation"]
    assert result["split"] == result["prompts"]["split"] == "test"
    assert result["prompts"]["ids"] == ["open-00", "open-32"]
    committed = json.loads((REPO / "bench" / "prompts" / "test.json").read_text())["categories"]["open"]
    assert result["samples"][0]["prompt"] == get_encoder_from_dir(REPO / "models" / "teach-target").decode(
        committed[0]["tokens"][:32])  # the test split's first open prompt, its first 32 tokens
    assert len(result["numpy_files"]) == 2
    (tmp_path / "manifest.json").write_text(json.dumps({"documents": {}}))
    unnamed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert unnamed.returncode == 2 and "names no held-out documents" in unnamed.stderr
    assert "Traceback" not in unnamed.stderr
