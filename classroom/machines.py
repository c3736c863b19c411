"""Speed across machines, as notebook 5 shows it: the bundled pair's default run on each CPU we measured it on,
read from the committed results, one row per CPU, beside the paper's shapes on a third CPU and the student's own.

Each row holds Leviathan et al.'s inputs, c (a draft step over a decode step), v(5) (scoring K + 1 = 5 tokens, in
decode steps) and alpha, with the measured speedup and the formula's speedup computed from those three: the same
pair, the same alpha, and a different v on each CPU explain why the default run gains on one machine and loses
on another.
"""

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from speedup.stats import expected_speedup, expected_tokens_per_loop

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
K = 4  # main.py's default
# the committed logs of `python main.py --K 4 --temperature 0 --json` and how many of their last runs are the
# current pair's (bench/results/README.md says which lines those are)
DEFAULT_RUN_LOGS = {"main.log": 3, "main_cpu_zen1.log": 3}
PAPER_SHAPES = "paper_shapes_cpu_xeon.json"  # GPT-2 124M drafting for 1558M's shape, random weights
PAPER_SHAPES_ALPHA = 0.8  # random weights accept nothing meaningful: the formula is read at an assumed alpha


@dataclass(frozen=True)
class Row:
    machine: str  # the CPU, its vector instructions or BLAS kernels
    pair: str
    c: float
    v5: float  # v(K + 1) at K = 4
    alpha: float
    measured: float | None  # the measured speedup; None where only the costs were measured

    @property
    def expected(self):  # the formula at this row's own c, v(5) and alpha
        return expected_speedup(self.alpha, self.c, K, self.v5)

    @property
    def break_even_v5(self):
        """The v(5) below which the default run pays at this c and alpha: a loop yields
        E[tokens per loop] tokens for K c + v(5) decode steps."""
        return expected_tokens_per_loop(self.alpha, K) - K * self.c

    def explain(self):
        """One sentence: the loop's price against what it yields, on this row's machine."""
        price = K * self.c + self.v5
        return (f"{self.machine}: a loop costs {K} x {self.c:.3f} + {self.v5:.2f} = {price:.2f} decode steps and "
                f"yields {expected_tokens_per_loop(self.alpha, K):.2f} tokens: {self.expected:.2f}x; it pays while "
                f"v(5) < {self.break_even_v5:.2f}")


def logged_runs(path):
    """[(comment, result)]: each JSON line of a log with the last '#' comment line above it."""
    runs, comment = [], ""
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            comment = line
        elif line.strip():
            runs.append((comment, json.loads(line)))
    return runs


def machine_in(comment):
    """The CPU a log's comment names: vendor, family, model, core and BLAS kernels, e.g.
    'AMD EPYC (family 23, model 1, Zen 1), Haswell kernels'."""
    vendor = re.search(r"AMD EPYC|Intel Xeon", comment)
    ids = re.search(r"family (\d+), model (\d+)", comment)
    core = re.search(r"Zen \d", comment)
    kernels = re.search(r"(\w+) kernels", comment)
    if not (vendor and ids and kernels):
        raise ValueError(f"the comment names no CPU and kernels: {comment!r}")
    core_text = f", {core.group()}" if core else ""
    return f"{vendor.group()} (family {ids[1]}, model {ids[2]}{core_text}), {kernels[1]} kernels"


def default_run_row(runs, machine, pair="bundled pair"):
    """One row from runs of main.py --json: the medians over the runs of c, v(5), alpha and the speedup."""
    speculative = [result["speculative"] for result in runs]
    if any(result["K"] != K for result in runs):
        raise ValueError(f"not the default run: K must be {K}")
    median = lambda key: statistics.median(run[key] for run in speculative)
    return Row(machine, pair, median("cost_ratio"), median("verify_steps"), median("acceptance_rate"),
               median("speedup"))


def committed_default_runs(results=RESULTS):
    """A row per committed log of the default run: its last runs, which must all name one machine."""
    rows = []
    for name, count in DEFAULT_RUN_LOGS.items():
        runs = logged_runs(Path(results) / name)[-count:]
        machines = {machine_in(comment) for comment, _ in runs}
        if len(machines) != 1:
            raise ValueError(f"{name}: the last {count} runs name {len(machines)} machines")
        rows.append(default_run_row([result for _, result in runs], machines.pop()))
    return rows


def paper_shapes_row(results=RESULTS, target="1558M", threads=1):
    """GPT-2 124M drafting for 1558M's shape (random weights) on the CPU bench/paper_shapes.py ran on: its
    measured c and v(5), the formula at an assumed alpha, no measured speedup."""
    summary = json.loads((Path(results) / PAPER_SHAPES).read_text())
    (run,) = [run for run in summary["results"] if run["engine"].startswith("gpt2") and run["target"] == target
              and run["threads"] == threads]
    cpu = re.sub(r"\(R\)| Processor", "", summary["machine"]["cpu"])  # 'Intel(R) Xeon(R) Processor' -> 'Intel Xeon'
    machine = f"{cpu}, {summary['machine']['blas']['kernels']} kernels"
    return Row(machine, f"124M -> {target} shapes", run["c"], run["v"][K], PAPER_SHAPES_ALPHA, None)


def card(rows):
    """The rows as a fixed-width table, the formula's speedup beside the measured one."""
    lines = [f"{'machine':<58} {'pair':<22} {'c':>6} {'v(5)':>6} {'alpha':>6} {'measured':>9} {'formula':>8}"]
    for row in rows:
        measured = f"{row.measured:.2f}x" if row.measured is not None else "-"
        lines.append(f"{row.machine:<58} {row.pair:<22} {row.c:6.3f} {row.v5:6.2f} {row.alpha:6.2f} "
                     f"{measured:>9} {row.expected:7.2f}x")
    return "\n".join(lines)
