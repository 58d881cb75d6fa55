"""LOBPCG for the lowest eigenpairs of a sparse symmetric H (paper Algorithm 1).

X, W = K^{-1} R, P; the only sparse product per iteration is H W (HX and HP follow the
recurrences (8)–(9)). S = [X | P | W] and H S are column ranges of one row-major buffer each. P comes
from the Ritz coefficients, orthogonal to the new X and normalised (dense.next_p_coefficients); [P W] is
made orthonormal against X by BCGS-PIP2 (dense.orthonormalise_tail). Rayleigh–Ritz and the
orthonormalisation take their tall-skinny Gram products from hybridblas.
Converged columns are soft-locked: they stay in the Rayleigh–Ritz basis but get no new W or P.
This module checks the arguments; cisolver.start makes the start and cisolver.iterations iterates (on GPUs
without waiting for the host within an iteration, the start queued likewise).
"""
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from . import gpu_ortho
from .dense import NotPositiveDefinite
from .arrays import Timer, column_sumsq, module_of, precision, to_host
from .iterations import Iterations, agreed
from .start import first_block


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
    redone: int = 0                                # GPU Rayleigh-Ritz steps, starts, guessed passes redone on host
    queued: bool = False                           # the iterations were queued on the GPU to the end (cisolver.iterations)


NORM_RANGE = (1e-100, 1e100)     # |H| estimates whose residual sums of squares stay within float64
DEFAULT_TOL = {8: 1e-8, 4: 1e-5}  # relative residual when not told, by itemsize: float32's level off near 1e-6


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
        if dtype is None:                   # the matrix's own precision, as for a sparse one (integers: float64)
            dtype = np.float64 if h.dtype.kind in "iu" else precision(h.dtype, "h's dtype")
        return _Dense(h.astype(dtype, copy=False))
    return SymmetricOperator(h, dtype=dtype)


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


def _name_value(value):
    return f"{type(value).__name__} {value!r}" if not hasattr(value, "shape") else \
        f"{type(value).__name__} of shape {value.shape} and dtype {getattr(value, 'dtype', None)}"


def _finite(a):
    """All of a (numpy or cupy) finite, read on the host."""
    return bool(module_of(a).isfinite(a).all())


def _check_matrix(h, dtype):
    """Shape, element type, finiteness and symmetry of a matrix ``h`` (dense or scipy.sparse) before any work.
    A non-symmetric matrix would give a wrong spectrum silently; the test costs one transposed difference."""
    import scipy.sparse as sp
    sparse = sp.issparse(h)
    if not (sparse or hasattr(h, "shape") and hasattr(h, "dtype") and getattr(h, "ndim", 0) == 2):
        raise TypeError(f"h must be a symmetric matrix (numpy, cupy or scipy.sparse, 2-D) or an operator with "
                        f"shape, dtype and matmat, got {_name_value(h)}")
    if h.shape[0] != h.shape[1]:
        raise ValueError(f"h must be square, got shape {h.shape}")
    kind = np.dtype(h.dtype)
    if not (np.issubdtype(kind, np.floating) or np.issubdtype(kind, np.integer) and dtype is not None):
        raise TypeError(f"h must hold real floating numbers (or give dtype), got dtype {kind}")
    values = h.data if sparse else h
    if not _finite(values):
        raise ValueError("h holds NaN or infinite entries")
    if h.shape[0] == 0:
        return
    diff = abs(h - h.T).max() if sparse else module_of(h).abs(h - h.T).max()
    scale = abs(h).max() if sparse else module_of(h).abs(h).max()
    rtol = 1e3 * np.finfo(kind if np.issubdtype(kind, np.floating) else np.float64).eps
    if float(diff) > rtol * float(scale):
        raise ValueError(f"h must be symmetric: max |h - h^T| = {float(diff):.3g} against max |h| = "
                         f"{float(scale):.3g} (an upper triangle alone goes through "
                         f"SymmetricOperator(h, storage='upper'))")


def _check_arguments(h, nev, block_size, x0=None, tol=None, maxiter=300, precond=None, seed=0, dtype=None,
                     context=None, callback=None, comm=None, queued=True):
    """Every argument of ``lobpcg``, before any work: a ValueError or TypeError naming it and its value."""
    if dtype is not None:
        precision(dtype)
    if hasattr(h, "matmat"):
        shape = getattr(h, "shape", None)
        if not (isinstance(shape, tuple) and len(shape) == 2 and shape[0] == shape[1]):
            raise ValueError(f"h (an operator) must have a square shape (n, n), got {shape!r}")
        own = getattr(h, "dtype", None)
        if dtype is None and (own is None or np.dtype(own) not in (np.float32, np.float64)):
            raise TypeError(f"h (an operator) must have dtype float32 or float64 (or give dtype), got {own}")
    else:
        _check_matrix(h, dtype)
    n = int(h.shape[0])
    if n == 0:
        raise ValueError("h is empty (0 x 0)")
    if comm is not None and getattr(h, "local", None) is None:
        raise ValueError("comm needs h to be an operator whose rows are split over the ranks (cisolver's "
                         "DistributedOperator or TriangularOperator); a whole matrix on every rank would be "
                         "counted once per rank")
    if not _integer(nev) or not 1 <= nev <= n:
        raise ValueError(f"nev must be an integer in 1..{n}, got {_name_value(nev)}")
    if block_size is not None and (not _integer(block_size) or not nev <= block_size <= n):
        raise ValueError(f"block_size must be an integer in {nev}..{n} (>= nev), got {_name_value(block_size)}")
    b = int(block_size or min(n, nev + 3))
    if 3 * b > n:
        raise ValueError(f"matrix too small for LOBPCG with block_size={b} (n={n}); use a dense solver")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, numbers.Real)
                            or not (math.isfinite(tol) and tol > 0)):
        raise ValueError(f"tol must be a finite number > 0 (or None), got {_name_value(tol)}")
    if not _integer(maxiter) or maxiter < 0:
        raise ValueError(f"maxiter must be an integer >= 0, got {_name_value(maxiter)}")
    if x0 is not None:
        if not (hasattr(x0, "shape") and hasattr(x0, "dtype")):
            raise TypeError(f"x0 must be a numpy or cupy array of shape ({n}, {b}), got {_name_value(x0)}")
        if tuple(x0.shape) != (n, b):
            raise ValueError(f"x0 must have shape ({n}, {b}) (n, block_size), got {tuple(x0.shape)}")
        if not np.issubdtype(np.dtype(x0.dtype), np.floating):
            raise TypeError(f"x0 must hold real floating numbers, got dtype {x0.dtype}")
        if not _finite(x0):
            raise ValueError("x0 holds NaN or infinite entries")
    if precond is not None and not callable(getattr(precond, "apply", None)):
        raise TypeError(f"precond must have a method apply(R, theta), or be None, got {_name_value(precond)}")
    if seed is not None and (not _integer(seed) or seed < 0):
        raise ValueError(f"seed must be an integer >= 0 or None, got {_name_value(seed)}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {_name_value(callback)}")
    if not isinstance(queued, (bool, np.bool_)):
        raise TypeError(f"queued must be True or False, got {_name_value(queued)}")
    if context is not None:
        import hybridblas as hb
        if not isinstance(context, hb.Context):
            raise TypeError(f"context must be a hybridblas.Context or None, got {_name_value(context)}")


def _integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def lobpcg(h, nev, *, block_size=None, **kwargs):
    """Lowest ``nev`` eigenpairs of symmetric ``h``; see ``_lobpcg`` for the arguments. Every argument is
    checked first (a ValueError or TypeError naming it); ``h`` and ``x0`` are only read. A matrix given as such
    is checked for symmetry, which costs one transposed difference of it; an operator (SymmetricOperator, ...)
    is taken as symmetric.

    On the CPU the dense steps split their rows over threads themselves (cisolver.host_blocks, and
    ``host_context`` for the Grams), so every BLAS library but MKL runs on one thread meanwhile: OpenBLAS's
    own threads spin after each call and took the cores from the row pieces and the sparse product's
    threads. An MKL sparse product (SymmetricOperator's ``mkl`` backend) keeps MKL's threads.
    """
    _check_arguments(h, nev, block_size, **kwargs)
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


def _lobpcg(h, nev, *, block_size=None, x0=None, tol=None, maxiter=300, precond=None, seed=0,
            dtype=None, context=None, callback=None, comm=None, queued=True):
    """Lowest ``nev`` eigenpairs of symmetric ``h`` (scipy/cupyx sparse, a SymmetricOperator, or dense),
    arguments checked by ``lobpcg``.

    tol: relative residual ‖H x − θ x‖ / ‖H‖_est, ‖H‖_est the largest |Ritz value| met so far (None: 1e-8, for
    float32 1e-5: its residuals level off near 1e-6).
    block_size: default nev + 3. x0: start block (n x block_size), else seeded normal random.
    precond: object with ``apply(R, theta)`` (e.g. TilePreconditioner), or None.
    comm: an MPI communicator when ``h`` is a DistributedOperator (rows over ranks); x0 is then the whole start
    block on every rank, the vectors and the returned eigenvectors this rank's rows, and the results equal
    the serial ones.
    queued: on GPUs, each iteration (and the start) is queued on the device and the host reads its small
    results at the end of the iteration; False waits for the GPU at every host trip, as CPU runs do (the
    same iterates to rounding; slower). CPU runs, and MPI runs whose operator cannot queue, always wait.
    """
    op = _as_operator(h, dtype)
    n = op.shape[0]
    dtype = np.dtype(dtype or op.dtype)
    if tol is None:
        tol = DEFAULT_TOL[dtype.itemsize]
    b = int(block_size or min(n, nev + 3))
    xp = getattr(op, "xp", np)
    timer = Timer(xp)
    x = np.random.default_rng(seed).standard_normal((n, b)) if x0 is None else to_host(x0)
    lo, hi = getattr(op, "local", (0, n))
    # a copy in any case: the start overwrites its block, and x0 is the caller's
    x = xp.asarray(np.array(x[lo:hi], dtype=dtype, order="C", copy=True))

    def norms(block):
        if comm is None:
            return np.sqrt(column_sumsq(block))
        from .distributed import colnorms
        return colnorms(block, comm)

    # S = [X | P | W] and H S in one row-major buffer each: the Gram products read a column range (no
    # concatenation), and every update writes one in place (cisolver.blocks); the new X and P go to a second
    # pair of buffers (they are made from the whole of the first), then the pairs swap
    s, hs, s_next, hs_next = (xp.empty((hi - lo, 3 * b), dtype=dtype) for _ in range(4))
    r = xp.empty((hi - lo, b), dtype=dtype)
    # a GPU run queues whole iterations (cisolver.iterations), and its start: in one process, or on MPI ranks
    # whose sums and gathers NCCL queues on the GPU; CPUs and other MPI runs wait at every host trip
    overlap = (queued and xp is not np and (comm is None or getattr(op, "queued", False))
               and gpu_ortho.fits(s, b))
    try:
        theta, largest, sq, start_redone = first_block(op, x, s, hs, r, context=context, comm=comm, timer=timer,
                                                       queued=overlap, agree=lambda value: agreed(value, comm))
    except NotPositiveDefinite as exc:
        if x0 is None:
            raise
        raise ValueError(f"x0's columns must be linearly independent; its Gram matrix is not positive definite "
                         f"({exc})") from None
    del x
    if largest != 0 and not NORM_RANGE[0] <= largest <= NORM_RANGE[1]:
        raise ValueError(f"h's largest start Ritz value |θ| = {largest:.3g} is outside {NORM_RANGE[0]:g}..."
                         f"{NORM_RANGE[1]:g}, where the residuals' sums of squares under- or overflow: scale h (its "
                         f"eigenvalues scale with it)")
    norm_est = max(largest, np.finfo(np.float64).tiny)
    run = Iterations(op, (s, hs, s_next, hs_next), r, theta, norm_est, sq, nev=nev, tol=tol, precond=precond,
                     context=context, comm=comm, timer=timer, callback=callback, overlap=overlap)
    run.redone = start_redone
    run.run(maxiter)
    s, theta, norm_est, converged, it = run.s, run.theta, run.norm_est, run.converged, run.it
    x = xp.ascontiguousarray(s[:, :b])
    # honest final residuals: one explicit product (the recurrences may drift, notably in float32)
    with timer.phase("spmm"):
        hx_true = op.matmat(x[:, :nev])
    rel = norms(hx_true - x[:, :nev] * xp.asarray(theta[:nev], dtype=dtype)[None, :]) / norm_est
    return LobpcgResult(np.asarray(theta[:nev]), x[:, :nev], rel, it, bool(converged[:nev].all()),
                        dict(timer.seconds), run.history, run.restarts, run.second_passes, run.declined,
                        run.redone, run.overlap)
