"""hybridblas-tune: info | calibrate | show, each with --json (also `python -m hybridblas.tuning`)."""
import argparse
import json
import platform
import sys
import time

from .. import __version__, blas_threads
from .. import profile as prof_mod
from .calibrate import Settings, calibrate_to, default_devices
from .measure import ROUTINES, combos
from .progress import Progress


def _profile_status():
    """(path or None, status line, Profile or None) without raising or warning."""
    path = prof_mod.find_profile()
    if path is None:
        return None, "none (defaults in use)", None
    try:
        p = prof_mod.read_profile(path)
    except prof_mod.ProfileError as exc:
        return str(path), f"ignored: {exc}", None
    if not p.matches():
        return str(path), f"ignored: measured on another node ({p.id})", None
    return str(path), "loaded", p


def node_info():
    fp = prof_mod.current_fingerprint()
    path, status, _ = _profile_status()
    devices = [{"name": "cpu", "kind": "cpu", "model": fp["cpu_model"], "cores": fp["cpu_cores"],
                "usable_cores": blas_threads.available_cores()}]
    devices += [{"name": f"cuda:{i}", "kind": "cuda", "model": n} for i, n in enumerate(fp["gpus"])]
    return {"hybridblas": __version__, "python": platform.python_version(), "devices": devices,
            "gpus": {"count": fp["gpu_count"], "names": fp["gpus"], "driver": fp["driver"], "cuda": fp["cuda"]},
            "blas": blas_threads.blas_info(), "fingerprint": fp,
            "profile": {"file_name": prof_mod.profile_filename(), "search_dirs": [str(d) for d in prof_mod.search_dirs()],
                        "active": path, "status": status}}


def cmd_info(args):
    info = node_info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"hybridblas {info['hybridblas']} (Python {info['python']})")
    for d in info["devices"]:
        extra = f", {d['cores']} cores ({d['usable_cores']} usable)" if d["kind"] == "cpu" else ""
        print(f"  {d['name']:8s} {d['model']}{extra}")
    g = info["gpus"]
    if g["count"]:
        print(f"  driver {g['driver']}, CUDA runtime {g['cuda']}")
    for lib in info["blas"]:
        print(f"  BLAS: {lib.get('internal_api')} {lib.get('version')} ({lib.get('threading_layer')}, "
              f"{lib.get('num_threads')} threads) {lib.get('filepath')}")
    p = info["profile"]
    print(f"profile file name: {p['file_name']}")
    print(f"searched: {', '.join(p['search_dirs'])}")
    print(f"active profile: {p['active'] or '-'} [{p['status']}]")
    return 0


def _settings(args):
    s = Settings.quick() if args.quick else Settings.thorough()
    if args.routines:
        s.routines = tuple(args.routines)
    if args.dtypes:
        s.dtypes = tuple(args.dtypes)
    if args.sizes:
        s.sizes = {"cpu": tuple(args.sizes), "cuda": tuple(args.sizes)}
        s.max_call_s = float("inf")
    return s


def cmd_calibrate(args):
    try:
        settings = _settings(args)
        settings.validate()
    except ValueError as exc:
        print(f"hybridblas-tune: {exc}", file=sys.stderr)
        return 2
    devices = args.devices or default_devices()
    t0 = time.perf_counter()
    work = combos(settings.routines, settings.dtypes)
    gpus = [d for d in devices if not d.startswith("cpu")]
    blocks = {"all": len(work), "first": 1, "none": 0}[settings.block_sweep]
    total = len(devices) * (len(work) + blocks) + len(gpus) + (len(work) if gpus and len(gpus) < len(devices) else 0)
    progress = Progress(total, enabled=not args.no_progress)
    progress.note(f"hybridblas-tune: {settings.mode} calibration of {', '.join(devices)} "
                  f"({len(work)} routine/dtype pairs)")
    try:
        path, log_path, data = calibrate_to(args.output, devices, settings, progress)
    except ValueError as exc:
        progress.close()
        print(f"hybridblas-tune: {exc}", file=sys.stderr)
        return 2
    progress.close()
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"profile_path": str(path), "log_path": str(log_path), "seconds": round(seconds, 2),
                          "mode": settings.mode, "devices": devices, "profile": data}, indent=2, default=str))
    else:
        print(f"wrote {path}\n  log {log_path}\n  {settings.mode} calibration took {seconds:.1f} s")
    return 0


def _load_for_show(args):
    if args.file:
        try:
            return prof_mod.read_profile(args.file), None
        except prof_mod.ProfileError as exc:
            return None, f"{args.file}: {exc}"
    path, status, p = _profile_status()
    return p, None if p else f"no usable profile for this node: {status}"


def cmd_show(args):
    p, why = _load_for_show(args)
    if p is None:
        print(json.dumps(None) if args.json else f"hybridblas-tune: {why}", file=sys.stdout if args.json else sys.stderr)
        return 1
    if args.plot:
        from .plot import plot_rates
        try:
            plot_rates(p, args.plot)
        except ImportError:
            print("hybridblas-tune: --plot needs matplotlib (pip install 'hybridblas[plot]')", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({"path": str(p.path) if p.path else None, "id": p.id, "profile": p.to_dict()},
                         indent=2, default=str))
        return 0
    d = p.to_dict()
    print(f"profile {p.path} ({d.get('mode')}, {d.get('created')})")
    for name, e in d["devices"].items():
        print(f"{name}: {e.get('model')}" + (f", {e['threads']} threads" if e.get("threads") else ""))
        for routine, per in e.get("rates", {}).items():
            for dt, table in per.items():
                cells = "  ".join(f"n={n}: {r / 1e9:8.1f}" for n, r in sorted(table.items()))
                print(f"  {routine:5s} {dt:10s} GFLOP/s  {cells}")
        blocks = e.get("block_size") or {}
        if blocks:
            print(f"  block size: default {blocks.get('default')}")
        for k, v in (e.get("transfer") or {}).items():
            print(f"  {k:12s} {v / 1e9:6.1f} GB/s")
    for routine, per in (d.get("static") or {}).items():
        for dt, per_n in per.items():
            for n, s in per_n.items():
                print(f"static {routine} {dt} n={n}: CPU share {s['cpu_share']:.3f} "
                      f"({'helps' if s['cpu_helps'] else 'does not help'})")
    return 0


def build_parser():
    ap = argparse.ArgumentParser(prog="hybridblas-tune", description="Measure this node and manage its "
                                 "hybridblas profile (rates, block sizes, CPU share, transfer rates).")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="devices, BLAS libraries, GPUs, fingerprint, the active profile")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("calibrate", help="measure this node and write its profile")
    p.add_argument("--quick", action="store_true", help="a short run (<= 2 min on a GPU node)")
    p.add_argument("--devices", nargs="+", metavar="DEV", help="devices to measure (default: cpu and every GPU)")
    p.add_argument("--output", metavar="DIR", help=f"directory to write to (default: ${prof_mod.ENV_DIR} "
                   "or ~/.config/hybridblas/profiles)")
    p.add_argument("--routines", nargs="+", choices=ROUTINES, help="routines to measure (default: all)")
    p.add_argument("--dtypes", nargs="+", choices=("float32", "float64", "complex64", "complex128"))
    p.add_argument("--sizes", nargs="+", type=int, metavar="N", help="problem edges to measure (every device)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("show", help="print the active profile")
    p.add_argument("--file", metavar="PATH", help="show this profile file instead of the active one")
    p.add_argument("--plot", metavar="PNG", help="also plot each device's rate against size (matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)
