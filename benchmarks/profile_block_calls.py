"""Host time of each small step of a LOBPCG iteration on a GPU, one by one (the GPU idle in between), and
cProfile of the costliest: where the dense steps' ~1.5 ms per iteration goes on small cases (24Mg).

    PYTHONPATH=. python3 benchmarks/profile_block_calls.py [--rows 28503] [--dtype float64] [--calls 300]
"""
import argparse
import cProfile
import io
import pstats
import time

import cupy as cp
import numpy as np

import hybridblas as hb
from cisolver import blocks, cuda_modules, dense, row_kernels


def per_call(fn, calls):
    """Median host seconds of fn() over ``calls`` calls, the stream drained before each."""
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cp.cuda.Device().synchronize()
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=28503)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=18)
    args = ap.parse_args()
    dtype, n, b = np.dtype(args.dtype), args.rows, 8
    rng = np.random.default_rng(0)
    s = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dtype))
    hs = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dtype))
    s2, hs2 = cp.empty_like(s), cp.empty_like(hs)
    r = cp.empty((n, b), dtype=dtype)
    m = rng.standard_normal((3 * b, 2 * b))
    small = rng.standard_normal((3 * b, 2 * b))
    m_dev = cp.asarray(small)
    c, u = rng.standard_normal((b, 2 * b)), np.triu(rng.standard_normal((2 * b, 2 * b))) + 4 * np.eye(2 * b)
    theta = rng.standard_normal(b)
    ctx = hb.Context(devices=["cuda:0"])
    kernel = cuda_modules.function(cp, dtype, "rows_times_small_16")
    both = cp.zeros((3 * b, 3 * b, 2), dtype=dtype, order="F")
    steps = {
        "cupy.asarray(24x16 host)": lambda: cp.asarray(small),
        "cupy Event() + record": lambda: cp.cuda.Event().record(),
        "cuda_modules.function": lambda: cuda_modules.function(cp, dtype, "rows_times_small_16"),
        "raw kernel launch": lambda: kernel((64,), (128,), (s, np.int64(3 * b), s2, np.int64(3 * b), m_dev,
                                                             np.int32(3 * b), np.int32(2 * b), np.int64(n),
                                                             np.int32(0), np.int32(0)),
                                            shared_mem=3 * b * 16 * dtype.itemsize),
        "copy w into s[:, 16:24]": lambda: s2.__setitem__((slice(None), slice(2 * b, 3 * b)), r),
        "row_kernels.product": lambda: row_kernels.product(s2[:, :2 * b], s, m),
        "blocks.tail_update": lambda: blocks.tail_update(s2[:, :3 * b], b, c, u),
        "update_with_residual": lambda: blocks.update_with_residual(s2[:, :2 * b], s, hs2[:, :2 * b], hs, m, r,
                                                                    theta),
        "hb.gemm S^T V (+ zeros C)": lambda: hb.gemm(1.0, s, s[:, b:], transa="T", context=ctx),
        "hb.gemmt into c": lambda: hb.gemmt(1.0, s, hs, transa="T", c=both[:, :, 0], context=ctx),
        "hb.syrk into c": lambda: hb.syrk(1.0, s, trans="T", c=both[:, :, 1], context=ctx),
        "get 24x24x2": lambda: both.get(),
        "dense.cross": lambda: dense.cross(s, s[:, b:], context=ctx),
        "dense.rayleigh_ritz": lambda: dense.rayleigh_ritz(s, hs, b, context=ctx),
    }
    for name, fn in steps.items():
        print(f"  {name:28s} {per_call(fn, args.calls) * 1e6:8.1f} us", flush=True)
    for name in ("blocks.tail_update", "hb.gemm S^T V (+ zeros C)", "update_with_residual"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            steps[name]()
        prof.disable()
        cp.cuda.Device().synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
        print(f"--- {name}\n" + "\n".join(text.getvalue().splitlines()[4:4 + args.top + 4]))


if __name__ == "__main__":
    main()
