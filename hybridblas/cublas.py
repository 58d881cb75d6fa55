"""ctypes bindings to the libcublas that CuPy itself loaded: gemm, herk, her2k, herkx, syrk, syr2k, syrkx.

CuPy wraps gemm and syrk but not herk/her2k/herkx, so every kernel goes through one small ctypes layer on
CuPy's per-thread, per-device handle. Each call sets the handle's stream first, uses host pointer mode and
restores the mode it found, and turns a non-zero cublasStatus_t into an error naming the routine.
ctypes releases the GIL around each call, so feeder threads of other GPUs keep running. ``gemm``,
``rank_k``, ``rank_kx`` and ``gemm_strided_batched`` cut calls whose sizes or leading dimensions exceed
cuBLAS's 32-bit ints (hybridblas.int_limits), copying out-of-range blocks on the call's own stream.
"""
import ctypes
import os
import threading

import numpy as np

from . import int_limits
from .problem import C as _OPC, N as _OPN, T as _OPT, Operand, leading_dim

_PREFIX = {np.dtype(np.float32): "S", np.dtype(np.float64): "D",
           np.dtype(np.complex64): "C", np.dtype(np.complex128): "Z"}
_REAL = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
          11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED",
          16: "LICENSE_ERROR"}
FILL_LOWER, FILL_UPPER = 0, 1
POINTER_MODE_HOST = 0

_lib = None
_lock = threading.Lock()


class CublasError(RuntimeError):
    pass


class CublasAllocError(CublasError, MemoryError):
    """cuBLAS could not allocate GPU memory (CUBLAS_STATUS_ALLOC_FAILED): a MemoryError too, so what retries or
    falls back on running out of memory (flapw's builds, their warm-up) treats it like any other."""


def check(status, name):
    if status != 0:
        kind = CublasAllocError if status == 3 else CublasError
        raise kind(f"{name} failed with cublasStatus {status} ({STATUS.get(status, 'unknown')})")


def handle():
    """CuPy's cuBLAS handle of the calling thread on the current GPU. Making one allocates GPU memory outside
    CuPy's pool; where cuBLAS cannot (CUBLAS_STATUS_ALLOC_FAILED), the pool releases the free blocks it keeps (a
    band call's stream set keeps its arrays' blocks for the next call) and it is tried once more, then a
    CublasAllocError (a MemoryError)."""
    import cupy
    return _made(cupy.cuda.device.get_cublas_handle)


def new_handle(stream_ptr):
    """A cuBLAS handle of the caller's own on the current GPU (not CuPy's per-thread one: its holder decides
    which thread uses it, one at a time), bound to the stream ``stream_ptr``; the holder destroys it
    (cupy.cuda.cublas.destroy). Making one can take milliseconds, during which the interpreter waits. Where
    cuBLAS cannot allocate, as handle()."""
    from cupy.cuda import cublas as cupy_cublas
    h = _made(cupy_cublas.create)
    try:
        cupy_cublas.setStream(h, stream_ptr)
    except BaseException:
        cupy_cublas.destroy(h)
        raise
    return h


def _made(make):
    """make(), once more after the pool released its free blocks where cuBLAS could not allocate (handle())."""
    import cupy
    try:
        return make()
    except Exception as exc:            # noqa: BLE001 - CuPy's CUBLASError, by name: its module may move
        if not _alloc_failed(exc):
            raise
    cupy.get_default_memory_pool().free_all_blocks()
    try:
        return make()
    except Exception as exc:            # noqa: BLE001 - as above
        if not _alloc_failed(exc):
            raise
        raise CublasAllocError(f"cublasCreate failed on GPU {cupy.cuda.Device().id} with cublasStatus 3 "
                               f"(ALLOC_FAILED) after the memory pool released its free blocks") from exc


def _alloc_failed(exc):
    return type(exc).__name__ == "CUBLASError" and getattr(exc, "status", None) == 3


def library_path():
    """Path of the libcublas CuPy has loaded (read from /proc/self/maps), or None."""
    import cupy
    from cupy_backends.cuda.libs import cublas as _cupy_cublas  # noqa: F401  (loads libcublas)
    cupy.cuda.device.get_cublas_handle()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libcublas.so"):
                    return path
    except OSError:
        pass
    return None


def lib():
    """The loaded libcublas (the same one CuPy uses, so CuPy's handles are valid in it)."""
    global _lib
    with _lock:
        if _lib is None:
            path = library_path()
            candidates = [path] if path else []
            candidates += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
            errors = []
            for name in candidates:
                try:
                    _lib = ctypes.CDLL(name)
                    break
                except OSError as exc:
                    errors.append(f"{name}: {exc}")
            if _lib is None:
                raise OSError("cannot load libcublas: " + "; ".join(errors))
            for fn in ("cublasSetStream_v2", "cublasGetStream_v2", "cublasGetPointerMode_v2",
                       "cublasSetPointerMode_v2"):
                getattr(_lib, fn).restype = ctypes.c_int
    return _lib


def _op(op, hermitian_kind):
    """Problem op bits -> cublasOperation_t (N=0, T=1, C=2)."""
    if not op & _OPT:
        return 0
    return 2 if (op == _OPC) else 1


class _Scalars:
    __slots__ = ("keep",)

    def __init__(self):
        self.keep = []

    def __call__(self, value, dtype):
        buf = np.array([value], dtype=dtype)
        self.keep.append(buf)
        return ctypes.c_void_p(buf.ctypes.data)


def _ptr(x):
    return ctypes.c_void_p(x.data.ptr)


def call(name, handle, stream_ptr, *args):
    """One cuBLAS call on ``handle`` and stream, host pointer mode, status checked, mode restored."""
    L = lib()
    fn = getattr(L, name)
    fn.restype = ctypes.c_int
    h = ctypes.c_void_p(handle)
    # set the stream only when it changes: cublasSetStream resets the handle's workspace every time
    current = ctypes.c_void_p()
    check(L.cublasGetStream_v2(h, ctypes.byref(current)), "cublasGetStream_v2")
    if (current.value or 0) != (stream_ptr or 0):
        check(L.cublasSetStream_v2(h, ctypes.c_void_p(stream_ptr)), "cublasSetStream_v2")
    mode = ctypes.c_int(0)
    check(L.cublasGetPointerMode_v2(h, ctypes.byref(mode)), "cublasGetPointerMode_v2")
    if mode.value != POINTER_MODE_HOST:
        check(L.cublasSetPointerMode_v2(h, POINTER_MODE_HOST), "cublasSetPointerMode_v2")
    try:
        check(fn(h, *args), name)
    finally:
        if mode.value != POINTER_MODE_HOST:
            L.cublasSetPointerMode_v2(h, mode.value)


def _i(v):
    return int_limits.c_int(v)


class _StreamRef:
    """A raw stream pointer under the CUDA stream protocol (what CuPy's Stream.from_external takes)."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def stream_of(cupy, stream_ptr):
    """A CuPy Stream for a raw stream pointer (0: the null stream); CuPy 14's from_external, else the
    ExternalStream of older CuPy."""
    if not stream_ptr:
        return cupy.cuda.Stream.null
    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(_StreamRef(stream_ptr))
    return cupy.cuda.ExternalStream(stream_ptr)


def _scratch(stream_ptr):
    """Compact copies made with CuPy on the stream the cuBLAS call runs on (CuPy's pool ties them to it)."""
    def setup():
        import cupy
        return cupy, stream_of(cupy, stream_ptr)
    return int_limits.Scratch(setup)


def gemm(handle, stream_ptr, c, alpha, x, y, beta):
    """c <- alpha op(x) op(y) + beta c with x, y Operands on cupy bases, c a column-major cupy view."""
    int_limits.gemm(lambda *args: _gemm(handle, stream_ptr, *args), _scratch(stream_ptr), c, alpha, x, y, beta)


def _gemm(handle, stream_ptr, c, alpha, x, y, beta):
    """One cublas<t>gemm: every size and leading dimension fits in 32 bits."""
    m, n = c.shape
    if m == 0 or n == 0:
        return
    dt = c.dtype
    s = _Scalars()
    call(f"cublas{_PREFIX[dt]}gemm_v2", handle, stream_ptr,
         _i(_op(x.op, False)), _i(_op(y.op, False)), _i(m), _i(n), _i(x.cols),
         s(alpha, dt), _ptr(x.base), _i(leading_dim(x.base)), _ptr(y.base), _i(leading_dim(y.base)),
         s(beta, dt), _ptr(c), _i(leading_dim(c)))


def gemm_strided_batched(handle, stream_ptr, parts, alpha, x, stride_x, y, stride_y, beta):
    """parts[b] <- alpha op(x_b) op(y_b) + beta parts[b] for every b: ``parts`` is a C-ordered cupy array
    (batch, n, m), i.e. column-major m x n blocks; x_b starts ``stride_x`` elements after x_(b-1)."""
    batch, n, m = parts.shape
    if batch == 0 or m == 0 or n == 0:
        return
    if max(batch, m, n, x.cols, leading_dim(x.base), leading_dim(y.base)) > int_limits.INT_MAX:
        for b in range(batch):    # out of 32-bit range: one gemm per entry, which int_limits cuts
            gemm(handle, stream_ptr, parts[b].T, alpha, _shifted(x, b * stride_x), _shifted(y, b * stride_y), beta)
        return
    dt = parts.dtype
    s = _Scalars()
    i64 = ctypes.c_longlong
    call(f"cublas{_PREFIX[dt]}gemmStridedBatched", handle, stream_ptr,
         _i(_op(x.op, False)), _i(_op(y.op, False)), _i(m), _i(n), _i(x.cols),
         s(alpha, dt), _ptr(x.base), _i(leading_dim(x.base)), i64(stride_x),
         _ptr(y.base), _i(leading_dim(y.base)), i64(stride_y),
         s(beta, dt), _ptr(parts), _i(m), i64(m * n), _i(batch))


def _shifted(x, offset):
    """Operand x with its base moved ``offset`` elements on (same shape and strides)."""
    import cupy
    base = x.base
    moved = cupy.ndarray(base.shape, base.dtype, base.data + offset * base.dtype.itemsize, strides=base.strides)
    return Operand(moved, x.op, x.scratch)


def rank_k(handle, stream_ptr, kind, c, lower, alpha, factors, beta):
    """Native herk/syrk/her2k/syr2k on a diagonal block; the factors share one op (N, or C/T)."""
    int_limits.rank_k(lambda *args: _rank_k(handle, stream_ptr, *args),
                      lambda *args: _gemm(handle, stream_ptr, *args), _scratch(stream_ptr),
                      kind, c, lower, alpha, factors, beta)


def _rank_k(handle, stream_ptr, kind, c, lower, alpha, factors, beta):
    """One cublas<t>herk/syrk/her2k/syr2k (or herkx/syrkx): every size and leading dimension fits."""
    n = c.shape[0]
    if n == 0:
        return
    dt = c.dtype
    first = factors[0]
    real = _REAL.get(dt, dt)
    s = _Scalars()
    trans = 0 if not (first.op & _OPT) else (2 if kind.startswith("her") else 1)
    alpha_t = real if kind == "herk" else dt
    beta_t = real if kind in ("herk", "her2k", "herkx") else dt
    args = [_i(FILL_LOWER if lower else FILL_UPPER), _i(trans), _i(n), _i(first.cols), s(alpha, alpha_t)]
    for f in factors:
        args += [_ptr(f.base), _i(leading_dim(f.base))]
    args += [s(beta, beta_t), _ptr(c), _i(leading_dim(c))]
    name = f"cublas{_PREFIX[dt]}{kind}" + ("" if kind.endswith("x") else "_v2")   # herkx, syrkx: no _v2
    call(name, handle, stream_ptr, *args)


def rank_kx(handle, stream_ptr, kind, c, lower, trans, alpha, a, b, beta):
    """herkx/syrkx: C[tri] <- alpha op(a) op(b)^H (or ^T) + beta C[tri]; a, b cupy column-major arrays,
    trans a cublasOperation_t (0 N, 1 T, 2 C)."""
    op = {0: _OPN, 1: _OPT, 2: _OPC}[trans]
    rank_k(handle, stream_ptr, kind, c, lower, alpha, [Operand(a, op), Operand(b, op)], beta)


def conj_transpose_into(dst, src):
    """dst <- src^H (src^T for real data) with cuBLAS geam on the current device and stream; dst and src
    are column-major cupy views that do not overlap (dst m x n, src n x m). Tiled, unlike a strided copy."""
    import cupy
    m, n = dst.shape
    if src.shape != (n, m):
        raise ValueError(f"src must be {n} x {m} for a {m} x {n} dst, got {src.shape}")
    if m == 0 or n == 0:
        return dst
    dt = dst.dtype
    s = _Scalars()
    op = 2 if dt.kind == "c" else 1
    # beta = 0 with B = C: cuBLAS's in-place form (ldb = ldc, transb N); C is only written
    call(f"cublas{_PREFIX[dt]}geam", handle(), cupy.cuda.get_current_stream().ptr,
         _i(op), _i(0), _i(m), _i(n), s(1.0, dt), _ptr(src), _i(leading_dim(src)),
         s(0.0, dt), _ptr(dst), _i(leading_dim(dst)), _ptr(dst), _i(leading_dim(dst)))
    return dst


class Backend:
    """The kernels.compute_block backend for one GPU: cuBLAS on a given handle and stream."""

    def __init__(self, handle, stream):
        import cupy
        self.xp = cupy
        self.handle = handle
        self.stream = stream

    def gemm(self, c, alpha, x, y, beta):
        gemm(self.handle, self.stream.ptr, c, alpha, x, y, beta)

    def rank_k(self, kind, c, lower, alpha, factors, beta):
        rank_k(self.handle, self.stream.ptr, kind, c, lower, alpha, factors, beta)
