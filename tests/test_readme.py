"""What the README tells a newcomer holds: its Python example runs, its sample of main.py's report is
what main.py prints, its dependency split is what main.py imports, and it names only things a reader
can find."""

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
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


def test_the_python_api_example_runs_as_written():
    (example,) = re.findall(r"```python\n(.*?)```", section(README, "Python API"), re.S)
    result = run_python(example)
    assert result.returncode == 0, result.stderr  # its last line asserts that greedy speculative == autoregressive
    text, stats = result.stdout.rstrip("\n").rsplit("\n", 1)
    assert stats.startswith("SpeculativeStats(loops=") and "acceptance_rate=" in stats and "origins" not in stats
    assert text.strip()


def test_the_batching_example_runs_as_written():
    (example,) = re.findall(r"```python\n(.*?)```", section(README, "Several sequences at once"), re.S)
    result = run_python(example)
    assert result.returncode == 0, result.stderr
    *rows, calls = result.stdout.rstrip("\n").split("\n")
    assert len(rows) >= 3 and calls.endswith(" batched target calls") and int(calls.split()[0]) > 0


def test_the_sample_report_lines_are_what_main_prints():
    command = re.search(r"\(`python main.py (--K 4 --temperature 0)`", README)
    sample = re.search(r"\n\n((?:    the same tokens.*\n)(?:    .*\n)*)", README[command.end():])[1]
    result = subprocess.run([sys.executable, str(REPO / "main.py"), *command[1].split(), "--repeats", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = [line.strip() for line in result.stdout.splitlines()]
    for line in sample.splitlines():
        assert line.strip() in printed


def test_main_py_needs_only_the_runtime_requirements():
    assert requirement_names("requirements.txt") == ["numpy", "tqdm", "fire", "regex"]
    assert "jax" in requirement_names("requirements-jax.txt")
    dev = (REPO / "requirements-dev.txt").read_text()
    assert "-r requirements-jax.txt" in dev and "-r requirements.txt" in (REPO / "requirements-jax.txt").read_text()
    assert {"pytest", "jax", "torch", "transformers", "tiktoken"} <= set(requirement_names("requirements-dev.txt"))
    assert "notebook" in requirement_names("requirements-notebooks.txt")
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
                                  "requirements-notebooks.txt", "tests/fixtures/gpt2-vocab/README.md"])
def test_the_docs_name_only_what_a_reader_can_find(path):
    text = (REPO / path).read_text(encoding="utf-8")
    for pattern in UNFINDABLE:
        assert not re.search(pattern, text), f"{path}: {re.search(pattern, text)[0]!r}"


def test_the_documents_stay_short():
    for path in ("README.md", "models/README.md"):
        lines = (REPO / path).read_text(encoding="utf-8").count("\n")
        assert lines <= 400, f"{path} has {lines} lines; history belongs in docs/HISTORY.md or models/HISTORY.md"
    results = [path.name for path in (REPO / "bench" / "results").iterdir() if path.is_file()]
    assert "README.md" in results and len(results) <= 30, f"{len(results)} files: move earlier stages to history/"


@pytest.mark.parametrize("path", ["README.md", "models/README.md", "bench/results/README.md", "docs/HISTORY.md",
                                  "models/HISTORY.md", "bench/README.md"])
def test_the_results_files_the_docs_name_exist(path):
    text = (REPO / path).read_text(encoding="utf-8")
    named = set(re.findall(r"bench/results/[\w./*-]*\w", text))
    if path == "bench/results/README.md":  # its tables name the files beside it
        named |= {f"bench/results/{name}" for name in re.findall(r"^\| `([\w.-]+\.(?:json|log))` \|", text, re.M)}
    assert named
    for name in named:
        assert list(REPO.glob(name)), f"{path} names {name}, which is not in the repository"


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
