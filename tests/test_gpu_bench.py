"""bench/gpu.py's time budget: a lent accelerator's minutes are few, so a part that would overrun is skipped
and said so, and what was measured is on disk after every part."""

import json
import subprocess
import sys

import pytest

from bench.budget import Budget, write_json_atomically
from conftest import REPO


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_part_runs_while_its_estimate_fits_and_is_skipped_with_the_reason_after():
    clock = FakeClock()
    budget = Budget(10, clock)

    def part(seconds, figure):
        def run():
            clock.now += seconds
            return {"figure": figure}
        return run

    assert budget.run("decode", part(4, 1)) == {"figure": 1}  # nothing known yet: the first part always runs
    assert budget.estimate("decode") == 4 and budget.estimate("verify") == 4  # an unseen kind: the longest so far
    assert budget.run("decode", part(4, 2)) == {"figure": 2}  # 4 s expected, 6 left
    skipped = budget.run("decode", part(4, 3))  # 4 s expected, 2 left: skipped, and it never ran
    assert set(skipped) == {"skipped"} and "4.0 s" in skipped["skipped"] and "2.0 s of 10 s" in skipped["skipped"]
    assert clock.now == 108
    assert "a verify part is expected to take 4.0 s" in budget.run("verify", part(1, 5))["skipped"]  # the longest
    budget.durations["bandwidth"] = 1.5  # a kind whose last part was short still fits
    assert budget.run("bandwidth", part(1.5, 6)) == {"figure": 6} and budget.left() == pytest.approx(0.5)


def test_the_result_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "gpu.json"
    write_json_atomically(path, {"decode": {"ms": 1.5}})
    assert json.loads(path.read_text()) == {"decode": {"ms": 1.5}}
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # no temporary file left beside it
    write_json_atomically(None, {"nothing": "written"})  # no --out: nothing to do


def test_a_run_over_budget_skips_every_part_says_so_and_still_writes_its_file(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "gpu.json"
    command = [sys.executable, str(REPO / "bench" / "gpu.py"), "--small", "--budget_s", "1e-9", "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result == json.loads(completed.stdout.strip().splitlines()[-1])
    assert not {"bandwidth", "decode", "verify", "device_loop", "loop", "pair"} & set(result)
    assert {"bandwidth copy", "decode 1558M_float32", "verify 124M_bfloat16", "device_loop 124M_to_1558M_float32",
            "loop 124M_to_1558M_float32", "pair bundled", "tree 1558M_float32"} <= set(result["skipped"])
    assert all("over the time budget" in why for key, why in result["skipped"].items() if key != "hf")
    assert result["has"]["jax_platform"] and result["targets"] == {"skipped": "the decode part did not run"}
    bad = subprocess.run([*command[:3], "--budget_s", "0"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert bad.returncode == 2 and "--budget_s must be positive" in bad.stderr
