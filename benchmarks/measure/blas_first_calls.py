"""The first calls on host operands over two GPUs after their page-locking, from fresh rates: each call measures
transfer and kernel rates for the next, and a layout that no longer serves them is made again (milliseconds of
Python). With band_plan.REBUILD_AHEAD on, the kept layout serves the call while a worker thread makes the new one;
off, the call makes it before it starts. Each pass starts from an empty layout cache and no calibration (as a
fresh process), makes a call on small copies, two calls that page-lock the operands, then ``--calls`` timed calls
back to back.

    python3 -m benchmarks.blas first-calls --sizes 8192 --routines zgemmt zherk --calls 12 --ahead on off on off \\
        --json out.json

Reported per pass: each call's wall time and the layouts made while it ran (in the call or by the worker); the
median and the worst of the timed calls after the first (the first copies freshly locked memory by DMA).
"""
import statistics

from hybridblas import band_plan, host_pinning
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_bands

from benchmarks.common import gpu_sync, two_gpu_run, write_json
from benchmarks.measure.blas_gpu import ROUTINES, call_hybrid, host_cases, sample_error, small_copies, timed


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=["zgemmt", "zherk"])
    ap.add_argument("--calls", type=positive_int, default=12, help="timed calls of each pass")
    ap.add_argument("--ahead", nargs="+", choices=["on", "off"], default=["on", "off", "on", "off"],
                    help="band_plan.REBUILD_AHEAD of each pass, in order")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def _kept():
    return {id(lay) for entries in list(band_plan._cache.values()) for _, lay in entries}


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    import numpy as np
    cp, ctx, gpus, doc = two_gpu_run("first-calls", "bench_blas_first_calls")
    rng = np.random.default_rng(7)
    default = band_plan.REBUILD_AHEAD

    sync = gpu_sync(cp, gpus)
    try:
        for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
            print(f"== {routine} n = k = {n}", flush=True)
            small = small_copies(host_args)
            for ahead in args.ahead:
                band_plan.wait_rebuilds()
                band_plan.REBUILD_AHEAD = ahead == "on"
                band_plan._cache.clear()
                cuda_bands._calibration.clear()
                call_hybrid(routine, small, kw, None, ctx)
                host_pinning.clear()
                for _ in range(2):
                    call_hybrid(routine, host_args, kw, c, ctx)
                host_pinning.wait_ready()
                seconds, made = [], []
                for _ in range(args.calls):
                    before = _kept()
                    seconds += timed(lambda: call_hybrid(routine, host_args, kw, c, ctx), sync, 1)
                    made.append(len(_kept() - before))
                later = seconds[1:] or seconds
                row = dict(routine=routine, n=n, ahead=ahead, seconds=seconds, layouts_made=made,
                           median_s=statistics.median(later), worst_s=max(later),
                           rel_error=sample_error(routine, host_args, c, rng))
                doc["results"].append(row)
                print(f"  ahead {ahead:3s}  median {row['median_s'] * 1e3:7.2f} ms  worst "
                      f"{row['worst_s'] * 1e3:7.2f} ms  calls (ms) " + " ".join(f"{x * 1e3:.1f}" for x in seconds)
                      + "  layouts made " + "".join(str(m) for m in made), flush=True)
                write_json(args.json, doc)
    finally:
        band_plan.wait_rebuilds()
        band_plan.REBUILD_AHEAD = default
    write_json(args.json, doc)
    return 0
