"""LOBPCG on MPI ranks, one GPU each (rows of H and of the vectors split by nonzeros), on the same matrix
and start block as `cisolver solve` (seed 2024), so its times and per-iteration split sit beside that
command's one- and two-GPU runs in one process.

    mpiexec -n 2 python3 -m benchmarks.cisolver ranks --cases 47V --out results/
    mpiexec -n 2 python3 -m benchmarks.cisolver ranks --cases 48Cr --dtype float32 --tol 1e-5 --out results/

Each case runs with its iterations queued on the GPUs (NCCL sums and gathers, cisolver.iterations) and,
with --compare-trips, once more waiting at every host trip. Rank 0 writes cisolver_ranks_<case>.json.
"""
import os
import time

import numpy as np

from cisolver import lobpcg
from cisolver.data import resolve_interaction
from cisolver.distributed import DistributedOperator, build_local
from cisolver.shellmodel import hamiltonian, snt
from hybridblas.console import positive_float, positive_int

from benchmarks.common import CASES, case_list, command_line, problem as case_problem, refuse, write_json


def run_case(name, comm, args, log):
    import cupy
    dtype = np.dtype(args.dtype)
    problem = case_problem(name)
    t0 = time.perf_counter()
    h, lo, hi = build_local(problem, comm, dtype=dtype, n_threads=args.threads)
    t_build = time.perf_counter() - t0
    op = DistributedOperator(h, lo, hi, problem.dimension, comm, dtype=dtype, device=cupy.cuda.Device().id)
    nnz = comm.allgather(int(h.nnz))
    del h
    sizes = args.block_sizes or [args.nev + 3]
    b = sizes[0]
    spmm_ms = comm.allgather(_local_spmm_ms(op, b))
    # one draw for every block size: the first b columns, the same as `cisolver solve`'s for b = nev + 3
    start = np.random.default_rng(2024).standard_normal((problem.dimension, max(sizes))).astype(dtype)
    rec = {"case": name, "ranks": comm.Get_size(), "dimension": problem.dimension, "nnz_per_rank": nnz,
           "rows_per_rank": op.counts, "local_spmm_ms_per_rank": spmm_ms, "build_seconds": t_build, "dtype": str(dtype), "tol": args.tol,
           "nev": args.nev, "block_size": b, "queued_collectives": op.queued, "runs": [],
           "command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    log(f"{name}: dim {problem.dimension}, nnz per rank {nnz}, local SpMM of {b} vectors per rank "
        f"{[round(x, 3) for x in spmm_ms]} ms, build {t_build:.1f} s")
    for queued in (True, False) if args.compare_trips else (True,):   # this case's kernels (sizes, alignments)
        for b in sizes:                                                 # compiled before any timing
            lobpcg(op, args.nev, block_size=b, x0=start[:, :b], tol=args.tol, maxiter=3, dtype=dtype, comm=comm,
                   queued=queued)
    # the block sizes alternate, so that a drift of the machine touches all of them
    runs = [(True, b) for _ in range(args.repeats) for b in sizes]
    runs += [(False, sizes[0])] if args.compare_trips else []
    for repeat, (queued, b) in enumerate(runs):
        x0 = start[:, :b]
        comm.Barrier()
        profile = None
        if args.profile and repeat == 0:
            import cProfile
            profile = cProfile.Profile()
            profile.enable()
        t0 = time.perf_counter()
        res = lobpcg(op, args.nev, block_size=b, x0=x0, tol=args.tol, maxiter=args.maxiter, dtype=dtype, comm=comm,
                     queued=queued)
        seconds = time.perf_counter() - t0
        if profile is not None:
            profile.disable()
            _print_profile(profile, comm, log)
        it = max(res.iterations, 1)
        per = {k: v / it for k, v in res.seconds.items()}
        share = per.get("dense", 0.0) / max(per.get("dense", 0.0) + per.get("spmm", 0.0), 1e-30)
        per_rank = comm.allgather(per)
        label = (f"cisolver-ranks{comm.Get_size()}" + ("" if queued else "-trips")
                 + (f"-b{b}" if len(sizes) > 1 else ""))
        rec["runs"].append({"solver": label, "block_size": b, "queued": res.queued,
                            "seconds": seconds,
                            "iterations": res.iterations,
                            "converged": res.converged, "declined": res.declined, "redone": res.redone,
                            "restarts": res.restarts, "energies": res.eigenvalues.tolist(),
                            "dense_share": share, "per_iteration": per, "per_iteration_per_rank": per_rank})
        log(f"  {label}: {seconds:.3f} s, {res.iterations} it, dense {per.get('dense', 0) * 1e3:.2f} ms/it, "
            f"spmm {per.get('spmm', 0) * 1e3:.2f} ms/it, dense share {100 * share:.1f} %, "
            f"declined {res.declined}, redone {res.redone}, {res.eigenvalues[:3]}; per rank dense / spmm ms "
            f"{[(round(p.get('dense', 0) * 1e3, 3), round(p.get('spmm', 0) * 1e3, 3)) for p in per_rank]}")
    return rec


def _print_profile(profile, comm, log):
    """Each rank's host time by function (tottime, then the waits by cumtime), printed by rank 0."""
    import io
    import pstats
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(18)
    stats.print_callers("compileProgram")                # a kernel compiled inside the timed run: from where
    texts = comm.gather(out.getvalue(), root=0)
    for rank, text in enumerate(texts or []):
        log(f"--- host profile, rank {rank}\n" + "\n".join(line for line in text.splitlines() if line.strip())[-6000:])


def _local_spmm_ms(op, b, reps=5):
    """This rank's sparse product alone (no gather), b vectors, ms per call after one warm-up call."""
    import cupy
    x = cupy.ones((op.shape[0], b), dtype=op.dtype)
    y = cupy.empty((op.gpu.shape[0], b), dtype=op.dtype)
    op.gpu.multiply_into(y, x)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        op.gpu.multiply_into(y, x)
    cupy.cuda.Device().synchronize()
    return 1e3 * (time.perf_counter() - t0) / reps


def warm_up(comm, dtype):
    """Compile and load every kernel a timed run uses, on 23Na's rows (USDB), before any timing: solved to
    convergence, so soft locking's column selection (a CuPy kernel of its own) is compiled too."""
    import cupy
    problem = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction("usdb")), 3, 4)
    h, lo, hi = build_local(problem, comm, dtype=dtype)
    op = DistributedOperator(h, lo, hi, problem.dimension, comm, dtype=dtype, device=cupy.cuda.Device().id)
    for queued in (True, False):
        lobpcg(op, 5, maxiter=200, dtype=dtype, comm=comm, queued=queued)
    cupy.cuda.Device().synchronize()


def add_arguments(ap):
    ap.add_argument("--out", required=True, help="folder for the JSON results (rank 0 writes)")
    ap.add_argument("--cases", type=case_list, default="47V", help=f"comma list from {sorted(CASES)}")
    ap.add_argument("--nev", type=positive_int, default=5)
    ap.add_argument("--tol", type=positive_float, default=1e-7)
    ap.add_argument("--maxiter", type=positive_int, default=500)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--threads", type=positive_int, default=None, help="threads for each rank's Hamiltonian build")
    ap.add_argument("--compare-trips", action="store_true", help="also run each case waiting at every host trip")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="queued runs per case (the spread shows in the JSON)")
    ap.add_argument("--profile", action="store_true", help="profile the first queued run's host time (cProfile)")
    ap.add_argument("--block-sizes", type=lambda text: [int(v) for v in text.split(",")], default=None,
                    help="LOBPCG block sizes to alternate, comma list (default nev + 3)")


def run(args):
    if args.block_sizes and min(args.block_sizes) < args.nev:
        refuse(f"--block-sizes: each must be >= --nev ({args.nev}), got {args.block_sizes}")
    from mpi4py import MPI
    import cupy
    from hybridblas.distributed import local_rank
    comm = MPI.COMM_WORLD
    cupy.cuda.Device(local_rank(comm)[0] % cupy.cuda.runtime.getDeviceCount()).use()
    rank0 = comm.Get_rank() == 0
    log = (lambda m: print(m, flush=True)) if rank0 else (lambda m: None)
    warm_up(comm, np.dtype(args.dtype))
    os.makedirs(args.out, exist_ok=True)
    for c in args.cases:
        rec = run_case(c, comm, args, log)
        if rank0:
            write_json(os.path.join(args.out, f"cisolver_ranks_{c}.json"), rec)
    return 0
