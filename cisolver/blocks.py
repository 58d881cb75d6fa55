"""Tall blocks times small coefficient matrices, written into column ranges of LOBPCG's buffers.

LOBPCG keeps X, P, W (and H X, H P, H W) as column ranges of one row-major n x 3b buffer, so every update
is a tall block of that buffer times a small float64 host matrix:

    product_into(out, a, m)       out <- a m            (out must not overlap a)
    subtract_product(out, a, m)   out <- out - a m      (out and a disjoint column ranges)
    times_upper(v, u)             v <- v u in place      (u upper triangular)

On a GPU each is one cuBLAS call (gemm, or trmm, whose in-place form cuBLAS supports) on the caller's CuPy
stream, reading and writing the strided column ranges directly through their leading dimension. Through
cupy's matmul the same updates cost a copy of each strided operand and a copy back (1.55 ms per iteration
for the X, P update at 48Cr's size on an H200, session 5). On the CPU they are numpy.
"""
import ctypes

import numpy as np

from .arrays import is_device

_PREFIX = {np.dtype(np.float32): "S", np.dtype(np.float64): "D"}


def _check(out, a, m):
    if a.shape[0] != out.shape[0] or m.shape != (a.shape[1], out.shape[1]):
        raise ValueError(f"{a.shape} @ {m.shape} does not fit out {out.shape}")


def product_into(out, a, m):
    """out <- a @ m; ``m`` a small host matrix (cast to the blocks' precision)."""
    _check(out, a, m)
    if _on_cublas(out, a):
        _gemm(out, a, m, 0.0)
    else:
        out[...] = a @ _like(out, m)
    return out


def subtract_product(out, a, m):
    """out <- out - a @ m; ``out`` and ``a`` must not share elements."""
    _check(out, a, m)
    if _on_cublas(out, a):
        _gemm(out, a, -np.asarray(m), 1.0)
    else:
        out -= a @ _like(out, m)
    return out


def times_upper(v, u):
    """v <- v @ u in place, ``u`` a small upper-triangular host matrix."""
    if u.shape != (v.shape[1], v.shape[1]):
        raise ValueError(f"u must be {v.shape[1]} x {v.shape[1]}, got {u.shape}")
    if _on_cublas(v):
        _trmm(v, u)
    else:
        v[...] = v @ _like(v, np.triu(u))
    return v


def _like(x, m):
    if is_device(x):
        import cupy
        return cupy.asarray(m, dtype=x.dtype)
    return np.asarray(m, dtype=x.dtype)


def _row_major(x):
    """Rows at a leading dimension, unit stride along a row (a column range of a row-major buffer)."""
    return (x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == x.itemsize) and x.strides[0] >= 0
            and x.strides[0] % x.itemsize == 0 and (x.shape[0] <= 1 or x.strides[0] >= x.shape[1] * x.itemsize))


def _on_cublas(*arrays):
    return (is_device(arrays[0]) and arrays[0].dtype in _PREFIX and all(x.dtype == arrays[0].dtype for x in arrays)
            and all(_row_major(x) for x in arrays))


def _leading(x):
    return max(x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1], 1)


def _cublas_call(routine, x, *args):
    import cupy
    from hybridblas import cublas
    cublas.call(f"cublas{_PREFIX[x.dtype]}{routine}", cupy.cuda.device.get_cublas_handle(),
                cupy.cuda.get_current_stream().ptr, *args)


def _scalar(value, dtype):
    holder = np.array([value], dtype=dtype)
    return holder, ctypes.c_void_p(holder.ctypes.data)


def _gemm(out, a, m, beta):
    """Row-major out (n x q) = a (n x p) m (p x q) + beta out, as the column-major out^T = m^T a^T."""
    import cupy
    n, q = out.shape
    p = a.shape[1]
    if n == 0 or q == 0:
        return
    m_dev = cupy.asarray(np.ascontiguousarray(m), dtype=out.dtype)     # row-major p x q = column-major m^T
    one, one_p = _scalar(1.0, out.dtype)
    b, b_p = _scalar(beta, out.dtype)
    i = ctypes.c_int
    _cublas_call("gemm_v2", out, i(0), i(0), i(q), i(n), i(p), one_p, ctypes.c_void_p(m_dev.data.ptr), i(max(q, 1)),
                 ctypes.c_void_p(a.data.ptr), i(_leading(a)), b_p, ctypes.c_void_p(out.data.ptr), i(_leading(out)))


def _trmm(v, u):
    """Row-major v (n x k) <- v u: the column-major v^T <- u^T v^T, u^T lower triangular, left side."""
    import cupy
    n, k = v.shape
    if n == 0 or k == 0:
        return
    u_dev = cupy.asarray(np.ascontiguousarray(np.triu(u)), dtype=v.dtype)   # row-major u = column-major u^T
    one, one_p = _scalar(1.0, v.dtype)
    i = ctypes.c_int
    ptr, ld = ctypes.c_void_p(v.data.ptr), i(_leading(v))
    # side left (0), fill lower (0), no transpose (0), non-unit diagonal (0); C = B: cuBLAS's in-place form
    _cublas_call("trmm_v2", v, i(0), i(0), i(0), i(0), i(k), i(n), one_p, ctypes.c_void_p(u_dev.data.ptr), i(k),
                 ptr, ld, ptr, ld)
