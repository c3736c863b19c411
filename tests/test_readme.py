"""What the README tells a newcomer holds: its commands are CI's, its Python example runs as a script from any
directory, its counts are what main.py reports, its map of Algorithm 2 points at code and notebook sections that
exist, its numbers are the committed JSON's, its dependency split is what main.py imports, and it and the pages in
docs/ name only things a reader can find."""

import json
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO
from drafters.heads import load_head, training_budget

README = (REPO / "README.md").read_text(encoding="utf-8")
DOC_PAGES = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "docs").glob("*.md"))
# words for things outside the repository that a reader cannot look up
UNFINDABLE = [r"(?i)\bseed reference", r"(?i)\bthe seed'?s\b", r"(?i)\bthe seeds\b", r"(?i)design card", r"\bGUIDE\b",
              r"(?i)\bissue \d+"]
# what only the extras install: `python main.py` must run without any of them
EXTRAS = ["jax", "jaxlib", "scipy", "torch", "transformers", "tiktoken", "pytest", "matplotlib", "nbclient",
          "nbformat", "ipykernel", "safetensors", "notebook"]


def section(text, heading):
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def run_python(code, *args):
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def requirement_names(path):
    names = []
    for line in (REPO / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            names.append(re.match(r"[A-Za-z0-9_.\-]+", line)[0].lower())
    return names


def run_as_script_outside_the_clone(example, tmp_path):
    """A README example saved as a script and run from an empty folder (the kit on PYTHONPATH, as
    `pip install -e .` puts it on sys.path): no module or file may be found through the current directory."""
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_the_python_api_example_runs_as_a_script_outside_the_clone(tmp_path):
    (example,) = re.findall(r"```python\n(.*?)```", section(README, "Python API"), re.S)
    result = run_as_script_outside_the_clone(example, tmp_path)
    assert result.returncode == 0, result.stderr  # its last line asserts that greedy speculative == autoregressive
    text, stats = result.stdout.rstrip("\n").rsplit("\n", 1)
    assert stats.startswith("SpeculativeStats(loops=") and "acceptance_rate=" in stats and "origins" not in stats
    assert text.strip()
    assert "print(stats)  # SpeculativeStats(loops=..., acceptance_rate=...)" in section(README, "Python API")


def test_the_batching_example_runs_as_a_script_outside_the_clone(tmp_path):
    (example,) = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "BATCHING.md").read_text(encoding="utf-8"), re.S)
    result = run_as_script_outside_the_clone(example, tmp_path)
    assert result.returncode == 0, result.stderr
    *rows, calls = result.stdout.rstrip("\n").split("\n")
    assert len(rows) >= 3 and calls.endswith(" batched target calls") and int(calls.split()[0]) > 0


def test_the_drafters_example_runs_as_a_script_outside_the_clone(tmp_path):
    """load_drafter finds the bundled heads beside the kit's code, not in the current directory."""
    (example,) = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "DRAFTERS.md").read_text(encoding="utf-8"), re.S)
    result = run_as_script_outside_the_clone(example, tmp_path)
    assert result.returncode == 0, result.stderr  # it asserts that EAGLE's chain and Medusa's tree are exact
    assert result.stdout.strip()


def test_the_fresh_machine_commands_are_what_ci_runs():
    first, tests, quick = re.findall(r"^    (.+)$", README[:README.index("\n## ")], re.M)[:3]
    assert first == "pip install -e . && python main.py --K 4 --temperature 0"
    assert tests == "pip install -r requirements-dev.txt && python -m pytest -q" and quick == "python -m pytest -q -m quick"
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install -q -r requirements-dev.txt" in ci and "-m pytest -q\n" in ci


def test_the_readme_counts_are_what_main_reports():
    """The README's counts for the default greedy run (the same every run) are main.py's own, read from --json so
    that the report's wording may change."""
    said = re.search(r"`python main.py (--K 4 --temperature 0)` \(greedy, so the same counts every run\) drafts (\d+)"
                     r"\s+tokens, accepts (\d+) and rejects (\d+); the other (\d+) were never judged.*?is (\d+) / \((\d+) \+ (\d+)\) = "
                     r"(\d\.\d+)", README, re.S)
    result = subprocess.run([sys.executable, str(REPO / "main.py"), *said[1].split(), "--repeats", "1", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout.strip().splitlines()[-1])["speculative"]
    assert [int(said[i]) for i in (2, 3, 4)] == [run["drafted"], run["accepted"], run["rejected"]]
    assert int(said[5]) == run["drafted"] - run["accepted"] - run["rejected"]
    assert [int(said[i]) for i in (6, 7, 8)] == [run["accepted"], run["accepted"], run["rejected"]]
    assert said[9] == f"{run['acceptance_rate']:.3f}"


def test_main_py_needs_only_the_runtime_requirements():
    assert requirement_names("requirements.txt") == ["numpy", "tqdm", "fire", "regex"]
    assert "jax" in requirement_names("requirements-jax.txt")
    dev = (REPO / "requirements-dev.txt").read_text()
    assert "-r requirements-jax.txt" in dev and "-r requirements.txt" in (REPO / "requirements-jax.txt").read_text()
    assert {"pytest", "jax", "torch", "transformers", "tiktoken"} <= set(requirement_names("requirements-dev.txt"))
    assert "notebook" in requirement_names("requirements-notebooks.txt")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]  # what `pip install -e .` installs
    assert [re.match(r"[A-Za-z0-9_.\-]+", name)[0] for name in project["dependencies"]] == requirement_names("requirements.txt")
    run = ("import json, runpy, sys; sys.argv = ['main.py', '--n_tokens_to_generate', '4', '--repeats', '1', '--json'];"
           "runpy.run_path('main.py', run_name='__main__'); print(json.dumps(sorted(sys.modules)))")
    result = run_python(run)
    assert result.returncode == 0, result.stderr
    imported = {name.split(".")[0] for name in json.loads(result.stdout.strip().splitlines()[-1])}
    assert "numpy" in imported and "fire" in imported
    assert imported.isdisjoint(EXTRAS), imported & set(EXTRAS)


@pytest.mark.parametrize("path", ["README.md", "notebooks/README.md", "main.py", "sampling.py", "classroom/lossless.py",
                                  "classroom/bug_zoo.py", "classroom/exercise_checks.py",
                                  "notebooks/solutions/exercise_solutions.py", "requirements.txt", "requirements-dev.txt", "requirements-jax.txt",
                                  "requirements-notebooks.txt", "tests/fixtures/gpt2-vocab/README.md", *DOC_PAGES])
def test_the_docs_name_only_what_a_reader_can_find(path):
    text = (REPO / path).read_text(encoding="utf-8")
    for pattern in UNFINDABLE:
        assert not re.search(pattern, text), f"{path}: {re.search(pattern, text)[0]!r}"


def test_the_documents_stay_short():
    """The README introduces (the reference pages in docs/ hold the rest), and no page grows without bound."""
    for path, limit in [("README.md", 255), ("models/README.md", 400), *[(page, 400) for page in DOC_PAGES]]:
        lines = (REPO / path).read_text(encoding="utf-8").count("\n")
        assert lines <= limit, f"{path} has {lines} lines; reference belongs in docs/, history in docs/HISTORY.md"
    results = [path.name for path in (REPO / "bench" / "results").iterdir() if path.is_file()]
    assert "README.md" in results and len(results) <= 30, f"{len(results)} files: move earlier stages to history/"


@pytest.mark.parametrize("path", ["README.md", "models/README.md", "bench/results/README.md", "docs/HISTORY.md",
                                  "docs/SPEED.md", "docs/DRAFTERS.md", "models/HISTORY.md", "bench/README.md"])
def test_the_results_files_the_docs_name_exist(path):
    text = (REPO / path).read_text(encoding="utf-8")
    named = set(re.findall(r"bench/results/[\w./*-]*\w", text))
    if path == "bench/results/README.md":  # its tables name the files beside it
        named |= {f"bench/results/{name}" for name in re.findall(r"^\| `([\w.-]+\.(?:json|log|md))` \|", text, re.M)}
    assert named
    for name in named:
        assert list(REPO.glob(name)), f"{path} names {name}, which is not in the repository"



def test_the_engine_links_name_sections_of_the_engine_notes():
    """engine/'s docstrings and comments keep the reason and link the measurement behind it: each link
    "bench/results/ENGINE.md, 'Section'" names a heading there, and each heading is linked from the code."""
    notes = (REPO / "bench" / "results" / "ENGINE.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (.+)$", notes, re.M))
    code = "".join(path.read_text(encoding="utf-8") for path in sorted((REPO / "engine").glob("*.py")))
    linked = set(re.findall(r"bench/results/ENGINE\.md,\s+(?:#\s+)?'([^']+)'", code))
    assert linked == headings, (linked ^ headings)


def card_row(heading):
    """The cells of the README's numbers card row that starts with `heading`."""
    row = re.search(rf"^\| {re.escape(heading)} \|(.*)\|$", section(README, "Speed"), re.M)[1]
    return [cell.strip() for cell in row.split("|")]


def test_the_numbers_card_is_the_committed_json():
    results = REPO / "bench" / "results"
    greedy = json.loads((results / "pair_cpu_zen4_stage14.json").read_text())
    assert card_row("K") == [str(row["K"]) for row in greedy["by_K"]]
    assert card_row("α, temperature 0") == [f"{row['acceptance_rate']:.3f}" for row in greedy["by_K"]]
    assert card_row("the formula, measured v") == [f"{row['median_expected_speedup']:.2f}x" for row in greedy["by_K"]]
    assert card_row("the formula, v = 1") == [f"{row['median_expected_speedup_one_step']:.2f}x" for row in greedy["by_K"]]
    measured = [cell.split()[0].strip("*") for cell in card_row("measured speedup (range over prompts)")]
    assert measured == [f"{row['median_speedup']:.2f}x" for row in greedy["by_K"]]
    sampled = json.loads((results / "pair_cpu_zen4_stage14_temperature1.json").read_text())
    alphas = [cell for cell in card_row("α, temperature 1") if cell]
    assert alphas == [f"{row['acceptance_rate']:.3f}" for row in sampled["by_K"]]
    assert "family 25, model 17" in greedy["machine"]["cpu"] and greedy["machine"]["blas"]["kernels"] == "SkylakeX"
    assert "family 25, model 17" in section(README, "Speed") and "SkylakeX" in section(README, "Speed")


def table_rows(text, heading):
    """The body rows of the first table in a README section, as lists of cells."""
    rows = re.findall(r"^\|(.*)\|$", section(text, heading), re.M)[2:]
    return [[cell.strip() for cell in row.split("|")] for row in rows]


def test_the_map_of_algorithm_2_points_at_what_exists():
    source = (REPO / "sampling.py").read_text(encoding="utf-8")
    loop = source[source.index("def speculative_sampling("):source.index("def greedy_assisted_generation(")]
    notebook = json.loads((REPO / "notebooks" / "3_speculative_step_by_step.ipynb").read_text(encoding="utf-8"))
    headings = {line.removeprefix("## ").strip() for cell in notebook["cells"] if cell["cell_type"] == "markdown"
                for line in "".join(cell["source"]).splitlines() if line.startswith("## ")}
    rows = table_rows(README, "Algorithm 2 in the code")
    assert len(rows) == 6
    for step, comment, calls, notebook_section in rows:
        assert comment.strip("`") in loop, f"sampling.speculative_sampling has no comment {comment}"
        for name in re.findall(r"`(\w+)`", calls):
            assert f"def {name}(" in source and f"{name}(" in loop, f"speculative_sampling does not call {name}"
        assert notebook_section.strip('"') in headings, f"notebook 3 has no section {notebook_section}"
    for quoted in re.findall(r'\("([^"]+)"\)', section(README, "Algorithm 2 in the code")):
        assert quoted in headings


def test_the_paper_table_holds_the_kit_s_committed_figures():
    """The kit's column is the numbers card's K = 4 (the committed JSON); the reference re-implementation's
    speedup is its two times' ratio; every number in Chen et al.'s column was checked against the paper by hand."""
    rows = {row[0]: row[1:] for row in table_rows(README, "The paper beside the kit")}
    greedy = json.loads((REPO / "bench" / "results" / "pair_cpu_zen4_stage14.json").read_text())
    at_4 = next(row for row in greedy["by_K"] if row["K"] == 4)
    kit = rows["time per token: target, draft"][1]
    assert kit == f"{at_4['decode_step_ms']:.2f} ms, {at_4['draft_step_ms']:.2f} ms"
    assert rows["K"] == ["4", "4", "4"]
    kit, reference = rows["speedup"][1:]
    assert kit.startswith(f"{at_4['median_speedup']:.2f}x ({greedy['n_prompts']} held-out prompts, greedy")
    assert greedy["temperature"] == 0 and "Zen 4" in rows["hardware"][1]
    slow, fast = map(float, re.search(r"\(([\d.]+) s against ([\d.]+) s", reference).groups())
    assert reference.startswith(f"{slow / fast:.2f}x")


def test_the_drafters_table_is_the_committed_benchmark():
    bench = json.loads((REPO / "bench" / "results" / "drafters_cpu_zen4.json").read_text())
    assert "family 25, model 17" in bench["machine"] and "bench/spec_bench.py" in bench["command"]
    rows = {(row["drafter"], row["category"], row["temperature"]): row for row in bench["rows"]}
    drafters = list(dict.fromkeys(row["drafter"] for row in bench["rows"]))
    table = table_rows(README, "Drafts from the target")
    assert len(table) == len(drafters) >= 6 and len({row["category"] for row in bench["rows"]}) >= 3
    cell = lambda row: f"{row['speedup']['median']:.2f}x ({row['predicted_speedup']:.2f}x)"
    for cells, drafter in zip(table, drafters):
        if (drafter, "open", 0) not in rows:  # a sampled tree: at temperature 0 p is one-hot, its drafts one chain
            assert cells[2:] == ["–"] * 5 + [cell(rows[(drafter, "open", 1)])] and "sampled" in drafter
            continue
        open_row = rows[(drafter, "open", 0)]
        assert cells[2:] == [f"{open_row['c']:.2f}", f"{open_row['alpha']:.2f}", cell(open_row),
                             cell(rows[(drafter, "copy", 0)]), cell(rows[(drafter, "structured", 0)]),
                             cell(rows[(drafter, "open", 1)])]
        head = {"eagle-chain": "eagle", "eagle3-chain": "eagle3", "medusa-chain": "medusa",
                "kangaroo": "kangaroo"}.get(drafter)
        if head:  # the budget beside the row: every run the head was continued from (drafters/heads.training_budget)
            budget = training_budget(load_head(REPO / "models" / f"teach-{head}")[1])
            assert cells[1] == f"{budget['steps']:,} steps, {budget['tokens'] / 1e6:.1f} M tokens, {budget['hours']:.1f} h"
