"""Side-by-side LOBPCG campaign on shell-model Hamiltonians (same matrix, same start block).

    python3 -m benchmarks.cisolver solve --devices cpu --out results/ [--cases 24Mg,44Ti]
    python3 -m benchmarks.cisolver solve --devices all --out results/

Peers: scipy.sparse.linalg.lobpcg and eigsh (CPU), cupyx.scipy.sparse.linalg.lobpcg (GPU, if cupy).
Ours: cisolver.lobpcg on the CPU, on one GPU and on two GPUs (when present). Writes one JSON per case,
cisolver_<case>.json. --cpu-backend picks the CPU sparse product (cisolver.SymmetricOperator's backend:
auto takes MKL when installed).
"""
import os
import platform
import sys
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from cisolver import lobpcg
from cisolver.operators import SymmetricOperator
from hybridblas.console import positive_float, positive_int
from hybridblas.devspec import parse_devices

from benchmarks.common import CASES, case_list, command_line, full_from_upper, problem, timed, write_json

COMPARE_TRIPS = False   # --compare-trips


def run_case(name, nev, tol, devices, dtype, maxiter, threads, log, path, meta, gpu_only=False, cpu_backend="auto"):
    """One case, every solver; the JSON at ``path`` is rewritten after each run, so a run cut short by a
    time limit keeps what finished."""
    inter_name, z, n = CASES[name]
    prob = problem(name)
    (hu, info), t_build = timed(lambda: prob.build(storage="upper", dtype=dtype, n_threads=threads))
    log(f"{name}: dim {info.dimension}, nnz(upper) {info.nnz_stored}, build {t_build:.1f}s")
    b = nev + 3
    x0 = np.random.default_rng(2024).standard_normal((info.dimension, b)).astype(dtype)
    rec = {"case": name, "interaction": inter_name, "protons": z, "neutrons": n, "dimension": info.dimension,
           "nnz_upper": info.nnz_stored, "build_seconds": t_build, "build_detail": info.seconds,
           "nev": nev, "block_size": b, "tol": tol, "dtype": str(np.dtype(dtype)), "runs": [], "meta": meta}

    def record(entry):
        rec["runs"].append(entry)
        write_json(path, rec)

    def ours(label, devs, storage, h, queued=True):
        backend = {"backend": cpu_backend} if devs == "cpu" else {}
        op = SymmetricOperator(h, storage=storage, devices=devs, **backend)
        res, t = timed(lambda: lobpcg(op, nev, block_size=b, x0=x0, tol=tol, maxiter=maxiter, dtype=dtype,
                                           queued=queued))
        it = max(res.iterations, 1)
        record({"solver": label, "backend": getattr(op, "backend", None), "seconds": t,
                "iterations": res.iterations, "converged": res.converged, "restarts": res.restarts,
                "second_passes": res.second_passes, "declined": res.declined, "redone": res.redone, "energies": res.eigenvalues.tolist(),
                "residuals": res.residual_norms.tolist(),
                "per_iteration": {k: v / it for k, v in res.seconds.items()}})
        log(f"  {label}: {t:.2f}s, {res.iterations} it ({res.second_passes} with a second CholQR pass, "
            f"{res.declined} GPU passes declined, {res.redone} GPU steps redone), dense {res.seconds.get('dense', 0) / it * 1e3:.2f} ms/it, "
            f"spmm {res.seconds.get('spmm', 0) / it * 1e3:.2f} ms/it, {res.eigenvalues[:3]}")
        if devs != "cpu" and COMPARE_TRIPS and queued:
            ours(label + "-trips", devs, storage, h, queued=False)      # the same run waiting at every host trip

    def peer(label, fn):
        try:
            w, t = timed(fn)
            record({"solver": label, "seconds": t, "energies": np.sort(w)[:nev].tolist()})
            log(f"  {label}: {t:.2f}s")
        except Exception as exc:     # a peer failing is a result, not a crash
            record({"solver": label, "error": repr(exc)})

    gpus = [] if devices == "cpu" else list(devices)
    if gpus:
        warm_up(gpus, dtype)
    if 2 * info.nnz_stored > 2**31 - 1:      # full CSR would need int64 indices (beyond 48Cr): upper only
        log("  full storage exceeds int32 CSR; peers and full-storage runs skipped for this case")
        for count in (1, 2)[:len(gpus)]:
            ours(f"cisolver-gpu{count}-upper", gpus[:count], "upper", hu)
        if not gpu_only:
            ours("cisolver-cpu-upper", "cpu", "upper", hu)
        return rec
    hf = full_from_upper(hu)
    # GPU runs first: a time limit then cuts the slow CPU peers, not the GPU results
    if gpus:
        import cupy
        import cupyx.scipy.sparse as csp
        import cupyx.scipy.sparse.linalg as csla
        ours("cisolver-gpu1", gpus[:1], "full", hf)
        if len(gpus) >= 2:
            ours("cisolver-gpu2", gpus[:2], "full", hf)
            ours("cisolver-gpu2-upper", gpus[:2], "upper", hu)
        with cupy.cuda.Device(gpus[0]):
            hg, xg = csp.csr_matrix(hf), cupy.asarray(x0)

            def cupyx_lobpcg():
                w = csla.lobpcg(hg, xg.copy(), tol=tol * 100, largest=False, maxiter=maxiter)[0]
                return cupy.asnumpy(w)        # waits for the GPU
            peer("cupyx-lobpcg", cupyx_lobpcg)
    if gpu_only:
        return rec
    # CPU peers on the same matrix and start block; lobpcg's tolerance is absolute, scaled to match ours
    peer("scipy-eigsh", lambda: spla.eigsh(hf, k=nev, which="SA", v0=x0[:, 0].astype(np.float64), tol=1e-10)[0])
    ours("cisolver-cpu-upper", "cpu", "upper", hu)
    peer("scipy-lobpcg", lambda: spla.lobpcg(hf, x0.copy(), tol=tol * 100, largest=False, maxiter=maxiter,
                                             verbosityLevel=0)[0])
    ours("cisolver-cpu-full", "cpu", "full", hf)
    return rec


def warm_up(gpus, dtype):
    """Compile and load the GPU kernels every timed solver uses (ours on one and two GPUs, both
    storages; cupyx's lobpcg) on a small matrix first, so no timed run pays for that; and ours on a
    sparse matrix of 2^20 + 8 rows, beyond hybridblas.lowlevel.grams' limits, where the Grams (the start's too)
    take hb.gemmt and hb.syrk instead (48Cr's first timed run had taken ~47 ms more for their first use)."""
    import cupy
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as csla
    rng = np.random.default_rng(0)
    n = 3000
    a = sp.random(n, n, density=0.002, random_state=rng, format="csr")
    a = (a + a.T + sp.diags(rng.uniform(-5, 5, n))).tocsr().astype(dtype)
    for devs in ([gpus[0]], gpus[:2]):
        for storage, h in (("full", a), ("upper", sp.triu(a).tocsr())):
            lobpcg(SymmetricOperator(h, storage=storage, devices=devs), 5, maxiter=5, dtype=dtype)
    big = (1 << 20) + 8
    tall = sp.random(big, big, density=2.0 / big, random_state=rng, format="csr")
    tall = (tall + tall.T + sp.diags(rng.uniform(-5, 5, big))).tocsr().astype(dtype)
    for devs in ([gpus[0]], gpus[:2]):
        lobpcg(SymmetricOperator(tall, devices=devs), 5, maxiter=3, dtype=dtype)
    with cupy.cuda.Device(gpus[0]):
        csla.lobpcg(csp.csr_matrix(a), cupy.asarray(rng.standard_normal((n, 8)).astype(dtype)), maxiter=5,
                    largest=False)
        cupy.cuda.Device().synchronize()


def add_arguments(ap):
    ap.add_argument("--devices", default="cpu", help="cpu, or the GPUs to use (all, gpu, 0,1 ...); the solvers "
                    "run on the first one and on the first two")
    ap.add_argument("--out", required=True, help="folder for the JSON results")
    ap.add_argument("--cases", type=case_list, default="24Mg,44Ti,46Ti", help=f"comma list from {sorted(CASES)}")
    ap.add_argument("--nev", type=positive_int, default=5)
    ap.add_argument("--tol", type=positive_float, default=1e-7)
    ap.add_argument("--maxiter", type=positive_int, default=500)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--threads", type=positive_int, default=None, help="threads for the Hamiltonian build")
    ap.add_argument("--cpu-backend", choices=["auto", "scipy", "mkl"], default="auto",
                    help="sparse product of ours on the CPU (auto: MKL when installed)")
    ap.add_argument("--gpu-only", action="store_true", help="skip the CPU solvers (ours and the peers)")
    ap.add_argument("--compare-trips", action="store_true",
                    help="run each GPU solve of ours a second time waiting at every host trip (lobpcg queued=False)")


def run(args):
    devices = "cpu"
    if args.devices != "cpu":
        devices = list(parse_devices(args.devices, name="--devices").gpus) or "cpu"
        if devices == "cpu":
            print("benchmarks.cisolver solve: no CUDA GPU found; running the CPU part only", file=sys.stderr)
    global COMPARE_TRIPS
    COMPARE_TRIPS = args.compare_trips
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "devices": devices,
            "command": command_line()}
    for c in args.cases:
        run_case(c, args.nev, args.tol, devices, np.dtype(args.dtype), args.maxiter, args.threads,
                 lambda m: print(m, flush=True), os.path.join(args.out, f"cisolver_{c}.json"), meta,
                 gpu_only=args.gpu_only, cpu_backend=args.cpu_backend)
    return 0
