"""Notebook 5's card of speed across machines, and notebook 2's memory counts, checked against the committed
results and the bundled pair's own parameters."""

import json

import numpy as np
import pytest

import utils
from classroom import machines, memory
from conftest import REPO
from speedup.stats import expected_speedup


def test_card_reads_one_row_per_cpu_from_the_committed_default_runs():
    rows = machines.committed_default_runs()
    assert len(rows) == len(machines.DEFAULT_RUN_LOGS) and len({row.machine for row in rows}) == len(rows)
    for row, name in zip(rows, machines.DEFAULT_RUN_LOGS):
        runs = [result["speculative"] for _, result in machines.logged_runs(REPO / "bench" / "results" / name)[-3:]]
        logged = np.median([run["expected_speedup"] for run in runs])
        # the formula at the row's medians explains the row: near the runs' own formula and their measured speedup
        assert row.expected == pytest.approx(logged, rel=0.05)
        assert row.expected == pytest.approx(row.measured, rel=0.15)
    assert len({round(row.alpha, 6) for row in rows}) == 1  # greedy, one prompt: alpha is the pair's, not the CPU's


def test_card_says_where_the_default_run_loses_and_why():
    zen4, zen1 = machines.committed_default_runs()
    assert "AVX" not in zen4.machine and "SkylakeX" in zen4.machine and "Haswell" in zen1.machine
    assert zen4.measured > 1 > zen1.measured  # the lesson of an AVX2 machine
    assert zen1.v5 > zen1.break_even_v5 and zen4.v5 < zen4.break_even_v5  # v(5) decides, the formula says where
    assert "pays while v(5) <" in zen1.explain()


def test_paper_shapes_row_is_the_formula_at_its_measured_costs():
    row = machines.paper_shapes_row()
    summary = json.loads((REPO / "bench" / "results" / machines.PAPER_SHAPES).read_text())
    (run,) = [r for r in summary["results"] if r["engine"].startswith("gpt2") and r["target"] == "1558M"
              and r["threads"] == 1]
    assert row.measured is None and row.expected == pytest.approx(run["expected_speedup"]["0.8"]["4"], abs=0.002)
    assert "(R)" not in row.machine and "Xeon" in row.machine
    assert row.expected == expected_speedup(0.8, row.c, 4, row.v5)


def test_card_formats_every_row_and_marks_an_unmeasured_speedup():
    rows = machines.committed_default_runs() + [machines.paper_shapes_row()]
    lines = machines.card(rows).splitlines()
    assert len(lines) == 1 + len(rows) and lines[-1].split()[-2] == "-"


def test_machine_in_a_comment_and_a_clear_error_without_one():
    comment = "# run 1, AMD EPYC (family 23, model 1), Zen 1, OpenBLAS Haswell kernels, 2 cores"
    assert machines.machine_in(comment) == "AMD EPYC (family 23, model 1, Zen 1), Haswell kernels"
    with pytest.raises(ValueError, match="names no CPU"):
        machines.machine_in("# python main.py --json")
    with pytest.raises(ValueError, match="K must be 4"):
        machines.default_run_row([{"K": 3, "speculative": {}}], "a machine")


def test_parameter_count_matches_the_bundled_pair_and_gpt2_124m():
    for name in ("teach-target", "teach-draft"):
        _, hparams, params = utils.load_encoder_hparams_and_params(name, REPO / "models")
        leaves = lambda tree: ([x for v in tree.values() for x in leaves(v)] if isinstance(tree, dict) else
                               [x for v in tree for x in leaves(v)] if isinstance(tree, list) else [tree])
        assert memory.parameter_count(hparams) == sum(leaf.size for leaf in leaves(params)), name
    assert memory.parameter_count(memory.gpt2_hparams("124M")) == 124_439_808  # OpenAI's checkpoint's count


def test_kv_cache_bytes_from_the_hparams():
    target = json.loads((REPO / "models" / "teach-target" / "hparams.json").read_text())
    # 2 x n_layer x n_embd values per token, float32, at the full context
    assert memory.kv_cache_bytes(target) == target["n_ctx"] * 2 * target["n_layer"] * target["n_embd"] * 4
    assert round(memory.kv_cache_bytes(memory.gpt2_hparams("124M")) / 1e6) == 75
    assert round(memory.kv_cache_bytes(memory.gpt2_hparams("1558M")) / 1e6) == 629
    gpt2 = memory.gpt2_hparams("1558M")
    assert memory.kv_cache_bytes(gpt2, n_kv_head=1) * gpt2["n_head"] == memory.kv_cache_bytes(gpt2)  # multi-query
    assert memory.grouped_kv_heads(25) == 5 and memory.grouped_kv_heads(12) == 3 and memory.grouped_kv_heads(1) == 1
    assert memory.kv_cache_bytes_per_token(gpt2, "int8") * 4 == memory.kv_cache_bytes_per_token(gpt2)
    with pytest.raises(ValueError, match="must divide"):
        memory.kv_cache_bytes_per_token(gpt2, n_kv_head=4)
