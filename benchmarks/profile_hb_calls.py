"""Host time of one small hybridblas call on a GPU, function by function (cProfile, cumulative time).

LOBPCG's Gram products are C of 24 x 24 from tall blocks (k up to 1.96e6): microseconds of GPU work, so
the library's front end (validation, planning, dispatch) sets their cost. This times ``--calls`` calls of
syrk, gemmt and gemm on device-resident row-major blocks (column ranges, as LOBPCG passes them) and
prints where the host time goes.

    PYTHONPATH=. python3 benchmarks/profile_hb_calls.py [--rows 1963461] [--dtype float32] [--calls 500]
"""
import argparse
import cProfile
import io
import pstats
import time

import cupy as cp

import hybridblas as hb


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1963461)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    buf = cp.random.standard_normal((args.rows, 24)).astype(args.dtype)
    hbuf = cp.random.standard_normal((args.rows, 24)).astype(args.dtype)
    calls = {"syrk S^T S": lambda: hb.syrk(1.0, buf, trans="T"),
             "gemmt S^T HS": lambda: hb.gemmt(1.0, buf, hbuf, transa="T"),
             "gemm S^T V": lambda: hb.gemm(1.0, buf, buf[:, 8:], transa="T")}
    for name, call in calls.items():
        call()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        host = (time.perf_counter() - t0) / args.calls
        cp.cuda.Device().synchronize()
        both = (time.perf_counter() - t0) / args.calls
        print(f"{name:14s} host {host * 1e6:7.1f} us per call, with the GPU {both * 1e6:7.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        calls["gemmt S^T HS"]()
    prof.disable()
    cp.cuda.Device().synchronize()
    for key in ("tottime", "cumtime"):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(args.top)
        print(text.getvalue())


if __name__ == "__main__":
    main()
