"""How NumPy's OpenBLAS should run the kit: set in the environment before NumPy is first imported.

    import blas_env
    blas_env.configure()  # before `import numpy`, by every entry point (main.py, bench/, tests/, tools/)

Neither setting overrides what the caller chose in the environment.
"""

import os

# OpenBLAS's AVX-512 kernels, for AMD CPUs that have AVX-512 (README, Speed: "Which OpenBLAS kernels")
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
AVX512_CORETYPE = "SkylakeX"


def configure():
    # One BLAS thread: on the 2-core machines we measured, a second OpenBLAS thread made a GPT-2 124M decode
    # step 22% faster when idle and 1.7x slower with one other busy process (README, Speed: "One BLAS thread").
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # OpenBLAS 0.3.31 (NumPy 2.4's) runs its AVX2 Haswell kernels on the AMD EPYC of family 26 (Zen 5) we
    # measured, which has AVX-512. There a GPT-2 124M call scoring 2 to 16 new tokens costs 2.1-3.1 decode
    # steps even in column panels; with its AVX-512 (SkylakeX) kernels 1.0-1.3 for 2 to 6, and the decode
    # step itself is no slower (bench/decode.py reports the kernels it ran with).
    if "OPENBLAS_CORETYPE" not in os.environ and amd_with_avx512():
        os.environ["OPENBLAS_CORETYPE"] = AVX512_CORETYPE


def amd_with_avx512(cpuinfo_path="/proc/cpuinfo"):
    """True on an AMD CPU whose flags include AVX-512 (Linux: read from /proc/cpuinfo; elsewhere False)."""
    try:
        with open(cpuinfo_path) as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        return False
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return fields.get("vendor_id") == "AuthenticAMD" and AVX512_FLAGS <= set(fields.get("flags", "").split())
