"""Array-module helpers: numpy on the CPU, cupy on a GPU (imported lazily, only when used)."""
import time

import numpy as np


def module_of(a):
    """numpy or cupy, whichever owns ``a``."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def is_device(a):
    return type(a).__module__.startswith("cupy")


def to_host(a):
    return a.get() if is_device(a) else np.asarray(a)


def column_sumsq(block):
    """Sum of squares of each column of a tall real block, as a float64 host array.

    On a GPU, cupy's reduction over axis 0 of a C-ordered n x 8 block gives one thread block per column
    and took 11 ms at n = 1.96e6 (48Cr, H200); a product with a vector of ones runs at bandwidth."""
    if not is_device(block):
        return np.einsum("ij,ij->j", block, block, dtype=np.float64)
    if block.shape[0] == 0:
        return np.zeros(block.shape[1])
    import cupy
    sq = block.astype(np.float64)
    sq *= sq
    return (cupy.ones(block.shape[0], dtype=np.float64) @ sq).get()


def row_major(x):
    """Rows at a leading dimension, unit stride along a row (e.g. a column range of a row-major buffer):
    the layout BLAS, cuBLAS and cisolver's row kernels read in place."""
    return (x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == x.itemsize) and x.strides[0] >= 0
            and x.strides[0] % x.itemsize == 0 and (x.shape[0] <= 1 or x.strides[0] >= x.shape[1] * x.itemsize))


def row_stride(x):
    """Elements between the starts of consecutive rows of a row-major block (its leading dimension)."""
    return max(x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1], 1)


def synchronize(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


class Timer:
    """Accumulates wall seconds per named phase; syncs the device so GPU time is charged correctly.

    ``phase("dense", "rayleigh_ritz")`` charges both "dense" and "dense:rayleigh_ritz"."""

    def __init__(self, xp=np):
        self.xp = xp
        self.seconds = {}

    def phase(self, name, part=None):
        timer = self
        names = [name] if part is None else [name, f"{name}:{part}"]

        class _Phase:
            def __enter__(self):
                synchronize(timer.xp)
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                synchronize(timer.xp)
                took = time.perf_counter() - self.t0
                for key in names:
                    timer.seconds[key] = timer.seconds.get(key, 0.0) + took
        return _Phase()
