"""Execute the classroom notebooks in place, so that their committed outputs are fresh.

    python tools/make_notebooks.py --execute                        # every notebooks/*.ipynb
    python tools/make_notebooks.py --execute 4_why_lossless.ipynb   # only these
    python tools/make_notebooks.py                                  # report only: executed?, size
    python tools/make_notebooks.py --plan                           # TEACHER.md's times table from the record

Each notebook runs top to bottom in a fresh kernel of this very Python (sys.executable), whatever
kernelspecs the machine has or lacks, with notebooks/ as its working directory, as Jupyter runs it.
A cell that raises stops the run and leaves the notebook on disk as it was; a finished notebook has
its pictures re-encoded with a 256-colour palette (a third of the bytes, no visible change, so the
committed notebooks stay small) and is written under a temporary name and renamed into place.
tests/test_notebooks.py runs the same `execute`. The notebooks themselves are the source: edit them
in Jupyter, then run this on a quiet machine: notebooks 2, 3, 5, 6 and 8 time things as they run, and where
other programs compete for a small CPU, BLAS threads can make multi-row calls many times slower.

Each execution records the notebook's seconds and its slow cells' (over SLOW_CELL_S, named by the section
they sit in) in notebooks/timings.json with the machine line, and rewrites the table of times in
notebooks/TEACHER.md from that record (tests/test_notebooks.py checks that they agree).
"""

import argparse
import base64
import io
import json
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from PIL import Image  # a dependency of matplotlib

from bench.machine import machine_line
from checkpoints.atomic import write_atomically

REPO = Path(__file__).resolve().parents[1]

NOTEBOOKS_DIR = REPO / "notebooks"
TIMINGS = NOTEBOOKS_DIR / "timings.json"
TEACHER = NOTEBOOKS_DIR / "TEACHER.md"
TABLE_START, TABLE_END = "<!-- times: tools/make_notebooks.py writes this table -->", "<!-- end of times -->"
SLOW_CELL_S = 10  # a cell that takes longer is named in the record: pre-run it, or show its committed output
SIZE_BUDGET_BYTES = 150_000  # per notebook, outputs included: small enough to read well on the web
CELL_TIMEOUT_S = 300
KERNEL_NAME = "kit-python"
# ipykernel's inline backend, even where the environment says MPLBACKEND=Agg: the pictures must be saved
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def kernel_manager(spec_dir):
    """A kernel manager for this Python, from a kernelspec written into spec_dir."""
    kernel_dir = Path(spec_dir) / KERNEL_NAME
    kernel_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", "--log-level=ERROR"],
            "display_name": "Python 3", "language": "python", "env": {"MPLBACKEND": INLINE_BACKEND}}
    (kernel_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir)])
    return AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def execute(path, timeout=CELL_TIMEOUT_S):
    """Run the notebook at path top to bottom; return the executed notebook (nothing is written), each code
    cell's seconds in its metadata's "seconds" until `take_timings` takes them out.

    Raises nbclient's CellExecutionError, naming the cell, when a cell raises.
    """
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as spec_dir:
        client = NotebookClient(notebook, km=kernel_manager(spec_dir), timeout=timeout, record_timing=True,
                                resources={"metadata": {"path": str(Path(path).resolve().parent)}})
        client.execute()
    for cell in notebook.cells:  # nbclient's timestamps, kept as seconds only (they would change every run)
        stamps = cell.metadata.pop("execution", None)
        if stamps and "shell.execute_reply" in stamps and "iopub.execute_input" in stamps:
            start, end = (datetime.fromisoformat(stamps[key].replace("Z", "+00:00"))
                          for key in ("iopub.execute_input", "shell.execute_reply"))
            cell.metadata["seconds"] = round((end - start).total_seconds(), 1)
    return join_streams(notebook)


def take_timings(notebook):
    """{"seconds": the code cells' total, "slow_cells": [{"section", "seconds"}]}, the cells' seconds taken out
    of their metadata. A slow cell is named by the last heading above it."""
    section, total, slow = "the top", 0.0, []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            headings = re.findall(r"^#+ (.+)$", cell.source, flags=re.MULTILINE)
            section = headings[-1].strip() if headings else section
        seconds = cell.metadata.pop("seconds", None)
        if seconds is not None:
            total += seconds
            if seconds > SLOW_CELL_S:
                slow.append({"section": section, "seconds": seconds})
    return {"seconds": round(total), "slow_cells": slow}


def record_timings(name, timings, path=TIMINGS):
    """Keep one notebook's timings in the record; a record made on another machine starts afresh."""
    record = json.loads(path.read_text()) if path.is_file() else {}
    line = machine_line()
    if record.get("machine") != line:
        record = {"machine": line, "notebooks": {}}
    record["notebooks"][name] = timings
    record["notebooks"] = dict(sorted(record["notebooks"].items(), key=lambda item: int(item[0].split("_")[0])))
    write_atomically(path, (json.dumps(record, indent=1) + "\n").encode())
    return record


def times_table(record, names):
    """TEACHER.md's table: each notebook's time and its slow cells on the record's machine."""
    machine = record.get("machine")
    rows = [f"Recorded on {machine[len('machine: '):] if machine else 'no machine yet'}.", "",
            "| Notebook | Time | Slow cells |", "|---|---|---|"]
    for name in names:
        timings = record.get("notebooks", {}).get(name)
        if timings is None:
            rows.append(f"| {name} | not recorded | |")
            continue
        slow = "; ".join(f"\"{cell['section']}\" {cell['seconds']:.0f} s" for cell in timings["slow_cells"])
        rows.append(f"| {name} | {timings['seconds']} s | {slow or 'none over ' + str(SLOW_CELL_S) + ' s'} |")
    return "\n".join(rows)


def write_times_table(record, teacher=TEACHER):
    """Replace the table between TEACHER.md's markers with the record's."""
    text = teacher.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    names = sorted((path.name for path in NOTEBOOKS_DIR.glob("*.ipynb")), key=lambda name: int(name.split("_")[0]))
    write_atomically(teacher, (text[:start] + "\n" + times_table(record, names) + "\n" + text[end:]).encode())


def join_streams(notebook):
    """Join each cell's consecutive outputs to the same stream into one, as Jupyter shows them: the kernel
    may send one print in pieces (a busy machine flushes between them), and a line such as the last cell's
    'checks: {...}' must stay whole for the tests to read it."""
    for cell in notebook.cells:
        joined = []
        for output in cell.get("outputs", []):
            previous = joined[-1] if joined else None
            if (output.get("output_type") == "stream" and previous is not None
                    and previous.get("output_type") == "stream" and previous.get("name") == output.get("name")):
                previous["text"] += output["text"]
            else:
                joined.append(output)
        if "outputs" in cell:
            cell["outputs"] = joined
    return notebook


def shrink_images(notebook):
    """Re-encode every PNG output with a 256-colour palette; plots use few colours, so nothing shows."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                image = Image.open(io.BytesIO(base64.b64decode(data["image/png"])))
                buffer = io.BytesIO()
                image.convert("RGB").quantize(256).save(buffer, format="png", optimize=True)
                data["image/png"] = base64.b64encode(buffer.getvalue()).decode("ascii")
    return notebook


def write_in_place(notebook, path):
    text = nbformat.writes(notebook)
    write_atomically(path, (text if text.endswith("\n") else text + "\n").encode("utf-8"))  # as nbformat.write


def describe(path):
    """One line: executed or not, error outputs, image count, size against the budget."""
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [output for cell in code for output in cell.get("outputs", [])]
    executed = all(cell.get("execution_count") is not None for cell in code)
    errors = sum(output.get("output_type") == "error" for output in outputs)
    images = sum("image/png" in output.get("data", {}) for output in outputs)
    size = Path(path).stat().st_size
    over = " OVER BUDGET" if size > SIZE_BUDGET_BYTES else ""
    return (f"{Path(path).name}: {'executed' if executed else 'NOT executed'}, {errors} errors, {images} images, "
            f"{size / 1000:.0f} KB of {SIZE_BUDGET_BYTES / 1000:.0f}{over}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="file names in notebooks/ (default: all)")
    parser.add_argument("--execute", action="store_true", help="execute in place (otherwise only report)")
    parser.add_argument("--plan", action="store_true", help="rewrite TEACHER.md's table of times from the record")
    args = parser.parse_args()
    if args.plan:
        write_times_table(json.loads(TIMINGS.read_text()) if TIMINGS.is_file() else {})
        return
    paths = [NOTEBOOKS_DIR / name for name in args.notebooks] or sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        sys.exit(f"error: no such notebook: {', '.join(missing)}")
    for path in paths:
        if args.execute:
            start = time.perf_counter()
            try:
                notebook = execute(path)
            except Exception as error:  # nbclient's error names the cell and holds the traceback
                sys.exit(f"error: {path.name} failed, left unchanged:\n{error}")
            timings = take_timings(notebook)
            write_in_place(shrink_images(notebook), path)
            write_times_table(record_timings(path.name, timings))
            print(f"{path.name}: executed in {time.perf_counter() - start:.0f} s, its cells {timings['seconds']} s")
        print(describe(path))


if __name__ == "__main__":
    main()
