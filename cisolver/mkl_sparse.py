"""Optional Intel MKL sparse backend for the CPU SpMM: the inspector-executor API through ctypes.

MKL (the ``mkl`` extra: ``pip install mkl``) multiplies a CSR matrix by a block of vectors as a block,
threaded by MKL itself, where scipy's CSR product costs about k single-vector products. The upper
triangle is handed over as a symmetric matrix (type symmetric, fill upper, non-unit diagonal), so the
half-stored H of MFDn is used directly, without U^T or a second pass. MKL's thread count is left to its
own defaults, MKL_NUM_THREADS and threadpoolctl (MKL counts there as a "blas" library).
"""
import ctypes
import ctypes.util
import glob
import importlib.metadata
import os
import sys

import numpy as np

# enum values and signatures from mkl_spblas.h / mkl_service.h
STATUS = {0: "SPARSE_STATUS_SUCCESS", 1: "SPARSE_STATUS_NOT_INITIALIZED", 2: "SPARSE_STATUS_ALLOC_FAILED",
          3: "SPARSE_STATUS_INVALID_VALUE", 4: "SPARSE_STATUS_EXECUTION_FAILED",
          5: "SPARSE_STATUS_INTERNAL_ERROR", 6: "SPARSE_STATUS_NOT_SUPPORTED"}
OPERATION_NON_TRANSPOSE = 10
MATRIX_TYPE_GENERAL, MATRIX_TYPE_SYMMETRIC = 20, 21
INDEX_BASE_ZERO = 0
FILL_MODE_UPPER = 41
DIAG_NON_UNIT = 50
LAYOUT_ROW_MAJOR = 101
INTERFACE_LP64 = 0


class MatrixDescr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("mode", ctypes.c_int), ("diag", ctypes.c_int)]


def _candidates():
    """libmkl_rt paths: the mkl wheel's own file list (wherever pip put it), the environment's lib
    folder (conda, venv), then the system loader (ldconfig, LD_LIBRARY_PATH)."""
    try:
        yield from (str(f.locate()) for f in importlib.metadata.files("mkl") or ()
                    if f.name.startswith("libmkl_rt.so"))
    except importlib.metadata.PackageNotFoundError:
        pass
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        yield from sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True)
    yield from filter(None, [ctypes.util.find_library("mkl_rt")])


_lib = None     # (CDLL, MKL_INT ctypes type, index dtype) once loaded, False when absent


def _load():
    global _lib
    if _lib is None:
        _lib = False
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
                # LP64 (32-bit MKL_INT) unless MKL was already set up otherwise in this process (the
                # layer is fixed by the first MKL call; the returned value is the layer in force)
                ilp64 = lib.MKL_Set_Interface_Layer(INTERFACE_LP64) & 1
                mkl_int = ctypes.c_int64 if ilp64 else ctypes.c_int32
                _declare(lib, mkl_int)
            except (OSError, AttributeError):     # not loadable, or not an MKL with this API
                continue
            _lib = (lib, mkl_int, np.int64 if ilp64 else np.int32)
            break
    return _lib


def _declare(lib, mkl_int):
    handle, ptr = ctypes.c_void_p, ctypes.c_void_p
    for p, real in (("s", ctypes.c_float), ("d", ctypes.c_double)):
        getattr(lib, f"mkl_sparse_{p}_create_csr").argtypes = [ctypes.POINTER(handle), ctypes.c_int, mkl_int,
                                                               mkl_int, ptr, ptr, ptr, ptr]
        getattr(lib, f"mkl_sparse_{p}_mm").argtypes = [ctypes.c_int, real, handle, MatrixDescr, ctypes.c_int,
                                                       ptr, mkl_int, mkl_int, real, ptr, mkl_int]
    lib.mkl_sparse_set_mm_hint.argtypes = [handle, ctypes.c_int, MatrixDescr, ctypes.c_int, mkl_int, mkl_int]
    lib.mkl_sparse_optimize.argtypes = [handle]
    lib.mkl_sparse_destroy.argtypes = [handle]


def available():
    """True when libmkl_rt loads (the optional ``mkl`` package, or a system MKL)."""
    return bool(_load())


def _check(status, call):
    if status != 0:
        raise RuntimeError(f"MKL {call} failed: {STATUS.get(status, f'status {status}')}")


class MklCsr:
    """y = H x with MKL for C-order x (n x k), H a scipy CSR (float32/float64) stored full or as its
    upper triangle (``symmetric_upper=True``). columns, calls: the hint given to mkl_sparse_optimize
    (block width and number of products expected)."""

    def __init__(self, h, symmetric_upper=False, columns=8, calls=1000):
        if not available():
            raise RuntimeError("Intel MKL (libmkl_rt) not found; install the 'mkl' extra: pip install mkl")
        lib, mkl_int, itype = _lib
        self.handle = None
        self.dtype = np.dtype(h.dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"MKL backend needs float32 or float64, got {self.dtype}")
        if not h.has_canonical_format:     # sorted, no duplicates: what MKL's symmetric kernels assume
            h = h.copy()
            h.sum_duplicates()
        if max(h.nnz, h.shape[0]) > np.iinfo(itype).max:
            raise ValueError(f"matrix too large for MKL's {np.dtype(itype)} indices (nnz {h.nnz})")
        # MKL keeps pointers to these arrays (no copy): they live as long as the handle
        self._arrays = (np.ascontiguousarray(h.indptr, dtype=itype), np.ascontiguousarray(h.indices, dtype=itype),
                        np.ascontiguousarray(h.data))
        indptr, indices, data = self._arrays
        self.shape = h.shape
        self.descr = (MatrixDescr(MATRIX_TYPE_SYMMETRIC, FILL_MODE_UPPER, DIAG_NON_UNIT) if symmetric_upper
                      else MatrixDescr(MATRIX_TYPE_GENERAL, FILL_MODE_UPPER, DIAG_NON_UNIT))   # mode, diag unused
        self._p = "s" if self.dtype == np.float32 else "d"
        self._lib = lib
        handle = ctypes.c_void_p()
        _check(getattr(lib, f"mkl_sparse_{self._p}_create_csr")(
            ctypes.byref(handle), INDEX_BASE_ZERO, h.shape[0], h.shape[1], indptr.ctypes.data,
            indptr.ctypes.data + indptr.itemsize, indices.ctypes.data, data.ctypes.data),
            f"mkl_sparse_{self._p}_create_csr")
        self.handle = handle
        _check(lib.mkl_sparse_set_mm_hint(handle, OPERATION_NON_TRANSPOSE, self.descr, LAYOUT_ROW_MAJOR,
                                          columns, calls), "mkl_sparse_set_mm_hint")
        _check(lib.mkl_sparse_optimize(handle), "mkl_sparse_optimize")

    def matmat(self, x):
        """H x for x (n x k); x is cast to the matrix's dtype, read only, and y is a new C-order array."""
        if self.handle is None:
            raise RuntimeError("MklCsr used after close()")
        x = np.ascontiguousarray(x, dtype=self.dtype)
        squeeze = x.ndim == 1
        if squeeze:
            x = x[:, None]
        if x.ndim != 2 or x.shape[0] != self.shape[1]:
            raise ValueError(f"x must have {self.shape[1]} rows, got shape {x.shape}")
        k = x.shape[1]
        y = np.zeros((self.shape[0], k), dtype=self.dtype)
        if k:
            _check(getattr(self._lib, f"mkl_sparse_{self._p}_mm")(
                OPERATION_NON_TRANSPOSE, 1.0, self.handle, self.descr, LAYOUT_ROW_MAJOR,
                x.ctypes.data, k, k, 0.0, y.ctypes.data, k), f"mkl_sparse_{self._p}_mm")
        return y[:, 0] if squeeze else y

    __matmul__ = matmat

    def close(self):
        if getattr(self, "handle", None) is not None:
            handle, self.handle = self.handle, None
            _check(self._lib.mkl_sparse_destroy(handle), "mkl_sparse_destroy")

    def __del__(self):
        try:
            self.close()
        except Exception:       # never raise from a finaliser (interpreter shutdown included)
            pass
