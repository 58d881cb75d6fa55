"""LOBPCG's block updates on the host: row-major tall blocks times small matrices through scipy's BLAS,
the rows cut into pieces that a pool of threads runs at once (one BLAS thread each).

The blocks are column ranges of LOBPCG's n x 3b buffers: n x 8 to n x 24 with a row stride of 3b. numpy
handles such narrow strided blocks row by row (a copy or a multiply of 28503 x 8 takes 0.35-0.9 ms on
the 2-core box, ten times its memory traffic), and OpenBLAS's own threads cost more than they give on
them (they spin after each call, against the sparse product's threads). So every update here is a BLAS
call on the strided block itself, through the GIL-free single calls of hybridblas.lowlevel, and
the parallelism is ours: row pieces of at least MIN_ROWS_PER_THREAD rows on ``threads`` threads.

    gemm(out, a, m, beta)           out <- a m + beta out     (one call, the caller's rows)
    product(out, a, m, beta)        out <- a m + beta out     (rows over the threads; products: several)
    upper_update(v, u, x, c)        v <- v u + x c         (u upper triangular, in place: BLAS trmm)
    residual(r, hx, x, theta)       r <- hx - x diag(theta), and the column sums of squares of r
"""
import contextlib
import os

import numpy as np

from hybridblas import lowlevel, workers
from hybridblas.blas_threads import available_cores

from .arrays import FLOATS, row_major

MIN_ROWS_PER_THREAD = 12288     # 2 x H200 node, 32 cores: 24Mg (28503 rows) best on 2 threads, 46Ti on 4-8
MAX_THREADS = 16


def cores():
    """The cores this process may use, or CISOLVER_THREADS when set (a cap for experiments and shared nodes)."""
    env = os.environ.get("CISOLVER_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"CISOLVER_THREADS must be a positive integer, got {env!r}")
        return int(env)
    return available_cores()


_cap = None


def threads_for(n_rows):
    """Threads worth using on blocks of ``n_rows`` rows (1 for small blocks), within ``limit``'s cap."""
    most = min(MAX_THREADS, cores(), _cap or MAX_THREADS)
    return max(1, min(most, n_rows // MIN_ROWS_PER_THREAD))


@contextlib.contextmanager
def limit(threads):
    """Cap the row threads inside the block (an MPI rank's share of its node's cores); None: no cap."""
    global _cap
    before, _cap = _cap, (None if threads is None else max(1, int(threads)))
    try:
        yield
    finally:
        _cap = before


def by_rows(n, piece, threads=None):
    """Call ``piece(r0, r1)`` on row ranges covering 0..n, on ``threads`` threads; returns their results."""
    threads = threads_for(n) if threads is None else max(1, min(threads, n // MIN_ROWS_PER_THREAD or 1))
    if threads == 1:
        return [piece(0, n)]
    edges = np.linspace(0, n, threads + 1).astype(int)
    return workers.map(lambda edge: piece(*edge), list(zip(edges[:-1].tolist(), edges[1:].tolist())), threads)


def blas_ready(*blocks):
    """True when BLAS can read and write these blocks in place: same float dtype, rows at a positive
    leading dimension, unit stride along a row."""
    x0 = blocks[0]
    return x0.dtype in FLOATS and all(isinstance(x, np.ndarray) and x.dtype == x0.dtype and row_major(x)
                                       for x in blocks)


def gemm(out, a, m, beta):
    """Row-major out (n x q) <- a (n x p) m (p x q) + beta out: one BLAS call on the blocks as they lie."""
    lowlevel.host_gemm(out, a, m, beta)


def _small(m, dtype):
    return np.ascontiguousarray(m, dtype=dtype)


def products(pairs, m, beta=0.0, threads=None):
    """out <- a @ m + beta out for each (out, a) in ``pairs`` (all with the same rows; no ``out`` may share
    elements with an ``a``), each piece of rows doing every pair."""
    m = _small(m, pairs[0][0].dtype)

    def piece(r0, r1):
        for out, a in pairs:
            gemm(out[r0:r1], a[r0:r1], m, beta)
    by_rows(pairs[0][0].shape[0], piece, threads)


def product(out, a, m, beta=0.0, threads=None):
    """out <- a @ m + beta out (``out`` must not share elements with ``a``)."""
    products([(out, a)], m, beta, threads)
    return out


def upper_update(v, u, x, c, threads=None):
    """v <- v @ u + x @ c in place, ``u`` upper triangular (x disjoint from v): a trmm and a gemm per piece
    of rows, no scratch and no copy (a gemm into scratch and a copy back cost 1.8 against 1.1 ms on 24Mg's
    28503 x 16 on the 2-core box)."""
    u, c = _small(np.triu(u), v.dtype), _small(c, v.dtype)

    def piece(r0, r1):
        lowlevel.host_trmm_right(v[r0:r1], u)
        gemm(v[r0:r1], x[r0:r1], c, 1.0)
    by_rows(v.shape[0], piece, threads)
    return v


def residual(r, hx, x, theta, threads=None):
    """r <- hx - x diag(theta); returns the column sums of squares of r (float64, the pieces' sums added
    in row order). Two small gemms per piece, r <- x (-diag(theta)) and r <- r + hx I, read the strided
    blocks at BLAS speed; the sums run on the piece while it is in cache."""
    b = r.shape[1]
    minus_theta = _small(-np.diag(theta), r.dtype)
    eye = np.eye(b, dtype=r.dtype)

    def piece(r0, r1):
        gemm(r[r0:r1], x[r0:r1], minus_theta, 0.0)
        gemm(r[r0:r1], hx[r0:r1], eye, 1.0)
        return np.einsum("ij,ij->j", r[r0:r1], r[r0:r1], dtype=np.float64)
    sums = by_rows(r.shape[0], piece, threads)
    return np.sum(sums, axis=0) if sums else np.zeros(b)
