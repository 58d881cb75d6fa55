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
from dataclasses import dataclass, field

import numpy as np

from . import gpu_ortho
from .arrays import Timer, column_sumsq, module_of, to_host
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

    # S = [X | P | W] and H S in one row-major buffer each: the Gram products read a column range (no
    # concatenation), and every update writes one in place (cisolver.blocks); the new X and P go to a second
    # pair of buffers (they are made from the whole of the first), then the pairs swap
    s, hs, s_next, hs_next = (xp.empty((hi - lo, 3 * b), dtype=dtype) for _ in range(4))
    r = xp.empty((hi - lo, b), dtype=dtype)
    # a GPU run queues whole iterations (cisolver.iterations), and its start: in one process, or on MPI ranks
    # whose sums and gathers NCCL queues on the GPU; CPUs and other MPI runs wait at every host trip
    overlap = (OVERLAP and xp is not np and (comm is None or getattr(op, "queued", False))
               and gpu_ortho.fits(s, b))
    theta, largest, sq, start_redone = first_block(op, x, s, hs, r, context=context, comm=comm, timer=timer,
                                                   queued=overlap, agree=lambda value: agreed(value, comm))
    del x
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
