"""GIL-free BLAS on host arrays: scipy.linalg.cython_blas function pointers called through ctypes.

scipy.linalg.blas (f2py) holds the GIL for the whole call, which would stall every other worker thread;
ctypes releases it around a foreign call. The pointers are scipy's own BLAS (LP64 ints), so the library
that numpy/scipy users already trust computes every tile; ``gemm`` and ``rank_k`` cut calls whose sizes or
leading dimensions exceed 32-bit ints (hybridblas.int_limits).
"""
import ctypes

import numpy as np
from scipy.linalg import cython_blas

from . import int_limits
from .problem import OP_CHAR, T, leading_dim

_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}
_REAL = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_ARGC = {"gemm": 13, "herk": 10, "syrk": 10, "her2k": 12, "syr2k": 12, "trmm": 11}
_cache = {}


def routine(prefix, name):
    """scipy's BLAS routine ``prefix + name`` (e.g. "d", "gemm") as a ctypes function that releases the
    GIL; every argument is passed by address, Fortran style."""
    key = prefix + name
    fn = _cache.get(key)
    if fn is None:
        capsule = cython_blas.__pyx_capi__[key]
        address = _get_pointer(capsule, _get_name(capsule))
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * _ARGC[name]))   # releases the GIL
        fn = _cache[key] = proto(address)
    return fn


class Args:
    """Keeps the scalar buffers alive for the duration of one foreign call."""
    __slots__ = ("keep",)

    def __init__(self):
        self.keep = []

    def char(self, c):
        buf = ctypes.c_char(c.encode())
        self.keep.append(buf)
        return ctypes.addressof(buf)

    def int(self, v):
        buf = int_limits.c_int(v)
        self.keep.append(buf)
        return ctypes.addressof(buf)

    def scalar(self, v, dtype):
        buf = np.array([v], dtype=dtype)
        self.keep.append(buf)
        return buf.ctypes.data


_SCRATCH = int_limits.Scratch(lambda: (np, None))


def gemm(c, alpha, x, y, beta):
    """c <- alpha op(x) op(y) + beta c, with x, y Operands and c a column-major view, of any size."""
    int_limits.gemm(_gemm, _SCRATCH, c, alpha, x, y, beta)


def rank_k(kind, c, lower, alpha, factors, beta):
    """Native herk/syrk/her2k/syr2k on a diagonal block of any size; factors share one op (N, or C/T)."""
    int_limits.rank_k(_rank_k, _gemm, _SCRATCH, kind, c, lower, alpha, factors, beta)


def _gemm(c, alpha, x, y, beta):
    """One ?gemm call: every size and leading dimension fits in 32 bits."""
    m, n = c.shape
    k = x.cols
    if m == 0 or n == 0:
        return
    g = Args()
    dt = c.dtype
    routine(_PREFIX[dt], "gemm")(
        g.char(OP_CHAR[x.op]), g.char(OP_CHAR[y.op]), g.int(m), g.int(n), g.int(k),
        g.scalar(alpha, dt), x.base.ctypes.data, g.int(leading_dim(x.base)),
        y.base.ctypes.data, g.int(leading_dim(y.base)),
        g.scalar(beta, dt), c.ctypes.data, g.int(leading_dim(c)))


def _rank_k(kind, c, lower, alpha, factors, beta):
    """One ?herk/?syrk/?her2k/?syr2k call: every size and leading dimension fits in 32 bits."""
    n = c.shape[0]
    if n == 0:
        return
    dt = c.dtype
    first = factors[0]
    k = first.cols
    trans = "N" if not (first.op & T) else ("C" if kind.startswith("her") else "T")
    g = Args()
    real = _REAL.get(dt, dt)
    alpha_t = real if kind == "herk" else dt
    beta_t = real if kind in ("herk", "her2k") else dt
    args = [g.char("L" if lower else "U"), g.char(trans), g.int(n), g.int(k), g.scalar(alpha, alpha_t)]
    for f in factors:
        args += [f.base.ctypes.data, g.int(leading_dim(f.base))]
    args += [g.scalar(beta, beta_t), c.ctypes.data, g.int(leading_dim(c))]
    routine(_PREFIX[dt], kind)(*args)
