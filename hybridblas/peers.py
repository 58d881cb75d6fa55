"""Peers that hybridblas is measured against (public: ``hybridblas.peers``), callable from any benchmark or
tool in the same process (``flapw build --blas cublasxt``).

- ``cublas_device_*``: one cuBLAS call on device-resident cupy arrays (the per-GPU ceiling);
- ``cublasxt_*``: NVIDIA's host-API multi-GPU BLAS on host (numpy, column-major) arrays, through ctypes
  with size_t dimensions, on the GPUs listed in ``devices``.

Arguments follow hybridblas/scipy: ``cublasxt_herk(alpha, a, beta, c, trans="N", lower=True, devices=(0,))``
updates ``c`` in place (it must be a Fortran-ordered numpy array) and returns it. Every operand is a 2-D
Fortran-ordered array (cupy for ``cublas_device_*``, numpy for ``cublasxt_*``) of one dtype (herk, her2k,
herkx: complex64 or complex128; syrk, gemm: any of float32, float64, complex64, complex128) and shapes
that fit ``trans``; anything else is a TypeError or ValueError naming the argument, before any GPU work.
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


def _check(routine, device, c, a, b=None, trans="N", transb=None):
    """TypeError / ValueError unless the operands suit ``routine`` (rank-k when ``transb`` is None, else gemm
    with trans = transa)."""
    arrays = {"c": c, "a": a} if b is None else {"c": c, "a": a, "b": b}
    kind = "cupy" if device else "numpy"
    for name, x in arrays.items():
        ok = type(x).__module__.split(".")[0] == "cupy" if device else isinstance(x, np.ndarray)
        if not ok or x.ndim != 2 or not x.flags.f_contiguous:
            raise TypeError(f"{name} must be a 2-D Fortran-ordered {kind} array, got {type(x).__name__} "
                            f"of shape {getattr(x, 'shape', None)}")
        if x.dtype != c.dtype or x.dtype not in cublas._PREFIX:
            raise TypeError(f"{name} has dtype {x.dtype}; c has {c.dtype}: one dtype of float32, float64, "
                            f"complex64, complex128")
    if routine.startswith("her") and c.dtype.kind != "c":
        raise TypeError(f"{routine} needs complex data, got dtype {c.dtype}")
    ops = {"trans": trans} if transb is None else {"transa": trans, "transb": transb}
    for name, t in ops.items():
        if t not in _OP:
            raise ValueError(f"{name} must be 'N', 'T' or 'C', got {t!r}")

    def shape(x, t):
        return x.shape if t == "N" else x.shape[::-1]
    if transb is None:
        n, k = shape(a, trans)
        if c.shape != (n, n) or (b is not None and shape(b, trans) != (n, k)):
            given = f"a {a.shape}" + ("" if b is None else f" and b {b.shape}")
            raise ValueError(f"{given} with trans={trans!r} do not fit c {c.shape} (op(a) n x k, c n x n)")
    elif shape(a, trans)[0] != c.shape[0] or shape(b, transb)[1] != c.shape[1] or \
            shape(a, trans)[1] != shape(b, transb)[0]:
        raise ValueError(f"op(a) times op(b) does not fit c {c.shape}: a {a.shape} with transa={trans!r}, "
                         f"b {b.shape} with transb={transb!r}")


# --------------------------------------------------------------------------- device-resident cuBLAS

def _device_args():
    import cupy
    stream = cupy.cuda.get_current_stream()
    return cupy.cuda.device.get_cublas_handle(), stream.ptr


def _ld(x):
    return max(1, x.shape[0])


def cublas_device_herk(alpha, a, beta, c, trans="N", lower=True):
    _check("herk", True, c, a, trans=trans)
    h, s = _device_args()
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pre = cublas._PREFIX[c.dtype]
    cublas.call(f"cublas{pre}herk_v2", h, s, _fill(lower), _op(trans), cublas._i(n), cublas._i(k),
                sc(alpha, np.float64 if pre == "Z" else np.float32), cublas._ptr(a), cublas._i(_ld(a)),
                sc(beta, np.float64 if pre == "Z" else np.float32), cublas._ptr(c), cublas._i(_ld(c)))
    return c


def _two(kind, alpha, a, b, beta, c, trans, lower):
    _check(kind.split("_")[0], True, c, a, b, trans=trans)
    h, s = _device_args()
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
    _check("gemm", True, c, a, b, trans=transa, transb=transb)
    h, s = _device_args()
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


def _host(x):
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
    _check(kind, False, c, a, trans=trans)
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pa, lda = _host(a)
    pc, ldc = _host(c)
    _xt_call(f"cublasXt{_prefix(c)}{kind}", devices, block_dim, pinning, _fill(lower), _op(trans), _size(n),
             _size(k), sc(alpha, scalar), pa, lda, sc(beta, scalar), pc, ldc)
    return c


def cublasxt_herk(alpha, a, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    return _xt_one("herk", alpha, a, beta, c, trans, lower, devices, block_dim, pinning, _real(c))


def cublasxt_syrk(alpha, a, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    return _xt_one("syrk", alpha, a, beta, c, trans, lower, devices, block_dim, pinning, c.dtype)


def _xt_two(kind, alpha, a, b, beta, c, trans, lower, devices, block_dim, pinning):
    _check(kind, False, c, a, b, trans=trans)
    n = c.shape[0]
    k = a.shape[1] if trans == "N" else a.shape[0]
    sc = cublas._Scalars()
    pa, lda = _host(a)
    pb, ldb = _host(b)
    pc, ldc = _host(c)
    _xt_call(f"cublasXt{_prefix(c)}{kind}", devices, block_dim, pinning, _fill(lower), _op(trans), _size(n),
             _size(k), sc(alpha, c.dtype), pa, lda, pb, ldb, sc(beta, _real(c)), pc, ldc)
    return c


def cublasxt_her2k(alpha, a, b, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    return _xt_two("her2k", alpha, a, b, beta, c, trans, lower, devices, block_dim, pinning)


def cublasxt_herkx(alpha, a, b, beta, c, trans="N", lower=True, devices=(0,), block_dim=None, pinning=False):
    """C[tri] <- alpha op(a) op(b)^H + beta C[tri] on host arrays (FLAPW's zgemmt H += A^H X: trans='C')."""
    return _xt_two("herkx", alpha, a, b, beta, c, trans, lower, devices, block_dim, pinning)


def cublasxt_gemm(alpha, a, b, beta, c, transa="N", transb="N", devices=(0,), block_dim=None, pinning=False):
    _check("gemm", False, c, a, b, trans=transa, transb=transb)
    m, n = c.shape
    k = a.shape[1] if transa == "N" else a.shape[0]
    sc = cublas._Scalars()
    pa, lda = _host(a)
    pb, ldb = _host(b)
    pc, ldc = _host(c)
    _xt_call(f"cublasXt{_prefix(c)}gemm", devices, block_dim, pinning, _op(transa), _op(transb), _size(m),
             _size(n), _size(k), sc(alpha, c.dtype), pa, lda, pb, ldb, sc(beta, c.dtype), pc, ldc)
    return c
