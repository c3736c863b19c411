"""Execute the classroom notebooks in place, so that their committed outputs are fresh.

    python tools/make_notebooks.py --execute                        # every notebooks/*.ipynb
    python tools/make_notebooks.py --execute 4_why_lossless.ipynb   # only these
    python tools/make_notebooks.py                                  # report only: executed?, size

Each notebook runs top to bottom in a fresh kernel of this very Python (sys.executable), whatever
kernelspecs the machine has or lacks, with notebooks/ as its working directory, as Jupyter runs it.
A cell that raises stops the run and leaves the notebook on disk as it was; a finished notebook has
its pictures re-encoded with a 256-colour palette (a third of the bytes, no visible change, so the
committed notebooks stay small) and is written under a temporary name and renamed into place.
tests/test_notebooks.py runs the same `execute`. The notebooks themselves are the source: edit them
in Jupyter, then run this on a quiet machine: notebooks 2, 3, 5, 6 and 8 time things as they run, and where
other programs compete for a small CPU, BLAS threads can make multi-row calls many times slower.
"""

import argparse
import base64
import io
import json
import sys
import tempfile
import time
from pathlib import Path


import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from PIL import Image  # a dependency of matplotlib

REPO = Path(__file__).resolve().parents[1]
from checkpoints.atomic import write_atomically

NOTEBOOKS_DIR = REPO / "notebooks"
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
    """Run the notebook at path top to bottom; return the executed notebook (nothing is written).

    Raises nbclient's CellExecutionError, naming the cell, when a cell raises.
    """
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as spec_dir:
        client = NotebookClient(notebook, km=kernel_manager(spec_dir), timeout=timeout, record_timing=False,
                                resources={"metadata": {"path": str(Path(path).resolve().parent)}})
        client.execute()
    return join_streams(notebook)


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
    args = parser.parse_args()
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
            write_in_place(shrink_images(notebook), path)
            print(f"{path.name}: executed in {time.perf_counter() - start:.0f} s")
        print(describe(path))


if __name__ == "__main__":
    main()
