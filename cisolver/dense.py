"""Dense steps of LOBPCG: tall-skinny Gram products through hybridblas (split-K syrk / gemmt) and
Cholesky-QR (CholQR2: syrk, potrf, trsm).  The small k x k work is done on the host in float64."""

import numpy as np
import scipy.linalg as sla

import hybridblas as hb

from .arrays import module_of, to_host


class NotPositiveDefinite(np.linalg.LinAlgError):
    """S^T S (or W^T W) is not numerically positive definite."""


def _lower_product(a, b, context):
    """Lower triangle of a^T a (b None) or a^T b through hybridblas: split-K syrk / gemmt, on the CPU or,
    for cupy operands, queued on the caller's stream without waiting."""
    if b is None:
        return hb.syrk(1.0, a, trans="T", context=context)
    return hb.gemmt(1.0, a, b, transa="T", context=context)


def _symmetric_host(c, comm):
    """The float64 host copy of a lower-triangle product, summed over ranks, with its upper mirrored."""
    c = to_host(c).astype(np.float64)
    if comm is not None:
        from hybridblas.distributed import allreduce
        c = allreduce(np.ascontiguousarray(c), comm)
    low = np.tril(c)
    return low + np.tril(low, -1).T


def gram(a, b=None, context=None, comm=None):
    """Symmetric a^T a (b None) or the symmetrised a^T b, as a float64 host array.

    With ``comm`` (rows distributed over MPI ranks) the local products are summed by one Allreduce.

    Only the lower triangle is computed (the library writes one triangle); the upper is mirrored.
    For a^T b this assumes a^T b is symmetric, true for S^T (H S) with symmetric H.
    """
    return _symmetric_host(_lower_product(a, b, context), comm)


def cholesky_upper(g, what="S^T S"):
    """Upper Cholesky factor R (g = R^T R); raises NotPositiveDefinite on failure."""
    try:
        r = sla.cholesky(g, lower=False, check_finite=True)
    except (np.linalg.LinAlgError, ValueError) as exc:
        raise NotPositiveDefinite(f"Cholesky of {what} failed: {exc}") from None
    d = np.abs(np.diag(r))
    if d.size and d.min() <= np.finfo(np.float64).eps ** 0.5 * 1e-2 * d.max():
        raise NotPositiveDefinite(f"{what} is numerically singular (diag(R) ratio {d.min() / d.max():.2e})")
    return r


def inverse_upper(r):
    """R^{-1} of a small upper-triangular host R (float64)."""
    return sla.solve_triangular(r, np.eye(r.shape[0]), lower=False)


def right_trsm(w, r, rinv=None):
    """w <- w R^{-1} in place (R upper triangular, small, host float64); w is n x k, any order.
    ``rinv``: R^{-1} when the caller has it already (one inverse for W and H W).

    One tall-skinny gemm with the small inverse, on the host and on a GPU: a triangular solve with a
    few rows and many right-hand sides is 4-7x slower (28503 x 8 on this 2-core box: trsm 2.4 ms, gemm
    0.5 ms; 1.96 M x 8 on an H200: 0.75 ms against 0.10 ms, benchmarks/bench_dense_steps.py). R is well
    conditioned here: CholQR2's second pass has R ~ I, and cholesky_upper rejects a near-singular one.
    """
    xp = module_of(w)
    rinv = inverse_upper(r) if rinv is None else rinv
    w[...] = w @ xp.asarray(rinv, dtype=w.dtype)
    return w


def cholqr2(w, hw=None, context=None, comm=None, passes=2):
    """Orthonormalise the columns of w in place by Cholesky-QR twice (``passes``); hw (= H w) gets the
    same R^{-1}.

    Returns the combined upper factor R (w_in = w_out R).
    """
    r_total = np.eye(w.shape[1])
    for _ in range(passes):
        r = cholesky_upper(gram(w, context=context, comm=comm), "W^T W")
        rinv = inverse_upper(r)
        right_trsm(w, r, rinv)
        if hw is not None:
            right_trsm(hw, r, rinv)
        r_total = r @ r_total
    return r_total


CANCELLATION = 1e-2   # below this share of a column's length outside span(X), project explicitly first


def orthonormalise_against(x, w, context=None, comm=None, passes=2):
    """W <- W minus its X components, then orthonormal, in place; X has orthonormal columns.

    Each pass computes X^T W and W^T W and takes them to the host together. By Pythagoras,
    (W - X X^T W)^T (W - X X^T W) = W^T W - (X^T W)^T (X^T W), so one Cholesky factor R of that serves,
    and W <- (W - X X^T W) R^{-1}. Two passes is block classical Gram-Schmidt with the Pythagorean inner
    product (BCGS-PIP2): one trip to the host per pass, where projection then CholQR2 took four.
    Without a preconditioner W is LOBPCG's residual, nearly orthogonal to the Ritz vectors X. A
    preconditioned W can lie mostly in span(X); the subtraction would then cancel, so when a column keeps
    less than CANCELLATION of its squared length outside X, that pass only projects (W -= X X^T W), and
    the Pythagorean passes follow (at most two such projections). A column that projection leaves at
    rounding level lies in span(X): NotPositiveDefinite.
    """
    xp = module_of(w)
    floor = (100 * np.finfo(w.dtype).eps) ** 2     # squared length left by rounding alone
    done = projected = 0
    first = None
    while done < passes:
        # queued; gram's trip to the host waits for it. cupy's matmul, not hybridblas: with hb.gemm the
        # W step took 3.0 ms per iteration at 48Cr on an H200, 2.7 ms this way (per-call overhead)
        xw = x.T @ w
        ww = gram(w, context=context, comm=comm)
        xw = to_host(xw).astype(np.float64)
        if comm is not None:
            from hybridblas.distributed import allreduce
            xw = allreduce(np.ascontiguousarray(xw), comm)
        if first is None:
            first = np.diag(ww).copy()
        elif done == 0 and (np.diag(ww) < floor * first).any():     # measured after explicit projection
            left = (np.diag(ww) / first).min()
            raise NotPositiveDefinite(f"a column of W lies in span(X) to rounding ({left:.2e} of it is left)")
        outside = ww - xw.T @ xw
        if projected < 2 and (np.diag(outside) < CANCELLATION * np.diag(ww)).any():
            w -= x @ xp.asarray(xw, dtype=w.dtype)
            projected += 1
            continue
        r = cholesky_upper(outside, "W^T W after projection")
        rinv = inverse_upper(r)
        w[...] = w @ xp.asarray(rinv, dtype=w.dtype) - x @ xp.asarray(xw @ rinv, dtype=w.dtype)
        done += 1
    return w


def rayleigh_ritz(s, hs, n_keep, context=None, comm=None):
    """Smallest n_keep eigenpairs of (S^T H S, S^T S): Cholesky of S^T S, then a standard eigh.

    S^T S is scaled to a unit diagonal first (Jacobi), so columns of very different lengths (a P
    block that is not normalised) do not make the Cholesky fail.
    Returns (theta, C, all_theta); raises NotPositiveDefinite when S^T S is ill-conditioned.
    """
    g, o = _lower_product(s, hs, context), _lower_product(s, None, context)   # both queued, then one wait
    g, o = _symmetric_host(g, comm), _symmetric_host(o, comm)
    d = np.diag(o)
    if not (d > 0).all():
        raise NotPositiveDefinite(f"S^T S has a non-positive diagonal entry ({d.min():.3g})")
    d = 1.0 / np.sqrt(d)
    g, o = g * np.outer(d, d), o * np.outer(d, d)
    r = cholesky_upper(o)
    # A = R^{-T} G R^{-1}; eigenvectors C = R^{-1} Y
    a = sla.solve_triangular(r, sla.solve_triangular(r, g, trans="T").T, trans="T").T
    a = 0.5 * (a + a.T)
    vals, vecs = np.linalg.eigh(a)
    c = d[:, None] * sla.solve_triangular(r, vecs[:, :n_keep])
    return vals[:n_keep], c, vals
