"""Where a two-GPU band call's host time goes: the band path's functions (devices.cuda_bands' jobs and helpers, the
cuBLAS layer, cuda_raw's calls) are wrapped, and each reports per call how often it ran, its wall seconds and the
CPU seconds of the thread that ran it (time.thread_time), both inclusive of what it calls. Wall above CPU is time
the thread waited: for the interpreter (the call's threads take turns for it), a queue or the GPU; CPU above the
sum of a job's Python is time in CUDA or cuBLAS (a spinning synchronize counts as CPU).

After three warm-up calls (page-locked by then), ``--calls`` calls run unwrapped (their times are the reference)
and ``--calls`` wrapped; the table is of the wrapped ones. ``--set MODULE.CONSTANT=VALUE`` sets constants of the
band path first (as ``turns`` does), e.g. ``cuda_bands.RAW_CALLS=False``.

    python3 -m benchmarks.blas host-profile --sizes 8192 --routines zgemmt zherk --calls 6 --json out.json
"""
import collections
import functools
import time

from hybridblas import cublas, downloads, host_pinning, plan
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_bands, cuda_direct, cuda_raw, cuda_tri_store

from benchmarks.common import gpu_sync, two_gpu_run, write_json
from benchmarks.measure.blas_band_settings import set_constants
from benchmarks.measure.blas_gpu import ROUTINES, call_hybrid, host_cases, timed

CALL_METHODS = ("_execute", "_pin", "_take_rings", "_allocate", "_queue_uploads", "_upload_piece", "_upload", "_feed",
                "_work", "_blocks", "_gather", "_pace", "_product", "_store_diagonals", "_serve", "_write", "_view",
                "_summary", "_record_stats", "_settle", "_release", "_balance", "__init__")
TARGETS = ([(cuda_bands._Call, m, "Call." + m) for m in CALL_METHODS]
           + [(cuda_bands, "applies", "cuda_bands.applies"), (cuda_bands, "run", "cuda_bands.run"),
              (cuda_bands, "queue_product", "queue_product"), (cuda_bands, "compute_block", "compute_block"),
              (cuda_bands._Side, "dots", "Side.dots"), (cuda_bands._StreamSet, "event", "StreamSet.event"),
              (cuda_bands._Board, "wait", "Board.wait"),
              (cuda_direct, "gemmt_kx", "gemmt_kx"), (cuda_direct, "diagonal_dots", "diagonal_dots"),
              (cublas, "call", "cublas.call"), (cublas, "_gemm", "cublas._gemm"),
              (cuda_raw.Calls, "rect", "raw.rect"), (cuda_raw.Calls, "diagonal", "raw.diagonal"),
              (plan, "with_k", "plan.with_k"), (plan, "make_task", "plan.make_task"),
              (cuda_tri_store, "queue", "tri_store.queue"),
              (cuda_tri_store, "queue_off_diagonal", "tri_store.queue_off_diagonal"),
              (downloads, "queue_full", "downloads.queue_full"), (cuda_bands, "layout_for", "layout_for")])


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=["zgemmt", "zherk"])
    ap.add_argument("--calls", type=positive_int, default=6, help="calls unwrapped, then as many wrapped")
    ap.add_argument("--set", nargs="+", metavar="MODULE.CONSTANT=VALUE", default=[],
                    help="set these constants of the band path first (as turns does)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


class Profile:
    """Wrappers around ``targets`` ((owner, attribute, label)) that, while ``on``, add each run's wall and thread
    CPU seconds to its label's totals; ``restore`` puts the originals back."""

    def __init__(self, targets):
        self.totals = collections.defaultdict(lambda: [0, 0.0, 0.0])
        self.on = False
        self._saved = []
        for owner, name, label in targets:
            real = owner.__dict__[name]
            self._saved.append((owner, name, real))
            setattr(owner, name, self._wrap(real, label))

    def _wrap(self, fn, label):
        @functools.wraps(fn)
        def timed_fn(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                row = self.totals[label]
                row[0] += 1
                row[1] += time.perf_counter() - t0
                row[2] += time.thread_time() - c0
        return timed_fn

    def restore(self):
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved = []


def table(totals, calls):
    """[(label, runs a call, wall ms a call, CPU ms a call, wall us a run)] of ``totals`` ({label: [runs, wall s,
    CPU s]} over ``calls`` calls), the longest wall first."""
    rows = [(label, runs / calls, wall / calls * 1e3, cpu / calls * 1e3, wall / max(runs, 1) * 1e6)
            for label, (runs, wall, cpu) in totals.items()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp, ctx, gpus, doc = two_gpu_run("host-profile", "bench_blas_host_profile", set=set_constants(args.set))
    sync = gpu_sync(cp, gpus)
    profile = Profile(TARGETS)
    try:
        for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
            def call():
                return call_hybrid(routine, host_args, kw, c, ctx)
            for _ in range(3):
                call()
            host_pinning.wait_ready()
            plain = timed(call, sync, args.calls)
            profile.totals.clear()
            profile.on = True
            try:
                wrapped = timed(call, sync, args.calls)
            finally:
                profile.on = False
            rows = table(profile.totals, args.calls)
            doc["results"].append(dict(routine=routine, n=n, plain_s=plain, wrapped_s=wrapped,
                                       functions=[dict(zip(("name", "runs", "wall_ms", "cpu_ms", "wall_us_each"), r))
                                                  for r in rows]))
            _report(routine, n, plain, wrapped, rows)
            write_json(args.json, doc)
    finally:
        profile.restore()
    write_json(args.json, doc)
    return 0


def _report(routine, n, plain, wrapped, rows):
    print(f"== {routine} n = k = {n}: calls {' '.join(f'{t * 1e3:.1f}' for t in plain)} ms; wrapped "
          f"{' '.join(f'{t * 1e3:.1f}' for t in wrapped)} ms", flush=True)
    print(f"   {'function':34s} {'runs/call':>9s} {'wall ms/call':>12s} {'CPU ms/call':>11s} {'wall us/run':>11s}")
    for label, runs, wall, cpu, each in rows:
        print(f"   {label:34s} {runs:9.1f} {wall:12.3f} {cpu:11.3f} {each:11.1f}", flush=True)
