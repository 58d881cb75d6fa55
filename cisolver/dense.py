"""Dense steps of LOBPCG: tall-skinny Gram products through hybridblas (split-K syrk / gemmt) and
Cholesky-QR (CholQR2: syrk, potrf, trsm).  The small k x k work is done on the host in float64."""

import numpy as np
from scipy.linalg import lapack

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


def host_sum(c, comm):
    """The float64 host copy of a product or vector of this rank's rows, summed over ranks when ``comm``."""
    c = to_host(c).astype(np.float64)
    if comm is not None:
        from hybridblas.distributed import allreduce
        c = allreduce(np.ascontiguousarray(c), comm)
    return c


def _symmetric_host(c, comm):
    """The float64 host copy of a lower-triangle product, summed over ranks, with its upper mirrored."""
    return _mirrored(host_sum(c, comm))


def _mirrored(lower):
    """A float64 C-ordered copy of a host matrix whose lower triangle holds the values, upper mirrored."""
    c = np.array(lower, dtype=np.float64, order="C")    # our own copy: mirrored in place
    upper = _upper_indices(c.shape[0])
    c[upper] = c.T[upper]
    return c


_upper_cache = {}


def _upper_indices(n):
    if n not in _upper_cache:
        _upper_cache[n] = np.triu_indices(n, 1)
    return _upper_cache[n]


def gram(a, b=None, context=None, comm=None):
    """Symmetric a^T a (b None) or the symmetrised a^T b, as a float64 host array.

    With ``comm`` (rows distributed over MPI ranks) the local products are summed by one Allreduce.

    Only the lower triangle is computed (the library writes one triangle); the upper is mirrored.
    For a^T b this assumes a^T b is symmetric, true for S^T (H S) with symmetric H.
    """
    return _symmetric_host(_lower_product(a, b, context), comm)


def cholesky_upper(g, what="S^T S"):
    """Upper Cholesky factor R (g = R^T R); raises NotPositiveDefinite on failure."""
    # LAPACK's potrf directly: scipy.linalg.cholesky's checks cost 6x the factorisation of a 24 x 24
    if not np.isfinite(g).all():
        raise NotPositiveDefinite(f"Cholesky of {what} failed: it has non-finite entries")
    r, info = lapack.dpotrf(g, lower=0, clean=1)
    if info != 0:
        raise NotPositiveDefinite(f"Cholesky of {what} failed: LAPACK potrf info {info} (leading minor "
                                  f"{info} is not positive definite)" if info > 0 else f"potrf info {info}")
    d = np.abs(np.diag(r))
    if d.size and d.min() <= np.finfo(np.float64).eps ** 0.5 * 1e-2 * d.max():
        raise NotPositiveDefinite(f"{what} is numerically singular (diag(R) ratio {d.min() / d.max():.2e})")
    return r


def inverse_upper(r):
    """R^{-1} of a small upper-triangular host R (float64), by LAPACK's trtri."""
    rinv, info = lapack.dtrtri(r, lower=0)
    if info != 0:
        raise NotPositiveDefinite(f"the triangular factor is singular (LAPACK trtri info {info})")
    return rinv


def right_trsm(w, r, rinv=None):
    """w <- w R^{-1} in place (R upper triangular, small, host float64); w is n x k, any order.
    ``rinv``: R^{-1} when the caller has it already (one inverse for W and H W).

    One tall-skinny gemm with the small inverse, on the host and on a GPU: a triangular solve with a
    few rows and many right-hand sides is 4-7x slower (28503 x 8 on this 2-core box: trsm 2.4 ms, gemm
    0.5 ms; 1.96 M x 8 on an H200: 0.75 ms against 0.10 ms, benchmarks.cisolver dense-steps). R is well
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


def cross(a, b, context=None, comm=None):
    """a^T b as a float64 host array (a, b tall, rows over MPI ranks summed by one Allreduce when ``comm``)."""
    return host_sum(hb.gemm(1.0, a, b, transa="T", context=context), comm)


def scaled_cholesky(g, what):
    """Upper R with g = R^T R, from the Cholesky of g scaled to a unit diagonal (Jacobi): columns of very
    different lengths (a preconditioned W beside unit P columns) are not mistaken for a singular g."""
    d = np.diag(g)
    if not (d > 0).all():
        raise NotPositiveDefinite(f"{what} has a non-positive diagonal entry ({d.min():.3g})")
    d = np.sqrt(d)
    return cholesky_upper(g / np.outer(d, d), what) * d[None, :]


CANCELLATION = 1e-2   # below this share of a column's length outside span(X), project explicitly first
# adaptive: one pass is enough when it leaves [X V] this close to orthonormal (u kappa^2 below)
SINGLE_PASS_LOSS = 1e-4


def predicted_loss(r, rinv, dtype):
    """Loss of orthogonality one Cholesky-QR pass with factor ``r`` leaves: the unit roundoff times
    kappa(R_s)^2, R_s the factor of the Jacobi-scaled Gram matrix (Yamamoto et al. 2015). kappa is bounded
    above by Frobenius norms (an SVD of the small factor cost ~0.1 ms of host time per iteration)."""
    d = np.linalg.norm(r, axis=0)                    # column lengths of V: R_s = R D^{-1}
    kappa = np.linalg.norm(r / d[None, :]) * np.linalg.norm(rinv * d[:, None])
    return 0.5 * np.finfo(dtype).eps * kappa ** 2


def orthonormalise_tail(s, hs, b, n_p, context=None, comm=None, passes=2, adaptive=False):
    """V = s[:, b:] made orthonormal and orthogonal to X = s[:, :b] (orthonormal), in place; V = [P W]
    with P its first ``n_p`` columns, and hs[:, b:b + n_p] (H P) follows P by the same coefficients.

    Each pass takes S^T V = [X^T V; V^T V] to the host in one product and one trip. By Pythagoras,
    (V - X X^T V)^T (V - X X^T V) = V^T V - (X^T V)^T (X^T V), so one Cholesky factor R of that serves, and
    V <- V R^{-1} - X (X^T V R^{-1}) = [X V] [-X^T V R^{-1}; R^{-1}] is one update (blocks.tail_update: one
    cuBLAS gemm into a scratch block and a copy back on a GPU, a trmm and a gemm on the host). Two passes is block
    classical Gram-Schmidt with the Pythagorean inner product (BCGS-PIP2). R is upper triangular, so the
    new P columns combine only X and P: H P follows from H X and H P (once, for all passes together),
    and H W is left to the caller.
    A V that lies mostly in span(X) would cancel in the subtraction, so when a column keeps less than
    CANCELLATION of its squared length outside X, that pass only projects (V -= X X^T V), and the
    Pythagorean passes follow (at most two such projections). A column that projection leaves at rounding
    level lies in span(X): NotPositiveDefinite, as when V itself is (numerically) rank deficient.
    ``adaptive``: stop after the first pass when it leaves [X V] orthonormal to SINGLE_PASS_LOSS
    (predicted_loss), which LOBPCG's Rayleigh-Ritz tolerates (it factors S^T S itself): the second pass's
    product, host trip and updates are then saved. Returns the number of passes made.
    """
    from .blocks import subtract_product, tail_update
    floor = (100 * np.finfo(s.dtype).eps) ** 2     # squared length left by rounding alone
    done = projected = 0
    first = None
    x, v = s[:, :b], s[:, b:]
    # H P is updated once at the end: every pass maps P to P U - X A (U upper triangular), and passes
    # compose as U = U1 U2, A = A1 U2 + A2, since X and H X do not change
    u_p, a_p = np.eye(n_p), np.zeros((b, n_p))
    try:
        while done < passes:
            y = cross(s, v, context=context, comm=comm)
            xv, vv = y[:b], y[b:]
            vv = 0.5 * (vv + vv.T)
            if first is None:
                first = np.diag(vv).copy()
            elif done == 0 and (np.diag(vv) < floor * first).any():     # measured after explicit projection
                left = (np.diag(vv) / first).min()
                raise NotPositiveDefinite(f"a column of W lies in span(X) to rounding ({left:.2e} of it is left)")
            outside = vv - xv.T @ xv
            if projected < 2 and (np.diag(outside) < CANCELLATION * np.diag(vv)).any():
                subtract_product(v, x, xv)                                  # V -= X X^T V
                a_p += xv[:, :n_p]
                projected += 1
                continue
            r = scaled_cholesky(outside, "W^T W after projection")
            rinv = inverse_upper(r)
            enough = adaptive and done == 0 and predicted_loss(r, rinv, s.dtype) <= SINGLE_PASS_LOSS
            # (V - X X^T V) R^{-1} = V R^{-1} - X (X^T V R^{-1}); R^{-1} upper: P's columns take X and P only
            tail_update(s, b, -xv @ rinv, rinv)
            u_p, a_p = u_p @ rinv[:n_p, :n_p], a_p @ rinv[:n_p, :n_p] + xv[:, :n_p] @ rinv[:n_p, :n_p]
            done += 1
            if enough:
                break
    finally:
        if n_p:             # also when a pass failed: H P must match the P that the passes before it left
            tail_update(hs[:, :b + n_p], b, -a_p, u_p)
    return done


def next_p_coefficients(c_x, g, b):
    """Coefficients Z of the next search directions P = S Z, and which columns of P are usable.

    LOBPCG's P is the part of the new X that came from W and the old P: S C_X with X's rows of C_X zeroed.
    Removing its component along the new X (in the S^T S inner product ``g``) and scaling each column to
    unit length changes nothing in span([X P]), but leaves P orthogonal to X and normalised, so the next
    orthonormalisation starts from well-scaled columns and needs no trip of its own (the idea of Hetmaniuk
    and Lehoucq 2006 and Duersch et al. 2018: keep the basis orthogonal through the small coefficients).
    A column that is rounding noise after the removal is marked unusable.
    """
    z = np.array(c_x, dtype=np.float64)
    z[:b] = 0.0
    before = np.sqrt(np.maximum(np.einsum("ij,ij->j", z, g @ z), 0.0))
    z -= c_x @ (c_x.T @ (g @ z))
    after = np.sqrt(np.maximum(np.einsum("ij,ij->j", z, g @ z), 0.0))
    usable = after > 1e3 * np.finfo(np.float64).eps * np.maximum(before, np.finfo(np.float64).tiny)
    z[:, usable] /= after[usable]
    z[:, ~usable] = 0.0
    return z, usable


def gram_buffer(s, hs, context=None):
    """S^T H S and S^T S, lower triangles by hybridblas gemmt and syrk, in one buffer where s lives
    ([:, :, 0] and [:, :, 1], each column-major k x k): one trip to the host for both."""
    k = s.shape[1]
    both = module_of(s).zeros((k, k, 2), dtype=s.dtype, order="F")
    hb.gemmt(1.0, s, hs, transa="T", c=both[:, :, 0], context=context)
    hb.syrk(1.0, s, trans="T", c=both[:, :, 1], context=context)
    return both


def split_grams(host):
    """The mirrored float64 pair (S^T H S, S^T S) from a host copy of gram_buffer's buffer."""
    return _mirrored(host[:, :, 0]), _mirrored(host[:, :, 1])


def _both_grams(s, hs, context, comm):
    """S^T H S and S^T S (mirrored), float64 host arrays, through one buffer: one trip to the host (and one
    Allreduce over ranks) for both."""
    return split_grams(host_sum(gram_buffer(s, hs, context), comm))


def rayleigh_ritz(s, hs, n_keep, context=None, comm=None, with_gram=False, grams=None):
    """Smallest n_keep eigenpairs of (S^T H S, S^T S): Cholesky of S^T S, then a standard eigh.

    S^T S is scaled to a unit diagonal first (Jacobi), so columns of very different lengths (a P
    block that is not normalised) do not make the Cholesky fail.
    ``grams``: an arrays.Later of split_grams of these s and hs (queued already), else they are computed here.
    Returns (theta, C, all_theta), and S^T S last when ``with_gram``; raises NotPositiveDefinite when
    S^T S is ill-conditioned.
    """
    g, o = grams.result() if grams is not None else _both_grams(s, hs, context, comm)
    d = np.diag(o)
    if not (d > 0).all():
        raise NotPositiveDefinite(f"S^T S has a non-positive diagonal entry ({d.min():.3g})")
    d = 1.0 / np.sqrt(d)
    scale = np.outer(d, d)
    rinv = inverse_upper(cholesky_upper(o * scale))
    # A = R^{-T} G R^{-1}; eigenvectors C = R^{-1} Y (R is a well-conditioned 3b x 3b here: cholesky_upper
    # rejects a near-singular one, so its explicit inverse is as good as two triangular solves, and cheaper)
    a = rinv.T @ (g * scale) @ rinv
    a = 0.5 * (a + a.T)
    vals, vecs = np.linalg.eigh(a)
    c = d[:, None] * (rinv @ vecs[:, :n_keep])
    if with_gram:
        return vals[:n_keep], c, vals, o
    return vals[:n_keep], c, vals
