"""A band call's cuBLAS calls made from device pointers and integers: no array views, no Operand blocks, no
stream or pointer-mode queries per call.

A band call queues a few dozen to a few hundred cuBLAS calls from its GPUs' worker threads, which share the
interpreter with the calling thread's uploads and the writers; each Python step of a product is time the other
threads wait. Through kernels.compute_block a rectangle's gemm took ~140 us of a thread's CPU (views of both
factors, int_limits' checks, a stream and a pointer-mode query around the call); here it is one ctypes call
whose argument types are declared once. 2 x H100, zgemmt n = k = 8192 (benchmarks.blas host-profile): queueing a
call's products took 12.6 ms of its threads' wall (7.9 ms CPU) against 26.6 (11.2).

``Calls`` serves one GPU of one call: the problem's terms over that GPU's copies of the factors, each copy's
device pointer and leading dimension read once. It needs a cuBLAS handle of the caller's own, bound to the stream
the calls go on and in host pointer mode (a band call's stream set's), factors whose bases are column-major, and
every size and leading dimension within 32 bits; ``Calls.make`` gives None otherwise and the caller keeps the
general path (kernels.compute_block).
"""
import ctypes

import numpy as np

from .. import cublas, int_limits
from ..problem import T, leading_dim

_P, _I = ctypes.c_void_p, ctypes.c_int
_GEMM = [_P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I]
_RANK_K = {1: [_P, _I, _I, _I, _I, _P, _P, _I, _P, _P, _I],              # herk / syrk: one factor
           2: [_P, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I]}      # her2k / syr2k


_functions = {}            # cuBLAS name -> this module's ctypes function object, made once


def _function(name, argtypes):
    """A ctypes function object of libcublas's ``name`` of this module's own, made once (CDLL's item lookup makes a
    new one: the argument types declared here bind no other caller's object; two threads that make one at once
    each get a valid one, and one is kept)."""
    fn = _functions.get(name)
    if fn is None:
        fn = cublas.lib()[name]
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        fn = _functions.setdefault(name, fn)
    return fn


class _Factor:
    """One operand over a device base: op(base)[r, c] is at ptr + offset(r, c) * item."""
    __slots__ = ("ptr", "ld", "item", "trans", "code")

    def __init__(self, operand):
        base = operand.base
        self.ptr = base.data.ptr
        self.ld = leading_dim(base)
        self.item = base.dtype.itemsize
        self.trans = bool(operand.op & T)
        self.code = cublas._op(operand.op, False)

    def at(self, r, c):
        return self.ptr + ((c + r * self.ld) if self.trans else (r + c * self.ld)) * self.item


class Calls:
    """cuBLAS gemm and herk/syrk/her2k/syr2k calls of one problem on one GPU (see the module's text)."""

    def __init__(self, handle, problem, factors):
        dt = problem.dtype
        prefix = cublas._PREFIX[dt]
        self.handle = handle
        self.kind = problem.kind
        self.lower = problem.lower
        self._keep = []
        self._scalars = {}
        self.terms = [(self._scalar(coef, dt), _Factor(x), _Factor(y)) for coef, x, y in problem.terms(factors)]
        self.gemm_name = f"cublas{prefix}gemm_v2"
        self.gemm_fn = _function(self.gemm_name, _GEMM)
        self.dtype = dt
        self.rank = None
        if problem.kind in ("herk", "syrk", "her2k", "syr2k"):
            self.rank_name = f"cublas{prefix}{problem.kind}_v2"
            self.rank = _function(self.rank_name, _RANK_K[len(factors)])
            real = cublas._REAL.get(dt, dt)
            self.alpha_t = real if problem.kind == "herk" else dt
            self.beta_t = real if problem.kind in ("herk", "her2k") else dt
            self.factors = [_Factor(f) for f in factors]
            first = factors[0]
            self.rank_trans = 0 if not first.op & T else (2 if problem.kind.startswith("her") else 1)
            self.alpha = problem.alpha

    @classmethod
    def make(cls, handle, problem, factors):
        """Calls for ``factors`` (Operands over device arrays), or None where a size or leading dimension does not
        fit in 32 bits, a base is not column-major, or the library cannot be reached."""
        bases = [f.base for f in factors]
        if any(b.ndim != 2 or (b.shape[0] > 1 and b.strides[0] != b.dtype.itemsize) for b in bases):
            return None
        if max([problem.m, problem.n, problem.k] + [leading_dim(b) for b in bases]) > int_limits.INT_MAX:
            return None
        try:
            return cls(handle, problem, factors)
        except (OSError, AttributeError, KeyError):
            return None

    def _scalar(self, value, dtype):
        key = (complex(value), dtype.char)
        ptr = self._scalars.get(key)
        if ptr is None:
            buf = np.array([value], dtype=dtype)
            self._keep.append(buf)
            ptr = self._scalars[key] = buf.ctypes.data
        return ptr

    def rect(self, i0, i1, j0, j1, k0, k1, c, ldc, beta):
        """C <- sum of coef op(X)[i0:i1, k0:k1] op(Y)[k0:k1, j0:j1] + beta C, C the column-major block at device
        address ``c`` with leading dimension ``ldc``."""
        m, n = i1 - i0, j1 - j0
        if m <= 0 or n <= 0:
            return
        b = self._scalar(beta, self.dtype)
        for coef, x, y in self.terms:
            status = self.gemm_fn(self.handle, x.code, y.code, m, n, k1 - k0, coef, x.at(i0, k0), x.ld,
                                  y.at(k0, j0), y.ld, b, c, ldc)
            if status:
                cublas.check(status, self.gemm_name)
            b = self._scalar(1.0, self.dtype)

    def diagonal(self, i0, i1, k0, k1, out, beta):
        """The triangle of a diagonal block by one herk/syrk/her2k/syr2k (this problem's kind)."""
        n = i1 - i0
        if n <= 0:
            return
        args = [self.handle, cublas.FILL_LOWER if self.lower else cublas.FILL_UPPER, self.rank_trans, n, k1 - k0,
                self._scalar(self.alpha, self.alpha_t)]
        for f in self.factors:
            args += [f.at(i0, k0), f.ld]
        args += [self._scalar(beta, self.beta_t), out.data.ptr, leading_dim(out)]
        status = self.rank(*args)
        if status:
            cublas.check(status, self.rank_name)
