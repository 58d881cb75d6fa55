"""Hand sweep of the static strategy's ratios, against the ratios the node profile calibrated.

For each CPU share s the static splitter runs with forced rates (CPU: s/(1-s) * sum of GPU rates; GPUs
at their profile rates, else equal); for each GPU split f (two GPUs) the first GPU gets the fraction f of
the GPU work and the CPU none. Then the same call runs with no forced rates, i.e. with what
`hybridblas-tune calibrate` stored. All points run in one process on the same inputs, interleaved: every
round calls each point once, so a drift of the node (clocks, temperature) hits all points alike. Reports
the best swept point, the calibrated one, and calibrated_time / best_time (acceptance: <= 1.05 on two
H200s).

    python3 -m benchmarks.blas sweep-ratio --routine herk --dtype complex128 --n 24576 \
        --devices cpu cuda:0 cuda:1 --shares 0.005 0.01 0.02 --gpu-splits 0.46 0.5 0.54 --rounds 5 --json out.json
"""
import datetime
import sys
import time

import numpy as np

import hybridblas as hb
from hybridblas.console import check_output_path, nonnegative_int, positive_int
from hybridblas.tuning.measure import flops

from benchmarks.common import refuse, write_json


def operands(routine, n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    def rand(r, c):
        x = rng.standard_normal((r, c))
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal((r, c))
        return np.asfortranarray(x.astype(dtype))
    a = rand(n, k)
    b = rand(n, k) if routine in ("her2k", "gemmt") else (rand(k, n) if routine == "gemm" else None)
    return a, b, np.zeros((n, n), dtype=dtype, order="F")


def call(routine, a, b, c, ctx):
    """One call of the routine on the operands with ``ctx``."""
    fn = getattr(hb, routine)
    if b is None:
        fn(1.0, a, 0.0, c, context=ctx)
    elif routine == "gemmt":
        fn(1.0, a, b, 0.0, c, transb="C", context=ctx)
    else:
        fn(1.0, a, b, 0.0, c, context=ctx)


def add_arguments(ap):
    ap.add_argument("--routine", default="herk", choices=("herk", "her2k", "gemmt", "syrk", "gemm"))
    ap.add_argument("--dtype", default="complex128")
    ap.add_argument("--n", type=positive_int, default=8192)
    ap.add_argument("--k", type=positive_int, default=None, help="inner dimension (default: n)")
    ap.add_argument("--devices", nargs="+", default=None, help="default: cpu and every GPU")
    ap.add_argument("--shares", nargs="+", type=float,
                    default=[0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5])
    ap.add_argument("--gpu-splits", nargs="*", type=float, default=[],
                    help="fractions of the GPU work for the first of two GPUs (CPU share 0)")
    ap.add_argument("--rounds", type=positive_int, default=5, help="timed calls per point, one per round")
    ap.add_argument("--warmup", type=nonnegative_int, default=2,
                    help="untimed calls per point first (the second one page-locks host operands)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def run(args):
    check_output_path(args.json, "--json")
    k = args.k or args.n
    base = hb.Context(devices=args.devices or "all", strategy="static")
    names = [d.name for d in base.devices]
    cpus = [x for x in names if x.startswith("cpu")]
    gpus = [x for x in names if not x.startswith("cpu")]
    if len(cpus) != 1:
        refuse(f"--devices needs exactly one 'cpu' (and GPUs), got {names}")
    a, b, c = operands(args.routine, args.n, k, args.dtype)
    fl = flops(args.routine, args.n, args.dtype) * k / args.n
    prof = base.profile
    g_rates = {g: (prof.rate(g, args.routine, np.dtype(args.dtype), max(args.n, k)) if prof else None) or 1.0
               for g in gpus}
    g_sum = sum(g_rates.values())
    points = []   # (label, cpu share, context)
    if gpus:
        points.append(("gpu-only", 0.0, hb.Context(devices=gpus, strategy="static", rates=g_rates,
                                                   profile=False)))
    for s in args.shares:
        if not 0 < s < 1 or not gpus:
            continue
        rates = dict(g_rates, **{cpus[0]: s / (1 - s) * g_sum})
        # cpu_min_share=0: without it a share under 5 % would silently run GPU-only
        points.append((f"cpu {s:g}", s, hb.Context(devices=names, strategy="static", rates=rates,
                                                    profile=False, cpu_min_share=0.0)))
    for f in args.gpu_splits:
        if len(gpus) != 2 or not 0 < f < 1:
            refuse(f"--gpu-splits needs two GPUs and fractions in (0, 1), got {f} with {gpus}")
        rates = {gpus[0]: f * g_sum, gpus[1]: (1 - f) * g_sum}
        points.append((f"gpu0 {f:g}", 0.0, hb.Context(devices=gpus, strategy="static", rates=rates,
                                                       profile=False)))
    if prof is not None:
        size = max(args.n, k)
        calibrated = prof.cpu_share(args.routine, np.dtype(args.dtype), size)
        helps = prof.cpu_helps(args.routine, np.dtype(args.dtype), size)
        points.append(("calibrated", calibrated if helps is not False and calibrated is not None else 0.0,
                       hb.Context(devices=names, strategy="static")))
    if not points:
        refuse(f"nothing to sweep on {names}: give GPUs, or calibrate a profile first")
    for _ in range(args.warmup):
        for _, _, ctx in points:
            call(args.routine, a, b, c, ctx)
    times = {label: [] for label, _, _ in points}
    for r in range(args.rounds):
        for label, _, ctx in points:
            t0 = time.perf_counter()
            call(args.routine, a, b, c, ctx)
            times[label].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for label, share, _ in points:
        t = sorted(times[label])
        rows.append({"label": label, "cpu_share": share, "best_s": t[0], "median_s": t[len(t) // 2],
                     "times_s": times[label], "tflops": fl / t[0] / 1e12})
        print(f"{label:>12s}  share {share:6.3f}  best {t[0]:8.4f} s  median {t[len(t) // 2]:8.4f} s  "
              f"{fl / t[0] / 1e12:7.2f} TFLOP/s", file=sys.stderr, flush=True)
    best = min(rows, key=lambda r: r["best_s"])
    cal = next((r for r in rows if r["label"] == "calibrated"), None)
    result = {"date": datetime.date.today().isoformat(), "routine": args.routine, "dtype": args.dtype,
              "n": args.n, "k": k, "devices": names, "profile": str(prof.path) if prof else None,
              "points": rows, "best": best,
              "calibrated_over_best": cal["best_s"] / best["best_s"] if cal else None,
              "calibrated_over_best_median": (cal["median_s"] / min(r["median_s"] for r in rows)
                                              if cal else None)}
    print(f"best: {best['label']} share {best['cpu_share']}: {best['best_s']:.4f} s; "
          + (f"calibrated/best = {result['calibrated_over_best']:.3f}" if cal else "no profile: run "
             "`hybridblas-tune calibrate` first"))
    write_json(args.json, result)
    return 0
