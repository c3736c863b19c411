"""blas_env: one OpenBLAS thread, and OpenBLAS's AVX-512 kernels on AMD CPUs with AVX-512, unless the caller
chose otherwise; and every entry point applies it before NumPy loads."""

import os

import pytest

import blas_env
from conftest import REPO

AVX2_ONLY = "fpu vme sse sse2 avx avx2 fma"
AVX512 = AVX2_ONLY + " avx512f avx512dq avx512bw avx512vl avx512_bf16"


def cpuinfo(tmp_path, vendor, flags):
    """A /proc/cpuinfo of two processors (only the first is read), as Linux writes it."""
    processor = f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: 26\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n"
    path = tmp_path / "cpuinfo"
    path.write_text(processor.format(0) + "\n" + processor.format(1))
    return path


@pytest.mark.parametrize("vendor, flags, expected", [("AuthenticAMD", AVX512, True), ("AuthenticAMD", AVX2_ONLY, False),
                                                     ("GenuineIntel", AVX512, False)])
def test_amd_with_avx512_reads_the_vendor_and_flags(tmp_path, vendor, flags, expected):
    assert blas_env.amd_with_avx512(cpuinfo(tmp_path, vendor, flags)) is expected


def test_no_cpuinfo_means_no_change(tmp_path):
    assert blas_env.amd_with_avx512(tmp_path / "missing") is False


@pytest.mark.parametrize("preset", [{}, {"OPENBLAS_NUM_THREADS": "2", "OPENBLAS_CORETYPE": "Haswell"}])
def test_configure_fills_in_only_what_the_caller_left_unset(monkeypatch, preset):
    for name in ["OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in preset.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(blas_env, "amd_with_avx512", lambda: True)
    blas_env.configure()
    assert os.environ["OPENBLAS_NUM_THREADS"] == preset.get("OPENBLAS_NUM_THREADS", "1")
    assert os.environ["OPENBLAS_CORETYPE"] == preset.get("OPENBLAS_CORETYPE", blas_env.AVX512_CORETYPE)


ENTRY_POINTS = ["main.py", "tests/conftest.py", "tools/make_notebooks.py", "bench/decode.py", "bench/pair.py",
                "bench/speculative.py", "bench/text_quality.py"]

THIRD_PARTY_IMPORTS = ("import numpy", "from numpy", "import gpt2", "import pytest", "import nbformat", "import jax")


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_entry_points_configure_before_numpy_loads(path):
    lines = (REPO / path).read_text().splitlines()
    configured = next(i for i, line in enumerate(lines) if line.startswith("blas_env.configure()"))
    # the first import that loads NumPy, or may (pytest's plugins, nbformat's dependencies)
    first_third_party = min(i for i, line in enumerate(lines) if line.startswith(THIRD_PARTY_IMPORTS))
    assert configured < first_third_party
