"""Device cuBLAS and hybridblas on host operands in turn, call by call, on two GPUs: the same GPUs, the same
inputs and the same recent load for both (the H100's power cap lowers its clock within a fraction of a second of
FP64 tensor-core work, so a baseline measured in a short burst on an idle GPU runs at a higher clock than a
call that follows others). Each round runs, in alternating order:

  - Σ device: cuBLAS on device-resident copies on both GPUs at once (a thread per GPU); each GPU's time by
    CUDA events, the sum of its rate and the other's;
  - alone: the same on each GPU by itself, one after the other (benchmarks.blas gpu's ceiling);
  - hybridblas: one call with host operands on both GPUs (page-locked by then), wall time; its result is
    checked on sampled entries.

Each hybridblas call notes whether it was its layout's first call (marked ``n`` in the listing: the kernels of new
shapes load), ran beside a layout being made by a worker thread (``b``), and how long the interpreter's garbage
collections took while it ran (``g`` where over 1 ms).

While it runs, NVML (where there is one) samples each GPU's SM clock every CLOCK_INTERVAL seconds (a thread
that wakes more often takes the interpreter from hybridblas's host threads); each kind's mean over its calls is
reported beside its times.

    python3 -m benchmarks.blas turns --sizes 8192 16384 --routines zgemmt zherk zher2k --rounds 8 --json out.json

``--set MODULE.CONSTANT=VALUE ...`` sets constants of the band path first (the modules of benchmarks.blas
band-settings): one process per setting, where band-settings' switches within a process would share the GPUs'
measured speeds between settings whose kernels run at different rates.

Ratios: hybridblas's time against the time both GPUs' device rates give together (1 / (1/t0 + 1/t1)), best
against best and median against median.
"""
import gc
import statistics
import threading
import time

import numpy as np

from hybridblas import host_pinning
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import gpu_sync, two_gpu_run, write_json
from benchmarks.measure.blas_band_replay import Clocks
from benchmarks.measure.blas_band_settings import set_constants
from benchmarks.measure.blas_gpu import FLOPS, ROUTINES, call_device, call_hybrid, host_cases, sample_error

CLOCK_INTERVAL = 0.01


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=list(ROUTINES))
    ap.add_argument("--rounds", type=positive_int, default=8, help="rounds of the three kinds of call")
    ap.add_argument("--set", nargs="+", metavar="MODULE.CONSTANT=VALUE", default=[],
                    help="set these constants of the band path before the run")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def _device_calls(cp, routine, dev, out, gpus):
    """Device cuBLAS on ``gpus`` at once (a thread each): {gpu: seconds by CUDA events}."""
    times, errors = {}, []
    start = threading.Barrier(len(gpus))

    def one(g):
        try:
            with cp.cuda.Device(g):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                start.wait()
                a.record()
                call_device(routine, dev[g], out[g])
                b.record()
                b.synchronize()
                times[g] = cp.cuda.get_elapsed_time(a, b) / 1e3
        except BaseException as exc:   # noqa: BLE001 - reported by the calling thread
            errors.append(exc)
            start.abort()
    threads = [threading.Thread(target=one, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return times


class GcTimes:
    """Seconds the interpreter's garbage collections take, from gc.callbacks, summed between mark() and take()."""

    def __init__(self):
        self.total, self._start, self._base = 0.0, None, 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.total += time.perf_counter() - self._start
            self._start = None

    def mark(self):
        self._base = self.total

    def take(self):
        return self.total - self._base

    def close(self):
        gc.callbacks.remove(self._note)


def _flags(gc_s):
    """The last hybridblas call's notes: its layout's first call, beside a layout build, its GC seconds."""
    from hybridblas.devices.cuda import last_stats
    stats = [st for st in last_stats.values() if isinstance(st, dict)]
    return {"new_layout": any(st.get("new_layout") for st in stats),
            "beside_build": any(st.get("beside_build") for st in stats), "gc_s": gc_s}


def _mark(row):
    if "new_layout" not in row:
        return ""
    return ("n" if row["new_layout"] else "") + ("b" if row["beside_build"] else "") + \
        ("g" if row["gc_s"] > 1e-3 else "")


def _summary(values):
    return {"best": min(values), "median": statistics.median(values)}


def _rounds(cp, routine, host_args, kw, c, ctx, dev, out, rounds):
    """{kind: [{"seconds", "per_gpu_s" (hybridblas: its notes, _flags), "window"}]} of ``rounds`` rounds of the three
    kinds of call, in alternating order; hybridblas warmed up first (the second call page-locks the operands:
    pin_host="auto")."""
    gpus = sorted(dev)

    sync = gpu_sync(cp, gpus)
    _device_calls(cp, routine, dev, out, gpus)
    for _ in range(2):
        call_hybrid(routine, host_args, kw, c, ctx)
    host_pinning.wait_ready()
    call_hybrid(routine, host_args, kw, c, ctx)
    sync()
    rows = {"both": [], "alone": [], "hb": []}
    collections = GcTimes()
    try:
        for r in range(rounds):
            _round(cp, routine, host_args, kw, c, ctx, dev, out, gpus, sync, rows, collections, r)
    finally:
        collections.close()
    return rows


def _round(cp, routine, host_args, kw, c, ctx, dev, out, gpus, sync, rows, collections, r):
    """One round of the three kinds of call, appended to ``rows``."""
    for kind in ("both", "alone", "hb") if r % 2 == 0 else ("hb", "alone", "both"):
        t0 = time.perf_counter()
        row = {}
        if kind == "hb":
            collections.mark()
            call_hybrid(routine, host_args, kw, c, ctx)
            sync()
            seconds = time.perf_counter() - t0
            row.update(_flags(collections.take()))
        else:
            got = {}
            for part in ([gpus] if kind == "both" else [[g] for g in gpus]):
                got.update(_device_calls(cp, routine, dev, out, part))
            seconds = 1 / sum(1 / got[g] for g in gpus)
            row["per_gpu_s"] = got
        rows[kind].append(dict(row, seconds=seconds, window=(t0, time.perf_counter())))


def _report(entry, rows, mhz):
    res, flops = entry["summary"], entry["flops"]
    print(f"== {entry['routine']} n = k = {entry['n']} (hybridblas's result: sampled entries' error "
          f"{entry['rel_error']:.1e})", flush=True)
    for kind, v in rows.items():
        print(f"  {kind:6s} best {res[kind]['best'] * 1e3:8.2f} ms  median {res[kind]['median'] * 1e3:8.2f} ms  "
              f"{flops / res[kind]['best'] / 1e12:6.1f} TF/s  SM clock (MHz) {mhz[kind] or '-'}  calls (ms) "
              + " ".join(f"{x['seconds'] * 1e3:.1f}{_mark(x)}" for x in v), flush=True)
    both, alone = entry["ratio_to_both"], entry["ratio_to_alone"]
    print(f"  hybridblas / Σ device at once: best {both['best']:.3f}, median {both['median']:.3f};  "
          f"/ each alone: best {alone['best']:.3f}, median {alone['median']:.3f}", flush=True)


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp, ctx, gpus, doc = two_gpu_run("turns", "bench_blas_turns", set=set_constants(args.set))
    clocks = Clocks(len(gpus), CLOCK_INTERVAL)
    rng = np.random.default_rng(7)
    try:
        for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
            dev, out = {}, {}
            for g in gpus:
                with cp.cuda.Device(g):
                    dev[g] = tuple(x if np.isscalar(x) else cp.asarray(x, order="F") for x in host_args)
                    out[g] = cp.empty((n, n), np.complex128, order="F")
            host_pinning.clear()
            rows = _rounds(cp, routine, host_args, kw, c, ctx, dev, out, args.rounds)
            res = {k: _summary([x["seconds"] for x in v]) for k, v in rows.items()}
            mhz = {k: clocks.mean([x.pop("window") for x in v]) for k, v in rows.items()}
            ratio = {base: {s: res[base][s] / res["hb"][s] for s in ("best", "median")} for base in ("both", "alone")}
            entry = dict(routine=routine, n=n, flops=FLOPS[routine] * n ** 3,
                         rel_error=sample_error(routine, host_args, c, rng), rounds=rows, summary=res,
                         sm_clock_mhz=mhz, ratio_to_both=ratio["both"], ratio_to_alone=ratio["alone"])
            doc["results"].append(entry)
            _report(entry, rows, mhz)
            dev = out = None
            for g in gpus:
                with cp.cuda.Device(g):
                    cp.get_default_memory_pool().free_all_blocks()
            write_json(args.json, doc)
    finally:
        clocks.stop.set()
    write_json(args.json, doc)
    return 0
