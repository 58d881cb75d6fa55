"""hybridblas-tune: info | calibrate | show, each with --json (also `python -m hybridblas.tuning`).

Every argument is checked before any measurement (the output folder included); errors are one line and
an exit code (hybridblas.console.run_main): 2 for bad input, 1 for no usable profile to show.
"""
import json
import logging
import platform
import sys
import time
from pathlib import Path

from .. import __version__, blas_threads, memory
from ..console import CLIError, add_common_options, check_output_path, positive_int, run_main, tool_parser
from ..devspec import parse_devices
from ..profile import node, search
from ..profile.model import ProfileError
from ..profile.store import read_profile
from .calibrate import Settings, calibrate_to, default_devices
from .measure import ROUTINES, combos, host_bytes

PROG = "hybridblas-tune"
log = logging.getLogger(PROG)


def _profile_status():
    """(path or None, status line, Profile or None) without raising or warning."""
    path = search.find_profile()
    if path is None:
        return None, "none (defaults in use)", None
    try:
        p = read_profile(path)
    except ProfileError as exc:
        return str(path), f"ignored: {exc}", None
    if not p.matches():
        return str(path), f"ignored: measured on another node ({p.id})", None
    return str(path), "loaded", p


def node_info():
    fp = node.current_fingerprint()
    path, status, _ = _profile_status()
    devices = [{"name": "cpu", "kind": "cpu", "model": fp["cpu_model"], "cores": fp["cpu_cores"],
                "usable_cores": blas_threads.available_cores()}]
    devices += [{"name": f"cuda:{i}", "kind": "cuda", "model": n} for i, n in enumerate(fp["gpus"])]
    return {"hybridblas": __version__, "python": platform.python_version(), "devices": devices,
            "gpus": {"count": fp["gpu_count"], "names": fp["gpus"], "driver": fp["driver"], "cuda": fp["cuda"]},
            "blas": blas_threads.blas_info(), "fingerprint": fp,
            "profile": {"file_name": node.profile_filename(), "search_dirs": [str(d) for d in search.search_dirs()],
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
        s.sizes = {"cpu": tuple(sorted(set(args.sizes))), "cuda": tuple(sorted(set(args.sizes)))}
        s.max_call_s = float("inf")
    if not combos(s.routines, s.dtypes):
        raise CLIError(f"--routines {' '.join(s.routines)} with --dtypes {' '.join(s.dtypes)} leave nothing to "
                       f"measure (herk and her2k are measured for complex dtypes only)")
    s.validate()
    return s


def _check_sizes_fit(args, settings):
    """Explicit --sizes are all measured (no time limit): refuse, before any work, one whose operands
    would not fit in host memory."""
    if args.sizes:
        n = max(args.sizes)
        memory.require(max(host_bytes(n, dt) for dt in settings.dtypes), where="host",
                       what=f"--sizes {n} (the operands of one call)", advice="give smaller --sizes")


def _output_folder(output):
    """The folder the profile and its calibration log go to, checked before any work: an explicit
    --output must be an existing, writable folder; the default one is made if missing."""
    if output is not None:
        if not str(output).strip():
            raise CLIError(f"--output {output!r}: give the folder to write the profile into")
        folder, option = Path(output).expanduser(), "--output"
        if folder.exists() and not folder.is_dir():
            raise CLIError(f"--output {output!r} is a file; give the folder to write the profile into")
        if not folder.is_dir():
            raise CLIError(f"--output {output!r}: the folder does not exist (create it first)")
    else:
        folder, option = search.default_output_dir(), "profile"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CLIError(f"cannot create the profile folder {str(folder)!r} ({exc.strerror or exc}); "
                           f"choose one with --output DIR") from None
    stem = node.fingerprint_id(node.current_fingerprint())
    for name in (stem + ".yaml", stem + ".calibration.json"):
        check_output_path(folder / name, option)
    return folder


def cmd_calibrate(args):
    settings = _settings(args)
    devices = parse_devices(",".join(args.devices), name="--devices").names if args.devices else default_devices()
    _check_sizes_fit(args, settings)
    folder = _output_folder(args.output)
    work = combos(settings.routines, settings.dtypes)
    log.info(f"{settings.mode} calibration of {', '.join(devices)} ({len(work)} routine/dtype pairs)")
    t0 = time.perf_counter()
    show = not (args.no_progress or args.quiet or args.verbose)     # -v logs each step instead of a bar
    path, log_path, data = calibrate_to(folder, devices, settings, show_progress=show)
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"profile_path": str(path), "log_path": str(log_path), "seconds": round(seconds, 2),
                          "mode": settings.mode, "devices": devices, "profile": data}, indent=2, default=str))
    else:
        print(f"wrote {path}\n  log {log_path}\n  {settings.mode} calibration took {seconds:.1f} s")
    return 0


PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".eps", ".ps")


def cmd_show(args):
    for option, value in (("--file", args.file), ("--plot", args.plot)):
        if value is not None and not str(value).strip():
            raise CLIError(f"{option} {value!r}: give a file name")
    check_output_path(args.plot, "--plot")
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise CLIError(f"--plot {args.plot!r}: the figure's name must end in {', '.join(PLOT_SUFFIXES)}")
    if args.file is not None:
        try:
            p = read_profile(args.file)
        except ProfileError as exc:
            raise CLIError(f"--file {args.file!r}: {exc}") from None
    else:
        path, status, p = _profile_status()
        if p is None:
            if args.json:
                print(json.dumps(None))
            where = f" ({path})" if path else ""
            print(f"{PROG}: no usable profile for this node{where}: {status}", file=sys.stderr)
            return 1
    if args.plot:
        from .plot import plot_rates
        try:
            plot_rates(p, args.plot)
        except ValueError as exc:
            raise CLIError(f"--plot {args.plot!r}: {exc}") from None
        except ImportError:
            raise CLIError("--plot needs matplotlib (pip install 'hybridblas[plot]')") from None
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
                      f"({'helps' if s.get('cpu_helps') else 'does not help'})")
    return 0


def build_parser():
    ap, sub = tool_parser(PROG, "Measure this node and manage its hybridblas profile (rates, block sizes, CPU "
                                "share, transfer rates).")
    p = sub.add_parser("info", help="devices, BLAS libraries, GPUs, fingerprint, the active profile")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("calibrate", help="measure this node and write its profile")
    p.add_argument("--quick", action="store_true", help="a short run (<= 2 min on a GPU node)")
    p.add_argument("--devices", nargs="+", metavar="DEV", help="devices to measure: cpu, gpu, all, 0,1, cuda:0 "
                   "(default: cpu and every GPU)")
    p.add_argument("--output", metavar="DIR", help=f"existing folder to write to (default: the first of "
                   f"${search.ENV_DIR}, $XDG_CONFIG_HOME/hybridblas/profiles, ~/.config/hybridblas/profiles)")
    p.add_argument("--routines", nargs="+", choices=ROUTINES, help="routines to measure (default: all)")
    p.add_argument("--dtypes", nargs="+", choices=("float32", "float64", "complex64", "complex128"))
    p.add_argument("--sizes", nargs="+", type=positive_int, metavar="N",
                   help="problem edges to measure on every device, all of them (no time limit)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none off a terminal)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("show", help="print the active profile")
    p.add_argument("--file", metavar="PATH", help="show this profile file instead of the active one")
    p.add_argument("--plot", metavar="PNG", help="also plot each device's rate against size (matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)
    for p in sub.choices.values():
        add_common_options(p)
    return ap


def main(argv=None):
    return run_main(PROG, lambda args: args.func(args), argv, build_parser())
