"""FLAPW H/S build campaign: end-to-end and BLAS-part TFLOP/s per system, Kmax, device set and BLAS backend.

    python3 -m benchmarks.flapw build --devices cpu --systems NaCl --kmax 2.5 3.0 --out results/
    python3 -m benchmarks.flapw build --devices cuda:0 all --blas hybridblas cublasxt \
        --systems TiO2 --kmax 2.5 3.0 3.5 4.0 --out results/ --cublas-peak
    python3 -m benchmarks.flapw build --devices all --arrays device --systems NaCl --kmax 3.5 \
        --interstitial --kpoints 3 --solve 20 --stages      # a whole build, stage by stage, k-point by k-point

A run builds ``--kpoints`` k-points in turn as ``flapw build`` does (k-independent data first, one workspace
for host arrays; the lower triangles unless --full), each ``--repeat`` times (the fastest kept), and with
``--solve`` times flapw.solve where H and S live. Its JSON holds the first k-point's report (the fastest
repeat), and ``per_kpoint``: every k-point's total, BLAS part and solve seconds, so the first k-point's
one-time costs show as ``first_over_later`` (with --warm-up they are paid before, as flapw build does, and
reported as ``warm_up_seconds``). --stages prints every k-point's per-stage table.

Each (device set, BLAS backend) is a column: "hybridblas" runs every large product through
hybridblas.Context(devices=...); "cublasxt" sends the same calls to hybridblas.peers.cublasxt_* on the
GPUs of that device set (skipped, with a note, when cuBLASXt or a GPU is missing). --cublas-peak measures
one device-resident cuBLAS zherk per GPU (hybridblas.peers.cublas_device_herk) so results can be read as a
fraction of Σ device-resident cuBLAS rates. One JSON per run plus summary.json and a plot go to --out.
"""
import datetime
import os
import platform
import sys
import time

import flapw
from flapw.backends import BackendUnavailable
from flapw.cli import _kpoints, make_backend, gpu_ids
from hybridblas.console import positive_float, positive_int

from benchmarks.common import write_json
from benchmarks.plotting import pyplot, save


def cublas_peak(gpus, n=8192, k=8192, repeat=3):
    """Device-resident cuBLAS zherk rate (flop/s) per GPU, on cupy arrays already on that GPU (n x n from an
    n x k operand: a build's own N_G and batch width with --cublas-shape)."""
    import cupy
    from hybridblas.peers import cublas_device_herk
    rates = {}
    for g in gpus:
        with cupy.cuda.Device(g):
            a = cupy.empty((n, k), complex, order="F")
            a.real[...] = cupy.random.standard_normal((n, k))
            a.imag[...] = cupy.random.standard_normal((n, k))
            c = cupy.zeros((n, n), complex, order="F")
            cublas_device_herk(1.0, a, 0.0, c)
            cupy.cuda.Device(g).synchronize()
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                cublas_device_herk(1.0, a, 0.0, c)
                cupy.cuda.Device(g).synchronize()
                best = min(best, time.perf_counter() - t0)
            rates[f"cuda:{g}"] = 4.0 * k * n * (n + 1) / best
            del a, c
    return rates


def run_one(system, kmax, method, devices, blas, args):
    cell = flapw.System.preset(system, kmax=kmax, supercell=args.supercell)
    backend = make_backend(blas, devices, args.strategy)
    max_bytes = None if args.max_temp_gib is None else int(args.max_temp_gib * 2 ** 30)
    _ = cell.tmats                                           # k-independent set-up, reported separately
    if args.interstitial:
        _ = cell.step_table
    workspace = flapw.Workspace() if args.arrays == "host" else None
    overlap = {"on": True, "off": False}.get(args.overlap)
    warm = {}
    if args.warm_up:                                         # what flapw build pays before its k-point loop
        from flapw.hsdla import _batch_size
        from flapw.warmup import prepare
        largest = max((cell.with_k(k) for k in _kpoints(args.kpoints, cell.k)), key=lambda c: c.n_g)
        warm = prepare(largest, backend, args.arrays, method, _batch_size(largest, method, None, max_bytes),
                       interstitial=args.interstitial, nev=args.solve, workspace=workspace, overlap=bool(overlap))
    per_k, first = [], None
    for ik, k in enumerate(_kpoints(args.kpoints, cell.k)):
        best = None
        for _ in range(args.repeat):
            h, s, rep = flapw.build_hs(cell.with_k(k), method=method, blas=backend, arrays=args.arrays,
                                       interstitial=args.interstitial, lower_only=not args.full,
                                       max_temp_bytes=max_bytes, return_report=True, workspace=workspace,
                                       overlap=overlap)
            d = rep.as_dict()
            if args.solve:
                t0 = time.perf_counter()
                values = flapw.solve(h, s, args.solve)
                d["solve_seconds"] = time.perf_counter() - t0
                d["eigenvalues"] = values.tolist()
            del h, s
            if best is None or d["total_seconds"] < best["total_seconds"]:
                best, table = d, rep.table()
        if args.stages:
            solve = f"\nsolve {best['solve_seconds']:.3f} s" if args.solve else ""
            print(f"k-point {ik + 1}/{args.kpoints}:\n{table}{solve}", flush=True)
        per_k.append({key: best.get(key) for key in ("N_G", "total_seconds", "blas_seconds", "solve_seconds")})
        first = first or best
    first.update(system=system, kmax=kmax, devices=devices, blas=blas, arrays=args.arrays,
                 interstitial=args.interstitial, triangle="full" if args.full else "lower", per_kpoint=per_k,
                 setup_seconds=cell.setup_seconds(), warm_up_seconds=warm)
    if len(per_k) > 1:
        later = sorted(p["total_seconds"] for p in per_k[1:])[(len(per_k) - 2) // 2]       # their median
        first["first_over_later"] = per_k[0]["total_seconds"] / later
    return first


def plot(results, path):
    """End-to-end and BLAS-part TF/s against Kmax, one line per system, method, device set and BLAS."""
    plt = pyplot(required=False)
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, title in ((axes[0], "total_tflops", "end-to-end"), (axes[1], "blas_tflops", "BLAS part")):
        series = {}
        for r in results:
            label = f"{r['system']} {r['method']} {r['devices']} {r['blas']}"
            series.setdefault(label, []).append((r["kmax"], r[key]))
        for label, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        ax.set_xlabel("Kmax (1/bohr)")
        ax.set_title(f"FLAPW H/S build, {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (LAWN 41)")
    axes[1].legend(fontsize=7)
    return save(fig, path, dpi=120)


def add_arguments(p):
    p.add_argument("--devices", nargs="+", default=["cpu"], help="device sets, e.g. cpu cuda:0 all")
    p.add_argument("--blas", nargs="+", default=["hybridblas"], choices=("hybridblas", "cublasxt"))
    p.add_argument("--systems", nargs="+", default=["NaCl"], choices=sorted(flapw.PRESETS))
    p.add_argument("--kmax", nargs="+", type=float, default=[2.5])
    p.add_argument("--methods", nargs="+", default=["refined"], choices=flapw.METHODS)
    p.add_argument("--supercell", type=int, nargs=3, default=None, help="override the presets' supercells")
    p.add_argument("--strategy", default="auto", choices=("static", "dynamic", "auto"))
    p.add_argument("--arrays", default="host", choices=("host", "device"))
    p.add_argument("--max-temp-gib", type=positive_float, default=None)
    p.add_argument("--repeat", type=positive_int, default=1)
    p.add_argument("--interstitial", action="store_true", help="add the interstitial part, as flapw build does")
    p.add_argument("--full", action="store_true", help="fill the upper triangles too (default: the lower ones)")
    p.add_argument("--kpoints", type=positive_int, default=1, help="k-points built in turn (the first shows one-time costs)")
    p.add_argument("--solve", type=int, default=0, metavar="NEV", help="time flapw.solve for NEV eigenvalues")
    p.add_argument("--overlap", default="auto", choices=("auto", "on", "off"),
                   help="host arrays: the host work beside the BLAS calls (build_hs's overlap=)")
    p.add_argument("--stages", action="store_true", help="print every k-point's per-stage table")
    p.add_argument("--warm-up", action="store_true",
                   help="pay the first-use costs before the k-points, as flapw build does (flapw.warmup.prepare)")
    p.add_argument("--cublas-peak", action="store_true", help="measure device-resident cuBLAS zherk per GPU")
    p.add_argument("--cublas-shape", type=int, nargs=2, default=(8192, 8192), metavar=("N", "K"),
                   help="the zherk of --cublas-peak: C is N x N, A is N x K (e.g. a build's N_G and atoms x N_L)")
    p.add_argument("--out", default="bench-flapw-results")


def run(args):
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "argv": sys.argv,
            "skipped": []}
    if args.cublas_peak:
        gpus = gpu_ids("all")
        meta["cublas_device_zherk_flops"] = cublas_peak(gpus, *args.cublas_shape) if gpus else {}
        meta["cublas_shape"] = list(args.cublas_shape)
    results = []
    for devices in args.devices:
        for blas in args.blas:
            for system in args.systems:
                for kmax in args.kmax:
                    for method in args.methods:
                        tag = f"{system}_k{kmax}_{method}_{devices.replace(',', '+').replace(':', '')}_{blas}"
                        try:
                            r = run_one(system, kmax, method, devices, blas, args)
                        except (BackendUnavailable, ValueError) as exc:
                            note = f"{tag}: skipped ({exc})"
                            print(note, file=sys.stderr)
                            meta["skipped"].append(note)
                            continue
                        if meta.get("cublas_device_zherk_flops"):
                            used = gpu_ids(devices) if devices != "cpu" else []
                            peak = sum(v for k, v in meta["cublas_device_zherk_flops"].items()
                                       if int(k.split(":")[1]) in used)
                            r["fraction_of_cublas_sum"] = (r["total_flops"] / r["total_seconds"] / peak) if peak else None
                        results.append(r)
                        write_json(os.path.join(args.out, tag + ".json"), r)
                        print(f"{tag}: N_G={r['N_G']} {r['total_seconds']:.2f} s end-to-end "
                              f"{r['total_tflops']:.3f} TFLOP/s, BLAS part {r['blas_tflops']:.3f} TFLOP/s, "
                              f"peak temp {r['peak_temp_bytes'] / 2**30:.2f} GiB", flush=True)
    write_json(os.path.join(args.out, "summary.json"), {"meta": meta, "results": results})
    if results:
        plot(results, os.path.join(args.out, "flapw_tflops.png"))
    return 0
