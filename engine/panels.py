"""Panels: a weight matrix stored, or viewed, as a stack of narrow column blocks, for engine/layouts.py.

A product of several rows x[m, n_in] @ w[n_in, n_out] with a plain layout makes OpenBLAS pack all of w first,
which costs several times one row's product when w does not fit in cache; the same product over a stack of
narrow column panels packs each panel while it is in cache. ColumnPanels copies w into such a stack;
ColumnMajorPanels reads a column-major w as one, without a copy. Both give x @ w, the same numbers.
"""

import numpy as np

PANEL_WIDTH = 32  # columns per panel: the best all round, from one row to eight (why, in ColumnPanels)
COLUMN_PANEL_WIDTH = 16  # columns per panel of a column-major matrix: small enough to stay in cache (ColumnMajorPanels)


class ColumnPanels:
    """A weight matrix w [n_in, n_out] stored as contiguous column panels [n_out / 32, n_in, 32].

    `x @ panels` gives x @ w (the same numbers). Why: OpenBLAS copies ("packs") the whole right-hand matrix
    before a product of several rows, and a layer's weight matrix does not fit in cache, so with a plain
    layout scoring m = 2 to 16 new tokens can cost 3-4 times one token: packing, not arithmetic. One
    np.matmul over a stack of panels packs each panel while it is in cache. Narrower panels make more, smaller
    products, each paying a product's overhead; wider ones are slow on one row and no longer stay in cache for
    many rows: 32 columns is the best all round. How much panels help differs from CPU to CPU and from matrix
    to matrix (on some, only the output projection gains): that is why the layout is measured, role by role,
    on the machine at hand (measured: bench/results/ENGINE.md, 'Panel width').
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
    So one row reads faster than through ColumnPanels and several rows cost little more than one. Sixteen
    columns keep a panel of a large model's matrix small enough to stay in cache; twice as wide, the panel no
    longer does and several rows cost much more (measured: bench/results/ENGINE.md, 'Column panels').
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
