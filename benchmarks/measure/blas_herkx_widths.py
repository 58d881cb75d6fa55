"""A band call's diagonal-block product alone on one GPU, device operands: cuBLAS zherkx of a w x w triangle
over k (A^H B, lower, with the diagonal computed once more, as devices.cuda_bands queues it), best of
``--repeats``, against w at each k. Beside each width: the 64 x 64 tiles of its triangle and the waves they
take on this GPU's SMs (band_outer.diag_width's rule), and the width diag_width moves it to.

    python3 -m benchmarks.blas herkx-widths --ks 8192 16384 --widths 192 3072 64 --json out.json
"""

import numpy as np

from hybridblas import band_outer, cublas, plan
from hybridblas import problem as P
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_direct
from hybridblas.devices.cuda_bands import queue_product

from benchmarks.common import gpus_or_refuse, one_gpu_doc, refuse, write_json


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
    cp, _ = gpus_or_refuse("herkx-widths")
    doc = one_gpu_doc(cp, "bench_herkx_widths")
    sms = doc["sms"]
    widths = list(range(first, last + 1, step))
    with cp.cuda.Device(0):
        for k in args.ks:
            doc["results"] += _sweep(cp, k, widths, sms, args.repeats)
            write_json(args.json, doc)
            cp.get_default_memory_pool().free_all_blocks()
    return 0


class DeviceGemmt:
    """zgemmt (A^H B, lower) on random k x n device operands of GPU 0, and the best time of one of its tasks queued
    as a band call queues it (devices.cuda_bands.queue_product) on a stream of its own."""

    def __init__(self, cp, k, n, seed):
        rs = cp.random.RandomState(seed)
        a = cp.asfortranarray(rs.standard_normal((k, n)) + 1j * rs.standard_normal((k, n)))
        b = cp.asfortranarray(rs.standard_normal((k, n)) + 1j * rs.standard_normal((k, n)))
        self.cp, self.c = cp, cp.empty((n, n), np.complex128, order="F")
        self.prob = P.build_problem("gemmt", 1.0, [a, b], 0.0, self.c, [P.C, P.N], True, None)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.backend = cublas.Backend(cublas.handle(), self.stream)
        self.factors = list(self.prob.factors)
        self.kx = cuda_direct.rank_kx(self.prob, self.factors, beta=1.0)

    def task(self, i0, i1, j0, j1, diag=False):
        return plan.make_task(self.prob, i0, i1, j0, j1, 0, self.prob.k, diag=diag)

    def best(self, task, repeats, columns=0):
        """Seconds of the best of ``repeats`` runs of ``task`` into C (after one that loads the kernels)."""
        cp, stream, times = self.cp, self.stream, []
        out = self.c[task.i0:task.i1, task.j0:task.j1]
        for _ in range(repeats + 1):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            with stream:
                start.record(stream)
                queue_product(self.backend, self.prob, self.factors, self.kx, task, out, 0.0, columns=columns)
                end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        return min(times[1:])


def _sweep(cp, k, widths, sms, repeats):
    run = DeviceGemmt(cp, k, max(widths), k)
    prob = run.prob
    rows = []
    for w in widths:
        seconds = run.best(run.task(0, w, 0, w, diag=True), repeats)
        tiles, count = waves(w, sms)
        flops = prob.tile_flops(w, w, k, diag=True)
        rows.append(dict(k=k, width=w, ms=round(seconds * 1e3, 4), tflops=round(flops / seconds / 1e12, 2),
                         tiles=tiles, waves=count, diag_width=band_outer.diag_width(w, sms, 64)))
        r = rows[-1]
        print(f"k = {k:6d}  width {w:5d}: {r['ms']:8.3f} ms {r['tflops']:6.1f} TF/s  {tiles:5d} tiles in "
              f"{count:3d} waves of {sms}; diag_width {r['diag_width']}", flush=True)
    return rows
