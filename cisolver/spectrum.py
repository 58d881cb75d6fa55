"""One shell-model spectrum end to end: interaction -> basis -> H -> LOBPCG -> energies and J.

``prepare`` checks every argument, counts the M-scheme dimension and the nonzeros of H (cisolver.estimate)
and refuses a run that would not fit in the chosen devices' memory, all within a second or so and before
anything is built; ``run`` then does the work. ``compute_spectrum`` is the two in one call.

Where H goes: on the CPU the host builds it with the chosen storage. On GPUs (no preconditioner, not a space
small enough for the dense solver) the GPUs build H's full rows themselves, each its own row range
(cisolver.gpu_build), when those fit in their free memory; else the host builds it and uploads it
(cisolver.gpu_spmm). Under MPI (layout "rows") each rank builds its own rows alike: on its GPU where every
rank's share fits on its GPU, else on the host, then uploaded.
"""
import math
import numbers
import os
import time
from dataclasses import dataclass

import numpy as np

import hybridblas as hb

from . import estimate, gpu_build, host_blocks, warmup
from . import solver as _lobpcg
from .arrays import precision, to_host
from .data import resolve_interaction
from .operators import SymmetricOperator
from .preconditioner import TilePreconditioner, configuration_labels
from .observables import TransitionOptions, compute_observables
from .shellmodel import angmom, hamiltonian, nushellx

# the H build's threads when not told: at most 8. On a 32-core node with two H100s 48Cr's build took 9.8 s on 8
# threads and 14.7-16.7 s on 32 (the fill's numpy steps contend), and each thread adds build scratch memory
BUILD_THREADS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def parse_devices(devices, name="devices"):
    """The GPU ids to run on (a list), or "cpu": ``devices`` in hybridblas' syntax (cpu, gpu, all, 0,1,
    cuda:0,cuda:1, a list of ids) or None (cpu). 'all' is every GPU, the host's cores where there is none.
    A 'cpu' next to GPUs adds nothing to the solve (the GPUs hold H)."""
    spec = hb.parse_devices("cpu" if devices is None else devices, name=name)
    return list(spec.gpus) if spec.gpus else "cpu"


@dataclass
class SpectrumRequest:
    """A checked request (``prepare``'s result): every argument valid, the sizes counted, the memory checked."""
    interaction: object          # snt.Interaction
    n_protons: int
    n_neutrons: int
    twice_m: int
    nev: int
    tol: float
    maxiter: int
    devices: object              # "cpu" or GPU ids (under MPI: this rank's GPU)
    dtype: np.dtype
    storage: str
    precond: str
    block_size: object           # int or None (nev + 3)
    seed: object
    n_threads: int               # threads of the H build
    layout: str
    comm: object
    return_vectors: bool
    observables: object          # TransitionOptions, or None for no observables
    counts: estimate.Counts
    memory: estimate.MemoryEstimate
    started: float
    on_gpus: bool = False        # the GPUs build H's full rows themselves (cisolver.gpu_build; MPI: the rank's)


def _integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class _Checker:
    """Raises ValueError / TypeError naming the argument as its caller knows it (``names``: parameter ->
    display name, e.g. the CLI's options) and the value."""

    def __init__(self, names):
        self.names = dict(names or {})

    def name(self, key):
        return self.names.get(key, key)

    def setting(self, key, value):
        """How the caller writes ``key`` set to ``value``: --dtype float32, or dtype='float32'."""
        name = self.name(key)
        return f"{name} {value}" if name.startswith("-") else f"{name}={value!r}"

    def integer(self, key, value, low=None, high=None, what=""):
        if not _integer(value):
            raise TypeError(f"{self.name(key)} must be an integer{what}, got {type(value).__name__} {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (f"in {low}..{high}" if low is not None and high is not None
                      else f">= {low}" if low is not None else f"<= {high}")
            raise ValueError(f"{self.name(key)} must be an integer {bounds}{what}, got {value!r}")
        return int(value)

    def choice(self, key, value, options):
        if value not in options:
            raise ValueError(f"{self.name(key)} must be one of {', '.join(map(repr, options))}, got {value!r}")
        return value


def prepare(interaction, n_protons, n_neutrons, nev=5, *, twice_m=None, tol=None, maxiter=300, devices="cpu",
            dtype="float64", storage="upper", precond="none", block_size=None, seed=0, n_threads=None,
            comm=None, layout="rows", return_vectors=False, observables=True, eff_charge=(1.5, 0.5), gl=(1.0, 0.0),
            gs=(5.586, -3.826), b=None, hbar_omega=None, names=None):
    """Check the arguments of ``compute_spectrum`` (``names`` renames them in messages, e.g. to CLI options),
    count the problem and check its memory: a SpectrumRequest for ``run``. Reads the interaction file; builds
    nothing. Raises ValueError / TypeError / FileNotFoundError on bad input and hybridblas.InsufficientMemory
    when the run cannot fit (under MPI on every rank alike)."""
    started = time.perf_counter()
    ck = _Checker(names)
    if comm is not None and not all(hasattr(comm, a) for a in ("Get_rank", "Get_size", "allgather")):
        raise TypeError(f"{ck.name('comm')} must be an MPI communicator (mpi4py) or None, got {type(comm).__name__}")
    layout = ck.choice("layout", layout, ("rows", "triangular"))
    storage = ck.choice("storage", storage, ("upper", "full"))
    precond = ck.choice("precond", "none" if precond is None else precond, ("none", "tiles"))
    dt = precision(dtype, ck.name("dtype"))
    if tol is None:
        tol = _lobpcg.DEFAULT_TOL[dt.itemsize]
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"{ck.name('tol')} must be a finite number > 0, got {tol!r}")
    maxiter = ck.integer("maxiter", maxiter, low=0)
    nev = ck.integer("nev", nev, low=1)
    if block_size is not None:
        block_size = ck.integer("block_size", block_size, low=nev, what=f" (at least {ck.name('nev')} = {nev})")
    if seed is not None:
        seed = ck.integer("seed", seed, low=0)
    n_threads = BUILD_THREADS if n_threads is None else ck.integer("n_threads", n_threads, low=1)
    host_blocks.cores()                  # $CISOLVER_THREADS checked now, not after the build
    if not isinstance(return_vectors, bool):
        raise TypeError(f"{ck.name('return_vectors')} must be True or False, got {return_vectors!r}")
    if not isinstance(observables, bool):
        raise TypeError(f"{ck.name('observables')} must be True or False, got {observables!r}")
    opts = TransitionOptions(eff_charge, gl, gs, b, hbar_omega) if observables else None
    gpus = parse_devices(devices, name=ck.name("devices"))
    if comm is not None:
        if precond != "none":
            raise ValueError(f"{ck.setting('precond', precond)} is not available under MPI; leave it 'none'")
        if layout == "triangular":
            from .triangular import grid_size
            grid_size(comm.Get_size())
            if gpus != "cpu":
                raise ValueError(f"{ck.setting('layout', layout)} runs on CPU operands only; use "
                                 f"{ck.setting('layout', 'rows')} with {ck.name('devices')}")
    if not isinstance(interaction, str) and not hasattr(interaction, "__fspath__"):
        raise TypeError(f"{ck.name('interaction')} must be a file path or an interaction name like 'usdb', "
                        f"got {type(interaction).__name__} {interaction!r}")
    inter = nushellx.read_interaction(resolve_interaction(interaction))
    where = f"the valence space of {inter.path}"
    for key, value, orbits in (("n_protons", n_protons, inter.proton_orbits),
                               ("n_neutrons", n_neutrons, inter.neutron_orbits)):
        ck.integer(key, value, low=0, high=sum(o.twoj + 1 for o in orbits), what=f" (the m-states of {where})")
    n_protons, n_neutrons = int(n_protons), int(n_neutrons)
    parity = (n_protons + n_neutrons) % 2
    largest = estimate.allowed_twice_m(inter, n_protons, n_neutrons)
    if twice_m is None:
        twice_m = parity
    else:
        twice_m = ck.integer("twice_m", twice_m, low=-largest, high=largest,
                             what=f" (2M of Z={n_protons} N={n_neutrons} in {inter.path})")
        if twice_m % 2 != parity:
            raise ValueError(f"{ck.name('twice_m')} must be {'odd' if parity else 'even'} for "
                             f"{n_protons + n_neutrons} valence nucleons (2M has the parity of A), got {twice_m}")
    counts = estimate.count(inter, n_protons, n_neutrons, twice_m)
    if nev > counts.dimension:
        raise ValueError(f"{ck.name('nev')} must be at most the M-scheme dimension {counts.dimension} of Z={n_protons} "
                         f"N={n_neutrons} 2M={twice_m} in {inter.path}, got {nev}")
    ranks = comm.Get_size() if comm is not None else 1
    local_ranks, asked = 1, gpus
    if comm is not None:
        from hybridblas.distributed import local_rank
        rank_on_node, local_ranks = local_rank(comm)
        if gpus != "cpu":              # one GPU per rank: local rank -> device, current on this thread from now
            gpus = [gpus[rank_on_node % len(gpus)]]     # (no context on another rank's GPU when a device
            import cupy                                   # switch inside the run switches back)
            cupy.cuda.Device(gpus[0]).use()
    elif gpus != "cpu":                # one process: a thread without a current GPU starts on the first (a run
        hb.console.use_first_gpu(gpus)   # on GPU 1 then makes no context on device 0)
    on_gpus = _builds_on_gpus(counts, gpus, dt, comm, layout, precond, block_size, nev)
    mem = estimate.memory(counts, nev=nev, block_size=block_size or nev + 3, dtype=dt, storage=storage,
                          gpus=() if gpus == "cpu" else tuple(gpus), ranks=ranks, layout=layout,
                          n_particles=n_protons + n_neutrons, n_threads=n_threads, on_gpus=on_gpus)
    estimate.check_memory(mem, advice=_advice(ck, dt, storage, asked, ranks, mem), local_ranks=local_ranks,
                          comm=comm)
    return SpectrumRequest(inter, n_protons, n_neutrons, twice_m, nev, float(tol), maxiter, gpus, dt, storage,
                           precond, block_size, seed, n_threads, layout, comm, return_vectors, opts, counts, mem,
                           started, on_gpus)


def _builds_on_gpus(counts, gpus, dtype, comm, layout, precond, block_size, nev):
    """Whether the GPUs build H's full rows themselves (cisolver.gpu_build): where they fit (gpu_build.fits).
    One process: not with a preconditioner, nor for the dense solver. Under MPI (layout "rows"): each rank its
    share of the rows on its GPU, decided alike on every rank (all GPUs must fit)."""
    if comm is None:
        return (gpus != "cpu" and precond == "none" and not _dense_size(counts.dimension, block_size, nev)
                and gpu_build.fits(counts.dimension, counts.nnz("full"), dtype.itemsize,
                                   [hb.memory.gpu_free(g) for g in gpus]))
    fits = (gpus != "cpu" and layout == "rows"
            and gpu_build.fits(counts.dimension, counts.nnz("full") / comm.Get_size(), dtype.itemsize,
                               [hb.memory.gpu_free(gpus[0])]))
    return all(comm.allgather(fits))


def _advice(ck, dtype, storage, gpus, ranks, mem):
    tips = []
    if dtype == np.float64:
        tips.append(ck.setting("dtype", "float32"))
    if storage == "full" and ranks == 1:
        tips.append(ck.setting("storage", "upper"))
    tips.append("more MPI ranks on more nodes (each holds about 1/ranks of H and of the vectors)")
    if gpus != "cpu":
        tips.append(f"more GPUs in {ck.name('devices')}")
    if mem.vectors >= mem.h_bytes:
        tips.append(f"a smaller {ck.name('nev')} or {ck.name('block_size')}")
    return "try " + ", ".join(tips)


def _dense_size(dim, block_size, nev):
    """Whether the space is small enough for a dense diagonalisation (the right tool there)."""
    return dim < 3 * (block_size or nev + 3)


def run(request, progress=None):
    """Do what ``request`` (from ``prepare``) asks: build H, solve, <J^2>. ``progress(done, total)`` is called
    as groups of H's rows are built on the host (not under MPI, not when the GPUs build H)."""
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {type(progress).__name__}")
    rq = request
    if rq.devices == "cpu" or rq.comm is not None:     # a rank's GPU: made current by prepare and _rank_gpu
        return _run_warmed(rq, progress)
    import cupy
    with hb.console.gpu_kept():         # one process: the run's first GPU is current during the run (the arrays
        cupy.cuda.Device(rq.devices[0]).use()   # the solve makes land on it, whatever GPU the caller had current);
        return _run_warmed(rq, progress)        # a caller's own current GPU is current again after it


def _run_warmed(rq, progress):
    warm = None
    if rq.devices != "cpu":             # cisolver's CUDA units compile (or load) while the host plans H
        import cupy
        from . import cuda_modules
        warm = warmup.start(rq)         # and, on a cold cache, CuPy's kernels of the solve and observables
        cuda_modules.prepare(cupy, rq.dtype, rq.devices)
        hb.lowlevel.prepare_kernels(rq.dtype, rq.devices)   # hybridblas's: lowlevel.grams', the skinny products'
    try:
        return _run(rq, progress)
    finally:
        if warm is not None:
            warm.close()


def _run(rq, progress):
    if rq.comm is not None:
        gpu = _rank_gpu(rq)
        # NCCL's set-up (every rank calls it) beside the problem's set-up and the build (2 x H200, 48Cr f32:
        # read+build 1.90 s on each of three runs, against 1.93-2.06 s with the set-up after the problem's)
        hb.distributed.prepare_collectives(rq.comm, gpu)
    problem = hamiltonian.ShellModelProblem(rq.interaction, rq.n_protons, rq.n_neutrons, rq.twice_m)
    if rq.comm is not None:
        return _distributed_spectrum(rq, problem, gpu)
    if rq.on_gpus:
        parts, stages = gpu_build.build_rows_on_gpus(problem, rq.devices, rq.dtype, rq.n_threads)
        t1 = time.perf_counter()
        op = SymmetricOperator.on_gpus(parts, problem.dimension, rq.dtype)
        h, nnz, storage = None, op.nnz, "full (built on the GPUs)"
        build_detail = dict(problem.setup_seconds, **stages)
    else:
        h, info = problem.build(storage=rq.storage, dtype=rq.dtype, n_threads=rq.n_threads, progress=progress)
        t1 = time.perf_counter()
        op = SymmetricOperator(h, storage=rq.storage, devices=rq.devices)
        nnz, storage, build_detail = info.nnz_stored, rq.storage, info.seconds
    pc = None
    if rq.precond == "tiles":
        pc = TilePreconditioner(h, configuration_labels(problem), upper=rq.storage == "upper", xp=op.xp)
    t2 = time.perf_counter()
    dim = problem.dimension
    if _dense_size(dim, rq.block_size, rq.nev):
        res = _dense(h, rq.storage, rq.nev)
    else:
        res = _lobpcg.lobpcg(op, rq.nev, block_size=rq.block_size, tol=rq.tol, maxiter=rq.maxiter, precond=pc,
                             seed=rq.seed, dtype=rq.dtype)
    t3 = time.perf_counter()
    j2 = _expectation_j2(problem, res.eigenvectors)
    t4 = time.perf_counter()
    vecs = to_host(res.eigenvectors) if rq.return_vectors else None
    out = _result(rq, problem, res, j2, vecs, dim=dim, nnz=nnz, storage=storage, devices=rq.devices)
    out.update(queued=res.queued,
               seconds={"read+build": t1 - rq.started, "setup": t2 - t1, "solve": t3 - t2, "j2": t4 - t3,
                        "build_detail": build_detail, "solve_detail": res.seconds})
    return _with_observables(out, problem, res.eigenvectors, rq.observables)     # on the GPU when they are there


def _expectation_j2(problem, vectors):
    """<J^2> of the columns of ``vectors``: on their GPU for CuPy arrays (cisolver.gpu_angmom), else on the host."""
    if hasattr(vectors, "get"):
        from .gpu_angmom import expectation_j2
        return expectation_j2(problem, vectors)
    return angmom.expectation_j2(problem, vectors)


def _with_observables(out, problem, vectors, opts, comm=None):
    """``out`` with ``out["observables"]`` (and its time) when ``opts`` asks for them (``comm``: ranks that
    each hold the whole vectors share the work)."""
    if opts is not None:
        t = time.perf_counter()
        out["observables"] = compute_observables(problem, vectors, opts, comm=comm)
        out["seconds"]["observables"] = time.perf_counter() - t
    return out


def compute_spectrum(interaction, n_protons, n_neutrons, nev=5, *, twice_m=None, tol=None,
                     maxiter=300, devices="cpu", dtype="float64", storage="upper", precond="none",
                     block_size=None, seed=0, n_threads=None, progress=None, comm=None, layout="rows",
                     return_vectors=False, observables=True, eff_charge=(1.5, 0.5), gl=(1.0, 0.0),
                     gs=(5.586, -3.826), b=None, hbar_omega=None):
    """The lowest ``nev`` eigenpairs of the M-scheme shell-model H of ``n_protons`` and ``n_neutrons`` valence
    nucleons in ``interaction`` (a .snt path or a name in the shared data folder): a dict with the dimension,
    energies (MeV), J and <J^2>, relative residuals, iterations, ``converged`` and timings.

    devices: hybridblas' syntax ("cpu", "gpu", "all", "0,1", "cuda:0", a list of ids). dtype: float64 or float32.
    tol: LOBPCG's relative residual tolerance (None: 1e-8 for float64, 1e-5 for float32, whose residuals level
    off near 1e-6).
    storage: how the host stores H: "upper" (the upper triangle, H = U + U^T - D) or "full". On GPUs H is
    held as full rows that the GPUs build themselves where they fit (result["storage"] "full (built on the
    GPUs)", under MPI "full (row blocks built on the GPUs)"; not with precond "tiles"); else the host builds it
    with ``storage`` and uploads it.
    precond: "none" or "tiles".
    return_vectors: also give "eigenvectors", a numpy (dimension x nev) array (under MPI gathered, on every rank).
    observables: add ``result["observables"]`` (cisolver.observables.compute_observables: occupations, T and
    parity, B(E2), B(M1), Q and mu) with effective charges, g-factors (proton, neutron) and the oscillator
    length b (fm) or hbar_omega (MeV; default 45 A^(-1/3) - 25 A^(-2/3) MeV).
    comm: an MPI communicator; each rank then builds and holds only its part of H and of the vectors,
    with Allreduce'd Gram matrices; ``storage`` and ``n_threads`` do not apply there. layout: "rows" (1-D row
    blocks, Allgatherv SpMM; with ``devices`` each rank holds its part on one GPU, local rank -> device) or
    "triangular" (MFDn's: one block of the stored half of H per rank, n_d (n_d + 1) / 2 ranks; CPU operands
    only); it applies under MPI only.
    Every argument is checked, and the memory the run needs estimated against the host's (and the GPUs'),
    before anything is built (``prepare``).
    """
    return run(prepare(interaction, n_protons, n_neutrons, nev, twice_m=twice_m, tol=tol, maxiter=maxiter,
                       devices=devices, dtype=dtype, storage=storage, precond=precond, block_size=block_size,
                       seed=seed, n_threads=n_threads, comm=comm, layout=layout, return_vectors=return_vectors,
                       observables=observables, eff_charge=eff_charge, gl=gl, gs=gs, b=b, hbar_omega=hbar_omega),
               progress=progress)


def _dense(h, storage, nev):
    """A LobpcgResult from a dense eigendecomposition, with the residuals measured as LOBPCG's are."""
    full = (h + h.T - _diag(h)) if storage == "upper" else h
    a = full.toarray()
    w, v = np.linalg.eigh(a)
    w, v = w[:nev], v[:, :nev]
    scale = max(float(np.abs(w).max()), np.finfo(np.float64).tiny)
    residuals = np.linalg.norm(a @ v - v * w[None, :], axis=0) / scale
    return _lobpcg.LobpcgResult(w, v, residuals, 0, True, {})


def _diag(h):
    import scipy.sparse as sp
    return sp.diags(h.diagonal())


def _result(rq, problem, res, j2, vecs, *, dim, nnz, storage, devices):
    out = {
        "interaction": str(rq.interaction.path), "protons": rq.n_protons, "neutrons": rq.n_neutrons,
        "mass": problem.mass, "twice_m": problem.basis.twice_m, "tbme_factor": problem.factor,
        "dimension": dim, "nnz_stored": nnz, "storage": storage, "dtype": str(rq.dtype), "devices": devices,
        "energies": [float(e) for e in res.eigenvalues],
        "j2": [float(x) for x in j2], "j": [float(x) for x in angmom.j_from_j2(j2)],
        "residuals": [float(x) for x in res.residual_norms], "iterations": res.iterations,
        "converged": res.converged,
    }
    if rq.return_vectors:
        out["eigenvectors"] = np.asarray(vecs)
    return out


def _rank_gpu(rq):
    """This rank's GPU (prepare gave each rank one), made current; None on the CPU."""
    if rq.devices == "cpu":
        return None
    import cupy
    gpu, = rq.devices
    cupy.cuda.Device(gpu).use()
    return gpu


def _distributed_spectrum(rq, problem, gpu):
    from hybridblas.distributed import allgather_rows
    from .distributed import DistributedOperator, build_rows, local_rows
    from .triangular import TriangularLayout, TriangularOperator, build_block
    comm, dtype = rq.comm, rq.dtype
    if rq.layout == "rows":             # on this rank's GPU where prepare found they fit (rq.on_gpus)
        lo, hi = local_rows(problem, comm)
        h_local, build_detail = build_rows(problem, (lo, hi), dtype, rq.n_threads, gpu if rq.on_gpus else None)
        t1 = time.perf_counter()
        op = DistributedOperator(h_local, lo, hi, problem.dimension, comm, dtype=dtype, device=gpu)
        h_local, nnz = None, op.nnz     # the rows held by op alone (none on the host when op is on a GPU)
        comm.Barrier()                  # every rank's rows on its device: "solve" starts together
        storage = "full (row blocks built on the GPUs)" if rq.on_gpus else "full (row blocks)"
    else:
        grid = TriangularLayout([b.size for b in problem.basis.blocks], comm.Get_size())
        h_local = build_block(problem, grid, comm.Get_rank(), dtype=dtype, n_threads=rq.n_threads)
        t1 = time.perf_counter()
        op = TriangularOperator(h_local, grid, problem.dimension, comm, dtype=dtype)
        nnz, build_detail = h_local.nnz, dict(problem.setup_seconds)
        storage = f"triangular blocks (n_d = {grid.n_d}; diagonal blocks in full)"
    t_setup = time.perf_counter()
    res = _lobpcg.lobpcg(op, rq.nev, block_size=rq.block_size, tol=rq.tol, maxiter=rq.maxiter, seed=rq.seed,
                         dtype=dtype, comm=comm)
    t2 = time.perf_counter()
    full = allgather_rows(res.eigenvectors, comm)      # every rank's GPU (NCCL) or host holds the whole vectors
    j2 = _expectation_j2(problem, full)
    t3 = time.perf_counter()
    nnz_local = comm.allgather(int(nnz))
    vecs = to_host(full) if rq.return_vectors else None
    out = _result(rq, problem, res, j2, vecs, dim=problem.dimension, nnz=sum(nnz_local), storage=storage,
                  devices="cpu" if gpu is None else [gpu])
    out.update(ranks=comm.Get_size(), queued=res.queued, declined=res.declined, nnz_local=nnz_local,
               seconds={"read+build": t1 - rq.started, "setup": t_setup - t1, "solve": t2 - t_setup,
                        "j2": t3 - t2, "build_detail": build_detail,
                        "solve_detail": dict(res.seconds, communication=op.comm_seconds)})
    return _with_observables(out, problem, full, rq.observables, comm)   # shared by the ranks, on their GPUs
