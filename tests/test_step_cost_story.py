"""What a step costs is told once (docs/DRAFTERS.md, "What a step costs", from bench/step_cost.py's committed JSON)
and the same way everywhere: the page's figures are the JSON's, no page or notebook tells the stories it replaced,
and every decimal notebook 11's prose quotes stands in what the notebook printed or in the results it reads."""

import json
import re
import statistics

import nbformat
import pytest

from classroom.drafter_exercises import counted_weights
from conftest import REPO

RESULTS = REPO / "bench" / "results"
STEP_COST = json.loads((RESULTS / "step_cost_cpu_zen4.json").read_text())
BENCH = json.loads((RESULTS / "drafters_cpu_zen4.json").read_text())
# the stories the measurement replaced: a step bound by reading the weights, or by NumPy's cost per operation
CONTRADICTIONS = [r"decode step is bound by reading", r"not (by reading|the) weights", r"bound by NumPy",
                  r"weighs most at this size", r"overhead per operation\) sets",
                  r"NumPy's (fixed )?(cost|overhead)[^.]{0,60}\bdominat"]
# what the three drafters of the split are called in the benchmark's rows
IN_BENCH = {"draft model": "draft", "eagle head": "eagle-chain", "early exit (2 layers)": "early-exit"}
# a paper's identifier or section is a citation, not a figure
CITATION = r"arXiv\s+\d{4}\.\d{4,5}|section\s+\d+(\.\d+)+"


def section(text, heading):
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def paid(drafter):  # -> the c the benchmark's loop paid, over all its rows
    return [row["c"] for row in BENCH["rows"] if row["drafter"] == drafter]


def span(values, digits=2):
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def prose_of_every_page():
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "notebooks" / "TEACHER.md",
             REPO / "notebooks" / "README.md", *sorted((REPO / "classroom").glob("*.py")), REPO / "bench" / "step_cost.py"]
    texts = {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8") for path in pages}
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        texts[path.name] = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    return texts


def test_no_page_tells_another_story_of_what_a_step_costs():
    told = [(name, pattern) for name, text in prose_of_every_page().items() for pattern in CONTRADICTIONS
            if re.search(pattern, " ".join(text.split()), flags=re.IGNORECASE)]
    assert not told, told


def test_the_drafters_page_table_is_the_committed_split():
    page = section((REPO / "docs" / "DRAFTERS.md").read_text(encoding="utf-8"), "What a step costs")
    assert "python bench/step_cost.py --out bench/results/step_cost_cpu_zen4.json" in page
    names = {"target": "target", "draft model": "draft model", "EAGLE's head": "eagle head",
             "early exit (2 layers)": "early exit (2 layers)"}
    for label, name in names.items():
        step = STEP_COST["steps"][name]
        row = re.search(rf"^    {re.escape(label)}  +(.+)$", page, flags=re.MULTILINE)[1].split()
        fixed = f"({step['fixed_share']:.0%})"
        expected = [f"{step['ms']:.2f}", f"{step['fixed_ms']:.2f}", fixed, f"{step['matrix_weights'] / 1e6:.2f}", "M"]
        if name == "target":
            expected += ["1", "1", "1"]
        else:
            expected += [f"{step['c_measured']:.3f}", f"{step['c_by_weights']:.3f}", span(paid(IN_BENCH[name]))]
        assert row == expected, (label, row, expected)


def test_the_drafters_page_prose_is_the_committed_split():
    page = " ".join(section((REPO / "docs" / "DRAFTERS.md").read_text(encoding="utf-8"), "What a step costs").split())
    steps = STEP_COST["steps"]
    target = steps["target"]
    per_weight = {name: (step["ms"] - step["fixed_ms"]) / step["matrix_weights"] for name, step in steps.items()}
    drafters = [name for name in steps if name != "target"]
    assert 0.05 < target["fixed_share"] < 0.15 and "The target's fixed part is a tenth of its step" in page
    assert 0.4 < steps["draft model"]["fixed_share"] < 0.6 and "half of the draft model's step is its fixed part" in page
    speeds = [f"{per_weight['target'] / per_weight[name]:.1f}" for name in drafters]
    assert f"({speeds[0]}, {speeds[1]} and {speeds[2]} times" in page and all(float(s) > 1 for s in speeds)
    sizes = [f"{4 * steps[name]['matrix_weights'] / 1e6:.1f}" for name in drafters]
    assert f"their matrices {sizes[0]}, {sizes[1]} and {sizes[2]} MB" in page
    assert f"against the target's {4 * target['matrix_weights'] / 1e6:.1f} MB" in page
    assert all(steps[name]["c_measured"] < steps[name]["c_by_weights"] for name in drafters)  # cost less than counted
    ratios = [c / steps[name]["c_by_weights"] for name in drafters for c in paid(IN_BENCH[name])]
    assert f"from {1 - min(ratios):.0%} below to {max(ratios) - 1:.0%} above its count" in page
    shape = {"n_layer": 8, "n_embd": 384, "n_vocab": 4096, "exit_layer": 2}  # the bundled target, the split's exit
    counted_kangaroo = counted_weights("kangaroo", **shape) / counted_weights("target", **shape)
    above = [round(100 * (c / counted_kangaroo - 1)) for c in paid("kangaroo")]
    assert (f"Kangaroo's, {span(paid('kangaroo'))}, lies {min(above)}-{max(above)}% above its count, "
            f"{counted_kangaroo:.3f}") in page
    for drafter in IN_BENCH.values():  # "in every row of these three, c at K 1 is above c at K 8"
        for row in (row for row in BENCH["rows"] if row["drafter"] == drafter):
            by_K = {run["K"]: run["c"] for run in row["calibration"]}
            assert by_K[1] > by_K[8], (drafter, row["category"], row["temperature"])


def over_count(row):  # -> the c a row paid over its drafter's count, less 1
    name = next(name for name, drafter in IN_BENCH.items() if drafter == row["drafter"])
    return row["c"] / STEP_COST["steps"][name]["c_by_weights"] - 1


EXIT_BLOCKS = 2 * 12 * 384 ** 2 / counted_weights("target", n_layer=8, n_embd=384, n_vocab=4096, exit_layer=2)


def per_loop_count(row):  # -> the exit's count per draft step, with its last draft's blocks shared by the loop's drafts
    name = next(name for name, drafter in IN_BENCH.items() if drafter == row["drafter"])
    return STEP_COST["steps"][name]["c_by_weights"] + EXIT_BLOCKS / row["draft_steps_per_loop"]


def signed(values):  # -> "-7% to +12%"
    return f"{min(values):+.0%} to {max(values):+.0%}"


def test_the_drafters_page_says_what_a_loops_own_work_adds_to_the_count():
    page = " ".join(section((REPO / "docs" / "DRAFTERS.md").read_text(encoding="utf-8"), "What a step costs").split())
    rows = [row for row in BENCH["rows"] if row["drafter"] in IN_BENCH.values()]
    assert f"{EXIT_BLOCKS:.3f} of a decode step per loop by the weights" in page
    exits = [row for row in rows if row["drafter"] == "early-exit"]
    assert f"the exit's rows lie {signed([row['c'] / per_loop_count(row) - 1 for row in exits])} from it" in page
    several = [row for row in rows if row["drafter"] != "early-exit" and row["K"] > 1]
    alone = [row for row in rows if row["drafter"] != "early-exit" and row["K"] == 1]
    assert f"the draft model's and EAGLE's rows at K 2 or more {signed(list(map(over_count, several)))}" in page
    if alone:  # a loop of one draft carries the loop's work alone
        assert f"those at K 1 {signed(list(map(over_count, alone)))}" in page
        assert min(map(over_count, alone)) > max(map(over_count, several))
    furthest = max(rows, key=over_count)
    assert furthest["K"] == 1 or furthest["drafter"] == "early-exit"


def test_the_side_by_side_and_the_results_index_quote_the_run():
    page = " ".join(section((REPO / "docs" / "DRAFTERS.md").read_text(encoding="utf-8"),
                            "Side by side: Spec-Bench in miniature").split())
    assert f"{len(BENCH['rows'])} rows" in page and f"a target decode step {BENCH['target_decode_ms']:.2f} ms" in page
    eagle_at_2 = [row["c"] for row in BENCH["rows"] if row["drafter"] == "eagle-chain" and row["K"] > 1]
    draft_at_2 = [row["c"] for row in BENCH["rows"] if row["drafter"] == "draft" and row["K"] > 1]
    assert f"c {span(eagle_at_2)} at the K of 2 or more it chose" in page and f"(c {span(draft_at_2)})" in page
    assert 1.5 < min(eagle_at_2) / max(draft_at_2) or 1.5 < statistics.median(eagle_at_2) / statistics.median(draft_at_2)
    assert f"(c {span(paid('early-exit') + paid('kangaroo'))}) for α" in page

    index = next(line for line in (RESULTS / "README.md").read_text(encoding="utf-8").splitlines()
                 if line.startswith("| `drafters_cpu_zen4.json`"))  # the results index says the same run
    assert f"{len(BENCH['settings']['drafters'])} drafters" in index
    assert f"{BENCH['wall_seconds'] / 60:.0f} minutes" in index


def test_the_d2_solution_says_how_near_the_count_lands():
    solution = " ".join((REPO / "notebooks" / "solutions" / "drafter_solutions.py").read_text(encoding="utf-8").split())
    shape = {"n_layer": 8, "n_embd": 384, "n_vocab": 4096, "exit_layer": 2}
    counted = {drafter: counted_weights(name, **shape) / counted_weights("target", **shape)
               for drafter, name in [("eagle-chain", "eagle"), ("early-exit", "early-exit"), ("kangaroo", "kangaroo")]}
    near = [row for row in BENCH["rows"] if row["drafter"] == "eagle-chain" and row["K"] > 1]
    assert near and all(abs(row["c"] / counted["eagle-chain"] - 1) < 1 / 5 for row in near)
    assert all(row["c"] > counted[row["drafter"]] for row in BENCH["rows"] if row["drafter"] in ("early-exit", "kangaroo"))
    assert ("within a fifth of the c notebook 11's loop paid for EAGLE wherever a loop drafts two tokens or more"
            in solution)


def results_read_by(notebook):  # -> the text of every committed result file its code names
    names = set(re.findall(r"\"([\w.-]+\.json)\"", "\n".join(cell.source for cell in notebook.cells
                                                            if cell.cell_type == "code")))
    return "\n".join((RESULTS / name).read_text() for name in sorted(names) if (RESULTS / name).is_file())


def unquoted_prose_numbers(notebook):
    """The decimals and percentages of the notebook's markdown that stand neither in its printed outputs nor in the
    committed results it reads."""
    printed = "\n".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                        for output in cell.get("outputs", []))
    sources = printed + "\n" + results_read_by(notebook)
    prose = re.sub(CITATION, "", "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown"))
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?!\.?\d)|\d+%", prose))
    return {number for number in numbers if not re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", sources)}


def test_notebook_11s_prose_quotes_only_what_it_printed_or_reads():
    notebook = nbformat.read(REPO / "notebooks" / "11_where_drafts_come_from.ipynb", as_version=4)
    assert not unquoted_prose_numbers(notebook)


def test_a_prose_number_nothing_printed_is_caught():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("c 0.056 and 2.75x, as in arXiv 2401.15077 section 2.3.2; 12% more"),
        nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", name="stdout", text="c 0.056, 2.75x\n")])])
    assert unquoted_prose_numbers(notebook) == {"12%"}
    notebook.cells[1].outputs[0]["text"] = "c 0.0561, 12.75x\n"  # a longer number is not the quoted one
    assert unquoted_prose_numbers(notebook) == {"0.056", "2.75", "12%"}


@pytest.mark.parametrize("name", ["5_when_it_pays.ipynb", "11_where_drafts_come_from.ipynb"])
def test_both_notebooks_read_the_committed_split(name):
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    assert "twin_width" in results_read_by(notebook)  # step_cost_cpu_zen4.json's text
    target = STEP_COST["steps"]["target"]
    printed = "\n".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                        for output in cell.get("outputs", []))
    assert f"{target['ms']:.2f}" in printed and f"{target['fixed_ms']:.2f}" in printed
    assert f"{target['fixed_share']:.0%}" in printed
