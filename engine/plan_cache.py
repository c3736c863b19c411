"""A measured layout plan kept on disk, per machine, so that only a machine's first run pays for measuring.

The plan measure.py chooses holds for one CPU (its model), one BLAS (its version, build and kernels), one thread
count and one set of weight shapes: `machine_key` names all of them, and a plan is kept in a JSON file of the
user's cache folder ($SPECULATIVE_KIT_CACHE, else $XDG_CACHE_HOME or ~/.cache, then speculative-sampling-kit)
named by a hash of its key. A file that is unreadable, or whose key differs from the one asked for (an older
VERSION, another machine's copy), is ignored and rewritten; writes are atomic (checkpoints/atomic.py).
"""

import hashlib
import json
import os
import platform
from pathlib import Path

import numpy as np

from checkpoints.atomic import write_atomically
from engine.layouts import ModelPlan

VERSION = 1  # raised when how a plan is measured or chosen changes: every older file is then stale
CPU_FIELDS = ("vendor_id", "model name", "cpu family", "model")  # /proc/cpuinfo's lines naming the CPU


def cache_folder():
    """Where measured plans are kept: $SPECULATIVE_KIT_CACHE, else speculative-sampling-kit in the user's cache."""
    if os.environ.get("SPECULATIVE_KIT_CACHE"):
        return Path(os.environ["SPECULATIVE_KIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "speculative-sampling-kit"


def cpuinfo_fields(path="/proc/cpuinfo"):  # -> {field: value} of the first core listed, or None where unreadable
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_identity():  # -> the fields of /proc/cpuinfo naming the CPU, or what platform knows elsewhere
    fields = cpuinfo_fields()
    if fields is None:
        return {"machine": platform.machine(), "processor": platform.processor()}
    return {name: fields.get(name) for name in CPU_FIELDS}


def blas_identity():  # -> NumPy's BLAS: its name, version and build, and the kernels OpenBLAS may be told to use
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return {"numpy": np.__version__, "name": blas.get("name"), "version": blas.get("version"),
            "configuration": blas.get("openblas configuration"), "coretype": os.environ.get("OPENBLAS_CORETYPE")}


def machine_key(shapes, memory_bytes):
    """What a measured plan depends on: shapes holds every weight matrix's shape by role and the thread count."""
    return {"version": VERSION, "cpu": cpu_identity(), "blas": blas_identity(), "memory_bytes": memory_bytes,
            "shapes": [list(shape) if isinstance(shape, tuple) else shape for shape in shapes]}


def plan_path(key):
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_folder() / f"layout-plan-{digest}.json"


def load(key):
    """The plan kept for this key, or None (none kept, unreadable, or kept for another key)."""
    try:
        kept = json.loads(plan_path(key).read_text())
        return ModelPlan.from_dict(kept["plan"]) if kept["key"] == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(key, plan):
    """Keep plan for this key (where the cache folder cannot be written, the plan is only not kept); -> plan."""
    path = plan_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"key": key, "plan": plan.as_dict(digits=None)}).encode())
    except OSError:
        pass
    return plan
