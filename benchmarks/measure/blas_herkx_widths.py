"""A band call's diagonal-block product alone on one GPU, device operands: cuBLAS zherkx of a w x w triangle
over k (A^H B, lower, with the diagonal computed once more, as devices.cuda_bands queues it), best of
``--repeats``, against w at each k. Beside each width: the 64 x 64 tiles of its triangle and the waves they
take on this GPU's SMs (band_outer.diag_width's rule), and the width diag_width moves it to.

    python3 -m benchmarks.blas herkx-widths --ks 8192 16384 --widths 192 3072 64 --json out.json
"""
import datetime
import platform

import numpy as np

from hybridblas import band_outer, cublas, plan
from hybridblas import problem as P
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_direct
from hybridblas.devices.cuda_bands import queue_product

from benchmarks.common import command_line, refuse, write_json


def add_arguments(ap):
    ap.add_argument("--ks", nargs="+", type=positive_int, default=[8192, 16384], help="k of each sweep")
    ap.add_argument("--widths", nargs=3, type=positive_int, default=[192, 3072, 64], metavar=("FIRST", "LAST", "STEP"),
                    help="widths FIRST, FIRST + STEP, ... up to LAST")
    ap.add_argument("--repeats", type=positive_int, default=5, help="timed products per width (the best is kept)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def waves(width, sms):
    """(tiles, waves) of a width's triangle in 64 x 64 tiles on ``sms`` SMs (band_outer.diag_tiles)."""
    tiles = band_outer.diag_tiles(width)
    return tiles, -(-tiles // sms)


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    first, last, step = args.widths
    if last < first:
        refuse(f"--widths LAST must be at least FIRST, got {first} {last} {step}")
    try:
        import cupy as cp
        cp.cuda.runtime.getDeviceCount()
    except Exception:                   # noqa: BLE001 - no CuPy, or no CUDA driver
        refuse("herkx-widths times a GPU: CuPy sees none")
    sms = cp.cuda.runtime.deviceGetAttribute(16, 0)      # cudaDevAttrMultiProcessorCount
    doc = {"benchmark": "bench_herkx_widths", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sms": sms, "results": []}
    widths = list(range(first, last + 1, step))
    with cp.cuda.Device(0):
        for k in args.ks:
            doc["results"] += _sweep(cp, k, widths, sms, args.repeats)
            write_json(args.json, doc)
            cp.get_default_memory_pool().free_all_blocks()
    return 0


def _sweep(cp, k, widths, sms, repeats):
    n = max(widths)
    rs = cp.random.RandomState(k)
    a = cp.asfortranarray(rs.standard_normal((k, n)) + 1j * rs.standard_normal((k, n)))
    b = cp.asfortranarray(rs.standard_normal((k, n)) + 1j * rs.standard_normal((k, n)))
    c = cp.empty((n, n), np.complex128, order="F")
    prob = P.build_problem("gemmt", 1.0, [a, b], 0.0, c, [P.C, P.N], True, None)
    stream = cp.cuda.Stream(non_blocking=True)
    backend = cublas.Backend(cublas.handle(), stream)
    factors = list(prob.factors)
    kx = cuda_direct.rank_kx(prob, factors, beta=1.0)

    def best(w):
        task = plan.make_task(prob, 0, w, 0, w, 0, k, diag=True)
        times = []
        for _ in range(repeats + 1):            # the first loads the kernel
            start, end = cp.cuda.Event(), cp.cuda.Event()
            with stream:
                start.record(stream)
                queue_product(backend, prob, factors, kx, task, c[:w, :w], 0.0)
                end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        return min(times[1:])

    rows = []
    for w in widths:
        seconds = best(w)
        tiles, count = waves(w, sms)
        flops = prob.tile_flops(w, w, k, diag=True)
        rows.append(dict(k=k, width=w, ms=round(seconds * 1e3, 4), tflops=round(flops / seconds / 1e12, 2),
                         tiles=tiles, waves=count, diag_width=band_outer.diag_width(w, sms, 64)))
        r = rows[-1]
        print(f"k = {k:6d}  width {w:5d}: {r['ms']:8.3f} ms {r['tflops']:6.1f} TF/s  {tiles:5d} tiles in "
              f"{count:3d} waves of {sms}; diag_width {r['diag_width']}", flush=True)
    return rows
