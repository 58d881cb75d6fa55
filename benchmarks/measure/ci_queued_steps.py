"""The GPU time of each dense step of a queued LOBPCG iteration (cisolver.iterations' overlap path), apart
from the host's: where the dense steps of 47V (484 k rows, float64) and 48Cr (1.96 M, float32) go.

Each step is timed twice, ``--reps`` calls in a row:
- paced: as the host issues them (events around the calls; GPU idle while the host is slow counts);
- GPU only: the same calls queued behind a spin kernel that holds the stream until the host has issued all
  of them, so the events see the GPU's own time (kernels and the gaps between them on the device).
The host's issue time per call is printed beside them. A step that waits for the GPU inside cannot be
queued behind the spin: it is marked "waits".

    python3 -m benchmarks.cisolver queued-steps --rows 484000 --dtype float64 [--reps 40] [--json F]
"""
import time

import numpy as np

import hybridblas as hb
from cisolver import blocks, dense, gpu_ortho, gpu_rayleigh_ritz, row_kernels
from cisolver.arrays import Later
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_grams

from benchmarks.common import write_json
from benchmarks.gputime import device_name, spin_seconds as queue_spin


def timed(fn, reps, spin_seconds=0.25):
    """(paced GPU us, GPU-only us, host us) per call of fn(); GPU-only is None when fn waited for the GPU."""
    import cupy as cp
    fn()
    cp.cuda.Device().synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    paced = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / reps
    queue_spin(spin_seconds)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = time.perf_counter() - t0
    e1.record()
    spin_left = not e0.done
    e1.synchronize()
    gpu = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / reps if spin_left else None
    return paced, gpu, host * 1e6 / reps


def with_settings(fn, *settings):
    """fn run with module attributes set, (module, name, value) each, and put back after: the same step with
    another kernel or tile size, timed beside the default."""
    def call():
        before = [(module, name, getattr(module, name)) for module, name, _ in settings]
        for module, name, value in settings:
            setattr(module, name, value)
        try:
            return fn()
        finally:
            for module, name, value in before:
                setattr(module, name, value)
    return call


def state(n, b, dtype, seed=0):
    """LOBPCG's buffers as an iteration finds them: X orthonormal, P orthogonal to X, W random."""
    import cupy as cp
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, 2 * b)))
    s = np.empty((n, 3 * b))
    s[:, :2 * b] = q
    s[:, 2 * b:] = rng.standard_normal((n, b))
    s = cp.asarray(s.astype(dtype))
    hs = cp.asarray((rng.standard_normal((n, 3 * b)) + 0.1 * cp.asnumpy(s)).astype(dtype))
    r = cp.asarray(rng.standard_normal((n, b)).astype(dtype))
    return s, hs, r


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, default=484000)
    ap.add_argument("--block", type=positive_int, default=8)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--reps", type=positive_int, default=40)
    ap.add_argument("--json", default=None)


def run(args):
    check_output_path(args.json, "--json")
    import cupy as cp
    n, b, dt = args.rows, args.block, np.dtype(args.dtype)
    k = 3 * b
    s, hs, r = state(n, b, dt)
    s_next, hs_next = cp.empty_like(s), cp.empty_like(hs)
    ctx = hb.Context(devices=["cuda:0"])
    y = hb.lowlevel.grams(s)[:, b:, 1]
    m = cp.asarray(np.vstack([np.zeros((b, 2 * b)), np.eye(2 * b)]), dtype=dt)
    m_hp = cp.asarray(np.vstack([np.zeros((b, b)), np.eye(b)]), dtype=dt)
    both = dense.gram_buffer(s, hs, context=ctx)
    grams64 = hb.lowlevel.grams(s, hs)
    rr = gpu_rayleigh_ritz.queue(grams64, b, dt)
    a = cp.asarray(np.diag(np.arange(1.0, k + 1))[None])
    flag = cp.zeros(1, dtype=np.int32)
    sym = np.random.default_rng(1).standard_normal((k, k))
    dense_a = cp.asarray((sym + sym.T)[None])
    w_copy = lambda: s[:, 2 * b:].__setitem__(Ellipsis, r)
    steps = {
        "W copy into S": w_copy,
        "ortho: hb.gemm [X^T V; V^T V]": lambda: hb.gemm(1.0, s, s[:, b:], transa="T", context=ctx),
        "ortho: lowlevel.grams S^T S (one pass)": lambda: hb.lowlevel.grams(s),
        "ortho: factor kernel": lambda: gpu_ortho._kernel(cp, dt)((1,), (gpu_ortho.THREADS,), (
            y, np.int64(y.strides[0] // y.itemsize), np.int64(y.strides[1] // y.itemsize), np.int32(b),
            np.int32(2 * b), np.int32(b), np.float64(1e-16), np.float64(dense.CANCELLATION),
            np.float64(dense.SINGLE_PASS_LOSS), np.float64(1e-10), cp.empty((k, 2 * b), dt), cp.empty((2 * b, b), dt),
            flag)),
        "ortho: S[:, b:] <- S m": lambda: blocks.replace_with_product(s[:, b:], s, m),
        "ortho: HP <- H[X P] m_hp": lambda: blocks.replace_with_product(hs[:, b:2 * b], hs[:, :2 * b], m_hp),
        "ortho: flag Later": lambda: Later(flag),
        "ortho: whole first_pass": lambda: gpu_ortho.first_pass(s, hs, b, b, context=ctx),
        "grams: zeros": lambda: cp.zeros((k, k, 2), dtype=dt, order="F"),
        "grams: hb.gemmt S^T HS": lambda: hb.gemmt(1.0, s, hs, transa="T", c=both[:, :, 0], context=ctx),
        "grams: hb.syrk S^T S": lambda: hb.syrk(1.0, s, trans="T", c=both[:, :, 1], context=ctx),
        "grams: whole gram_buffer": lambda: dense.gram_buffer(s, hs, context=ctx),
        "grams: cupy S^T [S HS] (one cuBLAS gemm each)": lambda: (s.T @ s, s.T @ hs),
        "grams: lowlevel.grams S^T HS and S^T S (one pass)": lambda: hb.lowlevel.grams(s, hs),
        "rr: cupy.linalg.eigh (1, k, k) syevjBatched": lambda: cp.linalg.eigh(a),
        "rr: cupy.linalg.eigh (1, k, k), a dense A": lambda: cp.linalg.eigh(dense_a),
        "rr: cupy.linalg.eigh (k, k) syevd, a dense A": lambda: cp.linalg.eigh(dense_a[0]),
        "rr: whole queue (prepare, syevj, finish)": lambda: gpu_rayleigh_ritz.queue(grams64, b, dt),
        "update: update_with_residual": lambda: blocks.update_with_residual(
            s_next[:, :2 * b], s, hs_next[:, :2 * b], hs, rr.m, r, rr.theta, later=True),
    }
    def row_kernel_limit(fn):             # a row kernel also beyond DOUBLE_ROWS_LIMIT float64 rows
        return with_settings(fn, (row_kernels, "DOUBLE_ROWS_LIMIT", 1 << 62))
    if dt == np.float64 and n > row_kernels.DOUBLE_ROWS_LIMIT:
        steps["update: update_with_residual (row kernel)"] = row_kernel_limit(steps["update: update_with_residual"])

    steps["ortho: S[:, b:] <- S m (thread per row)"] = lambda: row_kernels.product(s[:, b:], s, m, staged=False)
    steps["ortho: HP <- H[X P] m_hp (thread per row)"] = lambda: row_kernels.product(
        hs[:, b:2 * b], hs[:, :2 * b], m_hp, staged=False)
    steps["update: update_with_residual (thread per row)"] = row_kernel_limit(lambda: row_kernels.update_with_residual(
        s_next[:, :2 * b], s, hs_next[:, :2 * b], hs, rr.m, r, rr.theta, later=True, staged=False))
    for name in ("ortho: S[:, b:] <- S m", "update: update_with_residual"):
        for rows in (16, 48):
            steps[name + f" (staged, {rows} rows a tile)"] = with_settings(steps[name],
                                                                           (row_kernels, "STAGE_ROWS", rows))
    for threads in (64, 128):         # the one-block kernels: fewer warps at each barrier
        steps[f"ortho: factor kernel ({threads} threads)"] = with_settings(steps["ortho: factor kernel"],
                                                                          (gpu_ortho, "THREADS", threads))
        steps[f"rr: whole queue ({threads} threads)"] = with_settings(
            steps["rr: whole queue (prepare, syevj, finish)"], (gpu_rayleigh_ritz, "THREADS", threads))
    for name in ("ortho: lowlevel.grams S^T S (one pass)", "grams: lowlevel.grams S^T HS and S^T S (one pass)"):
        for per_sm in (3, 4):
            steps[name + f" (staged, {per_sm} blocks/SM)"] = with_settings(
                steps[name], (cuda_grams, "STAGED_BLOCKS_PER_SM", per_sm))
    steps["ortho: lowlevel.grams S^T S (register prefetch)"] = lambda: hb.lowlevel.grams(s, staged=False)
    steps["grams: lowlevel.grams S^T HS and S^T S (register prefetch)"] = lambda: hb.lowlevel.grams(s, hs, staged=False)

    def iteration():                  # as cisolver.iterations queues them
        w_copy()
        gpu_ortho.first_pass(s, hs, b, b, context=ctx)
        both = hb.lowlevel.grams(s, hs) if hb.lowlevel.grams_preferred(s, hs) else dense.gram_buffer(s, hs, context=ctx)
        queued = gpu_rayleigh_ritz.queue(both, b, dt)
        blocks.update_with_residual(s_next[:, :2 * b], s, hs_next[:, :2 * b], hs, queued.m, r, queued.theta,
                                    later=True)
    steps["iteration's dense steps, queued"] = iteration
    dev = device_name()
    print(f"n = {n}, b = {b}, {dt}, {dev}; us per call: paced (as issued), GPU only (queued behind a spin), host")
    out = {"rows": n, "block": b, "dtype": str(dt), "device": dev, "us": {}}
    for name, fn in steps.items():
        paced, gpu, host = timed(fn, args.reps)
        out["us"][name] = {"paced": paced, "gpu": gpu, "host": host}
        gpu_text = f"{gpu:9.1f}" if gpu is not None else "    waits"
        print(f"  {name:52s} {paced:9.1f} {gpu_text} {host:9.1f}", flush=True)
    write_json(args.json, out)
