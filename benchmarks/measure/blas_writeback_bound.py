"""How much of a two-GPU band call on host operands its write-back of C costs: the same calls, in turns, with the
write-back as the band path queues it, with none at all, and with DMAs of about the same bytes from and to contiguous
buffers (what C's column segments cost against whole copies; a diagonal block's is its whole strict triangle, a little
more than the band path's DMAs move beside its store kernel). Only the first is a correct result: the other two
are measurements of the links, and C is not written by them (their calls' results are not checked, and the GPUs'
measured write-back rates are kept out of the calibration while they run).

    python3 -m benchmarks.blas writeback-bound --sizes 8192 --routines zgemmt --rounds 6 --calls 3 --json out.json

Per setting: best and median wall time over ``--rounds`` rounds of ``--calls`` calls (each round takes the settings
in turn, reversed every other round, an untimed call after each switch), and the best call's upload and write-back
rates, idle gaps, tail and kernel time per GPU.
"""
import statistics

import numpy as np

from hybridblas import downloads, host_pinning
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_bands, cuda_tri_store

from benchmarks.common import gpu_sync, two_gpu_run, write_json
from benchmarks.measure.blas_gpu import ROUTINES, call_hybrid, host_cases, sample_error, timed

SETTINGS = ("as-is", "none", "contiguous")
SCRATCH_BYTES = 1 << 30      # per GPU and on the host: the largest block a setting copies from or into


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=["zgemmt"])
    ap.add_argument("--rounds", type=positive_int, default=6, help="rounds of the three settings")
    ap.add_argument("--calls", type=positive_int, default=3, help="timed calls of each setting a round")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


class Writeback:
    """Switches the band path's write-back functions between the settings (``set``) and back (``restore``)."""

    def __init__(self, cp, gpus):
        self.cp = cp
        self.saved = (downloads.queue_full, cuda_tri_store.queue_off_diagonal, cuda_tri_store.queue,
                      cuda_bands._calibrate)
        self.device = {}
        for g in gpus:
            with cp.cuda.Device(g):
                self.device[g] = cp.empty(SCRATCH_BYTES, np.uint8)
        self.host = cp.cuda.alloc_pinned_memory(SCRATCH_BYTES)

    def set(self, name):
        full, off, tri, calibrate = self.saved
        if name == "none":
            full, off, tri = _nothing, _nothing, _nothing
        elif name == "contiguous":
            full, off, tri = self._full, self._off, self._tri
        if name != "as-is":
            calibrate = self._calibrate
        downloads.queue_full, cuda_tri_store.queue_off_diagonal, cuda_tri_store.queue, cuda_bands._calibrate = (
            full, off, tri, calibrate)

    def restore(self):
        self.set("as-is")

    def _copy(self, src, nbytes, stream):
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(self.host.ptr, self.device[src.device.id].data.ptr, min(nbytes, SCRATCH_BYTES),
                       rt.memcpyDeviceToHost, stream.ptr)

    def _full(self, dst, src, stream):
        self._copy(src, src.size * src.itemsize, stream)

    def _off(self, dst, src, lower, stream, panel=None):
        m = src.shape[0]
        self._copy(src, m * (m - 1) // 2 * src.itemsize, stream)

    def _tri(self, cupy, dst, dst_address, src, lower, stream, panel=None):
        cuda_tri_store.queue_diagonals(cupy, dst, dst_address, src, lower, stream, panel)
        self._off(dst, src, lower, stream, panel)

    def _calibrate(self, device, what, *args, **kw):
        if what != "d2h_pinned":        # no write-back rate from a setting that does not write C
            self.saved[3](device, what, *args, **kw)


def _nothing(*args, **kw):
    return None


def gpu_row(stats):
    """The figures of one GPU's cuda.last_stats a row keeps."""
    return {"upload_gbps": stats.get("upload_gbps"), "writeback_gbps": stats.get("writeback_gbps"),
            "lead_ms": stats["lead_s"] * 1e3, "gaps_ms": stats["gaps_s"] * 1e3, "tail_ms": stats["tail_s"] * 1e3,
            "kernel_ms": stats["kernel_s"] * 1e3}


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp, ctx, gpus, doc = two_gpu_run("writeback-bound", "bench_blas_writeback_bound")
    from hybridblas.devices.cuda import last_stats
    wb = Writeback(cp, gpus)
    sync = gpu_sync(cp, gpus)
    rng = np.random.default_rng(7)
    try:
        for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
            for _ in range(2):
                call_hybrid(routine, host_args, kw, c, ctx)
            host_pinning.wait_ready()
            call_hybrid(routine, host_args, kw, c, ctx)
            err = sample_error(routine, host_args, c, rng)
            seconds = {s: [] for s in SETTINGS}
            stats = {s: [] for s in SETTINGS}
            for r in range(args.rounds):
                for name in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                    wb.set(name)
                    call_hybrid(routine, host_args, kw, c, ctx)
                    for _ in range(args.calls):
                        seconds[name] += timed(lambda: call_hybrid(routine, host_args, kw, c, ctx), sync, 1)
                        stats[name].append({g: gpu_row(s) for g, s in sorted(last_stats.items())})
            wb.restore()
            rows = {}
            print(f"== {routine} n = k = {n} (as-is calls' result: sampled entries' error {err:.1e})", flush=True)
            for name in SETTINGS:
                t = seconds[name]
                best = int(np.argmin(t))
                rows[name] = {"seconds": t, "best_s": t[best], "median_s": statistics.median(t),
                              "best_call": stats[name][best]}
                gpus_text = "; ".join(f"{g}: up {v['upload_gbps'] or 0:.1f} GB/s, write-back "
                                      f"{v['writeback_gbps'] or 0:.1f}, gaps {v['gaps_ms']:.2f} ms, tail "
                                      f"{v['tail_ms']:.2f}, kernels {v['kernel_ms']:.2f}"
                                      for g, v in stats[name][best].items())
                print(f"  {name:10s} best {t[best] * 1e3:8.2f} ms  median {statistics.median(t) * 1e3:8.2f} ms  "
                      f"({gpus_text})", flush=True)
            doc["results"].append(dict(routine=routine, n=n, rel_error=err, settings=rows))
            write_json(args.json, doc)
    finally:
        wb.restore()
    write_json(args.json, doc)
    return 0
