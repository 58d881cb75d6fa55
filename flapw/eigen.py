"""The lowest generalised eigenpairs H x = E S x of a build, where H and S live.

Only the lower triangles of H and S are read (what ``build_hs(lower_only=True)`` and ``flapw build``
compute). Host arrays go to scipy (LAPACK zhegvx: only the NEV lowest pairs). GPU arrays stay on their GPU
(CuPy: cuSOLVER and cuBLAS): S = L Lᴴ (Cholesky), C = L⁻¹ H L⁻ᴴ by two triangular solves, C's
eigenvalues (zheevd; with vectors X = L⁻ᴴ Z), the reduction that zhegv makes on the host. S must be
positive definite: without the interstitial part (S is then the muffin-tin part alone, of rank at most
2 N_A N_L) or with linearly dependent plane waves it is not, and the solve raises a ValueError saying so.
"""
import numpy as np

from .output import finite

__all__ = ["solve"]

NOT_POSITIVE = ("S is not positive definite at this k-point and Kmax ({why}): build with the interstitial part "
                "(--interstitial, interstitial=True); if it has it, the basis is too close to linearly dependent "
                "(lower Kmax)")


def solve(h, s, nev, *, vectors=False):
    """The ``nev`` lowest eigenvalues (ascending, Ha) of H x = E S x, and with ``vectors`` also the
    eigenvectors (N_G x nev, columns S-orthonormal: XᴴSX = 1) as a pair (values, vectors). h, s: N_G x N_G
    complex numpy or cupy arrays (both of one kind; the result lives there too); their lower triangles
    are read, their upper triangles never, and neither is changed."""
    xp = _module(h)
    n = h.shape[0] if getattr(h, "ndim", 0) == 2 else -1
    if _module(s) is not xp or h.shape != (n, n) or s.shape != (n, n):
        raise ValueError(f"h and s must be square arrays of one shape and kind, got {type(h).__name__} "
                         f"{getattr(h, 'shape', '')} and {type(s).__name__} {getattr(s, 'shape', '')}")
    if isinstance(nev, bool) or not isinstance(nev, (int, np.integer)) or not 1 <= nev <= n:
        raise ValueError(f"nev must be an integer in [1, {n}], got {nev!r}")
    if not isinstance(vectors, (bool, np.bool_)):
        raise TypeError(f"vectors must be True or False, got {type(vectors).__name__} {vectors!r}")
    for name, m in (("h", h), ("s", s)):
        if m.dtype.kind not in "biufc":
            raise TypeError(f"{name} must hold numbers, got dtype {m.dtype}")
        if not finite(m, True, xp):
            raise ValueError(f"{name} holds entries that are not finite (nan or inf) in its lower triangle")
    values, x = _on_host(h, s, int(nev), vectors) if xp is np else _reduced(h, s, int(nev), vectors, _gpu_ops(xp))
    return (values, x) if vectors else values


def _module(x):
    if isinstance(x, np.ndarray):
        return np
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    raise ValueError(f"h and s must be numpy or cupy arrays, got {type(x).__name__}")


def _on_host(h, s, nev, vectors):
    import scipy.linalg
    try:
        out = scipy.linalg.eigh(h, s, lower=True, eigvals_only=not vectors, subset_by_index=[0, nev - 1],
                                check_finite=False)
    except scipy.linalg.LinAlgError as exc:
        if "positive definite" not in str(exc):          # zhegvx: "the leading minor of order i of B is not ..."
            raise
        raise ValueError(NOT_POSITIVE.format(why=exc)) from None
    return (out[0], out[1]) if vectors else (out, None)


class _Ops:
    """The dense operations of the Cholesky reduction for one array module."""

    def __init__(self, xp, cholesky, solve_triangular, eigh, eigvalsh, errors, guard):
        self.xp, self.cholesky, self.solve_triangular = xp, cholesky, solve_triangular
        self.eigh, self.eigvalsh, self.errors, self.guard = eigh, eigvalsh, errors, guard


def _host_ops():
    """The reduction with numpy and scipy: the same steps as on a GPU (the tests compare it with zhegvx)."""
    import contextlib
    import scipy.linalg
    return _Ops(np, np.linalg.cholesky, scipy.linalg.solve_triangular, np.linalg.eigh, np.linalg.eigvalsh,
                (np.linalg.LinAlgError,), contextlib.nullcontext)


def _gpu_ops(xp):
    import cupyx
    from cupyx.scipy.linalg import solve_triangular
    return _Ops(xp, xp.linalg.cholesky, solve_triangular, xp.linalg.eigh, xp.linalg.eigvalsh, (np.linalg.LinAlgError,),
                lambda: cupyx.errstate(linalg="raise"))      # a failed Cholesky raises instead of leaving junk


def _reduced(h, s, nev, vectors, ops):
    """S = L Lᴴ, C = L⁻¹ H L⁻ᴴ, eigenpairs of C: every step on the arrays' device. H and S are copied
    (the copies get both triangles from the lower ones), so the caller's arrays are not changed."""
    from .hsdla import hermitian_fill
    xp = ops.xp
    full = hermitian_fill(s.copy(order="F"), xp)
    try:
        with ops.guard():
            chol = ops.cholesky(full)
    except ops.errors as exc:
        raise ValueError(NOT_POSITIVE.format(why=exc)) from None
    if not bool(xp.isfinite(chol.diagonal()).all()) or not bool((chol.diagonal().real > 0).all()):
        raise ValueError(NOT_POSITIVE.format(why="the Cholesky factor has a non-positive or non-finite pivot"))
    del full
    y = hermitian_fill(h.copy(order="F"), xp)
    y = ops.solve_triangular(chol, y, lower=True, overwrite_b=True)          # L⁻¹ H
    y = xp.asfortranarray(y.conj().T)                                         # H L⁻ᴴ = (L⁻¹ H)ᴴ
    c = ops.solve_triangular(chol, y, lower=True, overwrite_b=True)          # L⁻¹ H L⁻ᴴ
    del y
    if not vectors:
        return ops.eigvalsh(c, UPLO="L")[:nev], None
    values, z = ops.eigh(c, UPLO="L")
    del c
    x = ops.solve_triangular(chol, xp.asfortranarray(z[:, :nev]), trans="C", lower=True, overwrite_b=True)
    return values[:nev], x
