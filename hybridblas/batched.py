"""Batched matrix products of small blocks that live on one device: ``gemm_batched``.

    c[i] <- alpha a[i] @ b[i] + beta c[i]        for i in range(batch), b shared (2-D) or one per block (3-D)

Meant for many small products over strided views of one large array, e.g. the (N_G x N_L) blocks of a
FLAPW coefficient array taken as an (atoms, N_G, N_L) view, times one N_L x N_L matrix. On a GPU the whole
batch is one cuBLAS ``<t>gemmStridedBatched`` call on the caller's current stream, reading and writing the
views in place (CuPy's ``matmul`` copies strided operands and its result to contiguous temporaries first);
on the host it is numpy's ``matmul``. Arrays are numpy or CuPy, all of one kind (and one GPU); dtype one of
float32, float64, complex64, complex128, the same for all. Every argument is checked before anything is
written; with ``beta = 0`` c is not read (NaN there is overwritten), as in BLAS.
"""
import ctypes
from numbers import Number

import numpy as np

from .problem import _overlap, array_module

__all__ = ["gemm_batched"]

_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))
_INT_MAX = 2 ** 31 - 1


def gemm_batched(alpha, a, b, beta=0.0, c=None):
    """c[i] = alpha a[i] @ b[i] + beta c[i] (``b`` 2-D: the same b for every i); returns c.

    a: (batch, m, k); b: (k, n) or (batch, k, n); c: (batch, m, n), or None for a new C-ordered array (then
    beta must be 0). Views with any strides are taken as they are where each matrix has a unit stride along
    one of its two axes (others are copied first; c then receives the result by one copy). c must not
    overlap a or b, nor its own blocks one another."""
    xp = array_module(a, "a")
    for name, x in (("b", b), ("c", c)):
        if (x is not None or name == "b") and array_module(x, name) is not xp:
            raise TypeError(f"{name} must be a {xp.__name__} array like a, got {type(x).__module__}.{type(x).__name__}")
    if a.ndim != 3:
        raise ValueError(f"a must be 3-D (batch, m, k), got shape {a.shape}")
    if b.ndim not in (2, 3):
        raise ValueError(f"b must be 2-D (k, n) or 3-D (batch, k, n), got shape {b.shape}")
    batch, m, k = a.shape
    if b.shape[-2] != k or (b.ndim == 3 and b.shape[0] != batch):
        want = f"({k}, n)" if b.ndim == 2 else f"({batch}, {k}, n)"
        raise ValueError(f"b must have shape {want} for a of shape {a.shape}, got {b.shape}")
    n = b.shape[-1]
    dtype = a.dtype
    if dtype not in _DTYPES:
        raise TypeError(f"a must be float32, float64, complex64 or complex128, got {dtype}")
    if b.dtype != dtype:
        raise TypeError(f"b must have a's dtype {dtype}, got {b.dtype}")
    alpha, beta = _scalar(alpha, "alpha", dtype), _scalar(beta, "beta", dtype)
    if c is None:
        if beta != 0:
            raise ValueError(f"beta must be 0 when c is None (nothing to add to), got {beta!r}")
        c = xp.empty((batch, m, n), dtype=dtype)
    else:
        if c.shape != (batch, m, n):
            raise ValueError(f"c must have shape {(batch, m, n)}, got {c.shape}")
        if c.dtype != dtype:
            raise TypeError(f"c must have a's dtype {dtype}, got {c.dtype}")
        if xp is np and not c.flags.writeable:
            raise ValueError("c must be writeable, got a read-only array")
        if not _one_to_one(c.shape, c.strides, c.itemsize):
            raise ValueError(f"c's blocks overlap one another (shape {c.shape}, strides {c.strides})")
        for name, x in (("a", a), ("b", b)):
            how = _overlap(xp, c, x)
            if how:
                raise ValueError(f"c must not overlap {name}" + ("" if how == "shares" else
                                                                 " (the exact test would cost too much)"))
    if xp is not np:
        _check_device(a, b, c)
    if batch == 0 or m == 0 or n == 0:
        return c
    if k == 0 or alpha == 0:            # as in BLAS: a and b are not read
        _scale(c, beta)
        return c
    if xp is np:
        _host(alpha, a, b, beta, c)
    else:
        _device(alpha, a, b, beta, c)
    return c


def _scalar(value, name, dtype):
    """alpha or beta as a Python float (complex for complex data): a finite number; a complex value with a
    non-zero imaginary part only for complex data."""
    if isinstance(value, (bool, np.bool_)) or not (isinstance(value, Number) or getattr(value, "shape", None) == ()):
        raise TypeError(f"{name} must be a finite number, got {value!r:.60}")
    try:
        value = complex(value) if np.iscomplexobj(value) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name} must be a finite number, got {value!r:.60}") from None
    if not np.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    if isinstance(value, complex):
        if value.imag == 0:
            return value.real
        if dtype.kind != "c":
            raise TypeError(f"{name} must be real for {dtype} data, got {value!r}")
    return value


def _one_to_one(shape, strides, itemsize):
    """True where no two elements of the view share memory: along the axes sorted by stride, each stride
    reaches past everything the smaller ones span (sufficient; strided block views of one array pass). An
    empty view holds no element."""
    if 0 in shape:
        return True
    axes = sorted((abs(s), e) for s, e in zip(strides, shape) if e > 1)
    span = itemsize
    for stride, extent in axes:
        if stride < span:
            return False
        span = stride * (extent - 1) + span
    return True


def _check_device(*arrays):
    import cupy
    dev = cupy.cuda.Device().id
    for name, x in zip("abc", arrays):
        if x.device.id != dev:
            raise ValueError(f"{name} is on GPU {x.device.id}, not on the current device {dev}")


def _scale(c, beta):
    if beta == 0:
        c.fill(0)
    elif beta != 1:
        c *= beta


def _host(alpha, a, b, beta, c):
    prod = np.matmul(a, b)
    if alpha != 1:
        prod *= alpha
    if beta == 0:
        c[...] = prod
    else:
        if beta != 1:
            c *= beta
        c += prod


def _blas_view(x):
    """(transposed, ld, batch stride) in elements of the blocks of the 3-D (or 2-D, shared) array x as
    column-major matrices: transposed False: each block is itself column-major (unit stride down a column),
    True: each block is row-major, i.e. its transpose is column-major. None where neither axis has a unit
    stride or a stride is negative or not a whole number of elements."""
    item = x.itemsize
    if any(s < 0 or s % item for s in x.strides):
        return None
    *lead, sr, sc = (s // item for s in x.strides)
    rows, cols = x.shape[-2:]
    sb = lead[0] if lead and x.shape[0] > 1 else 0
    if sc == 1 or cols == 1:
        ld = sr if rows > 1 else cols
        return (True, max(ld, cols, 1), sb) if ld >= cols else None
    if sr == 1 or rows == 1:
        ld = sc if cols > 1 else rows
        return (False, max(ld, rows, 1), sb) if ld >= rows else None
    return None


def _device(alpha, a, b, beta, c):
    import cupy
    view_a, view_b = _blas_view(a), _blas_view(b)
    if view_a is None:
        a = cupy.ascontiguousarray(a)
        view_a = _blas_view(a)
    if view_b is None:
        b = cupy.ascontiguousarray(b)
        view_b = _blas_view(b)
    target = c
    view_c = _blas_view(c)
    if view_c is None:              # the result goes through a contiguous block
        target = cupy.ascontiguousarray(c) if beta != 0 else cupy.empty(c.shape, c.dtype)
        view_c = _blas_view(target)
    batch, m, k = a.shape
    n = b.shape[-1]
    if max(batch, m, n, k, view_a[1], view_b[1], view_c[1]) > _INT_MAX:
        from .routines import gemm          # beyond 32-bit sizes: one hybridblas gemm per block
        for i in range(batch):
            gemm(alpha, a[i], b if b.ndim == 2 else b[i], beta, target[i])
    else:
        _strided_batched(alpha, a, view_a, b, view_b, beta, target, view_c)
    if target is not c:
        c[...] = target


def _strided_batched(alpha, a, view_a, b, view_b, beta, c, view_c):
    """One cublas<t>gemmStridedBatched. A row-major c holds C^T = B^T A^T column-major, a column-major c
    C = A B; each operand's op is N where its column-major view is already the matrix wanted, else T."""
    import cupy
    from . import cublas
    batch, m, k = a.shape
    n = b.shape[-1]
    (ta, lda, sa), (tb, ldb, sb), (tc, ldc, sc) = view_a, view_b, view_c
    if tc:                          # C^T (n x m) = B^T (n x k) A^T (k x m)
        first, second = (b, tb, ldb, sb), (a, ta, lda, sa)
        rows, cols = n, m
        op1, op2 = (0 if tb else 1), (0 if ta else 1)
    else:                           # C (m x n) = A (m x k) B (k x n)
        first, second = (a, ta, lda, sa), (b, tb, ldb, sb)
        rows, cols = m, n
        op1, op2 = (1 if ta else 0), (1 if tb else 0)
    dt = c.dtype
    s = cublas._Scalars()
    i, i64 = ctypes.c_int, ctypes.c_longlong
    handle = cublas.handle()
    cublas.call(f"cublas{cublas._PREFIX[dt]}gemmStridedBatched", handle, cupy.cuda.get_current_stream().ptr,
                i(op1), i(op2), i(rows), i(cols), i(k), s(alpha, dt),
                ctypes.c_void_p(first[0].data.ptr), i(first[2]), i64(first[3]),
                ctypes.c_void_p(second[0].data.ptr), i(second[2]), i64(second[3]),
                s(beta, dt), ctypes.c_void_p(c.data.ptr), i(ldc), i64(sc), i(batch))
