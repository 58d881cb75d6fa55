"""Where the band path's kernel time goes on two GPUs: zgemmt (A^H B, lower) with host operands runs ``--calls``
calls after two warm-up calls (page-locked by then); the products of its last call (each GPU's blocks of C and
their k ranges, from cuda.last_stats) are then replayed in the same order on device-resident copies of the
operands: on both GPUs at once with no transfers, on both beside a copy load of the call's bytes (each GPU's
uploads from page-locked host memory, its peer copies and its write-back, queued on their own streams as the
replay starts), and on each GPU alone; best of ``--repeats`` rounds taken in turn. Rates are given per class
(rectangles: cuBLAS gemm; diagonal blocks: herkx and its diagonal), beside device cuBLAS herkx of the whole
triangle on each GPU alone, measured in the same rounds. Where NVML is there, each GPU's SM clock is sampled
every millisecond and averaged over the calls and over each kind of replay.

    python3 -m benchmarks.blas band-replay --sizes 8192 16384 --json out.json
"""
import ctypes
import datetime
import platform
import threading
import time

import numpy as np

import hybridblas as hb
from hybridblas import cublas, host_pinning, plan, workers
from hybridblas import problem as P
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_direct
from hybridblas.devices.cuda_bands import queue_product

from benchmarks.common import command_line, gpu_sync, refuse, two_gpus, write_json
from benchmarks.measure.blas_gpu import call_device, call_hybrid, make_host, operands, timed

KINDS = ("in_call", "replayed_both", "replayed_with_copies", "replayed_alone")


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192, 16384], help="n = k of each run")
    ap.add_argument("--calls", type=positive_int, default=6, help="timed band calls before the replay")
    ap.add_argument("--repeats", type=positive_int, default=3, help="rounds of replays (and device cuBLAS)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


class Clocks:
    """Each GPU's SM clock (MHz) every ``interval`` seconds through NVML, on a thread; ``mean(windows)`` per GPU
    over windows of perf_counter seconds, or None where NVML is missing."""

    def __init__(self, count, interval=0.001):
        self.samples, self.stop, self.interval = [], threading.Event(), interval
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self.nvml.nvmlInit_v2() != 0:
                raise OSError("nvmlInit failed")
            self.handles = []
            for i in range(count):
                h = ctypes.c_void_p()
                if self.nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                    raise OSError(f"no NVML handle for GPU {i}")
                self.handles.append(h)
        except OSError:
            self.nvml = None
            return
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        clock = ctypes.c_uint()
        while not self.stop.is_set():
            row = [time.perf_counter()]
            for h in self.handles:
                self.nvml.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(clock))      # NVML_CLOCK_SM
                row.append(clock.value)
            self.samples.append(row)
            time.sleep(self.interval)

    def mean(self, windows):
        rows = [r for r in list(self.samples) for t0, t1 in windows if t0 <= r[0] <= t1]
        if self.nvml is None or not rows:
            return None
        return [round(float(np.mean([r[1 + g] for r in rows]))) for g in range(len(self.handles))]


class _Replay:
    """One GPU's copies of the operands, the products of a call to run on them, and a copy load like the call's."""

    def __init__(self, cp, g, a, b, n, products):
        self.cp, self.g, self.products = cp, g, products
        with cp.cuda.Device(g):
            self.a, self.b = cp.asarray(a, order="F"), cp.asarray(b, order="F")
            self.c = cp.empty((n, n), np.complex128, order="F")
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.copy_streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
        self.scratch = None                  # bytes for the copy load (_replay_rounds)
        self.problem = P.build_problem("gemmt", 1.0, [self.a, self.b], 0.0, self.c, [P.C, P.N], True, None)

    def run(self):
        """Seconds of each product, queued back to back on one stream."""
        cp, prob = self.cp, self.problem
        with cp.cuda.Device(self.g), self.stream:
            backend = cublas.Backend(cp.cuda.device.get_cublas_handle(), self.stream)
            factors = list(prob.factors)
            kx = cuda_direct.rank_kx(prob, factors, beta=1.0)
            events = []
            for i0, i1, j0, j1, k0, k1, diag, _t in self.products:
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(self.stream)
                queue_product(backend, prob, factors, kx, plan.make_task(prob, i0, i1, j0, j1, k0, k1, diag=diag),
                              self.c[i0:i1, j0:j1], 0.0)
                end.record(self.stream)
                events.append((start, end))
            self.stream.synchronize()
        return [cp.cuda.get_elapsed_time(s, e) / 1e3 for s, e in events]

    def queue_copies(self, other, stats, host_in, host_out):
        """The call's bytes on this GPU's copy streams: uploads from ``host_in`` into ``scratch``, peer copies from
        ``other``'s scratch, write-back into ``host_out`` (page-locked buffers and scratch at least that large)."""
        cp = self.cp
        rt = cp.cuda.runtime
        up, peer, down = (int(stats[k]) for k in ("bytes_from_host", "bytes_from_peer", "bytes_to_host"))
        with cp.cuda.Device(self.g):
            s_in, s_peer, s_out = self.copy_streams
            rt.memcpyAsync(self.scratch.data.ptr, host_in.ctypes.data, up, rt.memcpyHostToDevice, s_in.ptr)
            rt.memcpyPeerAsync(self.scratch.data.ptr, self.g, other.scratch.data.ptr, other.g, peer, s_peer.ptr)
            rt.memcpyAsync(host_out.ctypes.data, self.scratch.data.ptr, down, rt.memcpyDeviceToHost, s_out.ptr)

    def wait_copies(self):
        for s in self.copy_streams:
            s.synchronize()

    def device_herkx(self):
        """Seconds of device cuBLAS herkx of the whole triangle."""
        cp = self.cp
        with cp.cuda.Device(self.g):
            return min(timed(lambda: call_device("zgemmt", (1.0, self.a, self.b), self.c),
                             lambda: cp.cuda.Device(self.g).synchronize(), 2))

    def release(self):
        with self.cp.cuda.Device(self.g):
            self.a = self.b = self.c = self.problem = self.scratch = None
            self.cp.get_default_memory_pool().free_all_blocks()


def _rates(problem, products, seconds):
    """TF/s and ms per class (rect, diag) and in all of ``products`` timed at ``seconds``."""
    out = {}
    for name, keep in (("rect", lambda d: not d), ("diag", lambda d: d), ("all", lambda d: True)):
        flops = sum(problem.tile_flops(i1 - i0, j1 - j0, k1 - k0, diag=d)
                    for (i0, i1, j0, j1, k0, k1, d, _), t in zip(products, seconds) if keep(d))
        time_s = sum(t for x, t in zip(products, seconds) if keep(x[6]))
        out[name] = {"tflops": round(flops / max(time_s, 1e-12) / 1e12, 2), "ms": round(time_s * 1e3, 3)}
    return out


def _on_both(replays, before=None):
    """Both GPUs' replays at once (``before(g)`` queued first on GPU g's thread); their seconds and the window."""
    def one(g):
        if before is not None:
            before(g)
        return replays[g].run()
    t0 = time.perf_counter()
    out = workers.map(one, (0, 1), 2)
    return out, (t0, time.perf_counter())


def _replay_rounds(cp, replays, stats, repeats, clocks):
    """Per kind of replay, per GPU, the best round's seconds of each product; device herkx seconds; clocks."""
    import cupyx
    need = max(int(st[k]) for st in stats.values() for k in ("bytes_from_host", "bytes_from_peer", "bytes_to_host"))
    host_in = cupyx.empty_pinned(need, np.uint8)
    host_out = [cupyx.empty_pinned(need, np.uint8) for _ in (0, 1)]
    for g in (0, 1):                    # every scratch buffer exists before a GPU copies from its peer's
        with cp.cuda.Device(g):
            replays[g].scratch = cp.empty(need, np.uint8)
    runs = {k: [[], []] for k in KINDS[1:]}
    windows = {k: [] for k in KINDS[1:3]}
    device = [[], []]
    for _ in range(repeats):
        seconds, window = _on_both(replays)
        windows["replayed_both"].append(window)
        for g in (0, 1):
            runs["replayed_both"][g].append(seconds[g])
        seconds, window = _on_both(replays, lambda g: replays[g].queue_copies(replays[1 - g], stats[g], host_in,
                                                                               host_out[g]))
        for rp in replays:
            rp.wait_copies()
        windows["replayed_with_copies"].append(window)
        for g in (0, 1):
            runs["replayed_with_copies"][g].append(seconds[g])
            runs["replayed_alone"][g].append(replays[g].run())
            device[g].append(replays[g].device_herkx())
    best = {k: [min(v[g], key=sum) for g in (0, 1)] for k, v in runs.items()}
    return best, device, {k: clocks.mean(w) for k, w in windows.items()}


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp = two_gpus("band-replay")
    from hybridblas.devices.cuda import CUDADevice, last_stats
    ctx = hb.Context(devices=[CUDADevice(0), CUDADevice(1)])
    clocks = Clocks(2)
    doc = {"benchmark": "bench_band_replay", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(),
           "gpus": [cp.cuda.runtime.getDeviceProperties(g)["name"].decode() for g in (0, 1)], "results": []}
    for n in args.sizes:
        a, b = make_host(cp, (n, n), 1), make_host(cp, (n, n), 2)
        c = np.zeros((n, n), np.complex128, order="F")
        host_args, kw = operands("zgemmt", a, b)
        host_pinning.clear()
        for _ in range(2):
            call_hybrid("zgemmt", host_args, kw, c, ctx)
        host_pinning.wait_ready()
        last_stats.clear()
        sync = gpu_sync(cp, (0, 1))
        t0 = time.perf_counter()
        calls = timed(lambda: call_hybrid("zgemmt", host_args, kw, c, ctx), sync, args.calls)
        call_window = (t0, time.perf_counter())
        stats = {g: last_stats.get(f"cuda:{g}", {}) for g in (0, 1)}
        if any(st.get("path") != "bands" for st in stats.values()):
            refuse(f"zgemmt n = {n} did not take the band path on both GPUs: nothing to replay")
        replays = [_Replay(cp, g, a, b, n, stats[g]["products"]) for g in (0, 1)]
        best, device, clock = _replay_rounds(cp, replays, stats, args.repeats, clocks)
        flops = 4.0 * n * n * n
        row = dict(routine="zgemmt", n=n, k=n, calls_s=calls, best_call_s=min(calls[1:] or calls), gpus={},
                   sm_clock_mhz=dict(in_call=clocks.mean([call_window]), **clock))
        for g in (0, 1):
            products = stats[g]["products"]
            seconds = {"in_call": [x[7] for x in products], **{k: best[k][g] for k in KINDS[1:]}}
            row["gpus"][g] = dict(blocks=len(products), **{k: stats[g][k] for k in ("wall_s", "lead_s", "gaps_s",
                                                                                      "tail_s")},
                                  **{k: _rates(replays[g].problem, products, seconds[k]) for k in KINDS},
                                  device_herkx_tflops=round(flops / min(device[g]) / 1e12, 2))
        device_sum = sum(flops / min(device[g]) for g in (0, 1))
        row["ratio_to_sum"] = round(flops / row["best_call_s"] / device_sum, 3)
        doc["results"].append(row)
        _print(row)
        for rp in replays:
            rp.release()
        host_pinning.clear()
        write_json(args.json, doc)
    clocks.stop.set()
    write_json(args.json, doc)
    return 0


def _print(row):
    print(f"== zgemmt n = k = {row['n']}: best call {row['best_call_s'] * 1e3:.2f} ms, {row['ratio_to_sum']:.3f} of "
          f"the sum of device cuBLAS; SM clocks (MHz) {row['sm_clock_mhz']}", flush=True)
    for g, r in row["gpus"].items():
        line = "; ".join(f"{kind} " + ", ".join(f"{cls} {v['tflops']:.1f} TF/s ({v['ms']:.1f} ms)"
                                                 for cls, v in r[kind].items()) for kind in KINDS)
        print(f"  GPU {g}: {r['blocks']} products; {line}; device herkx {r['device_herkx_tflops']:.1f} TF/s",
              flush=True)
