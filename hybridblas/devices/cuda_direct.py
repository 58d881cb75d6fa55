"""Double-precision calls on the one GPU that holds every operand, C wider than cuda_inline's: cuBLAS's own
routine on the caller's current stream, from the caller's thread.

A call whose operands and C all live on the one GPU that computes it needs no staging, so the tiled run's
machinery (worker threads, three streams, events, a panel cache, a dozen tiles each a cuBLAS call from
Python) is pure cost there. Measured on one H100, complex128, best of 3 (n = 4414, k = 3136 is a FLAPW
k-point's product): tiled against here, zherk 5.84 / 4.41 ms, zher2k 11.96 / 10.13 ms, zgemmt 6.30 / 6.30 ms; at
n = k = 8192 1.11, 1.03 and 0.99 times faster here. Tiled, the caller's thread was busy for the whole call, and
two callers on two GPUs at once slowed each other's zgemmt from 5.9 to 10.5-12.4 ms.

Here herk, her2k, syrk and syr2k are one cuBLAS call, gemm one per term, and gemmt one herkx or syrkx where
its two ops allow (op(B) = op'(B')^H or ^T with op' the op of A: what flapw's and LOBPCG's products are).
cuBLAS documents herkx and syrkx for results known to be Hermitian or symmetric; they compute the requested
triangle's entries as products like any other (checked against non-Hermitian products on every trans, layout and
triangle to n = 2049 in the tests, and on sampled entries of A^H X with unrelated A, X to n = 16384 in
benchmarks.blas), except that herkx makes the diagonal real, so after a herkx the diagonal is computed once more,
exactly, as n dot products in one strided-batched gemm. Other gemmt calls, and herkx with
a complex beta, keep the tiles. The call is queued on CuPy's current stream, ordered with the caller's own
work like any CuPy operation, and returns without waiting for the GPU (as cuda_inline's calls do).

cuBLAS's rank-k routines run a short, wide C against a long k without splitting k (cuda_inline: 10x
slower than a gemm at 24 x 24 from k = 3e4), so calls with k above K_RATIO times n keep the tiles.
"""
import numpy as np

from .. import cublas, plan
from ..kernels import rect_block
from ..problem import C, T, Operand, leading_dim
from . import cuda_inline

K_RATIO = 16        # here only while k <= K_RATIO * n
_DOUBLE = (np.dtype(np.float64), np.dtype(np.complex128))


def applies(problem, device, ctx=None):
    """Double precision on one GPU that holds every operand and C, C wider than cuda_inline takes, a cuBLAS
    routine for the whole call, and no memory cap, fixed block or emulation asked for (those want tiles)."""
    if problem.dtype not in _DOUBLE or problem.run.emulation or (ctx is not None and getattr(ctx, "block_size", None)):
        return False
    if max(problem.m, problem.n) <= cuda_inline.MAX_EDGE or min(problem.m, problem.n, problem.k) == 0:
        return False
    if problem.kind != "gemm" and problem.k > K_RATIO * problem.n:
        return False
    if problem.kind == "gemmt" and rank_kx(problem) is None:
        return False
    return cuda_inline.held_whole(problem, device)


def run(problem, device):
    import cupy
    with cupy.cuda.Device(device.index):
        backend = cublas.Backend(cublas.handle(), cupy.cuda.get_current_stream())
        if problem.kind == "gemm":
            rect_block(backend, problem.terms(), 0, problem.m, 0, problem.n, 0, problem.k, problem.c, problem.beta)
        elif problem.kind == "gemmt":
            _gemmt(backend, problem)
        else:
            task = plan.whole(problem)
            blocks = [f.block(task.i0, task.i1, task.k0, task.k1) for f in problem.factors]
            backend.rank_k(problem.kind, problem.c, problem.lower, problem.alpha, blocks, problem.beta)


def rank_kx(problem, factors=None, beta=None):
    """(kind, coef, x, y) of the gemmt C[tri] += coef op(X) op(Y) when it is a cuBLAS herkx (op(Y) = op_X(Y)^H,
    complex data, real beta: the problem's, or ``beta``) or syrkx (op(Y) = op_X(Y)^T), else None; x and y are
    the terms' operands over ``factors`` (default the problem's)."""
    terms = problem.terms(factors)
    if len(terms) != 1:
        return None
    coef, x, y = terms[0]
    flip = x.op ^ y.op
    beta = problem.beta if beta is None else beta
    if problem.complex and flip == T:
        kind = "syrkx"
    elif problem.complex and flip == C and complex(beta).imag == 0:
        kind = "herkx"
    elif not problem.complex and flip & T:
        kind = "syrkx"
    else:
        return None
    return kind, coef, x, y


def _gemmt(backend, problem):
    kind, coef, x, y = rank_kx(problem)
    gemmt_kx(backend, kind, coef, x, y, problem.c, problem.lower, problem.beta)


def gemmt_kx(backend, kind, coef, x, y, c, lower, beta, dots=None):
    """c[tri] <- coef op(x) op(y) + beta c[tri] as one cuBLAS ``kind`` (herkx or syrkx, from rank_kx) on the
    square column-major view c, op(x) n x k and op(y) k x n; after a herkx the diagonal is computed once more.
    ``dots`` (herkx): (buffer, event) from diagonal_dots queued by the caller on another stream, which c's
    stream waits for before it writes them; else they are computed here, on c's stream."""
    n = c.shape[0]
    diagonal = _diagonal(c) if kind == "herkx" else None
    old = diagonal.copy() if diagonal is not None and beta != 0 else None        # beta = 0 never reads C
    factors = [x, Operand(y.base, x.op, y.scratch)]                # cuBLAS takes one op for both
    backend.rank_k(kind, c, lower, coef, factors, complex(beta).real if kind == "herkx" else beta)
    if diagonal is None:
        return
    if dots is None:
        values = backend.xp.empty((n, 1, 1), dtype=c.dtype)
        diagonal_dots(backend, coef, x, y, values)
    else:
        values, ready = dots
        backend.stream.wait_event(ready)
    values = values.reshape(n)
    if old is not None:
        values += beta * old
    diagonal[...] = values


def diagonal_dots(backend, coef, x, y, out):
    """out[i, 0, 0] <- coef op(x)[i, :] op(y)[:, i] for every i (out: (n, 1, 1)), one strided-batched gemm on
    ``backend``'s stream."""
    k = x.cols
    cublas.gemm_strided_batched(backend.handle, backend.stream.ptr, out, coef,
                                x.block(0, 1, 0, k), leading_dim(x.base) if x.trans else 1,
                                y.block(0, k, 0, 1), 1 if y.trans else leading_dim(y.base), 0.0)


def _diagonal(c):
    """The diagonal of the column-major square view ``c``, as a view."""
    from cupy.lib.stride_tricks import as_strided
    return as_strided(c, shape=(c.shape[0],), strides=(c.strides[0] + c.strides[1],))
