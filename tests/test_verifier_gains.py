"""bench/verifier_gains.py on the bundled pair, at a size for the test suite: every verifier runs, greedy tokens equal
the autoregressive ones (the bench stops otherwise), and the gains are computed from the pooled counters."""

import json
import subprocess
import sys

import pytest

from bench.verifier_gains import decoder_for, gains
from conftest import REPO


def test_verifier_names():
    assert decoder_for("multi3r").keywords == {"n_drafts": 3, "replacement": True}
    assert decoder_for("tree2").keywords == {"n_drafts": 2, "replacement": False, "drafts": "sampled"}
    assert decoder_for("topk2").keywords == {"n_drafts": 2, "drafts": "top_k"}
    for bad in ("topk2r", "multi0", "tree", "blocks"):
        with pytest.raises(ValueError, match="unknown verifier"):
            decoder_for(bad)


def test_gains_are_ratios_of_tokens_per_target_call():
    rows = {("token", 4): {"tokens_per_target_call": 2.0}, ("block", 4): {"tokens_per_target_call": 2.2},
            ("multi3", 2): {"tokens_per_target_call": 3.0}}
    assert gains(rows) == {"block_over_token_K4": 1.1}  # no token row at K = 2: nothing to compare with


def test_a_small_run_of_every_kind_of_verifier():
    command = [sys.executable, str(REPO / "bench" / "verifier_gains.py"), "--n_prompts", "1", "--seeds", "1",
               "--n_tokens", "8", "--K", "2", "--temperature", "0,1",
               "--verifiers", "token,block,multi2,multi2r,tree2,topk2"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(result["rows"]) == 12 and result["machine"]["cpu"]
    assert result["split"] == result["prompts"]["split"] == "test" and result["prompts"]["ids"] == ["open-00"]
    for row in result["rows"]:
        assert 1 <= row["tokens_per_target_call"] <= 3 and row["median_speedup"] > 0  # K = 2: at most 3 a call
    assert set(result["gains"]) == {"T0", "T1"} and "block_over_token_K2" in result["gains"]["T1"]
    greedy = {row["verifier"]: row["tokens_per_target_call"] for row in result["rows"] if row["temperature"] == 0}
    assert greedy["block"] == greedy["token"]  # at temperature 0 block verification is token verification
