"""Peers that hybridblas is measured against, callable from any benchmark in the same process.

- ``cublas_device_*``: one cuBLAS call on device-resident cupy arrays (the per-GPU ceiling);
- ``cublasxt_*``: NVIDIA's host-API multi-GPU BLAS on host (numpy, column-major) arrays, through ctypes
  with size_t dimensions, on the GPUs listed in ``devices``.

Arguments follow hybridblas/scipy: ``cublasxt_herk(alpha, a, beta, c, trans="N", lower=True, devices=(0,))``
updates ``c`` in place (it must be a Fortran-ordered numpy array) and returns it.
"""
import ctypes
import threading

import numpy as np

from . import cublas

__all__ = ["cublas_device_herk", "cublas_device_her2k", "cublas_device_herkx", "cublas_device_gemm",
           "cublasxt_herk", "cublasxt_her2k", "cublasxt_herkx", "cublasxt_gemm", "cublasxt_syrk",
           "cublasxt_handle"]

_OP = {"N": 0, "T": 1, "C": 2}
_size = ctypes.c_size_t


def _fill(lower):
    return ctypes.c_int(cublas.FILL_LOWER if lower else cublas.FILL_UPPER)


def _op(trans):
    if trans not in _OP:
        raise ValueError(f"trans must be 'N', 'T' or 'C', got {trans!r}")
    return ctypes.c_int(_OP[trans])


# --------------------------------------------------------------------------- device-resident cuBLAS

def _device_args(*arrays):
    import cupy
    for x in arrays:
        if not isinstance(x, cupy.ndarray) or not x.flags.f_contiguous:
            raise TypeError("device peers take Fortran-ordered cupy arrays")
    stream = cupy.cuda.get_current_stream()
    return cupy.cuda.device.get_cublas_handle(), stream.ptr


def _ld(x):
    return max(1, x.shape[0])


def cublas_device_herk(alpha, a, beta, c, trans="N", lower=True):
    h, s = _device_args(a, c)
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pre = cublas._PREFIX[c.dtype]
    cublas.call(f"cublas{pre}herk_v2", h, s, _fill(lower), _op(trans), cublas._i(n), cublas._i(k),
                sc(alpha, np.float64 if pre == "Z" else np.float32), cublas._ptr(a), cublas._i(_ld(a)),
                sc(beta, np.float64 if pre == "Z" else np.float32), cublas._ptr(c), cublas._i(_ld(c)))
    return c


def _two(kind, alpha, a, b, beta, c, trans, lower):
    h, s = _device_args(a, b, c)
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pre = cublas._PREFIX[c.dtype]
    real = np.float64 if pre == "Z" else np.float32
    cublas.call(f"cublas{pre}{kind}", h, s, _fill(lower), _op(trans), cublas._i(n), cublas._i(k),
                sc(alpha, c.dtype), cublas._ptr(a), cublas._i(_ld(a)), cublas._ptr(b), cublas._i(_ld(b)),
                sc(beta, real), cublas._ptr(c), cublas._i(_ld(c)))
    return c


def cublas_device_her2k(alpha, a, b, beta, c, trans="N", lower=True):
    return _two("her2k_v2", alpha, a, b, beta, c, trans, lower)


def cublas_device_herkx(alpha, a, b, beta, c, trans="N", lower=True):
    """C[tri] <- alpha op(a) op(b)^H + beta C[tri] (cuBLAS's herkx: FLAPW's H += A^H X with trans='C')."""
    return _two("herkx", alpha, a, b, beta, c, trans, lower)


def cublas_device_gemm(alpha, a, b, beta, c, transa="N", transb="N"):
    h, s = _device_args(a, b, c)
    m, n = c.shape
    k = a.shape[1] if transa == "N" else a.shape[0]
    sc = cublas._Scalars()
    pre = cublas._PREFIX[c.dtype]
    cublas.call(f"cublas{pre}gemm_v2", h, s, _op(transa), _op(transb), cublas._i(m), cublas._i(n),
                cublas._i(k), sc(alpha, c.dtype), cublas._ptr(a), cublas._i(_ld(a)), cublas._ptr(b),
                cublas._i(_ld(b)), sc(beta, c.dtype), cublas._ptr(c), cublas._i(_ld(c)))
    return c


# --------------------------------------------------------------------------- cuBLASXt on host arrays

_xt = {}
_xt_lock = threading.Lock()


def cublasxt_handle(devices=(0,), block_dim=None, pinning=False):
    """A cuBLASXt handle on ``devices`` (made once per settings and kept)."""
    devices = tuple(int(d) for d in devices)
    key = (devices, block_dim, bool(pinning))
    with _xt_lock:
        h = _xt.get(key)
        if h is not None:
            return h
        L = cublas.lib()
        for fn in ("cublasXtCreate", "cublasXtDeviceSelect", "cublasXtSetBlockDim", "cublasXtSetPinningMemMode"):
            getattr(L, fn).restype = ctypes.c_int
        handle = ctypes.c_void_p()
        cublas.check(L.cublasXtCreate(ctypes.byref(handle)), "cublasXtCreate")
        ids = (ctypes.c_int * len(devices))(*devices)
        cublas.check(L.cublasXtDeviceSelect(handle, ctypes.c_int(len(devices)), ids), "cublasXtDeviceSelect")
        if block_dim:
            cublas.check(L.cublasXtSetBlockDim(handle, ctypes.c_int(int(block_dim))), "cublasXtSetBlockDim")
        if pinning:
            cublas.check(L.cublasXtSetPinningMemMode(handle, ctypes.c_int(1)), "cublasXtSetPinningMemMode")
        _xt[key] = handle
        return handle


def _host(x, name):
    if not isinstance(x, np.ndarray) or not x.flags.f_contiguous:
        raise TypeError(f"{name} must be a Fortran-ordered numpy array for cuBLASXt")
    return ctypes.c_void_p(x.ctypes.data), _size(max(1, x.shape[0]))


def _xt_call(name, devices, block_dim, pinning, *args):
    L = cublas.lib()
    fn = getattr(L, name)
    fn.restype = ctypes.c_int
    h = cublasxt_handle(devices, block_dim, pinning)
    cublas.check(fn(h, *args), name)


def _prefix(c):
    return cublas._PREFIX[c.dtype]


def _real(c):
    return np.float32 if c.dtype.itemsize == 8 and c.dtype.kind == "c" else np.float64


def _xt_one(kind, alpha, a, beta, c, trans, lower, devices, block_dim, pinning, scalar):
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pa, lda = _host(a, "a")
    pc, ldc = _host(c, "c")
    _xt_call(f"cublasXt{_prefix(c)}{kind}", devices, block_dim, pinning, _fill(lower), _op(trans), _size(n),
             _size(k), sc(alpha, scalar), pa, lda, sc(beta, scalar), pc, ldc)
    return c


def cublasxt_herk(alpha, a, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    return _xt_one("herk", alpha, a, beta, c, trans, lower, devices, block_dim, pinning, _real(c))


def cublasxt_syrk(alpha, a, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    return _xt_one("syrk", alpha, a, beta, c, trans, lower, devices, block_dim, pinning, c.dtype)


def _xt_two(kind, alpha, a, b, beta, c, trans, lower, devices, block_dim, pinning):
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pa, lda = _host(a, "a")
    pb, ldb = _host(b, "b")
    pc, ldc = _host(c, "c")
    _xt_call(f"cublasXt{_prefix(c)}{kind}", devices, block_dim, pinning, _fill(lower), _op(trans), _size(n),
             _size(k), sc(alpha, c.dtype), pa, lda, pb, ldb, sc(beta, _real(c)), pc, ldc)
    return c


def cublasxt_her2k(alpha, a, b, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    return _xt_two("her2k", alpha, a, b, beta, c, trans, lower, devices, block_dim, pinning)


def cublasxt_herkx(alpha, a, b, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    """C[tri] <- alpha op(a) op(b)^H + beta C[tri] on host arrays (FLAPW's zgemmt H += A^H X: trans='C')."""
    return _xt_two("herkx", alpha, a, b, beta, c, trans, lower, devices, block_dim, pinning)


def cublasxt_gemm(alpha, a, b, beta, c, transa="N", transb="N", devices=(0,), block_dim=None, pinning=False):
    m, n = c.shape
    k = a.shape[1] if transa == "N" else a.shape[0]
    sc = cublas._Scalars()
    pa, lda = _host(a, "a")
    pb, ldb = _host(b, "b")
    pc, ldc = _host(c, "c")
    _xt_call(f"cublasXt{_prefix(c)}gemm", devices, block_dim, pinning, _op(transa), _op(transb), _size(m),
             _size(n), _size(k), sc(alpha, c.dtype), pa, lda, pb, ldb, sc(beta, c.dtype), pc, ldc)
    return c
