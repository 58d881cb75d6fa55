"""hybridblas on host operands over two GPUs while another process runs products on GPU 1 (a node shared with
another job, or a GPU that throttles). A band call sizes each GPU's band by the kernel rates earlier calls
measured; a GPU measured well below its speed starts its readings anew (cuda_bands.DROP, and _Call._rebalance for
calls that give no speed reading), and a layout whose shares moved far is made in the call
(band_plan.STALE_SHARE). Per size and routine, in one process, the load running from the start:

  - device cuBLAS on GPU 0 and on GPU 1 (with the load), each alone, best of three;
  - hybridblas on GPU 0 alone, host operands: the same call on the best single device of the pair;
  - hybridblas on GPUs 0 and 1, host operands: ``--calls`` calls from the routine's first, each with its time and
    each GPU's share of the products' flops and its kernel seconds, and its time over the call on GPU 0 alone;
  - the load stopped: ``--after`` more calls on both GPUs.

    python3 -m benchmarks.blas shared-gpu --sizes 16384 --routines zgemmt zher2k --calls 10 --after 6 --json out.json

Each call's result is checked on sampled entries (the worst error is reported).
"""
import subprocess
import sys

import numpy as np

import hybridblas as hb
from hybridblas import host_pinning
from hybridblas.console import check_output_path, nonnegative_int, positive_int
from hybridblas.devices import cuda
from hybridblas.devices.cuda import CUDADevice

from benchmarks.common import gpu_sync, two_gpu_run, write_json
from benchmarks.measure.blas_band_settings import device_alone
from benchmarks.measure.blas_gpu import FLOPS, ROUTINES, call_device, call_hybrid, host_cases, sample_error, timed

LOAD = """
import sys
import cupy as cp
cp.cuda.Device(int(sys.argv[1])).use()
rs = cp.random.RandomState(3)
a = rs.standard_normal((4096, 4096)) + 1j * rs.standard_normal((4096, 4096))
b = a @ a
cp.cuda.runtime.deviceSynchronize()
print("ready", flush=True)
while True:
    for _ in range(4):
        b = a @ a
    cp.cuda.runtime.deviceSynchronize()
"""


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[16384], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=["zgemmt", "zher2k"])
    ap.add_argument("--calls", type=positive_int, default=10, help="two-GPU calls with the load running")
    ap.add_argument("--after", type=nonnegative_int, default=6, help="two-GPU calls after the load stopped")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed calls of hybridblas on GPU 0 alone")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


class Load:
    """Another process running complex128 products of 4096 x 4096 matrices on GPU ``gpu`` without pause."""

    def __init__(self, gpu):
        self.proc = subprocess.Popen([sys.executable, "-c", LOAD, str(gpu)], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("the load process did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def shares(names):
    """Per GPU of the last band call (cuda.last_stats): (its share of the products' flops, its kernel seconds,
    whether the call was its layout's first)."""
    flops, out = [], []
    for name in names:
        st = cuda.last_stats.get(name, {})
        kernels = st.get("kernels") or {}
        flops.append(sum(v["s"] * v["tflops"] for v in kernels.values()))
        out.append((st.get("kernel_s", 0.0), bool(st.get("new_layout"))))
    total = sum(flops) or 1.0
    return [(f / total, s, new) for f, (s, new) in zip(flops, out)]


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    cp, ctx, gpus, doc = two_gpu_run("shared-gpu", "bench_blas_shared_gpu", load_gpu=1)
    names = [f"cuda:{g}" for g in gpus]
    one = hb.Context(devices=[CUDADevice(0)])
    sync = gpu_sync(cp, gpus)
    rng = np.random.default_rng(11)
    for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
        flops = FLOPS[routine] * n ** 3
        load = Load(1)
        try:
            dev = [device_alone(cp, routine, host_args, n, g) for g in gpus]
            for _ in range(2):
                call_hybrid(routine, host_args, kw, c, one)
            host_pinning.wait_ready()
            hb_one = min(timed(lambda: call_hybrid(routine, host_args, kw, c, one), sync, args.repeats))
            calls, err = [], 0.0
            for i in range(args.calls + args.after):
                if i == args.calls:
                    load.stop()
                t = timed(lambda: call_hybrid(routine, host_args, kw, c, ctx), sync, 1)[0]
                err = max(err, sample_error(routine, host_args, c, rng))
                calls.append(dict(seconds=t, loaded=i < args.calls, gpus=shares(names)))
        finally:
            load.stop()
        doc["results"].append(dict(routine=routine, n=n, device_s=dev, hb_one_gpu_s=hb_one, calls=calls,
                                   rel_error=err))
        print(f"== {routine} n = k = {n} ({flops / 1e12:.1f} Tflop), GPU 1 shared with another "
              f"process; worst sampled error {err:.1e}", flush=True)
        print(f"  device cuBLAS: GPU 0 {dev[0] * 1e3:.1f} ms, GPU 1 {dev[1] * 1e3:.1f} ms; hybridblas on GPU 0, "
              f"host operands: {hb_one * 1e3:.1f} ms", flush=True)
        for i, x in enumerate(calls):
            parts = "  ".join(f"GPU {g}: {sh:.2f} of the flops, kernels {s * 1e3:.1f} ms"
                              + (" (new layout)" if new else "") for g, (sh, s, new) in zip(gpus, x["gpus"]))
            print(f"  call {i + 1:2d} {'loaded' if x['loaded'] else 'free  '} {x['seconds'] * 1e3:9.1f} ms "
                  f"({x['seconds'] / hb_one:4.2f} x on GPU 0 alone)  {parts}", flush=True)
        write_json(args.json, doc)
    write_json(args.json, doc)
    return 0
