"""What a benchmark ran on: the CPU (with its family, which the model name alone may not say) and NumPy's BLAS.

Speed on the CPU depends on both: the same code verifies K + 1 tokens at about one decode step's price on
one CPU and at two on another (README, Speed), so every result records them.
"""

import ctypes
import os
import platform
from pathlib import Path

import numpy as np

from engine.threads import openblas_call


def cpu_model(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's model name, with its family and model numbers where /proc/cpuinfo gives them."""
    fields = {}
    try:
        for line in Path(cpuinfo_path).read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine() or "unknown"
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's feature flags (avx2, avx512f, ...) as /proc/cpuinfo lists them; empty where it cannot be read."""
    try:
        for line in Path(cpuinfo_path).read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def blas_info():
    """NumPy's BLAS as numpy.show_config reports it, plus the kernels and thread count it runs with, where
    they can be read, and the environment's OPENBLAS_CORETYPE (which overrides OpenBLAS's own choice)."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    info = {key: blas.get(key) for key in ("name", "version", "openblas configuration")}
    core = openblas_call("get_corename", ctypes.c_char_p)
    info["kernels"] = core.decode() if core else None  # which CPU's kernels OpenBLAS runs
    info["OPENBLAS_CORETYPE"] = os.environ.get("OPENBLAS_CORETYPE")
    info["threads"] = openblas_call("get_num_threads", ctypes.c_int)
    return info


def machine_line(cpuinfo_path="/proc/cpuinfo"):
    """One printable line naming what a timing ran on, as the notebooks print it before they time anything:
    'machine: <CPU (family F, model M)>, <n> cores; NumPy <version>, <BLAS> <version> running its <kernels> kernels'."""
    blas = blas_info()
    return (f"machine: {cpu_model(cpuinfo_path)}, {os.cpu_count()} cores; NumPy {np.__version__}, {blas['name']} "
            f"{blas['version']} running its {blas['kernels']} kernels")
