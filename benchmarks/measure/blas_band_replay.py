"""Where the band path's kernel time goes on two GPUs: zgemmt (A^H B, lower) with host operands runs ``--calls``
calls after two warm-up calls (page-locked by then); the products of its last call (each GPU's blocks of C and
their k ranges, from cuda.last_stats) are then replayed in the same order on device-resident copies of the
operands, with no transfers: on both GPUs at once, then on each alone, best of ``--repeats`` rounds taken in
turn. Rates are given per class (rectangles: cuBLAS gemm; diagonal blocks: herkx and its diagonal) in the call
and replayed, beside device cuBLAS herkx of the whole triangle on each GPU alone, measured in the same process
between the rounds.

    python3 -m benchmarks.blas band-replay --sizes 8192 16384 --json out.json
"""
import datetime
import platform
import threading

import numpy as np

import hybridblas as hb
from hybridblas import cublas, host_pinning, plan
from hybridblas import problem as P
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_direct
from hybridblas.kernels import compute_block

from benchmarks.common import command_line, refuse, two_gpus, write_json
from benchmarks.measure.blas_gpu import call_device, call_hybrid, make_host, operands, timed


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192, 16384], help="n = k of each run")
    ap.add_argument("--calls", type=positive_int, default=6, help="timed band calls before the replay")
    ap.add_argument("--repeats", type=positive_int, default=3, help="rounds of replays (and device cuBLAS)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


class _Replay:
    """One GPU's copies of the operands and the products of a call to run on them."""

    def __init__(self, cp, g, a, b, n, products):
        self.cp, self.g, self.products = cp, g, products
        with cp.cuda.Device(g):
            self.a, self.b = cp.asarray(a, order="F"), cp.asarray(b, order="F")
            self.c = cp.empty((n, n), np.complex128, order="F")
            self.stream = cp.cuda.Stream(non_blocking=True)
        self.problem = P.build_problem("gemmt", 1.0, [self.a, self.b], 0.0, self.c, [P.C, P.N], True, None)

    def run(self):
        """Seconds of each product, queued back to back on one stream."""
        cp, prob = self.cp, self.problem
        with cp.cuda.Device(self.g), self.stream:
            backend = cublas.Backend(cp.cuda.device.get_cublas_handle(), self.stream)
            factors = list(prob.factors)
            kind, coef, x, y = cuda_direct.rank_kx(prob, factors, beta=1.0)
            events = []
            for i0, i1, j0, j1, k0, k1, diag, _t in self.products:
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(self.stream)
                out = self.c[i0:i1, j0:j1]
                if diag:
                    cuda_direct.gemmt_kx(backend, kind, coef, x.block(i0, i1, k0, k1), y.block(k0, k1, i0, i1), out,
                                         True, 0.0)
                else:
                    compute_block(backend, prob, plan.make_task(prob, i0, i1, j0, j1, k0, k1), out, 0.0,
                                  factors=factors)
                end.record(self.stream)
                events.append((start, end))
            self.stream.synchronize()
        return [cp.cuda.get_elapsed_time(s, e) / 1e3 for s, e in events]

    def device_herkx(self):
        """Seconds of device cuBLAS herkx of the whole triangle."""
        cp = self.cp
        with cp.cuda.Device(self.g):
            return min(timed(lambda: call_device("zgemmt", (1.0, self.a, self.b), self.c),
                             lambda: cp.cuda.Device(self.g).synchronize(), 2))

    def release(self):
        with self.cp.cuda.Device(self.g):
            self.a = self.b = self.c = self.problem = None
            self.cp.get_default_memory_pool().free_all_blocks()


def _rates(problem, products, seconds):
    """TF/s and ms per class (rect, diag) and in all of ``products`` timed at ``seconds``."""
    out = {}
    for name, keep in (("rect", lambda d: not d), ("diag", lambda d: d), ("all", lambda d: True)):
        flops = sum(problem.tile_flops(i1 - i0, j1 - j0, k1 - k0, diag=d)
                    for (i0, i1, j0, j1, k0, k1, d, _), t in zip(products, seconds) if keep(d))
        time = sum(t for x, t in zip(products, seconds) if keep(x[6]))
        out[name] = {"tflops": round(flops / max(time, 1e-12) / 1e12, 2), "ms": round(time * 1e3, 3)}
    return out


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp = two_gpus("band-replay")
    from hybridblas.devices.cuda import CUDADevice, last_stats
    ctx = hb.Context(devices=[CUDADevice(0), CUDADevice(1)])
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
        sync = lambda: [cp.cuda.Device(g).synchronize() for g in (0, 1)]      # noqa: E731
        calls = timed(lambda: call_hybrid("zgemmt", host_args, kw, c, ctx), sync, args.calls)
        stats = {g: last_stats[f"cuda:{g}"] for g in (0, 1)}
        if any(st.get("path") != "bands" for st in stats.values()):
            refuse(f"zgemmt n = {n} did not take the band path on both GPUs: nothing to replay")
        replays = [_Replay(cp, g, a, b, n, stats[g]["products"]) for g in (0, 1)]
        both, alone, device = [[], []], [[], []], [[], []]
        for _ in range(args.repeats):
            results = [None, None]

            def one(g):
                results[g] = replays[g].run()
            threads = [threading.Thread(target=one, args=(g,)) for g in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for g in (0, 1):
                both[g].append(results[g])
                alone[g].append(replays[g].run())
                device[g].append(replays[g].device_herkx())
        flops = 4.0 * n * n * n
        row = dict(routine="zgemmt", n=n, k=n, calls_s=calls, best_call_s=min(calls[1:] or calls), gpus={})
        for g in (0, 1):
            products = stats[g]["products"]
            in_call = [x[7] for x in products]
            row["gpus"][g] = dict(
                blocks=len(products), wall_s=stats[g]["wall_s"], lead_s=stats[g]["lead_s"],
                gaps_s=stats[g]["gaps_s"], tail_s=stats[g]["tail_s"],
                in_call=_rates(replays[g].problem, products, in_call),
                replayed_both=_rates(replays[g].problem, products, min(both[g], key=sum)),
                replayed_alone=_rates(replays[g].problem, products, min(alone[g], key=sum)),
                device_herkx_tflops=round(flops / min(device[g]) / 1e12, 2))
        device_sum = sum(flops / min(device[g]) for g in (0, 1))
        row["ratio_to_sum"] = round(flops / row["best_call_s"] / device_sum, 3)
        doc["results"].append(row)
        print(f"== zgemmt n = k = {n}: best call {row['best_call_s'] * 1e3:.2f} ms, {row['ratio_to_sum']:.3f} of the "
              f"sum of device cuBLAS", flush=True)
        for g, r in row["gpus"].items():
            line = "; ".join(f"{where} " + ", ".join(f"{cls} {v['tflops']:.1f} TF/s ({v['ms']:.1f} ms)"
                                                      for cls, v in r[where].items())
                             for where in ("in_call", "replayed_both", "replayed_alone"))
            print(f"  GPU {g}: {r['blocks']} products; {line}; device herkx {r['device_herkx_tflops']:.1f} TF/s",
                  flush=True)
        for rp in replays:
            rp.release()
        host_pinning.clear()
        write_json(args.json, doc)
    write_json(args.json, doc)
    return 0
