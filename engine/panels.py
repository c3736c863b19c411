"""Panels: a weight matrix stored, or viewed, as a stack of narrow column blocks, for engine/layouts.py.

A product of several rows x[m, n_in] @ w[n_in, n_out] with a plain layout makes OpenBLAS pack all of w first,
which costs several times one row's product when w does not fit in cache; the same product over a stack of
narrow column panels packs each panel while it is in cache. ColumnPanels copies w into such a stack;
ColumnMajorPanels reads a column-major w as one, without a copy. Both give x @ w, the same numbers.
"""

import numpy as np

PANEL_WIDTH = 32  # columns per panel; why 32, measured, in ColumnPanels
COLUMN_PANEL_WIDTH = 16  # columns per panel of a column-major matrix; why 16, measured, in ColumnMajorPanels


class ColumnPanels:
    """A weight matrix w [n_in, n_out] stored as contiguous column panels [n_out / 32, n_in, 32].

    `x @ panels` gives x @ w (the same numbers). Why: OpenBLAS copies ("packs") the whole right-hand matrix
    before a product of several rows, and a layer's weight matrix does not fit in cache, so with a plain
    layout scoring m = 2 to 16 new tokens can cost 3-4 times one token: packing, not arithmetic. One
    np.matmul over a stack of panels packs each panel while it is in cache. Measured on an AMD EPYC with
    AVX2 (OpenBLAS's Haswell kernels, one thread) over GPT-2 124M's weight shapes, as multiples of a plain
    single-row step:

        rows m          1     2     3     4     5     8
        plain          1.00  2.5-2.7  2.8  2.5  2.9-3.1  3.1-3.5
        panels of 16   0.93  0.89  1.26  1.37  1.58  1.69
        panels of 32   0.96  0.75  0.96  0.97  1.15  1.17
        panels of 64   1.09  0.70  0.92  0.75  0.96  1.59

    Sixteen-wide panels cost more for every block, 64-wide ones are slow on one row and on eight; 32 is
    the best all round. On an AMD Zen 5 with OpenBLAS's AVX-512 kernels, the whole 124M model: 16 wide
    1.86 at 5 rows, 1.58 at 6, 2.03 at 8; 32 wide 1.37, 1.14, 1.40; 64 wide 1.10, 1.41, 1.43. On an AMD
    Zen 3 (Haswell kernels by OpenBLAS's own choice) panels help the output projection and little else:
    that is why the layout is measured, role by role, on the machine at hand.
    """

    __array_ufunc__ = None  # makes NumPy hand `x @ panels` to __rmatmul__ instead of trying to convert us

    def __init__(self, w, width=PANEL_WIDTH):  # [n_in, n_out]
        n_in, self.n_out = w.shape
        n_panels = -(-self.n_out // width)
        padded = np.zeros((n_in, n_panels * width), w.dtype)  # zero columns fill the last panel
        padded[:, :self.n_out] = w
        self.panels = np.ascontiguousarray(padded.reshape(n_in, n_panels, width).transpose(1, 0, 2))
        self.shape, self.dtype, self.nbytes, self.width = w.shape, self.panels.dtype, self.panels.nbytes, width

    def columns(self, start, stop):
        """Columns start..stop (start a multiple of the width) as panels of their own: a view, no copy."""
        part = object.__new__(ColumnPanels)
        part.panels, part.width = self.panels[start // self.width:-(-stop // self.width)], self.width
        part.n_out, part.shape, part.dtype, part.nbytes = stop - start, (self.shape[0], stop - start), self.dtype, 0
        return part

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        out = np.matmul(x, self.panels)  # [n_panels, m, width], each panel packed while it is in cache
        return out.transpose(1, 0, 2).reshape(len(x), -1)[:, :self.n_out]


class ColumnMajorPanels:
    """A column-major matrix w [n_in, n_out] multiplied as a stack of 16-column panels: a view of w, no copy.

    Column-major, each column of w is contiguous, so 16 neighbouring columns are one contiguous [16, n_in]
    block, which BLAS reads as a transposed [n_in, 16] panel. One np.matmul over the stack packs each panel while
    it is in cache, as ColumnPanels does, and one row reads the matrix front to back, as column-major does.
    Measured on an Intel Xeon (family 6, AVX-512, OpenBLAS's SkylakeX kernels), 8 layers of GPT-2 1558M's
    matrices, one row on one thread: 15.5 GB/s (ColumnPanels 12-13); 5 rows cost 1.2 single rows (column-major
    alone 2.6). On two threads (engine/threads.py), mlp.c_proj [6400, 1600]: one row 29 GB/s, 5 rows 1.14 and 8
    rows 1.32 with 16 columns; 32 columns, a 0.8 MB panel, cost 2.3 at 5 rows; 8 columns read one row as fast.
    """

    __array_ufunc__ = None  # makes NumPy hand `x @ panels` to __rmatmul__

    def __init__(self, w, width=COLUMN_PANEL_WIDTH):  # w: column-major [n_in, n_out]
        n_in, n_out = w.shape
        whole = n_out // width * width
        self.w, self.width, self.shape, self.dtype, self.nbytes = w, width, w.shape, w.dtype, 0  # w's memory is w's
        self.panels = w[:, :whole].T.reshape(-1, width, n_in).transpose(0, 2, 1)  # [n_panels, n_in, width], views
        self.tail = w[:, whole:] if whole < n_out else None  # the last n_out % width columns, multiplied as they lie

    def columns(self, start, stop):  # columns start..stop as panels of their own: a view
        return ColumnMajorPanels(self.w[:, start:stop], self.width)

    def __rmatmul__(self, x):  # [m, n_in] @ [n_in, n_out] -> [m, n_out]
        out = np.matmul(x, self.panels).transpose(1, 0, 2).reshape(len(x), -1)  # [n_panels, m, width] -> [m, whole]
        return out if self.tail is None else np.concatenate([out, x @ self.tail], axis=1)
