"""GPU time of the small symmetric eigensolve in LOBPCG's Rayleigh-Ritz step (k x k, k = 24, batch of one):
cuSOLVER's syevjBatched (what cisolver.gpu_rayleigh_ritz calls) against cusolverDnXsyevBatched (CUDA 12.6+,
not wrapped by CuPy: called through ctypes on the libcusolver CuPy has loaded), on a dense random matrix and
on a LOBPCG-like one (Ritz values on the leading diagonal, small coupling). GPU time from events around
calls queued behind a spin kernel; host time per call separately; accuracy as max |A v - w v| / max |w|.

    python3 -m benchmarks.cisolver small-eigh [--k 24] [--json out.json] [--matrices a.npy]
    python3 -m benchmarks.cisolver small-eigh --capture a.npy     # CPU only: LOBPCG's own matrices

--capture runs the CPU LOBPCG on 24Mg (USDB) and 45Ti (GXPF1A) and saves every 24 x 24 Rayleigh-Ritz matrix
A = R^-T (S^T H S) R^-1 it diagonalised; --matrices times syevj on them at several tolerances.
"""
import ctypes
import time

import numpy as np

from hybridblas.console import check_output_path, positive_int

from benchmarks.common import write_json
from benchmarks.gputime import device_name, spin

try:
    import cupy as cp
except ImportError:            # --capture runs on the CPU
    cp = None


def capture(path, k=24):
    """LOBPCG's own k x k Rayleigh-Ritz matrices from CPU runs (the host path's np.linalg.eigh sees them)."""
    from cisolver import dense, lobpcg
    from cisolver.data import resolve_interaction
    from cisolver.operators import SymmetricOperator
    from cisolver.shellmodel import hamiltonian, snt
    caught, eigh = [], np.linalg.eigh

    def spy(a, *args, **kwargs):
        if a.shape == (k, k):
            caught.append(np.array(a))
        return eigh(a, *args, **kwargs)
    dense.np.linalg.eigh = spy
    try:
        for name, z, n in (("usdb", 4, 4), ("gxpf1a", 2, 3)):
            problem = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction(name)), z, n)
            h, _ = problem.build("upper")
            x0 = np.random.default_rng(2024).standard_normal((problem.dimension, k // 3))
            lobpcg(SymmetricOperator(h, storage="upper"), k // 3 - 3, block_size=k // 3, x0=x0, tol=1e-7)
    finally:
        dense.np.linalg.eigh = eigh
    np.save(path, np.array(caught))
    print(f"{len(caught)} matrices of {k} x {k} saved to {path}")


def _loaded_cusolver():
    from cupy_backends.cuda.libs import cusolver
    assert cusolver is not None                       # importing it loads the library
    with open("/proc/self/maps") as fh:
        paths = {line.split()[-1] for line in fh if "libcusolver.so" in line}
    if not paths:
        raise RuntimeError("libcusolver is not loaded")
    return ctypes.CDLL(sorted(paths)[0])


class XsyevBatched:
    """cusolverDnXsyevBatched on one k x k float64 matrix, on the current stream."""

    def __init__(self, k):
        from cupy_backends.cuda.libs import cusolver
        self.lib = _loaded_cusolver()
        self.k = k
        self.handle = cp.cuda.device.get_cusolver_handle()
        self.params = cusolver.createParams()
        i64, vp, sz = ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t
        self.lib.cusolverDnXsyevBatched_bufferSize.argtypes = [vp, vp, ctypes.c_int, ctypes.c_int, i64, ctypes.c_int, vp,
                                                               i64, ctypes.c_int, vp, ctypes.c_int,
                                                               ctypes.POINTER(sz), ctypes.POINTER(sz), i64]
        self.lib.cusolverDnXsyevBatched.argtypes = [vp, vp, ctypes.c_int, ctypes.c_int, i64, ctypes.c_int, vp, i64,
                                                    ctypes.c_int, vp, ctypes.c_int, vp, sz, vp, sz, vp, i64]
        a, w = cp.empty((k, k)), cp.empty(k)
        dev, host = sz(), sz()
        st = self.lib.cusolverDnXsyevBatched_bufferSize(self.handle, self.params, 1, 0, k, 1, a.data.ptr, k, 1,
                                                        w.data.ptr, 1, ctypes.byref(dev), ctypes.byref(host), 1)
        if st:
            raise RuntimeError(f"cusolverDnXsyevBatched_bufferSize: status {st}")
        self.work = cp.empty(max(dev.value, 8), dtype=np.uint8)
        self.host = np.empty(max(host.value, 8), dtype=np.uint8)
        self.host_bytes = host.value
        self.info = cp.empty(1, dtype=np.int32)

    def __call__(self, a, w):
        from cupy_backends.cuda.libs import cusolver
        cusolver.setStream(self.handle, cp.cuda.get_current_stream().ptr)
        st = self.lib.cusolverDnXsyevBatched(self.handle, self.params, 1, 0, self.k, 1, a.data.ptr, self.k, 1,
                                             w.data.ptr, 1, self.work.data.ptr, self.work.size,
                                             self.host.ctypes.data, self.host_bytes, self.info.data.ptr, 1)
        if st:
            raise RuntimeError(f"cusolverDnXsyevBatched: status {st}")


def syevj_batched(k, tol=None):
    """syevjBatched as cisolver calls it; with ``tol``, its own parameters with that tolerance."""
    from cupy_backends.cuda.libs import cusolver
    from cisolver import gpu_rayleigh_ritz
    info = cp.empty(1, dtype=np.int32)
    if tol is None:
        return lambda a, w: gpu_rayleigh_ritz._eigh_in_place(cp, a, w, info)
    params = cusolver.createSyevjInfo()
    cusolver.xsyevjSetTolerance(params, tol)
    handle = cp.cuda.device.get_cusolver_handle()
    a, w = cp.empty((k, k)), cp.empty(k)
    size = cusolver.dsyevjBatched_bufferSize(handle, 1, 0, k, a.data.ptr, k, w.data.ptr, params, 1)
    work = cp.empty(max(size, 1))

    def call(a, w):
        cusolver.setStream(handle, cp.cuda.get_current_stream().ptr)
        cusolver.dsyevjBatched(handle, 1, 0, k, a.data.ptr, k, w.data.ptr, work.data.ptr, size, info.data.ptr,
                               params, 1)
    return call


def real_matrices(path, record):
    """LOBPCG's own Rayleigh-Ritz matrices A (saved from CPU runs): syevj's time per tolerance, median
    over the matrices, with the worst eigenpair residual and eigenvalue error."""
    mats = np.load(path)
    k = mats.shape[1]
    for tol in (None, 1e-14, 1e-12, 1e-10):
        fn = syevj_batched(k, tol)
        rows = [gpu_time(fn, cp.asarray(m), reps=10) for m in mats]
        errs = [float(np.abs(r[3] - np.linalg.eigvalsh(m)).max() / np.abs(r[3]).max()) for r, m in zip(rows, mats)]
        entry = {"solver": "syevjBatched", "tolerance": tol, "matrices": len(mats),
                 "gpu_us_median": 1e6 * float(np.median([r[0] for r in rows])),
                 "gpu_us_max": 1e6 * float(max(r[0] for r in rows)),
                 "residual_max": max(r[2] for r in rows), "eigenvalue_error_max": max(errs)}
        record["real"].append(entry)
        print(f"real A ({len(mats)}), syevj tol {tol}: GPU median {entry['gpu_us_median']:.1f} us "
              f"(max {entry['gpu_us_max']:.1f}), residual <= {entry['residual_max']:.1e}, "
              f"eigenvalues <= {entry['eigenvalue_error_max']:.1e} relative")


def gpu_time(fn, a0, reps=50):
    a0 = cp.ascontiguousarray(a0)
    a, w = a0.copy(), cp.empty(a0.shape[0])
    fn(a, w)
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        a[...] = a0
        spin(2_000_000)                                 # ~1 ms of queue ahead: events see GPU time only
        start.record()
        fn(a, w)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(a, w)
    host = (time.perf_counter() - t0) / reps
    cp.cuda.Device().synchronize()
    a[...] = a0
    fn(a, w)
    vecs, lam, ah = a.get().T, w.get(), a0.get()    # column-major out: eigenvector i is row i of the C array
    err = np.abs(ah @ vecs - vecs * lam[None, :]).max() / np.abs(lam).max()
    return float(np.median(times)), host, float(err), lam


def add_arguments(ap):
    ap.add_argument("--k", type=positive_int, default=24)
    ap.add_argument("--json")
    ap.add_argument("--matrices", help=".npy stack of LOBPCG Rayleigh-Ritz matrices (k x k) to time syevj on")
    ap.add_argument("--capture", help="save LOBPCG's own k x k matrices from CPU runs to this .npy and stop")


def run(args):
    check_output_path(args.json, "--json")
    if args.capture:
        check_output_path(args.capture, "--capture")
        capture(args.capture, args.k)
        return 0
    if cp is None:
        raise ValueError("small-eigh needs CuPy (pip install 'hybridblas[cuda13]' or '[cuda12]'); "
                         "--capture runs without it")
    k, rng = args.k, np.random.default_rng(1)
    m = rng.standard_normal((k, k))
    dense = (m + m.T) / 2
    ritz = np.diag(np.concatenate([np.linspace(-80, -70, k // 3), rng.uniform(-60, 60, k - k // 3)]))
    ritz += 1e-4 * dense
    record = {"k": k, "device": device_name(), "runs": [], "real": []}
    if args.matrices:
        real_matrices(args.matrices, record)
    for name, make in (("syevjBatched", syevj_batched), ("XsyevBatched", XsyevBatched)):
        try:
            fn = make(k)
        except Exception as exc:               # an older cuSOLVER has no XsyevBatched: a result, not a crash
            record["runs"].append({"solver": name, "error": repr(exc)})
            print(f"{name}: {exc!r}")
            continue
        for label, a in (("dense", dense), ("lobpcg-like", ritz)):
            g, h, err, lam = gpu_time(fn, cp.asarray(a, order="F"))
            ref = np.linalg.eigvalsh(a)
            record["runs"].append({"solver": name, "matrix": label, "gpu_us": 1e6 * g, "host_us": 1e6 * h,
                                   "residual": err, "eigenvalue_error": float(np.abs(lam - ref).max())})
            print(f"{name:13s} {label:11s} GPU {1e6 * g:7.1f} us  host {1e6 * h:6.1f} us  residual {err:.1e}  "
                  f"eigenvalues off by {np.abs(lam - ref).max():.1e}")
    write_json(args.json, record)
    return 0
