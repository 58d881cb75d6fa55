"""Small calls on the one GPU that holds every operand: cuBLAS on the caller's current stream.

LOBPCG's Gram matrices (C of 24 x 24, k from 3e4 to 2e6) are microseconds of GPU work. The tiled run
(three streams, events, a panel cache and a free-memory query per call) cost 0.66 ms per such call in
float64 and 3 ms in float32 with its k chunks, against 35 us for a cupy matmul
(benchmarks.blas small-calls, H200). Here such a call is queued on CuPy's current stream, ordered
with the caller's own work like any CuPy operation, and returns without waiting for the GPU.

Single precision sums k in chunks of CHUNK terms, each chunk one sgemm of a strided-batched call, and
adds the chunks' partial products in double before rounding once: cuBLAS's own float32 gemm/syrk sums
a whole k range in one float32 accumulator (10x the error of CPU BLAS on LOBPCG's Gram matrices,
docs/performance.md), and widening the operands to double first cost 6x a float32 gemm at 48Cr's
k = 1.96e6 (benchmarks.cisolver dense-steps).

float32 products whose operands are row-major tall blocks (LOBPCG's S^T S) go to cuda_skinny instead:
one kernel that streams k once and sums in double (faster than these chunks, whose batched calls leave
the host busy, and 10x more accurate).
"""
import threading

import numpy as np

from .. import cublas, plan
from . import cuda_ozaki, cuda_skinny
from ..kernels import compute_block, rect_block
from ..problem import leading_dim

MAX_EDGE = 512              # C at most this wide: its triangle comes from one full scratch product
CHUNK = 512                 # single-precision k terms summed in float32 before going into double
PARTIALS_BYTES = 64 << 20   # partial products held at once (one strided-batched call fills them)
_WIDE = {np.dtype(np.float32): np.dtype(np.float64), np.dtype(np.complex64): np.dtype(np.complex128)}
_masks = {}
_masks_lock = threading.Lock()


def held_whole(problem, device):
    """``device`` is a GPU holding C and every operand, and no memory cap or fixed block asks for tiles: a call
    it can run on the caller's stream (here, or cuda_direct's)."""
    if device.kind != "cuda" or problem.xp is np:
        return False
    if device.memory_limit or device.block or problem.run.memory_limit:
        return False
    return all(x.device.id == device.index for x in [problem.c] + [f.base for f in problem.factors])


def applies(problem, device):
    """One GPU, every operand on it, C small, no memory cap or fixed block asked for (those want tiles)."""
    if max(problem.m, problem.n) > MAX_EDGE:
        return False
    if problem.run.emulation and cuda_ozaki.applies(problem.dtype, problem.m, problem.n, problem.k, problem.alpha):
        return False            # emulated products run in the tiles (never at these sizes by default)
    return held_whole(problem, device)


def run(problem, device):
    import cupy
    with cupy.cuda.Device(device.index):
        if cuda_skinny.applies(problem):       # float32 row-major tall blocks: one pass, summed in double
            cuda_skinny.run(problem)
            return
        backend = cublas.Backend(cublas.handle(), cupy.cuda.get_current_stream())
        if problem.dtype in _WIDE:
            _store(cupy, problem, problem.c, _chunked_full(backend, problem))
        elif problem.kind == "gemm":
            compute_block(backend, problem, plan.whole(problem), problem.c, problem.beta)
        else:
            _triangle(backend, problem, problem.c, problem.beta)


def _chunked_full(backend, problem):
    """The full m x n of sum_t coef_t op(X_t) op(Y_t) + beta C in double, from single-precision chunks."""
    xp = backend.xp
    m, n, k = problem.m, problem.n, problem.k
    wide = _WIDE[problem.dtype]
    full = xp.zeros((m, n), dtype=wide, order="F")
    if m == 0 or n == 0:
        return full
    if problem.beta != 0:       # beta = 0 never reads C (it may hold anything, NaN included)
        full += problem.beta * problem.c.astype(wide)   # widened first: beta C rounds once, in full
    terms = problem.terms()
    chunks = k // CHUNK
    per_call = max(1, PARTIALS_BYTES // (m * n * problem.dtype.itemsize))
    for c0 in range(0, chunks, per_call):
        c1 = min(chunks, c0 + per_call)
        parts = xp.empty((c1 - c0, n, m), dtype=problem.dtype)    # column-major m x n blocks
        for t, (coef, x, y) in enumerate(terms):
            k0 = c0 * CHUNK     # the first chunk of this call; the strides reach the others
            xb, yb = x.block(0, m, k0, k0 + CHUNK), y.block(k0, k0 + CHUNK, 0, n)
            cublas.gemm_strided_batched(backend.handle, backend.stream.ptr, parts, coef,
                                        xb, _chunk_stride(xb, left=True), yb, _chunk_stride(yb, left=False),
                                        0.0 if t == 0 else 1.0)
        full += parts.sum(axis=0, dtype=wide).T
    if chunks * CHUNK < k:      # the last k terms, fewer than CHUNK
        tail = xp.empty((m, n), dtype=problem.dtype, order="F")
        rect_block(backend, terms, 0, m, 0, n, chunks * CHUNK, k, tail, 0.0)
        full += tail
    return full


def _chunk_stride(x, left):
    """Elements between the starts of consecutive CHUNK-long k ranges of operand x: op(x) is m x k when
    ``left``, k x n otherwise; k runs along the base's unit-stride axis 0 or its leading-dimension axis 1."""
    k_on_axis0 = x.trans if left else not x.trans
    return CHUNK if k_on_axis0 else CHUNK * leading_dim(x.base)


def _store(xp, problem, out, full):
    """Round ``full`` into out: all of it for gemm, else its triangle (herk/her2k with a real diagonal)."""
    if problem.kind == "gemm":
        out[...] = full
        return
    if problem.hermitian:
        xp.copyto(full, full.real, where=_mask(xp, problem.m, None))
    xp.copyto(out, full, where=_mask(xp, problem.m, problem.lower))


def _triangle(backend, problem, out, beta):
    """The triangle from full products and a masked copy. cuBLAS's syrk/herk run a tall-skinny product
    (24 x 24 from k = 3e4) without splitting k: 10x slower than a gemm, which does (benchmarks.blas small-calls);
    C is at most MAX_EDGE wide, so the other triangle's flops cost nothing that shows."""
    xp = backend.xp
    n = problem.m
    scratch = xp.empty((n, n), dtype=out.dtype, order="F")
    rect_block(backend, problem.terms(), 0, n, 0, n, 0, problem.k, scratch, 0.0)
    if beta != 0:
        scratch += beta * out
    _store(xp, problem, out, scratch)


def _mask(xp, n, lower):
    """Boolean n x n mask on the current GPU: lower or upper triangle, or the diagonal (lower=None).

    Made once and shared by every thread: it is published only after the stream that filled it has
    finished, since another caller may read it at once from a stream of its own."""
    key = (xp.cuda.Device().id, n, lower)
    mask = _masks.get(key)
    if mask is None:
        with _masks_lock:
            mask = _masks.get(key)
            if mask is None:
                ones = xp.ones((n, n), dtype=bool)
                mask = xp.eye(n, dtype=bool) if lower is None else (xp.tril(ones) if lower else xp.triu(ones))
                xp.cuda.get_current_stream().synchronize()
                _masks[key] = mask
    return mask
