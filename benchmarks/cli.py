"""Wall clock of a command-line run as a user waits for it: process start to exit, in a fresh process.

    python3 -m benchmarks.cli --label 48Cr-f32-2gpu --repeat 2 --json out.json -- \
        python3 -m cisolver spectrum --interaction gxpf1a --protons 4 --neutrons 4 --nev 5 --dtype float32 \
        --tol 1e-5 --devices all --json

Each repeat is a new process. When the command prints one JSON object (``--json``), its ``seconds`` (the
stages the tool measured itself) are kept beside the wall time, and the time before the tool's first stage
(interpreter start, imports) is the wall time less their sum. Records are appended to ``--json``.
"""
if not __package__:                      # run as a file: start again as a module of the repository
    import os, runpy, sys                # noqa: E401
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runpy.run_module("benchmarks.cli", run_name="__main__", alter_sys=True)
    sys.exit()

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from hybridblas.console import add_common_options, check_output_path, positive_int, run_main  # noqa: E402


def run_once(cmd, env=None, cwd=None):
    """Run ``cmd`` once in a new process (with ``env`` and in ``cwd`` when given); its wall time and report."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    record = {"wall_s": wall, "rc": proc.returncode}
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        out = None
    if isinstance(out, dict):
        stages = out.get("seconds") or {}
        if not stages and out.get("reports"):              # flapw build --json: per k-point reports
            stages = {"loop": sum(out.get("loop_seconds") or [0.0])}
        record["stages"] = {k: v for k, v in stages.items() if isinstance(v, (int, float))}
        record["details"] = {k: v for k, v in stages.items() if isinstance(v, dict)}
        record["outside_stages_s"] = wall - sum(record["stages"].values())
        for key in ("dimension", "energies", "j", "converged", "iterations", "devices", "queued", "arrays",
                    "kpoints_per_second", "loop_seconds"):
            if key in out:
                record[key] = out[key]
        if out.get("reports"):
            record["reports"] = out["reports"]
    if proc.returncode != 0:
        record["stderr_tail"] = proc.stderr[-2000:]
    return record


def build_parser():
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.cli", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--repeat", type=positive_int, default=1)
    ap.add_argument("--json", default=None, help="append the records to this JSON list file")
    add_common_options(ap)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    return ap


def body(args):
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise ValueError("give the command after --")
    check_output_path(args.json, "--json")
    records = []
    for i in range(args.repeat):
        rec = dict(label=args.label, repeat=i, cmd=" ".join(cmd), **run_once(cmd))
        records.append(rec)
        stages = "  ".join(f"{k} {v:.2f}" for k, v in rec.get("stages", {}).items())
        print(f"{args.label} #{i}: wall {rec['wall_s']:.2f} s rc {rec['rc']}  [{stages}]"
              + (f"  outside {rec['outside_stages_s']:.2f}" if "outside_stages_s" in rec else ""), flush=True)
        if rec["rc"] != 0:
            print(rec.get("stderr_tail", ""), file=sys.stderr)
    if args.json:
        try:
            with open(args.json) as fh:
                old = json.load(fh)
        except (OSError, ValueError):
            old = []
        with open(args.json, "w") as fh:
            json.dump(old + records, fh, indent=1)
    return 0


def main(argv=None):
    return run_main("benchmarks.cli", body, argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
