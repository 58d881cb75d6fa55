"""The host time of laying out a band call (hybridblas.band_plan.layout_for, both orders and their models) for
host operands on two GPUs, from an empty layout cache: what a call pays when its shapes are new or the GPUs'
measured rates have moved past what the cached layout serves. No GPU is used: the layout is arithmetic on the
shapes, here those of benchmarks.blas gpu's host cases (complex128, n = k, F-order operands), at rates near two
H100s' (GPU speeds in TF/s, link rates in GB/s).

    python3 -m benchmarks.blas layout-build --sizes 8192 16384 --routines zgemmt zherk zher2k --repeats 30
"""
import datetime
import platform
import statistics
import time

import numpy as np

from hybridblas import band_plan
from hybridblas import problem as P
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import command_line, write_json
from benchmarks.measure.blas_gpu import ROUTINES


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192, 16384], help="n = k of each case")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=list(ROUTINES))
    ap.add_argument("--repeats", type=positive_int, default=30, help="layouts made per case (best and median)")
    ap.add_argument("--speeds", nargs=2, type=float, default=[50.0, 53.0], metavar=("GPU0", "GPU1"),
                    help="the GPUs' flop rates, TF/s")
    ap.add_argument("--links", nargs=2, type=float, default=[30.0, 45.0], metavar=("D2H", "H2D"),
                    help="write-back and upload rates, GB/s")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def problem(routine, n):
    """The routine's band problem on uninitialised n x n host operands (as blas gpu's host cases call it)."""
    a, b = (np.empty((n, n), np.complex128, order="F") for _ in range(2))
    if routine == "zherk":
        return P.build_problem("herk", 1.0, [a], 0.0, None, [P.N], True, None)
    if routine == "zher2k":
        return P.build_problem("her2k", 1.0 + 0.5j, [a, b], 0.0, None, [P.N, P.N], True, None)
    return P.build_problem("gemmt", 1.0, [a, b], 0.0, None, [P.C, P.N], True, None)


def time_layouts(prob, speeds, d2h, h2d, repeats, sms=132):
    """Seconds of each of ``repeats`` layout_for calls from an empty cache, and the last layout."""
    out, lay = [], None
    mixes = [(0.8, 0.16), (0.85, 0.10)] if prob.kind == "gemmt" else None
    for _ in range(repeats):
        band_plan._cache.clear()
        t0 = time.perf_counter()
        lay = band_plan.layout_for(prob, speeds, d2h, h2d, speeds=speeds, mixes=mixes, sms=sms)
        out.append(time.perf_counter() - t0)
    return out, lay


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    speeds = [x * 1e12 for x in args.speeds]
    d2h, h2d = (x * 1e9 for x in args.links)
    doc = {"benchmark": "bench_blas_layout_build", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(), "processor": platform.processor(), "results": []}
    for n in args.sizes:
        for routine in args.routines:
            seconds, lay = time_layouts(problem(routine, n), speeds, d2h, h2d, args.repeats)
            row = dict(routine=routine, n=n, order=lay.order, pieces=len(lay.pieces), best_s=min(seconds),
                       median_s=statistics.median(seconds), seconds=seconds)
            doc["results"].append(row)
            print(f"{routine} n = k = {n}: {lay.order} order, {len(lay.pieces)} pieces; best {row['best_s'] * 1e3:.2f} "
                  f"ms, median {row['median_s'] * 1e3:.2f} ms of {args.repeats}", flush=True)
    write_json(args.json, doc)
    return 0
