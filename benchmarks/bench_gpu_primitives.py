"""What each primitive of a LOBPCG iteration's dense steps costs on a GPU: the host side (launch, Python)
and the GPU side, at 24Mg's size (float64, n = 28503) and 48Cr's (float32, n = 1963461), block 8.

Each primitive is timed two ways: ``queued`` (many calls, one wait at the end: the host cost when the GPU
keeps up) and ``waited`` (a wait after each call: host cost plus GPU time plus one round trip). It also
checks whether a small host-to-device copy waits for the queue (it does when CuPy stages pageable memory
synchronously), which decides how many hidden round trips an iteration has.

    PYTHONPATH=. python3 benchmarks/bench_gpu_primitives.py [--json out.json]
"""
import argparse
import json
import time

import cupy as cp
import numpy as np
import scipy.linalg as sla

import hybridblas as hb


def timed(fn, reps, wait_each):
    stream = cp.cuda.get_current_stream()
    fn()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
        if wait_each:
            stream.synchronize()
    stream.synchronize()
    return (time.perf_counter() - t0) / reps


def case(n, dtype, b=8, reps=100):
    rng = np.random.default_rng(0)
    s = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dtype))
    hs = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dtype))
    x, w = cp.ascontiguousarray(s[:, :b]), cp.ascontiguousarray(s[:, b:2 * b])
    xp2 = cp.ascontiguousarray(s[:, :2 * b])
    theta = cp.asarray(rng.standard_normal(b).astype(dtype))
    small = rng.standard_normal((3 * b, 3 * b))
    small_spd = small @ small.T + 3 * b * np.eye(3 * b)
    small_dev = cp.asarray(small.astype(dtype))
    c = cp.asarray(rng.standard_normal((3 * b, b)).astype(dtype))
    ctx = hb.Context(devices=["cuda:0"])
    f_s = cp.asfortranarray(s)
    out = {}
    prims = {
        "sync (idle)": lambda: None,
        "get 24x24": lambda: small_dev.get(),
        "asarray 24x24 (host to device)": lambda: cp.asarray(small, dtype=dtype),
        "cupy x.T @ w (n x 8)": lambda: x.T @ w,
        "cupy [X P].T @ w (n x 16, n x 8)": lambda: xp2.T @ w,
        "cupy s @ c (n x 24 @ 24 x 8)": lambda: s @ c,
        "cupy F-order s @ c": lambda: f_s @ c,
        "hb.syrk s (n x 24)": lambda: hb.syrk(1.0, s, trans="T", context=ctx),
        "hb.gemmt s, hs": lambda: hb.gemmt(1.0, s, hs, transa="T", context=ctx),
        "hb.syrk w (n x 8)": lambda: hb.syrk(1.0, w, trans="T", context=ctx),
        "residual hx - x*theta": lambda: w - x * theta[None, :],
        "concatenate 3 blocks": lambda: cp.concatenate([x, w, x], axis=1),
        "w[...] = w @ a - x @ b": lambda: w.__setitem__(Ellipsis, w @ small_dev[:b, :b] - x @ small_dev[:b, :b]),
        "cupy cholesky 24x24": lambda: cp.linalg.cholesky(small_dev.astype(np.float64) @ small_dev.T.astype(np.float64) + 30 * cp.eye(3 * b)),
        "cupy eigh 24x24": lambda: cp.linalg.eigh(small_dev.astype(np.float64) + small_dev.T.astype(np.float64)),
    }
    for name, fn in prims.items():
        out[name] = {"queued_us": timed(fn, reps, False) * 1e6, "waited_us": timed(fn, reps, True) * 1e6}
    host = {
        "scipy cholesky 24x24": lambda: sla.cholesky(small_spd, lower=False),
        "scipy solve_triangular 24x24": lambda: sla.solve_triangular(np.triu(small_spd), np.eye(3 * b)),
        "numpy eigh 24x24": lambda: np.linalg.eigh(small_spd),
    }
    for name, fn in host.items():
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out[name] = {"host_us": (time.perf_counter() - t0) / reps * 1e6}
    # does a small upload wait for queued GPU work? queue ~20 big products, then time one upload
    big = cp.asarray(rng.standard_normal((4096, 4096)).astype(np.float32))
    stream = cp.cuda.get_current_stream()
    for label, upload in (("asarray", lambda: cp.asarray(small, dtype=dtype)),
                          ("pinned set", None)):
        if upload is None:
            pinned = cp.cuda.alloc_pinned_memory(small.astype(dtype).nbytes)
            src = np.frombuffer(pinned, dtype, small.size).reshape(small.shape)
            src[...] = small
            dst = cp.empty(small.shape, dtype)
            upload = lambda: dst.set(src, stream)  # noqa: E731
        stream.synchronize()
        t_q = time.perf_counter()
        for _ in range(20):
            big @ big
        queued = time.perf_counter() - t_q
        t0 = time.perf_counter()
        upload()
        took = time.perf_counter() - t0
        stream.synchronize()
        total = time.perf_counter() - t_q
        out[f"upload behind queued work ({label})"] = {"upload_us": took * 1e6, "queue_us": total * 1e6,
                                                        "launch_us": queued * 1e6}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    for label, n, dtype in (("24Mg f64", 28503, np.float64), ("48Cr f32", 1963461, np.float32)):
        res = case(n, dtype)
        result[label] = res
        print(f"== {label} (n = {n}), {result['device']}")
        for name, v in res.items():
            print(f"  {name:40s} " + "  ".join(f"{k} {val:9.1f}" for k, val in v.items()), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
