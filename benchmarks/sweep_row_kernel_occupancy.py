"""The row kernels (cisolver.row_kernels) at several register caps: __launch_bounds__(256, MIN_BLOCKS) for
MIN_BLOCKS in --min-blocks. GPU time (queued behind a spin, bench_queued_steps.timed) of the end of iteration
and of the orthonormalisation's in-place S <- S m, on LOBPCG-shaped blocks.

    PYTHONPATH=. python3 benchmarks/sweep_row_kernel_occupancy.py --sizes 241944:float64 1963461:float32
"""
import argparse

import cupy as cp
import numpy as np

from bench_queued_steps import state, timed
from cisolver import blocks, row_kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["241944:float64", "483887:float64", "1963461:float32"])
    ap.add_argument("--min-blocks", default="2,3,4")
    ap.add_argument("--block", type=int, default=8)
    args = ap.parse_args()
    b = args.block
    for size in args.sizes:
        n, dt = int(size.split(":")[0]), np.dtype(size.split(":")[1])
        s, hs, r = state(n, b, dt)
        s_next, hs_next = cp.empty_like(s), cp.empty_like(hs)
        m = cp.asarray(np.vstack([np.zeros((b, 2 * b)), np.eye(2 * b)]), dtype=dt)
        theta = cp.zeros(b)
        for blocks_per_sm in (int(x) for x in args.min_blocks.split(",")):
            row_kernels.MIN_BLOCKS = blocks_per_sm
            limit, row_kernels.DOUBLE_ROWS_LIMIT = row_kernels.DOUBLE_ROWS_LIMIT, 1 << 62   # the row kernel always
            update = timed(lambda: blocks.update_with_residual(s_next[:, :2 * b], s, hs_next[:, :2 * b], hs, m, r,
                                                               theta, later=True), 30)[1]
            product = timed(lambda: blocks.replace_with_product(s[:, b:], s, m), 30)[1]
            row_kernels.DOUBLE_ROWS_LIMIT = limit
            print(f"n = {n} {dt}, MIN_BLOCKS {blocks_per_sm}: end of iteration {update:.1f} us, S <- S m {product:.1f} us",
                  flush=True)
    row_kernels.MIN_BLOCKS = 2


if __name__ == "__main__":
    main()
