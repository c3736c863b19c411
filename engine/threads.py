"""Every core on one product: a weight matrix's columns cut into groups, each multiplied on its own thread.

A decode step of a large model streams every weight from memory once, and one core cannot draw all the
bandwidth a machine has. OpenBLAS can spread a product over its own threads, but its threads made scoring
several rows through a large model cost far more decode steps than one thread did, which makes speculative
sampling worthless (measured: bench/results/ENGINE.md, 'Threads').
So BLAS keeps one thread per call once a program opts into the measured layouts or sets --threads (THREADS.set
calls OpenBLAS's openblas_set_num_threads; importing this module changes nothing; one row of a large model aside,
see BlasThreaded below) and the split is ours: x @ w becomes x @ w[:, group] for a few
column groups at once, one on the calling thread and the rest on a small pool of Python threads (NumPy lets go
of the interpreter lock inside a product), and the groups' outputs are joined. Each output column is the same
dot product either way; only who computes it changes. The groups are views of the matrix as it is stored (row-
major, column-major or column panels): no copy. A hand-off wakes a sleeping thread, which costs tens of
microseconds: small beside a large matrix, not beside a small one (a pair of locks instead of the pool was no
faster; measured: bench/results/ENGINE.md, 'Threads').

Whether a split pays is measured, per matrix role and row count, with the layouts (measure.measure_plan):
for GPT-2 1558M nearly everywhere, for the bundled pair's small matrices rarely.

For one row BLAS's own threads can be faster still: OpenBLAS's idle threads spin instead of sleeping, so it
hands work over far sooner, and a decode step of a large model on BLAS's threads can beat our split. So
`BlasThreaded` is a third way to multiply, measured like the others: BLAS on THREADS.count threads for that one
product, and back to one thread after it. The spinning has a price: for a while after such a product OpenBLAS's
idle thread holds a core and slows a split product beside it. So a split product first shuts OpenBLAS's threads
down (once after a run of BLAS-threaded products), and a plan uses BLAS's threads in every matrix of a pass or in
none (measured: bench/results/ENGINE.md, 'BLAS threads for one row').
"""

import ctypes
import functools
import glob
import operator
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ALIGN = 32  # column groups start at multiples of 32 columns: whole column panels, whole cache lines of a row


def usable_cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def openblas_function(name, restype):
    """openblas_<name> (or OpenBLAS's internal <name>) of the OpenBLAS bundled in numpy.libs (already loaded by
    NumPy), or None where NumPy has no OpenBLAS of its own."""
    for library in glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*")):
        handle = ctypes.CDLL(library)
        for symbol in (f"scipy_openblas_{name}64_", f"scipy_openblas_{name}", f"openblas_{name}64_", f"openblas_{name}", name):
            if hasattr(handle, symbol):
                function = getattr(handle, symbol)
                function.restype = restype
                return function
    return None


def openblas_call(name, restype, *args):
    """openblas_<name>(*args), or None where NumPy has no OpenBLAS of its own."""
    function = openblas_function(name, restype)
    return None if function is None else function(*args)


def thread_count(count):  # None: every usable core; else checked
    count = usable_cores() if count is None else count
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"the number of threads must be a positive integer, got {count!r}")
    return count


class Threads:
    """How many threads a split product uses, and the pool that runs all groups but the caller's."""

    def __init__(self, count=None):  # count: as for set(); OpenBLAS is left as it is until set() is called
        self.count = thread_count(count)
        self.pool = ThreadPoolExecutor(self.count - 1, "product") if self.count > 1 else None  # starts no thread yet
        self.blas_awake = True  # whether OpenBLAS's own threads may be running (spinning when idle)
        set_threads = openblas_function("set_num_threads", None)
        self.blas_set = (lambda n: set_threads(ctypes.c_int(n))) if set_threads else None
        self.blas_start = openblas_function("blas_thread_init", ctypes.c_int)
        self.blas_stop = openblas_function("blas_thread_shutdown_", ctypes.c_int)

    @property
    def blas_threading(self):  # whether BlasThreaded can work here: NumPy's own OpenBLAS, and several threads
        return self.count > 1 and None not in (self.blas_set, self.blas_start, self.blas_stop)

    def use_blas_threads(self, wanted):
        """Start OpenBLAS's threads before BLAS-threaded products (so that none pays for starting them), or shut
        them down before anything else runs on the other cores (so that none spins beside it)."""
        if wanted != self.blas_awake and self.blas_stop is not None:
            (self.blas_start if wanted else self.blas_stop)()
            self.blas_awake = wanted

    def blas_product(self, x, w):  # x @ w on BLAS's own self.count threads, then BLAS back at one thread
        self.use_blas_threads(True)
        self.blas_set(self.count)
        try:
            return x @ w
        finally:
            self.blas_set(1)

    def set(self, count=None):
        """Use `count` threads (default: every usable core); 1 means no split anywhere. BLAS then runs one thread
        per call: its own threads would compete with ours (BlasThreaded uses them one product at a time)."""
        count = thread_count(count)
        if self.blas_set:
            self.blas_set(1)
        if count != self.count or self.pool is None and count > 1:
            if self.pool is not None:
                self.pool.shutdown()
            self.count, self.pool = count, ThreadPoolExecutor(count - 1, "product") if count > 1 else None
        return self

    def claim(self):
        """Take the cores as set() does, keeping the count: what measuring or using a plan does first."""
        return self.set(self.count)


THREADS = Threads()  # one pool per process, sized by the entry point (main.py --threads); nothing set at import


def column_groups(n_columns, n_groups, align=ALIGN):
    """[(start, stop)] cutting n_columns into at most n_groups near-equal runs, each starting at a multiple of align."""
    blocks = -(-n_columns // align)
    cuts = [min(n_columns, align * (blocks * i // n_groups)) for i in range(n_groups + 1)]
    return [(start, stop) for start, stop in zip(cuts, cuts[1:]) if stop > start]


class SplitMatrix:
    """w [n_in, n_out] (an array, or panels.ColumnPanels, cut between its panels) multiplied in n_groups column
    groups at once, on the calling thread and THREADS' pool.

    `x @ split` gives x @ w: the first group on the calling thread, the others on the pool, joined in order."""

    __array_ufunc__ = None  # makes NumPy hand `x @ split` to __rmatmul__

    def __init__(self, w, n_groups):
        self.shape, self.dtype = w.shape, w.dtype
        self.nbytes = 0  # views of w: no memory of its own
        self.groups = [w.columns(start, stop) if hasattr(w, "columns") else w[:, start:stop]
                       for start, stop in column_groups(w.shape[1], n_groups, getattr(w, "width", ALIGN))]

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        pool = THREADS.pool
        THREADS.use_blas_threads(False)  # an idle OpenBLAS thread would spin on a core our groups need
        if pool is None or len(self.groups) == 1:  # threads set to 1 after the split was built: same numbers, serially
            return np.concatenate([x @ group for group in self.groups], axis=1)
        others = [pool.submit(operator.matmul, x, group) for group in self.groups[1:]]
        first = x @ self.groups[0]
        return np.concatenate([first, *(product.result() for product in others)], axis=1)


class BlasThreaded:
    """w [n_in, n_out] (an array) multiplied by BLAS on all of THREADS' threads: `x @ blas_threaded` gives x @ w."""

    __array_ufunc__ = None  # makes NumPy hand `x @ blas_threaded` to __rmatmul__

    def __init__(self, w):
        self.w, self.shape, self.dtype, self.nbytes = w, w.shape, w.dtype, 0  # w's memory is w's

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        return THREADS.blas_product(x, self.w)
