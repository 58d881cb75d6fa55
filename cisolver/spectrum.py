"""One shell-model spectrum end to end: interaction -> basis -> H -> LOBPCG -> energies and J."""
import time

import numpy as np

from . import solver as _lobpcg
from .arrays import to_host
from .data import resolve_interaction
from .operators import SymmetricOperator
from .preconditioner import TilePreconditioner, configuration_labels
from .shellmodel import angmom, hamiltonian, snt


def parse_devices(devices):
    """'cpu' -> 'cpu'; 'all' -> every CUDA device (cpu if none); '0,1' -> [0, 1]."""
    if devices in (None, "cpu"):
        return "cpu"
    if devices == "all":
        try:
            import cupy
            n = cupy.cuda.runtime.getDeviceCount() if cupy.is_available() else 0
        except Exception:
            n = 0
        return list(range(n)) if n else "cpu"
    if isinstance(devices, str):
        try:
            return [int(x) for x in devices.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"devices must be 'cpu', 'all' or a list like '0,1', got {devices!r}") from None
    return list(devices)


def compute_spectrum(interaction, n_protons, n_neutrons, nev=5, *, twice_m=None, tol=1e-8,
                     maxiter=300, devices="cpu", dtype="float64", storage="upper", precond="none",
                     block_size=None, seed=0, n_threads=None, progress=None, comm=None, layout="rows"):
    """comm: an MPI communicator; each rank then builds and holds only its part of H and of the vectors,
    with Allreduce'd Gram matrices. layout: "rows" (1-D row blocks, Allgatherv SpMM; with ``devices``
    each rank holds its part on one GPU) or "triangular" (MFDn's: one block of the stored half of H per
    rank, n_d (n_d + 1) / 2 ranks; CPU operands only)."""
    if layout not in ("rows", "triangular"):
        raise ValueError(f"layout must be 'rows' or 'triangular', got {layout!r}")
    t0 = time.perf_counter()
    inter = snt.read_snt(resolve_interaction(interaction))
    problem = hamiltonian.ShellModelProblem(inter, n_protons, n_neutrons, twice_m)
    if comm is not None:
        return _distributed_spectrum(problem, inter, nev, tol, maxiter, dtype, block_size, seed,
                                     n_threads, comm, t0, layout, parse_devices(devices))
    h, info = problem.build(storage=storage, dtype=dtype, n_threads=n_threads, progress=progress)
    t1 = time.perf_counter()
    devs = parse_devices(devices)
    op = SymmetricOperator(h, storage=storage, devices=devs)
    pc = None
    if precond == "tiles":
        pc = TilePreconditioner(h, configuration_labels(problem), upper=storage == "upper", xp=op.xp)
    elif precond not in ("none", None):
        raise ValueError(f"precond must be 'none' or 'tiles', got {precond!r}")
    t2 = time.perf_counter()
    dim = problem.dimension
    if dim < 3 * (block_size or nev + 3):      # tiny spaces: dense diagonalisation is the right tool
        w, v = np.linalg.eigh((h + h.T - __import__("scipy.sparse").sparse.diags(h.diagonal())).toarray()
                              if storage == "upper" else h.toarray())
        res = _lobpcg.LobpcgResult(w[:nev], v[:, :nev], np.zeros(min(nev, dim)), 0, True, {})
    else:
        res = _lobpcg.lobpcg(op, nev, block_size=block_size, tol=tol, maxiter=maxiter, precond=pc,
                             seed=seed, dtype=dtype)
    t3 = time.perf_counter()
    if hasattr(res.eigenvectors, "get"):         # on a GPU: <J²> there (cisolver.gpu_angmom)
        from .gpu_angmom import expectation_j2
        j2 = expectation_j2(problem, res.eigenvectors)
    else:
        j2 = angmom.expectation_j2(problem, res.eigenvectors)
    t4 = time.perf_counter()
    return {
        "interaction": str(inter.path), "protons": n_protons, "neutrons": n_neutrons,
        "mass": problem.mass, "twice_m": problem.basis.twice_m, "tbme_factor": problem.factor,
        "dimension": dim, "nnz_stored": info.nnz_stored, "storage": storage, "dtype": str(np.dtype(dtype)),
        "devices": devs, "energies": [float(e) for e in res.eigenvalues],
        "j2": [float(x) for x in j2], "j": [float(x) for x in angmom.j_from_j2(j2)],
        "residuals": [float(x) for x in res.residual_norms], "iterations": res.iterations,
        "converged": res.converged, "queued": res.queued,
        "seconds": {"read+build": t1 - t0, "setup": t2 - t1, "solve": t3 - t2, "j2": t4 - t3,
                    "build_detail": info.seconds, "solve_detail": res.seconds},
    }


def _distributed_spectrum(problem, inter, nev, tol, maxiter, dtype, block_size, seed, n_threads, comm, t0,
                          layout, devices):
    from hybridblas.distributed import allgather_rows, local_rank
    from .distributed import DistributedOperator, build_local
    from .triangular import TriangularLayout, TriangularOperator, build_block
    gpu = None
    if devices != "cpu":            # one GPU per rank: local rank -> device
        if layout != "rows":
            raise ValueError(f"layout={layout!r} runs on CPU operands only; use layout='rows' with GPUs")
        if not devices:
            raise ValueError("devices names no GPU")
        gpu = devices[local_rank(comm)[0] % len(devices)]
        import cupy
        cupy.cuda.Device(gpu).use()
    if layout == "rows":
        h_local, lo, hi = build_local(problem, comm, dtype=dtype, n_threads=n_threads)
        t1 = time.perf_counter()
        op = DistributedOperator(h_local, lo, hi, problem.dimension, comm, dtype=dtype, device=gpu)
        comm.Barrier()                  # every rank's rows uploaded: "solve" starts together
        storage = "full (row blocks)"
    else:
        grid = TriangularLayout([b.size for b in problem.basis.blocks], comm.Get_size())
        h_local = build_block(problem, grid, comm.Get_rank(), dtype=dtype, n_threads=n_threads)
        t1 = time.perf_counter()
        op = TriangularOperator(h_local, grid, problem.dimension, comm, dtype=dtype)
        storage = f"triangular blocks (n_d = {grid.n_d}; diagonal blocks in full)"
    t_setup = time.perf_counter()
    res = _lobpcg.lobpcg(op, nev, block_size=block_size, tol=tol, maxiter=maxiter, seed=seed,
                         dtype=dtype, comm=comm)
    t2 = time.perf_counter()
    vecs = to_host(allgather_rows(res.eigenvectors, comm))
    j2 = angmom.expectation_j2(problem, vecs)
    t3 = time.perf_counter()
    nnz_local = comm.allgather(int(h_local.nnz))
    return {
        "interaction": str(inter.path), "protons": problem.n_protons, "neutrons": problem.n_neutrons,
        "mass": problem.mass, "twice_m": problem.basis.twice_m, "tbme_factor": problem.factor,
        "dimension": problem.dimension, "nnz_stored": sum(nnz_local), "storage": storage,
        "dtype": str(np.dtype(dtype)), "devices": "cpu" if gpu is None else [gpu], "ranks": comm.Get_size(),
        "energies": [float(e) for e in res.eigenvalues],
        "j2": [float(x) for x in j2], "j": [float(x) for x in angmom.j_from_j2(j2)],
        "residuals": [float(x) for x in res.residual_norms], "iterations": res.iterations,
        "converged": res.converged,
        "queued": res.queued, "declined": res.declined, "nnz_local": nnz_local,
        "seconds": {"read+build": t1 - t0, "setup": t_setup - t1, "solve": t2 - t_setup, "j2": t3 - t2,
                    "solve_detail": dict(res.seconds, communication=op.comm_seconds)},
    }
