"""Fixed cost of a small hybridblas call on a GPU, against the same product through CuPy (cuBLAS).

LOBPCG's dense steps are tall-skinny Gram products (n x 24, n ~ 3e4..2e6): microseconds of GPU work each.
On a 4xH200 node a float32 24Mg solve spent ~20 ms per iteration more with its Gram products through
hybridblas than through cupy matmul (benchmarks/results/h200x4-2026-11-22/float32-diagnosis.txt). This
times one product both ways and profiles the hybridblas call, so the fixed costs can be named.

    python3 -m benchmarks.blas small-calls --rows 28503 --cols 24 --dtype float64
"""
import cProfile
import io
import pstats

import numpy as np

import hybridblas as hb
from hybridblas.console import positive_int

from benchmarks.gputime import per_call


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, default=28503)
    ap.add_argument("--cols", type=positive_int, default=24)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--reps", type=positive_int, default=200)


def run(args):
    import cupy as cp
    x = cp.asarray(np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(args.dtype))
    y = cp.asarray(np.random.default_rng(1).standard_normal((args.rows, args.cols)).astype(args.dtype))
    ctx = hb.Context(devices=["cuda:0"])
    cases = {
        "cupy x.T @ x": lambda: x.T @ x,
        "hybridblas syrk (x^T x)": lambda: hb.syrk(1.0, x, trans="T", context=ctx),
        "cupy x.T @ y": lambda: x.T @ y,
        "hybridblas gemmt (x^T y)": lambda: hb.gemmt(1.0, x, y, transa="T", context=ctx),
        "hybridblas syrk, default context": lambda: hb.syrk(1.0, x, trans="T"),
    }
    for name, fn in cases.items():
        print(f"{name:34s} {per_call(fn, args.reps) * 1e6:9.1f} us per call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.reps):
        hb.syrk(1.0, x, trans="T", context=ctx)
    cp.cuda.Device().synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
    print(out.getvalue())
