"""bench/step_cost.py: a step's time split into its fixed part (a twin of the same depth at width 18) and its
weights; the JSON's ratios are the ones its own times and weight counts give."""

import json
import subprocess
import sys

import pytest

from classroom.drafter_exercises import counted_weights
from conftest import REPO


@pytest.mark.slow
def test_step_cost_bench_splits_each_step_into_its_fixed_part_and_its_weights(tmp_path):
    out = tmp_path / "step_cost.json"
    command = [sys.executable, str(REPO / "bench" / "step_cost.py"), "--rounds", "2", "--calls", "2", "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result == json.loads(completed.stdout) and "family" in result["machine"]
    steps = result["steps"]
    assert set(steps) == {"target", "draft model", "eagle head", "early exit (2 layers)"}
    target = steps["target"]
    assert target["c_measured"] == target["c_by_weights"] == pytest.approx(1.0)
    assert target["c_by_model"] == pytest.approx(1.0)  # the cost per weight is fitted to the target
    shape = {"n_layer": 8, "n_embd": 384, "n_vocab": 4096, "exit_layer": 2}  # the bundled target's
    for name, drafter in [("eagle head", "eagle"), ("early exit (2 layers)", "early-exit")]:
        assert steps[name]["matrix_weights"] == counted_weights(drafter, **shape)  # notebook 11's count
    for row in steps.values():
        assert 0 < row["fixed_ms"] and 0 < row["fixed_share"] == pytest.approx(row["fixed_ms"] / row["ms"])
        assert row["c_measured"] == pytest.approx(row["ms"] / target["ms"])
