"""GPU time (CUDA events) and host time per launch of the dense-step kernels at 48Cr's size, against
cupy (cuBLAS) on the same data: hybridblas's Gram products with its tall-skinny kernel
(devices/cuda_skinny.py) and without it (the cuBLAS inline path), and cisolver's block updates
(cisolver/blocks.py) with its row kernels (cisolver/row_kernels.py) and with cuBLAS. `cisolver dense-steps`
times whole calls, which can be bound by the host; this separates the two.

    python3 -m benchmarks.cisolver kernels [--rows 1963461] [--json out.json]
"""
import numpy as np

import hybridblas as hb
from cisolver import row_kernels
from cisolver.arrays import column_sumsq
from cisolver.blocks import (product_into_both, replace_with_product, subtract_product, times_upper,
                             update_with_residual)
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import write_json
from benchmarks.gputime import device_name, gpu_and_host_us


def _residual_kernel():
    """The residual HX - X theta as one CuPy elementwise kernel."""
    import cupy as cp
    return cp.ElementwiseKernel("T hx, T x, T theta", "T r", "r = hx - x * theta", "cisolver_residual_bench")


def _no_skinny(call):
    from hybridblas.devices import cuda_skinny
    keep = cuda_skinny.applies
    cuda_skinny.applies = lambda problem: False
    try:
        return call()
    finally:
        cuda_skinny.applies = keep


def _cublas(call):
    """The same call with cisolver's row kernels off (its cuBLAS route)."""
    def run():
        keep = row_kernels._fits
        row_kernels._fits = lambda *args, **kwargs: False
        try:
            return call()
        finally:
            row_kernels._fits = keep
    return run


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, default=1963461)
    ap.add_argument("--json")


def run(args):
    check_output_path(args.json, "--json")
    import cupy as cp
    _residual = _residual_kernel()
    n, b = args.rows, 8
    out = {}
    for dt in (np.float32, np.float64):
        rng = np.random.default_rng(0)
        s = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dt))
        hs = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dt))
        res = cp.empty((n, b), dtype=dt)
        s2, hs2 = cp.empty_like(s), cp.empty_like(hs)
        upper = lambda: times_upper(s[:, b:], u16)
        subtract = lambda: subtract_product(s[:, b:], s[:, :b], m8)
        replace = lambda: replace_with_product(s[:, b:], s, m24 * 0.2)
        cz = rng.standard_normal((3 * b, 2 * b)) / np.sqrt(3 * b)
        cz_dev = cp.asarray(cz, dtype=dt)
        theta = rng.standard_normal(b)
        theta_dev = cp.asarray(theta, dtype=dt)
        u16 = np.eye(2 * b) + np.triu(rng.standard_normal((2 * b, 2 * b))) * 1e-3
        m8, m24 = rng.standard_normal((b, 2 * b)) * 1e-3, rng.standard_normal((3 * b, 2 * b)) / np.sqrt(3 * b)
        ctx = hb.Context(devices=["cuda:0"])
        both = lambda: product_into_both(s2[:, :2 * b], s, hs2[:, :2 * b], hs, cz)                  # noqa: E731
        end = lambda: update_with_residual(s2[:, :2 * b], s, hs2[:, :2 * b], hs, cz, res, theta)    # noqa: E731
        nbytes = s.nbytes
        cases = {
            "S^T S hb.syrk (skinny)": lambda: hb.syrk(1.0, s, trans="T", context=ctx),
            "S^T S hb.syrk (cuBLAS inline path)": lambda: _no_skinny(lambda: hb.syrk(1.0, s, trans="T", context=ctx)),
            "S^T S cupy": lambda: s.T @ s,
            "S^T HS hb.gemmt (skinny)": lambda: hb.gemmt(1.0, s, hs, transa="T", context=ctx),
            "S^T HS hb.gemmt (cuBLAS inline path)": lambda: _no_skinny(lambda: hb.gemmt(1.0, s, hs, transa="T", context=ctx)),
            "S^T HS cupy": lambda: s.T @ hs,
            "S^T [P W] hb.gemm (skinny)": lambda: hb.gemm(1.0, s, s[:, b:], transa="T", context=ctx),
            "update S C, cupy matmul (no copy back)": lambda: s @ cz_dev,
            "residual, cupy subtract into r": lambda: cp.subtract(hs[:, :b], s[:, :b] * theta_dev[None, :], out=res),
            "residual, one elementwise kernel": lambda: _residual(hs[:, :b], s[:, :b], theta_dev[None, :], res),
            "column norms^2 of r, column_sumsq": lambda: column_sumsq(res),
            "column norms^2 of r, hb.syrk diagonal": lambda: cp.diagonal(hb.syrk(1.0, res, trans="T", context=ctx)).get(),
            "V <- V U, blocks.times_upper (row kernel)": upper,
            "V -= X M, blocks.subtract_product (cuBLAS)": subtract,
            "V <- S M in place, blocks.replace_with_product (row kernel)": replace,
            "V <- S M in place, blocks.replace_with_product (cuBLAS + copy)": _cublas(replace),
            "[X P], H[X P] <- S C, HS C, blocks.product_into_both (row kernel)": both,
            "[X P], H[X P] <- S C, HS C, blocks.product_into_both (cuBLAS)": _cublas(both),
            "end of iteration, blocks.update_with_residual (one kernel)": end,
            "end of iteration, cuBLAS product_into_both + residual kernel": _cublas(end),
            "copy n x 16 strided (a scratch back into S)": lambda: s[:, b:].__setitem__(Ellipsis, hs[:, b:]),
            "copy S (read + write, bandwidth reference)": lambda: s.copy(),
        }
        name = np.dtype(dt).name
        out[name] = {}
        print(f"== n = {n}, {name}, S = {nbytes / 1e6:.0f} MB, {device_name()}")
        for label, fn in cases.items():
            r = gpu_and_host_us(fn)
            out[name][label] = r
            print(f"  {label:44s} host {r['host_us']:7.1f} us   pipelined {r['pipelined_us']:7.1f} us   "
                  f"alone {r['alone_us']:7.1f} us", flush=True)
    write_json(args.json, out)
