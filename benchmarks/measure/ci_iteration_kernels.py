"""Every kernel of one queued LOBPCG iteration's dense steps (as cisolver.iterations queues them), for Nsight
Compute: run under ncu, the profiled range is one iteration after two warm-up iterations. Per kernel ncu
reports its GPU time, DRAM throughput and SM throughput: whether it is bound by memory, by its instructions
or by neither (latency), which the event times of `cisolver queued-steps` cannot tell.

    ncu --profile-from-start off --csv --metrics gpu__time_duration.sum,dram__bytes.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
launch__grid_size,launch__registers_per_thread \
        python3 -m benchmarks.cisolver iteration-kernels --rows 241944 > kernels.csv
"""
import numpy as np

import hybridblas as hb
from cisolver import blocks, dense, gpu_ortho, gpu_rayleigh_ritz
from hybridblas.console import positive_int

from benchmarks.measure.ci_queued_steps import state


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, default=241944)
    ap.add_argument("--block", type=positive_int, default=8)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])


def run(args):
    import cupy as cp
    n, b, dt = args.rows, args.block, np.dtype(args.dtype)
    s, hs, r = state(n, b, dt)
    s_next, hs_next = cp.empty_like(s), cp.empty_like(hs)
    ctx = hb.Context(devices=["cuda:0"])

    def iteration():
        s[:, 2 * b:] = r                                   # W into S
        gpu_ortho.first_pass(s, hs, b, b, context=ctx)
        both = hb.lowlevel.grams(s, hs) if hb.lowlevel.grams_preferred(s, hs) else dense.gram_buffer(s, hs, context=ctx)
        queued = gpu_rayleigh_ritz.queue(both, b, dt)
        blocks.update_with_residual(s_next[:, :2 * b], s, hs_next[:, :2 * b], hs, queued.m, r, queued.theta,
                                    later=True)
    for _ in range(2):
        iteration()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    iteration()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    print(f"profiled one iteration's dense steps: n = {n}, b = {b}, {dt}")
    return 0
