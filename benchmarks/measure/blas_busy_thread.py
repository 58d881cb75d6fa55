"""hybridblas on host operands over two GPUs while another thread of the caller's process runs Python: a band
call's host threads (a feeder, a worker and a writer per GPU) queue each upload, product and write-back from
Python, so they need the interpreter between CUDA calls; a thread that runs Python without pause holds it for
up to the interpreter's switch interval (sys.getswitchinterval(), 5 ms) at every hand-over. Rounds of
``--calls`` calls each, in alternating order:

  - quiet: nothing else runs;
  - spin: a thread runs a pure-Python loop for the whole call;
  - numpy: a thread multiplies 256 x 256 float64 matrices with numpy in a loop (numpy lets go of the
    interpreter while it computes);
  - scipy-blas: a thread multiplies 512 x 512 complex128 matrices with scipy.linalg.blas.zgemm in a loop (its
    f2py wrapper keeps the interpreter for the whole BLAS call, so every hand-over waits for a product).

    python3 -m benchmarks.blas busy-thread --sizes 8192 --routines zgemmt zherk --calls 3 --rounds 2 --json out.json

Reported per kind: best and median wall time, and each over the quiet calls' (the slowdown); the last call's
result is checked on sampled entries.
"""
import statistics
import sys
import threading

import numpy as np

from hybridblas import host_pinning
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import gpu_sync, two_gpu_run, write_json
from benchmarks.measure.blas_gpu import ROUTINES, call_hybrid, host_cases, sample_error, timed

KINDS = ("quiet", "spin", "numpy", "scipy-blas")


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=["zgemmt", "zherk"])
    ap.add_argument("--calls", type=positive_int, default=3, help="calls of each kind a round")
    ap.add_argument("--rounds", type=positive_int, default=2, help="rounds of the kinds")
    ap.add_argument("--kinds", nargs="+", choices=KINDS[1:], default=list(KINDS[1:]),
                    help="the loads beside the quiet calls")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


class Load:
    """A daemon thread that, while ``kind`` is set (one of KINDS but "quiet"), runs that kind of work."""

    def __init__(self):
        self.kind = None
        self.wake = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="busy-load").start()

    def set(self, kind):
        self.kind = None if kind == "quiet" else kind
        if self.kind:
            self.wake.set()
        else:
            self.wake.clear()

    def _run(self):
        from scipy.linalg import blas
        rng = np.random.default_rng(0)
        x = rng.standard_normal((256, 256))
        z = np.asfortranarray(rng.standard_normal((512, 512)) + 1j * rng.standard_normal((512, 512)))
        while True:
            self.wake.wait()
            kind = self.kind
            if kind == "spin":
                s = 0
                for i in range(2000):
                    s += i
            elif kind == "numpy":
                x = x @ x
                x /= np.abs(x).max()
            elif kind == "scipy-blas":
                blas.zgemm(1.0, z, z)


def slowdown(rows):
    """{kind: {"best", "median", "best_ratio", "median_ratio"}} of {kind: [seconds]}: each kind's best and median,
    and each over the quiet calls' own."""
    out = {}
    for kind, values in rows.items():
        out[kind] = {"best": min(values), "median": statistics.median(values)}
    for kind in out:
        out[kind]["best_ratio"] = out[kind]["best"] / out["quiet"]["best"]
        out[kind]["median_ratio"] = out[kind]["median"] / out["quiet"]["median"]
    return out


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp, ctx, gpus, doc = two_gpu_run("busy-thread", "bench_blas_busy_thread",
                                     switch_interval_s=sys.getswitchinterval())
    load = Load()
    rng = np.random.default_rng(7)

    sync = gpu_sync(cp, gpus)
    for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
        for _ in range(2):
            call_hybrid(routine, host_args, kw, c, ctx)
        host_pinning.wait_ready()
        for _ in range(2):
            call_hybrid(routine, host_args, kw, c, ctx)
        kinds = ("quiet",) + tuple(k for k in KINDS[1:] if k in args.kinds)
        rows = {kind: [] for kind in kinds}
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                load.set(kind)
                rows[kind] += timed(lambda: call_hybrid(routine, host_args, kw, c, ctx), sync, args.calls)
                load.set("quiet")
        res = slowdown(rows)
        err = sample_error(routine, host_args, c, rng)
        doc["results"].append(dict(routine=routine, n=n, seconds=rows, summary=res, rel_error=err))
        print(f"== {routine} n = k = {n} (the last call's result: sampled entries' error {err:.1e})", flush=True)
        for kind in kinds:
            s = res[kind]
            print(f"  {kind:10s} best {s['best'] * 1e3:9.2f} ms ({s['best_ratio']:5.1f} x quiet)  median "
                  f"{s['median'] * 1e3:9.2f} ms ({s['median_ratio']:5.1f} x)  calls (ms) "
                  + " ".join(f"{x * 1e3:.1f}" for x in rows[kind]), flush=True)
        write_json(args.json, doc)
    write_json(args.json, doc)
    return 0

