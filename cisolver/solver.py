"""LOBPCG for the lowest eigenpairs of a sparse symmetric H (paper Algorithm 1).

X, W = K^{-1} R, P; the only sparse product per iteration is H W (HX and HP follow the
recurrences (8)–(9)). S = [X | P | W] and H S are column ranges of one row-major buffer each. P comes
from the Ritz coefficients, orthogonal to the new X and normalised (dense.next_p_coefficients); [P W] is
made orthonormal against X by BCGS-PIP2 (dense.orthonormalise_tail). Rayleigh–Ritz and the
orthonormalisation take their tall-skinny Gram products from hybridblas.
Converged columns are soft-locked: they stay in the Rayleigh–Ritz basis but get no new W or P.
"""
from dataclasses import dataclass, field

import numpy as np

from . import dense, gpu_ortho, gpu_rayleigh_ritz
from .arrays import Later, Ready, Timer, column_sumsq, module_of, to_host
from .blocks import product_into, residual_into, update_with_residual


@dataclass
class LobpcgResult:
    eigenvalues: np.ndarray
    eigenvectors: object          # n x nev, numpy or cupy
    residual_norms: np.ndarray    # relative, recomputed with an explicit H X at the end
    iterations: int
    converged: bool
    seconds: dict = field(default_factory=dict)
    history: list = field(default_factory=list)   # per iteration: relative residuals of the block
    restarts: int = 0                              # iterations where P had to be dropped
    second_passes: int = 0                         # iterations whose [P W] needed a second CholQR pass
    declined: int = 0                              # GPU orthonormalisation passes handed to the host path


def _orthonormalise_on_host(s, q, k):
    """Last resort for a W = s[:, q:k] that is (nearly) rank deficient, serial runs only: project it off
    s[:, :q] twice and take a host QR."""
    xp = module_of(s)
    basis, w = s[:, :q], xp.ascontiguousarray(s[:, q:k])
    for _ in range(2):
        w -= basis @ (basis.T @ w)
    s[:, q:k] = xp.asarray(np.linalg.qr(to_host(w))[0], dtype=s.dtype)


def _orthonormalise_apart(s, hs, w, b, n_p, k, restarts, context, comm):
    """[P W] failed to orthonormalise together: find which part is at fault (returns the new n_p and
    restart count). P alone first: if it is fine, W is (nearly) rank deficient and gets the host QR
    against [X P], keeping P; if P alone fails too, P is dropped (a restart) and W, restored from the
    preconditioner's output (a failed pass may have mixed P into it), is orthonormalised against X alone."""
    n_w = k - b - n_p
    w_alone_failed = n_p == 0                # the failed call was W alone already
    if n_p:
        try:
            dense.orthonormalise_tail(s[:, :b + n_p], hs[:, :b + n_p], b, n_p, context=context, comm=comm)
        except dense.NotPositiveDefinite:
            n_p, restarts = 0, restarts + 1
    s[:, b + n_p:b + n_p + n_w] = w
    if n_p == 0 and not w_alone_failed:
        try:
            dense.orthonormalise_tail(s[:, :b + n_w], hs[:, :b + n_w], b, 0, context=context, comm=comm)
            return n_p, restarts
        except dense.NotPositiveDefinite:
            pass
    if comm is not None:
        raise dense.NotPositiveDefinite("W is rank deficient on a distributed run (no host QR there)")
    _orthonormalise_on_host(s, b + n_p, b + n_p + n_w)
    return n_p, restarts


def _orthonormalise(s, hs, w, b, n_p, k, restarts, context, comm):
    """[P W] = s[:, b:k] orthonormal and orthogonal to X on the host path (dense.orthonormalise_tail, one
    or two passes); returns the new n_p, restart count and passes made."""
    try:
        passes = dense.orthonormalise_tail(s[:, :k], hs[:, :k], b, n_p, context=context, comm=comm, adaptive=True)
        return n_p, restarts, passes
    except dense.NotPositiveDefinite:
        n_p, restarts = _orthonormalise_apart(s, hs, w, b, n_p, k, restarts, context, comm)
        return n_p, restarts, 0


def _multiply(op, s, hs, c0, c1):
    """hs[:, c0:c1] <- H s[:, c0:c1]; GPU operators write the column range in place."""
    if getattr(op, "devices", None) is not None:
        op.matmat(s[:, c0:c1], out=hs[:, c0:c1])
    else:
        hs[:, c0:c1] = op.matmat(s[:, c0:c1])


def _as_operator(h, dtype):
    from .operators import SymmetricOperator
    if hasattr(h, "matmat"):
        return h
    if hasattr(h, "shape") and not hasattr(h, "tocsr") and getattr(h, "ndim", 0) == 2:
        class _Dense:        # small dense matrices (tests)
            def __init__(self, a):
                self.a, self.shape, self.dtype, self.xp = a, a.shape, a.dtype, module_of(a)

            def matmat(self, x):
                return self.a @ x
        return _Dense(h.astype(dtype, copy=False))
    return SymmetricOperator(h, dtype=dtype)


OVERLAP = True        # False: GPU runs wait for every host trip as CPU runs do (benchmarks compare the two)
_host_contexts = {}


def host_context(threads):
    """The hybridblas context for the Gram products of host blocks: ``threads`` CPU workers, each one BLAS
    thread, every call split over them by k (the rows), whatever its size (the caller sized ``threads`` to
    the rows). No GPU, also on a GPU node: shipping an n x 3b block to a GPU for one Gram costs more than
    the Gram (the vectors of a CPU run live on the host); and no node profile (finding it takes the node's
    GPU inventory) for workers that are alike anyway."""
    import hybridblas as hb
    if threads not in _host_contexts:
        _host_contexts[threads] = hb.Context(devices=["cpu"] * threads, strategy="static", cpu_threads=threads,
                                             profile=False, min_call_seconds=0)
    return _host_contexts[threads]


def lobpcg(h, nev, *, block_size=None, **kwargs):
    """Lowest ``nev`` eigenpairs of symmetric ``h``; see ``_lobpcg`` for the arguments.

    On the CPU the dense steps split their rows over threads themselves (cisolver.host_blocks, and
    ``host_context`` for the Grams), so every BLAS library but MKL runs on one thread meanwhile: OpenBLAS's
    own threads spin after each call and took the cores from the row pieces and the sparse product's
    threads. An MKL sparse product (SymmetricOperator's ``mkl`` backend) keeps MKL's threads.
    """
    op = _as_operator(h, kwargs.get("dtype"))
    if getattr(op, "xp", np) is not np:
        return _lobpcg(op, nev, block_size=block_size, **kwargs)
    from threadpoolctl import ThreadpoolController
    from . import host_blocks
    lo, hi = getattr(op, "local", (0, op.shape[0]))
    cap = None
    if kwargs.get("comm") is not None:             # an MPI rank: its share of the node's cores
        from hybridblas.distributed import local_rank
        cap = max(1, host_blocks.cores() // local_rank(kwargs["comm"])[1])
    blas = ThreadpoolController().select(user_api="blas")
    if getattr(op, "backend", None) == "mkl":       # MKL's sparse product keeps its threads
        blas = blas.select(internal_api=[lc.internal_api for lc in blas.lib_controllers if lc.internal_api != "mkl"])
    with host_blocks.limit(cap), blas.limit(limits=1):
        if kwargs.get("context") is None:
            kwargs["context"] = host_context(host_blocks.threads_for(hi - lo))
        return _lobpcg(op, nev, block_size=block_size, **kwargs)


def _lobpcg(h, nev, *, block_size=None, x0=None, tol=1e-8, maxiter=300, precond=None, seed=0,
            dtype=None, context=None, callback=None, comm=None):
    """Lowest ``nev`` eigenpairs of symmetric ``h`` (scipy/cupyx sparse, a SymmetricOperator, or dense).

    tol: relative residual ‖H x − θ x‖ / ‖H‖_est, ‖H‖_est the largest |Ritz value| met so far.
    block_size: default nev + 3. x0: start block (n x block_size), else seeded normal random.
    precond: object with ``apply(R, theta)`` (e.g. TilePreconditioner), or None.
    comm: an MPI communicator when ``h`` is a DistributedOperator (rows over ranks); vectors, start
    block and the returned eigenvectors are then this rank's rows, and the results equal the serial ones.
    """
    op = _as_operator(h, dtype)
    n = op.shape[0]
    dtype = np.dtype(dtype or op.dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    if not isinstance(nev, (int, np.integer)) or not 1 <= nev <= n:
        raise ValueError(f"nev must be an integer in 1..{n}, got {nev!r}")
    b = int(block_size or min(n, nev + 3))
    if not nev <= b <= n:
        raise ValueError(f"block_size must be in {nev}..{n} (>= nev), got {block_size!r}")
    if 3 * b > n:
        raise ValueError(f"matrix too small for LOBPCG with block_size={b} (n={n}); use a dense solver")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")
    xp = getattr(op, "xp", np)
    timer = Timer(xp)
    if x0 is None:
        x = np.random.default_rng(seed).standard_normal((n, b))
    else:
        x = to_host(x0)
        if x.shape != (n, b):
            raise ValueError(f"x0 must have shape ({n}, {b}), got {x.shape}")
    lo, hi = getattr(op, "local", (0, n))
    x = xp.asarray(np.ascontiguousarray(x[lo:hi], dtype=dtype))

    def norms(block):
        if comm is None:
            return np.sqrt(column_sumsq(block))
        from .distributed import colnorms
        return colnorms(block, comm)

    with timer.phase("dense", "start"):
        dense.cholqr2(x, context=context, comm=comm)
    with timer.phase("spmm"):
        hx = op.matmat(x)
    with timer.phase("dense", "start"):
        theta, c, allv = dense.rayleigh_ritz(x, hx, b, context=context, comm=comm)
        # S = [X | P | W] and H S in one row-major buffer each: the Gram products read a column range
        # (no concatenation), and every update writes one in place (cisolver.blocks); the new X and P
        # go to a second pair of buffers (they are made from the whole of the first), then the pairs swap
        s, hs, s_next, hs_next = (xp.empty((hi - lo, 3 * b), dtype=dtype) for _ in range(4))
        product_into(s[:, :b], x, c)
        product_into(hs[:, :b], hx, c)
        r = xp.empty((hi - lo, b), dtype=dtype)
        del x, hx
        sq = residual_into(r, hs[:, :b], s[:, :b], theta)      # R = H X - X Theta, and its column norms^2
    norm_est = max(np.abs(allv).max(), np.finfo(np.float64).tiny)
    p_usable = np.zeros(b, dtype=bool)       # columns of s[:, b:2b] that hold a search direction
    history, restarts, second_passes, declined, it = [], 0, 0, 0, 0
    converged = np.zeros(b, dtype=bool)
    pending = Ready(sq)                      # the residuals' sums of squares of the current X
    # A GPU run (one process) queues a whole iteration before it waits: the first orthonormalisation pass
    # is factored on the GPU (gpu_ortho), and the residuals of the current X are read once that pass is
    # queued, so W's columns follow the residuals of the X before (soft locking decided one iteration late)
    overlap = OVERLAP and xp is not np and comm is None and gpu_ortho.fits(s, b)

    def residuals_read():
        """Relative residuals of the current X; True when the wanted ones have converged."""
        nonlocal converged
        with timer.phase("dense", "residual"):
            rel = np.sqrt(dense.host_sum(pending.result(), comm)) / norm_est
        history.append(rel.copy())
        converged = rel <= tol
        if callback:
            callback(it, theta, rel)
        return converged[:nev].all()

    for it in range(1, maxiter + 1):
        if not overlap and residuals_read():
            break
        active = np.nonzero(~converged)[0]
        n_w = len(active)
        with timer.phase("precond"):
            w = r if n_w == b else r[:, active]
            w = precond.apply(w, theta[active]) if precond is not None else w
        with timer.phase("dense", "orthonormalise"):
            # P of the active columns (usable ones) next to X, then W: S = [X | P_a | W]
            keep = active[p_usable[active]]
            n_p = len(keep)
            if n_p and not np.array_equal(keep, np.arange(n_p)):
                s[:, b:b + n_p], hs[:, b:b + n_p] = s[:, b + keep], hs[:, b + keep]
            k = b + n_p + n_w
            s[:, b + n_p:k] = w
            # [P W] orthonormal and orthogonal to X: one or two passes, one product and one host trip each
            if overlap:
                flag = Later(gpu_ortho.first_pass(s[:, :k], hs[:, :k], b, n_p, context=context))
            else:
                n_p, restarts, passes = _orthonormalise(s, hs, w, b, n_p, k, restarts, context, comm)
                second_passes += passes > 1
                k = b + n_p + n_w
        if overlap and residuals_read():
            break
        with timer.phase("spmm"):
            _multiply(op, s, hs, b + n_p, k)
        grams = rr = None
        if overlap:
            with timer.phase("dense", "rayleigh_ritz"):
                both = dense.gram_buffer(s[:, :k], hs[:, :k], context=context)
                if gpu_rayleigh_ritz.fits(s, b):
                    rr = gpu_rayleigh_ritz.queue(both, b, dtype)
                else:
                    grams = Later(both, dense.split_grams)
            if flag.result()[0]:
                # the GPU pass left S and H S as they were (V would cancel, is rank deficient or wants a
                # second pass): the host path, and H W again
                declined, grams, rr = declined + 1, None, None
                with timer.phase("dense", "orthonormalise"):
                    n_p, restarts, passes = _orthonormalise(s, hs, w, b, n_p, k, restarts, context, comm)
                    second_passes += passes > 1
                    k = b + n_p + n_w
                with timer.phase("spmm"):
                    _multiply(op, s, hs, b + n_p, k)
        if rr is not None:
            with timer.phase("dense", "update"):
                later = update_with_residual(s_next[:, :2 * b], s[:, :k], hs_next[:, :2 * b], hs[:, :k], rr.m, r,
                                             rr.theta, later=True)
            new_theta, largest, usable, definite = rr.summary()      # while the GPU runs the update
            if definite:
                theta, p_usable, pending = new_theta, usable, later
                norm_est = max(norm_est, largest)
                s, s_next, hs, hs_next = s_next, s, hs_next, hs
                continue
            # S^T S not numerically positive definite: the host path below, from the same S and H S
        with timer.phase("dense", "rayleigh_ritz"):
            try:
                theta, c, allv, g = dense.rayleigh_ritz(s[:, :k], hs[:, :k], b, context=context, comm=comm,
                                                        with_gram=True, grams=grams)
            except dense.NotPositiveDefinite:
                if n_p == 0:
                    raise
                # recover: drop P and retry with [X, W]
                s[:, b:b + n_w], hs[:, b:b + n_w] = s[:, k - n_w:k].copy(), hs[:, k - n_w:k].copy()
                n_p, k, restarts = 0, b + n_w, restarts + 1
                theta, c, allv, g = dense.rayleigh_ritz(s[:, :k], hs[:, :k], b, context=context, comm=comm,
                                                        with_gram=True)
            norm_est = max(norm_est, float(np.abs(allv).max()))
        with timer.phase("dense", "update"):
            # new X = S C and P = S Z (orthogonal to X, unit columns), H X and H P; R of the new X
            z, p_usable = dense.next_p_coefficients(c, g, b)
            both = np.hstack([c, z])
            pending = update_with_residual(s_next[:, :2 * b], s[:, :k], hs_next[:, :2 * b], hs[:, :k], both, r,
                                           theta, later=True)
            s, s_next, hs, hs_next = s_next, s, hs_next, hs
    x = xp.ascontiguousarray(s[:, :b])
    # honest final residuals: one explicit product (the recurrences may drift, notably in float32)
    with timer.phase("spmm"):
        hx_true = op.matmat(x[:, :nev])
    rel = norms(hx_true - x[:, :nev] * xp.asarray(theta[:nev], dtype=dtype)[None, :]) / norm_est
    return LobpcgResult(np.asarray(theta[:nev]), x[:, :nev], rel, it, bool(converged[:nev].all()),
                        dict(timer.seconds), history, restarts, second_passes, declined)
