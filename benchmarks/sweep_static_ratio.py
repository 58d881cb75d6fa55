"""Hand sweep of the static strategy's CPU share, against the share the node profile calibrated.

For each CPU share s the static splitter runs with forced rates (CPU: s/(1-s) * sum of GPU rates; GPUs
at their profile rates, else equal), all in one process on the same inputs; then the same call runs
with no forced rates, i.e. with what `hybridblas-tune calibrate` stored. Reports the best swept share,
the calibrated one, and calibrated_time / best_time (acceptance: <= 1.05 on two H200s).

    python benchmarks/sweep_static_ratio.py --routine herk --dtype complex128 --n 16384 --k 16384 \
        --devices cpu cuda:0 cuda:1 --shares 0 0.01 0.02 0.03 0.05 0.075 0.1 0.15 0.2 --json out.json
"""
import argparse
import datetime
import json
import sys

import numpy as np

import hybridblas as hb
from hybridblas.tuning.measure import bench, flops


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


def run(routine, a, b, c, ctx):
    fn = getattr(hb, routine)
    if b is None:
        fn(1.0, a, 0.0, c, context=ctx)
    elif routine == "gemmt":
        fn(1.0, a, b, 0.0, c, transb="C", context=ctx)
    else:
        fn(1.0, a, b, 0.0, c, context=ctx)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routine", default="herk", choices=("herk", "her2k", "gemmt", "syrk", "gemm"))
    ap.add_argument("--dtype", default="complex128")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=None, help="inner dimension (default: n)")
    ap.add_argument("--devices", nargs="+", default=None, help="default: cpu and every GPU")
    ap.add_argument("--shares", nargs="+", type=float,
                    default=[0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5])
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds of repetitions per point")
    ap.add_argument("--reps", type=int, default=3, help="at least this many timed calls per point")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")
    args = ap.parse_args(argv)
    k = args.k or args.n
    base = hb.Context(devices=args.devices or "all", strategy="static")
    names = [d.name for d in base.devices]
    cpus = [x for x in names if x.startswith("cpu")]
    gpus = [x for x in names if not x.startswith("cpu")]
    if len(cpus) != 1:
        ap.error(f"--devices needs exactly one 'cpu' (and GPUs), got {names}")
    a, b, c = operands(args.routine, args.n, k, args.dtype)
    fl = flops(args.routine, args.n, args.dtype) * k / args.n
    prof = base.profile
    g_rates = {g: (prof.rate(g, args.routine, np.dtype(args.dtype), max(args.n, k)) if prof else None) or 1.0
               for g in gpus}
    g_sum = sum(g_rates.values())
    rows = []
    def point(label, share, ctx):
        best, median, reps = bench(lambda: run(args.routine, a, b, c, ctx), args.min_time, args.reps)
        rows.append({"label": label, "cpu_share": share, "best_s": best, "median_s": median, "reps": reps,
                     "tflops": fl / best / 1e12})
        print(f"{label:>12s}  share {share if share is not None else float('nan'):6.3f}  "
              f"{best:8.4f} s  {fl / best / 1e12:7.2f} TFLOP/s", file=sys.stderr, flush=True)
    if gpus:
        point("gpu-only", 0.0, hb.Context(devices=gpus, strategy="static", rates=g_rates, profile=False))
    for s in args.shares:
        if not 0 < s < 1 or not gpus:
            continue
        rates = dict(g_rates, **{cpus[0]: s / (1 - s) * g_sum})
        point("swept", s, hb.Context(devices=names, strategy="static", rates=rates, profile=False))
    calibrated = None
    if prof is not None:
        size = max(args.n, k)
        calibrated = prof.cpu_share(args.routine, np.dtype(args.dtype), size)
        helps = prof.cpu_helps(args.routine, np.dtype(args.dtype), size)
        point("calibrated", calibrated if helps is not False else 0.0, hb.Context(devices=names, strategy="static"))
    best = min(rows, key=lambda r: r["best_s"])
    cal = next((r for r in rows if r["label"] == "calibrated"), None)
    result = {"date": datetime.date.today().isoformat(), "routine": args.routine, "dtype": args.dtype,
              "n": args.n, "k": k, "devices": names, "profile": str(prof.path) if prof else None,
              "points": rows, "best": best,
              "calibrated_over_best": cal["best_s"] / best["best_s"] if cal else None}
    print(f"best: {best['label']} share {best['cpu_share']}: {best['best_s']:.4f} s; "
          + (f"calibrated/best = {result['calibrated_over_best']:.3f}" if cal else "no profile: run "
             "`hybridblas-tune calibrate` first"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
