"""What a benchmark ran on: the CPU (with its family, which the model name alone may not say) and NumPy's BLAS.

Speed on the CPU depends on both: the same code verifies K + 1 tokens at about one decode step's price on
one CPU and at two on another (docs/SPEED.md), so every result records them.
"""

import ctypes
import os
import platform
from pathlib import Path

import numpy as np

from engine.plan_cache import cpuinfo_fields
from engine.threads import openblas_call, usable_cores


def cpu_model(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's model name, with its family and model numbers where /proc/cpuinfo gives them."""
    fields = cpuinfo_fields(cpuinfo_path)
    if fields is None:
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


def instruction_set(flags):
    """The widest vector instructions among the CPU's flags that decide which BLAS kernels can run."""
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("asimd", "NEON")):
        if flag in flags:
            return name
    return platform.machine() or "unknown"


def machine_line(cpuinfo_path="/proc/cpuinfo"):
    """One line naming what a timing ran on, the same for every notebook run on one machine, e.g.
    'machine: AMD EPYC (family 25, model 17, AVX-512), scipy-openblas 0.3.31 SkylakeX kernels, 2 cores'."""
    name, isa = cpu_model(cpuinfo_path), instruction_set(cpu_flags(cpuinfo_path))
    cpu = name[:-1] + f", {isa})" if name.endswith(")") else f"{name} ({isa})"
    blas = blas_info()
    kernels = f" {blas['kernels']} kernels" if blas["kernels"] else ""
    forced = f" (OPENBLAS_CORETYPE={blas['OPENBLAS_CORETYPE']})" if blas["OPENBLAS_CORETYPE"] else ""
    return f"machine: {cpu}, {blas['name']} {blas['version']}{kernels}{forced}, {usable_cores()} cores"
