"""Small calls on the one GPU that holds every operand: cuBLAS on the caller's current stream.

LOBPCG's Gram matrices (C of 24 x 24, k from 3e4 to 2e6) are microseconds of GPU work. The tiled run
(three streams, events, a panel cache and a free-memory query per call) cost 0.66 ms per such call in
float64 and 3 ms in float32 with its k chunks, against 35 us for a cupy matmul
(benchmarks/bench_small_calls.py, H200). Here such a call is queued on CuPy's current stream, ordered
with the caller's own work like any CuPy operation, and returns without waiting for the GPU.

Single precision is computed in double precision, the operands widened in slices of k, and rounded
once: cuBLAS's float32 syrk sums a whole k range in one float32 accumulator (10x the error of CPU BLAS
on LOBPCG's Gram matrices, docs/performance.md). Measured cost: at k = 28503 163 us per call (cupy's
sgemm 20 us); at k = 1.96e6 (48Cr) 2.7 ms for S^T S against 0.45 ms for cupy's sgemm
(bench_dense_steps.py). Next step, not yet proven on a GPU: k chunks as one strided-batched sgemm with
the partial sums added in double.
"""
import dataclasses

import numpy as np

from .. import cublas, plan
from ..kernels import compute_block, rect_block
from ..problem import Operand, k_axis

MAX_EDGE = 512              # C at most this wide: its triangle comes from one full scratch product
WIDEN_BYTES = 64 << 20      # a k slice of one widened operand holds at most this many bytes
_WIDE = {np.dtype(np.float32): np.dtype(np.float64), np.dtype(np.complex64): np.dtype(np.complex128)}
_masks = {}


def applies(problem, device):
    """One GPU, every operand on it, C small, no memory cap or fixed block asked for (those want tiles)."""
    if device.kind != "cuda" or problem.xp is np or max(problem.m, problem.n) > MAX_EDGE:
        return False
    if device.memory_limit or device.block or problem.extra.get("memory_limit") \
            or problem.extra.get("device_block"):
        return False
    return all(x.device.id == device.index for x in [problem.c] + [f.base for f in problem.factors])


def run(problem, device):
    import cupy
    with cupy.cuda.Device(device.index):
        backend = cublas.Backend(cupy.cuda.device.get_cublas_handle(), cupy.cuda.get_current_stream())
        wide = _WIDE.get(problem.dtype)
        if wide is None:
            _compute(backend, problem, problem.c, problem.beta)
            return
        acc = problem.c.astype(wide, order="F")    # the untouched triangle goes back unchanged
        step = max(1, WIDEN_BYTES // (max(problem.m, problem.n, 1) * wide.itemsize))
        for k0 in range(0, problem.k, step):
            k1 = min(problem.k, k0 + step)
            factors = [_widened_slice(problem, f, fac, k0, k1, wide) for f, fac in enumerate(problem.factors)]
            part = dataclasses.replace(problem, c=acc, factors=factors, k=k1 - k0, writeback=None)
            _compute(backend, part, acc, problem.beta if k0 == 0 else 1.0)
        problem.c[...] = acc


def _widened_slice(problem, f, fac, k0, k1, wide):
    """Factor f's k range [k0, k1) as a double-precision column-major copy with the same op."""
    part = fac.base[k0:k1, :] if k_axis(problem.kind, f, fac.op) == 0 else fac.base[:, k0:k1]
    return Operand(part.astype(wide, order="F"), fac.op, scratch=True)


def _compute(backend, problem, out, beta):
    if problem.kind == "gemm":
        compute_block(backend, problem, plan.whole(problem), out, beta)
    else:
        _triangle(backend, problem, out, beta)


def _triangle(backend, problem, out, beta):
    """The triangle from full products and a masked copy. cuBLAS's syrk/herk run a tall-skinny product
    (24 x 24 from k = 3e4) without splitting k: 10x slower than a gemm, which does (bench_small_calls.py);
    C is at most MAX_EDGE wide, so the other triangle's flops cost nothing that shows."""
    xp = backend.xp
    n = problem.m
    scratch = xp.empty((n, n), dtype=out.dtype, order="F")
    rect_block(backend, problem.terms(), 0, n, 0, n, 0, problem.k, scratch, 0.0)
    if beta != 0:
        scratch += beta * out
    if problem.hermitian:     # herk/her2k leave an exactly real diagonal
        xp.copyto(scratch, scratch.real, where=_mask(xp, n, None))
    xp.copyto(out, scratch, where=_mask(xp, n, problem.lower))


def _mask(xp, n, lower):
    """Boolean n x n mask on the current GPU: lower or upper triangle, or the diagonal (lower=None)."""
    key = (xp.cuda.Device().id, n, lower)
    if key not in _masks:
        ones = xp.ones((n, n), dtype=bool)
        _masks[key] = xp.eye(n, dtype=bool) if lower is None else (xp.tril(ones) if lower else xp.triu(ones))
    return _masks[key]
