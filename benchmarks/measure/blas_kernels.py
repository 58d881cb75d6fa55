"""The float32 tall-skinny Gram kernel (hybridblas/devices/cuda_skinny.py) at several launch sizes
(thread blocks per multiprocessor), against cupy (cuBLAS) on the same data: GPU time from CUDA events, and
the error against a float64 product. Shapes are LOBPCG's at 48Cr's size: S^T S, S^T HS, S^T [P W], and
[S HS]^T S from one n x 6b buffer (both Rayleigh-Ritz Gram matrices in one call).

    python3 -m benchmarks.blas kernels [--rows 1963461 28503] [--json out.json]
"""
import numpy as np

import hybridblas as hb
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_skinny

from benchmarks.common import write_json
from benchmarks.gputime import device_name, gpu_and_host_us


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, nargs="+", default=[1963461, 28503])
    ap.add_argument("--blocks-per-sm", type=positive_int, nargs="+", default=[2, 4])
    ap.add_argument("--json")


def run(args):
    check_output_path(args.json, "--json")
    import cupy as cp
    b = 8
    keep = cuda_skinny.BLOCKS_PER_SM
    ctx = hb.Context(devices=["cuda:0"])
    out = {}
    for n in args.rows:
        rng = np.random.default_rng(0)
        buf = cp.asarray(rng.standard_normal((n, 6 * b)).astype(np.float32))
        s, hs = buf[:, :3 * b], buf[:, 3 * b:]
        wide = buf.astype(np.float64)
        cases = {
            "S^T S (syrk)": (lambda: hb.syrk(1.0, s, trans="T", context=ctx), lambda: s.T @ s,
                             lambda: wide[:, :3 * b].T @ wide[:, :3 * b]),
            "S^T HS (gemmt)": (lambda: hb.gemmt(1.0, s, hs, transa="T", context=ctx), lambda: s.T @ hs,
                               lambda: wide[:, :3 * b].T @ wide[:, 3 * b:]),
            "S^T [P W] (gemm)": (lambda: hb.gemm(1.0, s, s[:, b:], transa="T", context=ctx), lambda: s.T @ s[:, b:],
                                 lambda: wide[:, :3 * b].T @ wide[:, b:3 * b]),
            "[S HS]^T S (gemm, 48 x 24)": (lambda: hb.gemm(1.0, buf, s, transa="T", context=ctx), lambda: buf.T @ s,
                                           lambda: wide.T @ wide[:, :3 * b]),
        }
        print(f"== n = {n}, float32, {device_name()}", flush=True)
        out[n] = {}
        for label, (ours, peer, exact) in cases.items():
            ref = exact().get()
            scale = np.abs(ref).max()
            row = {"cupy": gpu_and_host_us(peer)}
            row["cupy"]["error"] = float(np.abs(peer().get() - ref).max() / scale)
            for per_sm in args.blocks_per_sm:
                cuda_skinny.BLOCKS_PER_SM = per_sm
                r = gpu_and_host_us(ours)
                got = ours().get()
                mask = np.tril(np.ones_like(ref, dtype=bool)) if "syrk" in label or "gemmt" in label else True
                r["error"] = float(np.abs(np.where(mask, got - ref, 0)).max() / scale)
                row[f"ours x{per_sm}"] = r
            out[n][label] = row
            print(f"  {label}", flush=True)
            for key, r in row.items():
                print(f"    {key:10s} alone {r['alone_us']:7.1f} us  pipelined {r['pipelined_us']:7.1f} us  "
                      f"host {r['host_us']:6.1f} us  error {r['error']:.1e}", flush=True)
        cuda_skinny.BLOCKS_PER_SM = keep
        buf = s = hs = wide = cases = None      # free the GPU memory before the next size
        cp.get_default_memory_pool().free_all_blocks()
    write_json(args.json, out)
