"""Keep every BLAS call's integers in range, whatever the sizes of the caller's arrays.

scipy's cython_blas (LP64) and cuBLAS's classic API take m, n, k and leading dimensions as 32-bit ints;
a larger value would wrap (BLAS then reports an illegal argument and computes nothing). The host and the
cuBLAS wrappers call through ``gemm`` and ``rank_k`` here, which pass a call that fits straight to the
one-call kernel and otherwise cut it:

* k into chunks of at most INT_MAX, the first with the caller's beta and the others adding (beta = 1);
* C's rows and columns into blocks of at most INT_MAX (a triangle's off-diagonal blocks become gemms);
* a block whose leading dimension itself exceeds INT_MAX is copied into a compact column-major buffer
  (C is copied back after the call); such blocks are cut small enough that one copy holds at most
  COPY_ELEMENTS elements.

``Scratch`` says where the compact copies live: numpy on the host, cupy on the stream of the BLAS call.
"""
import ctypes
import math
from contextlib import contextmanager, nullcontext

from .problem import Operand, leading_dim, product_terms

INT_MAX = 2**31 - 1            # the largest size or leading dimension one BLAS call is given
COPY_ELEMENTS = 1 << 24        # elements of one compact copy of an out-of-range block (128 MiB in float64)
_C_INT_MIN, _C_INT_MAX = -2**31, 2**31 - 1


def c_int(value):
    """ctypes.c_int(value), refused when it does not fit (ctypes would wrap it silently)."""
    value = int(value)
    if not _C_INT_MIN <= value <= _C_INT_MAX:
        raise OverflowError(f"BLAS integer argument {value} does not fit in 32 bits")
    return ctypes.c_int(value)


class Scratch:
    """Compact copies of blocks whose leading dimension is out of range. ``setup()`` -> (xp, stream): the
    array module that makes them and a context manager that makes them on the BLAS call's stream (or
    None); it runs only when a copy is needed, so a call that fits pays nothing."""

    def __init__(self, setup):
        self._setup = setup

    def _copy(self, write):
        xp, stream = self._setup()
        with stream if stream is not None else nullcontext():
            return write(xp)

    def operand(self, x):
        """x itself, or an Operand on a compact column-major copy of its base."""
        if leading_dim(x.base) <= INT_MAX:
            return x
        return Operand(self._copy(lambda xp: xp.asfortranarray(x.base)), x.op, scratch=True)

    @contextmanager
    def output(self, c):
        """c itself, or a compact copy of it that is written back once the block is done."""
        if leading_dim(c) <= INT_MAX:
            yield c
            return
        work = self._copy(lambda xp: xp.asfortranarray(c))
        yield work
        self._copy(lambda xp: xp.copyto(c, work))


def _ranges(extent, step):
    """[(start, stop)] of at most ``step`` each; one empty range for a zero extent (beta still applies)."""
    return [(i, min(i + step, extent)) for i in range(0, extent, step)] or [(0, 0)]


def _steps(extents, spans):
    """Chunk length per axis: at most INT_MAX, and for each operand whose leading dimension is out of
    range (``spans``: [((axis, axis), leading dimension)]) small enough that its copy holds at most
    COPY_ELEMENTS elements."""
    step = {axis: max(1, min(extent, INT_MAX)) for axis, extent in extents.items()}
    side = math.isqrt(COPY_ELEMENTS)
    for axes, ld in spans:
        if ld > INT_MAX:
            short, long_ = sorted(axes, key=step.get)
            step[short] = min(step[short], side)
            step[long_] = min(step[long_], max(1, COPY_ELEMENTS // step[short]))
    return step


def gemm(kernel, scratch, c, alpha, x, y, beta):
    """c <- alpha op(x) op(y) + beta c through ``kernel`` (the same signature, one BLAS call whose
    integers fit), cut into calls that fit; x, y are Operands and c is a column-major view."""
    m, n = c.shape
    k = x.cols
    lds = leading_dim(c), leading_dim(x.base), leading_dim(y.base)
    if max(m, n, k, *lds) <= INT_MAX:
        kernel(c, alpha, x, y, beta)
        return
    step = _steps({"m": m, "n": n, "k": k}, [(("m", "n"), lds[0]), (("m", "k"), lds[1]), (("k", "n"), lds[2])])
    for i0, i1 in _ranges(m, step["m"]) if m else []:
        for j0, j1 in _ranges(n, step["n"]) if n else []:
            with scratch.output(c[i0:i1, j0:j1]) as out:
                b = beta
                for k0, k1 in _ranges(k, step["k"]):
                    kernel(out, alpha, scratch.operand(x.block(i0, i1, k0, k1)),
                           scratch.operand(y.block(k0, k1, j0, j1)), b)
                    b = 1.0


def rank_k(kernel, gemm_kernel, scratch, kind, c, lower, alpha, factors, beta):
    """The ``lower`` (else upper) triangle of c <- the ``kind`` product of ``factors`` + beta c through
    ``kernel`` (kind, c, lower, alpha, factors, beta; one BLAS call whose integers fit), cut into calls
    that fit: diagonal blocks through ``kernel``, the blocks between them through ``gemm_kernel``.
    ``kind``: herk syrk her2k syr2k (the factors share one op), or herkx syrkx (op(a) op(b)^H or ^T)."""
    n = c.shape[0]
    k = factors[0].cols
    lds = [leading_dim(c)] + [leading_dim(f.base) for f in factors]
    if max(n, k, *lds) <= INT_MAX:
        kernel(kind, c, lower, alpha, factors, beta)
        return
    step = _steps({"n": n, "k": k}, [(("n", "n"), lds[0])] + [(("n", "k"), ld) for ld in lds[1:]])
    blocks = _ranges(n, step["n"]) if n else []
    terms = product_terms(kind, alpha, factors)
    for bi, (i0, i1) in enumerate(blocks):
        with scratch.output(c[i0:i1, i0:i1]) as out:
            b = beta
            for k0, k1 in _ranges(k, step["k"]):
                kernel(kind, out, lower, alpha, [scratch.operand(f.block(i0, i1, k0, k1)) for f in factors], b)
                b = 1.0
        for j0, j1 in blocks[:bi]:        # the blocks beside the diagonal one, in the requested triangle
            r0, r1, q0, q1 = (i0, i1, j0, j1) if lower else (j0, j1, i0, i1)
            b = beta
            for coef, x, y in terms:
                gemm(gemm_kernel, scratch, c[r0:r1, q0:q1], coef, x.block(r0, r1, 0, k), y.block(0, k, q0, q1), b)
                b = 1.0
