"""The classroom notebooks: each executes top to bottom in a fresh kernel (nbclient) and verifies what it
teaches, and the committed copies carry their outputs, small enough to read well on the web.

Each notebook's last cell prints `checks: {json}`, the values it verified; the tests read them from the
outputs. Executing all of them takes a few minutes on a 2-core CPU.
"""

import base64
import functools
import io
import json
import re
import subprocess
import sys

import matplotlib
import nbformat
import numpy as np
import pytest

from conftest import REPO
from test_step_cost_story import unquoted_prose_numbers

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(REPO / "tools"))
import make_notebooks  # noqa: E402

NOTEBOOKS = ["1_gpt2_in_numpy.ipynb", "2_decoding_and_kv_cache.ipynb", "3_speculative_step_by_step.ipynb",
             "4_why_lossless.ipynb", "5_when_it_pays.ipynb", "6_choosing_K_and_the_draft.ipynb",
             "7_bugs_that_look_right.ipynb", "8_batching_and_speculation.ipynb", "9_exercises.ipynb",
             "10_beyond_algorithm_2.ipynb", "11_where_drafts_come_from.ipynb"]
PAIR = [REPO / "models" / name / "hparams.json" for name in ("teach-target", "teach-draft")]
# the notebooks that time anything: their committed outputs must come from one machine, named in their first output
TIMING_NOTEBOOKS = ["2_decoding_and_kv_cache.ipynb", "3_speculative_step_by_step.ipynb", "5_when_it_pays.ipynb",
                    "6_choosing_K_and_the_draft.ipynb", "8_batching_and_speculation.ipynb",
                    "10_beyond_algorithm_2.ipynb"]
QUICK_NOTEBOOKS = ["5_when_it_pays.ipynb", "6_choosing_K_and_the_draft.ipynb"]  # they take NOTEBOOKS_QUICK=1


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def outputs(notebook):
    return [output for cell in code_cells(notebook) for output in cell.get("outputs", [])]


def checks_of(notebook):
    """The JSON the last code cell prints after 'checks: '."""
    for output in code_cells(notebook)[-1].get("outputs", []):
        for line in output.get("text", "").splitlines():
            if line.startswith("checks: "):
                return json.loads(line[len("checks: "):])
    raise AssertionError("the last code cell printed no 'checks: {...}' line")


def committed(name):
    return nbformat.read(REPO / "notebooks" / name, as_version=4)


def machine_line_of(notebook):
    """The 'machine: ...' line of the notebook's first output, or None."""
    first = next((output for output in outputs(notebook) if output.get("text")), None)
    lines = [line for line in (first or {}).get("text", "").splitlines() if line.startswith("machine: ")]
    return lines[0] if lines else None


def skip_without_the_pair():
    if not all(path.is_file() for path in PAIR):
        pytest.skip("the bundled pair models/teach-target and models/teach-draft is missing "
                    "(python tools/train_pair.py writes it)")


@functools.cache
def executed(name):
    skip_without_the_pair()
    return make_notebooks.execute(REPO / "notebooks" / name)


# ---------------------------------------------------------------- executed now


def on_its_notebooks_worker(name):
    """pytest-xdist runs the tests that read one executed notebook on one worker, which executes it once."""
    return pytest.mark.xdist_group(name)


@pytest.mark.parametrize("name", [pytest.param(name, marks=on_its_notebooks_worker(name)) for name in NOTEBOOKS])
def test_notebook_executes_and_its_checks_pass(name):
    notebook = executed(name)  # raises CellExecutionError if any cell fails
    assert not [output for output in outputs(notebook) if output.output_type == "error"]
    assert any("image/png" in output.get("data", {}) for output in outputs(notebook)), "no picture was drawn"
    checks = checks_of(notebook)
    failed = [key for key, value in checks.items() if value is False]
    assert checks and not failed, f"{name}: failed checks {failed}"


@on_its_notebooks_worker("1_gpt2_in_numpy.ipynb")
def test_gpt2_notebook_hand_pass_and_greedy_check():
    checks = checks_of(executed("1_gpt2_in_numpy.ipynb"))
    assert checks["hand_pass_max_abs_diff"] < 1e-3
    assert checks["greedy_matches_full_pass"] is True
    log = json.loads((REPO / "models" / "training_log.json").read_text())
    distillations, stage = 0, log.get("draft_distillation")
    while stage:  # each distillation holds the one before it
        distillations, stage = distillations + 1, stage.get("continued_from")
    assert checks["training_stages_shown"] == 1 + distillations + ("target_unlikelihood" in log)


@on_its_notebooks_worker("2_decoding_and_kv_cache.ipynb")
def test_decoding_notebook_cache_and_processing():
    checks = checks_of(executed("2_decoding_and_kv_cache.ipynb"))
    assert checks["cache_gives_same_tokens"] and checks["own_loop_matches_library"]
    assert checks["top_k_keeps_k"] and checks["top_p_is_smallest_set_over_p"]
    hparams = json.loads(PAIR[0].read_text())  # the cache at full context: 2 x n_layer x n_embd float32 per token
    per_token = 2 * hparams["n_layer"] * hparams["n_embd"] * 4
    assert checks["kv_cache_bytes_full_context_target"] == hparams["n_ctx"] * per_token


@on_its_notebooks_worker("3_speculative_step_by_step.ipynb")
def test_step_by_step_notebook_matches_the_library():
    checks = checks_of(executed("3_speculative_step_by_step.ipynb"))
    assert checks["hand_loop_matches_library"] is True
    assert checks["greedy_speculative_equals_autoregressive"] and checks["assisted_equals_autoregressive"]
    assert checks["speedup_formula_from_measured_costs"] is True and 0 <= checks["loop_lengths_p_value"] <= 1
    # the loop by hand, found by a search: three drafts or more, one kept although q < p, then a rejection
    assert checks["hand_loop_keeps_a_q_below_p_draft_then_rejects"] is True and checks["hand_loop_drafts_judged"] >= 3
    assert checks["target_cache_keeps_only_accepted_drafts"] and checks["draft_feeds_two_tokens_after_a_bonus"]
    assert checks["tail_explains_the_gap_T0"] is True and checks["tail_explains_the_gap_T1"] is True


@on_its_notebooks_worker("4_why_lossless.ipynb")
def test_lossless_notebook_chi_square_tells_correct_from_broken():
    checks = checks_of(executed("4_why_lossless.ipynb"))
    assert checks["proof_terms_sum_to_q"] is True
    for key in ("toy_p_value_correct", "pair_p_value_library", "pair_p_value_correct"):
        assert checks[key] > 0.001, key
    for key in ("toy_p_value_broken", "pair_p_value_broken"):
        assert checks[key] < 1e-6, key


@on_its_notebooks_worker("4_why_lossless.ipynb")
def test_lossless_notebook_proves_whole_sequences_and_the_conditions():
    checks = checks_of(executed("4_why_lossless.ipynb"))
    assert checks["induction_exact_max_error"] < 1e-12 and checks["induction_wrong_bonus_error"] > 0.01
    assert checks["matched_drafts_exact"] is True and checks["mismatched_drafts_off_by"] > 0.01
    assert checks["tokens_per_loop_formula_ok"] and checks["kit_chi_square_matches_scipy"]
    assert checks["first_token_check_p_value_bonus_bug"] > 0.001 > checks["checker_p_value_bonus_bug"]
    assert checks["joint_check_p_value_bonus_bug"] < 0.001


@on_its_notebooks_worker("5_when_it_pays.ipynb")
def test_when_it_pays_notebook_measures_every_K():
    checks = checks_of(executed("5_when_it_pays.ipynb"))
    assert checks["formula_matches_stats"] and checks["acceptance_in_range"]
    assert 1 <= checks["best_K"] <= 8 and checks["best_speedup"] > 0 and checks["verify_cost_K4"] > 0
    assert checks["verify_cost_K4_plain"] > 0
    assert checks["runs_per_K"] >= 8 and checks["target_parameters_M"] > 0  # bootstrap units; sizes from the params
    # the card: two committed CPUs, the paper's shapes and this machine; alpha is the pair's, whatever the CPU
    from classroom import machines
    assert checks["machines_card_rows"] == 4 and checks["card_formula_here"] > 0
    assert abs(checks["card_alpha_here"] - machines.committed_default_runs()[0].alpha) < 0.05


@on_its_notebooks_worker("6_choosing_K_and_the_draft.ipynb")
def test_choosing_K_notebook_measures_both_drafts_and_keeps_the_greedy_tokens():
    checks = checks_of(executed("6_choosing_K_and_the_draft.ipynb"))
    assert checks["v1_is_one"] and checks["surface_optimum_is_best_K"]
    assert checks["greedy_tokens_equal_autoregressive"] is True
    assert checks["auto_K_median_speedup"] > 0 and checks["assisted_median_speedup"] > 0


@on_its_notebooks_worker("7_bugs_that_look_right.ipynb")
def test_bugs_notebook_shows_every_bug_caught_and_the_myth_exact():
    checks = checks_of(executed("7_bugs_that_look_right.ipynb"))
    assert checks["reference_passed"] and checks["reference_p_value"] > 0.001
    assert len(checks["bug_p_values"]) >= 10 and all(p < 1e-3 for p in checks["bug_p_values"].values())
    assert checks["myth_is_lossless"] and checks["no_bonus_is_lossless"] and checks["no_bonus_caught_by_calls"]
    assert checks["showcase_tv_reference"] < 0.06 < checks["showcase_tv_smallest_bug"]
    assert checks["power_at_default_tv_0.05"] > 0.9 and checks["power_at_default_tv_0.02"] < 0.5
    assert checks["drafter_residual_bug_caught"] and checks["drafter_residual_bug_tv"] > 0.1  # the rule broken
    assert checks["drafter_pairing_bug_lost_per_call"] > 1  # the wiring broken: the law kept, acceptance lost


@on_its_notebooks_worker("9_exercises.ipynb")
def test_exercises_notebook_checks_every_exercise_and_leaves_them_to_the_class():
    checks = checks_of(executed("9_exercises.ipynb"))
    assert set(checks) == {str(number) for number in range(1, 15)} | {"7b", "12b"}
    assert set(checks.values()) == {"unsolved"}  # the stubs; tests/test_exercises.py runs the checks on solutions


@on_its_notebooks_worker("8_batching_and_speculation.ipynb")
def test_batching_notebook_rows_are_exact_and_every_batch_size_is_measured():
    checks = checks_of(executed("8_batching_and_speculation.ipynb"))
    assert checks["rows_equal_batch_one"] and checks["row_stats_equal_batch_one"]
    assert checks["greedy_batch_equals_autoregressive"] is True
    assert checks["batch_sizes"] == [1, 2, 4, 8, 16] and checks["autoregressive_gain_at_8"] > 0
    assert len(checks["speedup_by_batch_size"]) == 5 and min(checks["speedup_by_batch_size"]) > 0
    assert min(checks["verify_steps_by_batch_size"]) > 0


@on_its_notebooks_worker("10_beyond_algorithm_2.ipynb")
def test_beyond_algorithm_2_notebook_proves_each_verifier_and_catches_the_lossy_ones():
    checks = checks_of(executed("10_beyond_algorithm_2.ipynb"))
    assert checks["block_example_token"] == "10/9" and checks["block_example_block"] == "11/9"
    assert checks["block_weights_match_fractions"] and checks["block_example_first_token_is_q"]
    assert checks["block_never_below_token"] is True and checks["block_equals_token_at_K1_T0_one_hot"] is True
    assert checks["recursive_rejection_law_is_q"] is True
    assert checks["tree_logits_equal_plain_feed"] is True and checks["tree_logits_max_difference"] < 1e-3
    assert checks["oracle_passes_all_three"] is True and checks["buggy_copies_caught"] is True
    assert min(checks["buggy_copies_tv"].values()) > 1e-4
    assert checks["typical_acceptance_follows_p"] is True and checks["speculative_follows_q"] is True
    measured = checks["measured_tokens_per_target_call"]
    assert measured["autoregressive"] == 1 and all(value >= 1 for value in measured.values()) and len(measured) == 7
    assert checks["tree_and_rows_same_tokens_per_call"] is True  # one law, the same seeds: the same tokens
    assert checks["block_keeps_fewer_on_aa"] is True  # "never loses" holds in expectation, not on every draft pair
    assert checks["tree_mask_second_child_sees_parent_and_itself"] is True and checks["oracle_demo_law_is_q"] is True
    assert checks["unscaled_residual_passes_chi_square"] is True and checks["unscaled_residual_differs"] is True
    assert checks["zoo_mismatches_fail"] is True and checks["zero_uniform_reaches_impossible"] is True
    low, high = checks["block_minus_token_interval"]
    assert low <= high and checks["committed_block_over_token"] > 1 and checks["exercise_block"] == "unsolved"


@on_its_notebooks_worker("11_where_drafts_come_from.ipynb")
def test_where_drafts_come_from_notebook_keeps_the_tokens_and_reads_the_committed_benchmark():
    checks = checks_of(executed("11_where_drafts_come_from.ipynb"))
    assert checks["hand_steps_match_propose"] is True and checks["greedy_identity_every_drafter"] is True
    assert set(checks["greedy_identity"]) == {"EAGLE chain", "Medusa chain", "early exit", "adapted exit"}
    assert checks["eagle_tree_greedy_equals_autoregressive"] is True and checks["tree_walk_is_greedy_prefix"] is True
    for key in ("tree_keeps_the_budget", "tree_tokens_are_the_best_nodes", "tree_kept_nodes_have_kept_parents",
                "tree_parents_match", "tree_kept_values_are_the_highest"):
        assert checks[key] is True, key
    assert checks["medusa_depth2_tokens_from_head_2_alone"] is True and checks["eagle_step2_depends_on_step1_token"]
    top1 = checks["agreement_top1"]
    assert top1["EAGLE's head"] > max(top1["Medusa's head 1"], top1["early exit"])
    assert checks["exit_curve_matches_the_exit_above"] is True
    assert top1["adapted exit"] > top1["early exit"] and checks["exit_agrees_more_the_later_it_reads"] is True
    own_text = checks["agreement_top1_on_own_text"]  # the same drafters on the target's own greedy continuations
    assert set(own_text) == set(top1) and all(0 <= value <= 1 for value in own_text.values())
    assert checks["ahead_on_own_text"] == max(["draft model", "EAGLE's head"], key=own_text.get)
    c_by_weights = checks["c_by_weights"]
    assert checks["adapter_is_a_third_of_a_block"] is True and checks["count_is_the_step_bench_count"] is True
    assert checks["count_ranks_the_drafters_as_paid"] is True and checks["model_steps_cost_less_than_counted"] is True
    assert 0 < c_by_weights["early-exit"] < c_by_weights["kangaroo"] < 1
    # the side-by-side table is the committed benchmark's, and the verdict follows from its rows
    bench = json.loads((REPO / "bench" / "results" / "drafters_cpu_zen4.json").read_text())
    assert checks["bench_rows"] == len(bench["rows"])
    chain = [row for row in bench["rows"] if row["n_nodes"] is None and row["temperature"] == 0]
    fastest = max(chain, key=lambda row: row["speedup"]["median"])
    assert checks["fastest_drafter_here"] == fastest["drafter"]
    assert checks["drafters_that_pay_here"] == sorted({row["drafter"] for row in chain if row["speedup"]["low"] > 1})
    for key in ("bench_ranges_hold_their_medians", "bench_greedy_rows_keep_the_tokens",
                "bench_tokens_per_call_at_least_one", "formula_reproduces_predictions", "verification_costs_positive",
                "pays_above_break_even", "break_even_rises_with_c", "break_even_k1_is_c_plus_v_minus_1"):
        assert checks[key] is True, key
    for category, drafter in checks["fastest_per_category"].items():  # the winner of each kind of text, not overall
        in_category = [row for row in chain if row["category"] == category]
        assert drafter == max(in_category, key=lambda row: row["speedup"]["median"])["drafter"]
    assert set(checks["eagle_against_the_draft_model"].values()) <= {"level", "EAGLE's head ahead",
                                                                      "the draft model ahead"}
    budgets = checks["training_budget"]  # every run summed, as the model card's table
    assert budgets["eagle"]["steps"] > budgets["medusa"]["steps"] and budgets["eagle"]["runs"] >= 1
    assert checks["c_by_weights_seven_b"]["eagle"] < checks["c_by_weights"]["early-exit"] / 4
    assert set(checks["exercises"]) == {"d1", "d2", "d3", "d4", "d4b", "d5", "d6"}


@on_its_notebooks_worker("11_where_drafts_come_from.ipynb")
def test_where_drafts_come_from_notebook_quotes_only_what_it_printed():
    """Every decimal its prose quotes, the take-away's included, stands in what the notebook prints as it runs now
    or in the committed results it reads: the prose cannot drift from the cells it sums up."""
    assert not unquoted_prose_numbers(executed("11_where_drafts_come_from.ipynb"))


def test_the_second_session_is_planned_with_notebook_11_its_exercises_and_a_quiz():
    teacher = (REPO / "notebooks" / "TEACHER.md").read_text()
    session = teacher[teacher.index("## The second session"):]
    plan = [line for line in session.splitlines() if re.match(r"\| \d+-\d+ \| 11[ ,]", line)]
    assert plan and plan[-1].startswith("| 82-90")
    quiz = session[session.index("**The quiz"):]
    assert len(re.findall(r"^\d+\. .*\*", quiz, flags=re.MULTILINE)) >= 8  # each question with its key in italics
    assert "45-minute cut" in session and "Homework" in session


@pytest.mark.parametrize("name", QUICK_NOTEBOOKS)
def test_quick_settings_run_for_a_slow_laptop(name, monkeypatch):
    """TEACHER.md's reduced settings (fewer K, one seed, fewer prompts): the notebook runs and its checks pass."""
    skip_without_the_pair()
    monkeypatch.setenv("NOTEBOOKS_QUICK", "1")  # the kernel inherits this process's environment
    notebook = make_notebooks.execute(REPO / "notebooks" / name)
    checks = checks_of(notebook)
    assert checks and not [key for key, value in checks.items() if value is False]


# ---------------------------------------------------------------- the committed copies


def test_committed_timing_notebooks_were_run_on_one_machine():
    """Every notebook that times anything names its machine in its first output, and all name the same one.
    (Fails until the notebooks are re-executed together on one machine: python tools/make_notebooks.py --execute.)"""
    lines = {name: machine_line_of(committed(name)) for name in TIMING_NOTEBOOKS}
    assert not [name for name, line in lines.items() if line is None], f"no machine line: {lines}"
    assert len(set(lines.values())) == 1, lines


def test_every_notebook_that_times_anything_is_a_timing_notebook():
    for name in NOTEBOOKS:
        sources = "\n".join(cell.source for cell in code_cells(committed(name)))
        if re.search(r"perf_counter|measure_costs|main\.py", sources):
            assert name in TIMING_NOTEBOOKS, name


def test_teachers_table_of_times_is_the_record():
    """TEACHER.md's times come from notebooks/timings.json, which make_notebooks.py writes as it executes."""
    record = json.loads(make_notebooks.TIMINGS.read_text()) if make_notebooks.TIMINGS.is_file() else {}
    teacher = make_notebooks.TEACHER.read_text()
    table = teacher[teacher.index(make_notebooks.TABLE_START) + len(make_notebooks.TABLE_START):
                    teacher.index(make_notebooks.TABLE_END)]
    assert table.strip() == make_notebooks.times_table(record, NOTEBOOKS).strip()
    for name, timings in record.get("notebooks", {}).items():
        assert name in NOTEBOOKS and timings["seconds"] >= sum(cell["seconds"] for cell in timings["slow_cells"]) - 1


def test_timings_name_each_slow_cell_by_its_section():
    cell = lambda kind, source, seconds=None: (nbformat.v4.new_markdown_cell(source) if kind == "md" else
                                               nbformat.v4.new_code_cell(source, metadata={"seconds": seconds}))
    notebook = nbformat.v4.new_notebook(cells=[cell("code", "a", 1.0), cell("md", "## Figure 1\ntext"),
                                               cell("code", "b", 42.0), cell("code", "c", 2.0)])
    timings = make_notebooks.take_timings(notebook)
    assert timings == {"seconds": 45, "slow_cells": [{"section": "Figure 1", "seconds": 42.0}]}
    assert all("seconds" not in c.metadata for c in notebook.cells)  # taken out: the committed cells stay as they were
    table = make_notebooks.times_table({"machine": "machine: X", "notebooks": {"5_a.ipynb": timings}},
                                       ["5_a.ipynb", "6_b.ipynb"])
    assert "| 5_a.ipynb | 45 s | \"Figure 1\" 42 s |" in table and "| 6_b.ipynb | not recorded | |" in table


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_its_outputs_and_fits_the_budget(name):
    notebook = committed(name)
    counts = [cell.get("execution_count") for cell in code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), "not executed top to bottom in one fresh kernel"
    assert not [output for output in outputs(notebook) if output.output_type == "error"]
    assert any("image/png" in output.get("data", {}) for output in outputs(notebook))
    checks = checks_of(notebook)
    assert checks and not [key for key, value in checks.items() if value is False]
    size = (REPO / "notebooks" / name).stat().st_size
    assert size <= make_notebooks.SIZE_BUDGET_BYTES, f"{name} is {size} bytes"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_declares_a_python3_kernel(name):
    assert committed(name).metadata["kernelspec"]["name"] == "python3"  # what Jupyter and the web show


def test_readme_links_every_notebook():
    readme = (REPO / "notebooks" / "README.md").read_text()
    for name in NOTEBOOKS:
        assert f"]({name})" in readme, name
    assert sorted(path.name for path in (REPO / "notebooks").glob("*.ipynb")) == sorted(NOTEBOOKS)


# ---------------------------------------------------------------- the tool


def test_shrink_images_keeps_the_picture_in_fewer_bytes():
    fig, ax = plt.subplots(figsize=(4, 2), dpi=80)
    ax.plot([0, 1, 2], [1, 3, 2], "o-", label="a line")
    ax.imshow([[0, 1], [1, 0]], extent=(0, 1, 0, 1))
    ax.legend()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    original = buffer.getvalue()
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("plot()", outputs=[
        nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(original).decode()})])])
    shrunk = base64.b64decode(make_notebooks.shrink_images(notebook).cells[0].outputs[0].data["image/png"])
    from PIL import Image

    before, after = Image.open(io.BytesIO(original)), Image.open(io.BytesIO(shrunk))
    assert after.size == before.size and len(shrunk) < len(original)
    difference = np.abs(np.asarray(before.convert("RGB"), float) - np.asarray(after.convert("RGB"), float))
    assert difference.mean() < 2  # per channel, out of 255


def test_a_print_sent_in_pieces_is_joined_into_one_output():
    stream = lambda name, text: nbformat.v4.new_output("stream", name=name, text=text)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("report()", outputs=[
        stream("stdout", "checks:"), stream("stdout", ' {"ok": true}\n'), stream("stderr", "note\n"),
        stream("stdout", "after\n")])])
    outputs = make_notebooks.join_streams(notebook).cells[0].outputs
    assert [(output.name, output.text) for output in outputs] == [
        ("stdout", 'checks: {"ok": true}\n'), ("stderr", "note\n"), ("stdout", "after\n")]
    assert checks_of(notebook) == {"ok": True}


def test_tool_reports_a_missing_notebook_in_one_line():
    result = subprocess.run([sys.executable, str(REPO / "tools" / "make_notebooks.py"), "--execute", "nope.ipynb"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no such notebook" in result.stderr and "Traceback" not in result.stderr
