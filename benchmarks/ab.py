"""Two source trees side by side on one machine: the BLAS core, a FLAPW build and a 48Cr spectrum, in fresh processes.

    python3 -m benchmarks.ab --trees /path/to/before . --rounds 2 --json ab.json

Each tree is a folder holding the packages hybridblas, flapw and cisolver (a checkout, or ``git archive REV
hybridblas flapw cisolver | tar -x -C DIR``); every measurement runs in a new process with PYTHONPATH set to that
tree, and the trees take turns within each round (the first tree first in even rounds, the second in odd ones), so
that drift of the machine falls on both. Measurements (all through the public API or the command lines a user runs):

- ``blas``: zherk, zher2k and zgemmt, complex128, n = k, host numpy operands on ``--blas-devices`` and cupy
  operands on the first GPU of each ``--device-operands`` set, the best of three calls after two warm-up calls
  (host operands are page-locked at their second call), as TF/s;
- ``flapw``: ``flapw build --system TiO2 --kmax 3.0 --devices all --kpoints 2 --json``: process wall and the BLAS
  part (its stages marked blas), both k-points;
- ``cisolver``: ``cisolver spectrum --interaction gxpf1a --protons 4 --neutrons 4 --nev 5 --dtype float32 --tol
  1e-5 --devices all --json`` (48Cr): process wall, solve, energies.

The summary gives, per quantity, the best over the rounds of each tree and their ratio (the second tree against
the first; above 1 is better for TF/s, below 1 for seconds).
"""
if not __package__:                      # run as a file: start again as a module of the repository
    import os, runpy, sys                # noqa: E401
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runpy.run_module("benchmarks.ab", run_name="__main__", alter_sys=True)
    sys.exit()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from benchmarks.cli import run_once  # noqa: E402
from hybridblas.console import add_common_options, check_output_path, positive_int, run_main  # noqa: E402

BLAS_PROGRAM = r"""
import json, sys, time
import numpy as np
import hybridblas as hb
n, devices, where = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rng = np.random.default_rng(1)
def operand():                             # random values, a 1 Mi-entry random block repeated (fast to make)
    x = np.empty((n, n), dtype=np.complex128)
    flat = x.view(np.float64).reshape(-1)
    block = rng.random(min(flat.size, 1 << 20)) + 0.5
    whole = flat.size // block.size * block.size
    flat[:whole].reshape(-1, block.size)[:] = block
    flat[whole:] = block[:flat.size - whole]
    return x
a, b, c = operand(), operand(), np.zeros((n, n), dtype=np.complex128)
if where == "device":                      # cupy operands on the first GPU of the context
    import cupy
    with cupy.cuda.Device(int(devices.split(",")[0].split(":")[1])):
        a, b, c = cupy.asarray(a), cupy.asarray(b), cupy.asarray(c)
ctx = hb.Context(devices=devices.split(","))      # a list: every version takes one
calls = {"zherk": lambda: hb.herk(1.0, a, 0.0, c, context=ctx),
         "zher2k": lambda: hb.her2k(1.0, a, b, 0.0, c, context=ctx),
         "zgemmt": lambda: hb.gemmt(1.0, a, b, 0.0, c, context=ctx)}
flops = {"zherk": 4.0 * n ** 3, "zher2k": 8.0 * n ** 3, "zgemmt": 4.0 * n ** 3}
out = {}
for name, call in calls.items():
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    out[f"{name} n={n} {where} {devices} TF/s"] = flops[name] / min(times[2:]) / 1e12
print(json.dumps(out))
"""

FLAPW = ["-m", "flapw", "build", "--system", "TiO2", "--kmax", "3.0", "--devices", "all", "--kpoints", "2",
         "--json"]
CISOLVER = ["-m", "cisolver", "spectrum", "--interaction", "gxpf1a", "--protons", "4", "--neutrons", "4", "--nev",
            "5", "--dtype", "float32", "--tol", "1e-5", "--devices", "all", "--json"]


def _tree_env(tree):
    """This process's environment with the tree's packages first on the path (the process runs in the tree: a
    module run with -m or a program run with -c finds its current folder's packages before PYTHONPATH's)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(tree)] + rest))


def command(kind, tree):
    """One run of the FLAPW or 48Cr command line in the tree: {quantity: value}, quantities in seconds."""
    rec = run_once([sys.executable] + (FLAPW if kind == "flapw" else CISOLVER), env=_tree_env(tree), cwd=tree)
    if rec["rc"] != 0:
        raise RuntimeError(f"{kind} in {tree} failed: {rec.get('stderr_tail', '')[-800:]}")
    if kind == "flapw":
        blas = sum(s["seconds"] for r in rec["reports"] for s in r["stages"] if s.get("blas"))
        return {"flapw wall s": rec["wall_s"], "flapw BLAS part s": blas}, rec
    return {"cisolver wall s": rec["wall_s"], "cisolver solve s": rec["stages"].get("solve", float("nan"))}, rec


def blas(tree, n, devices, where):
    """The BLAS program in the tree at size n, operands on the host or the first device: {quantity: TF/s}."""
    proc = subprocess.run([sys.executable, "-c", BLAS_PROGRAM, str(n), devices, where], capture_output=True, text=True,
                          env=_tree_env(tree), cwd=tree)
    if proc.returncode != 0:
        raise RuntimeError(f"blas n={n} in {tree} failed: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_parser():
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs=2, required=True, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--rounds", type=positive_int, default=2)
    ap.add_argument("--sizes", type=positive_int, nargs="+", default=[8192, 16384])
    ap.add_argument("--blas-devices", default="cuda:0,cuda:1", help="devices of the host-operand calls")
    ap.add_argument("--device-operands", nargs="*", default=["cuda:0", "cuda:0,cuda:1"],
                    help="device sets for calls on cupy operands on their first GPU, at the largest size")
    ap.add_argument("--only", nargs="*", choices=["blas", "flapw", "cisolver"], default=["blas", "flapw", "cisolver"])
    ap.add_argument("--json", default=None)
    add_common_options(ap)
    return ap


def body(args):
    check_output_path(args.json, "--json")
    for tree in args.trees:
        if not all(os.path.isdir(os.path.join(tree, p)) for p in ("hybridblas", "flapw", "cisolver")):
            raise ValueError(f"--trees: {tree!r} does not hold hybridblas, flapw and cisolver")
    for tree in args.trees[::-1]:        # the interaction files, for a tree whose cisolver does not ship them
        shipped = os.path.join(os.path.abspath(tree), "cisolver", "data", "interactions")
        if os.path.isdir(shipped):
            os.environ.setdefault("CISOLVER_DATA", shipped)
    values = {tree: {} for tree in args.trees}
    records = []
    for rnd in range(args.rounds):
        for kind in args.only:
            for tree in (args.trees if rnd % 2 == 0 else args.trees[::-1]):
                got = {}
                try:                           # a failed measurement is reported and left out, not fatal
                    if kind == "blas":
                        for n in args.sizes:
                            got.update(blas(tree, n, args.blas_devices, "host"))
                        for devices in args.device_operands:
                            got.update(blas(tree, max(args.sizes), devices, "device"))
                    else:
                        got, rec = command(kind, tree)
                        records.append(dict(tree=tree, round=rnd, kind=kind, **rec))
                except (RuntimeError, ValueError, KeyError, IndexError) as exc:
                    print(f"round {rnd} {kind} {tree}: {exc}", file=sys.stderr, flush=True)
                for name, v in got.items():
                    values[tree].setdefault(name, []).append(v)
                print(f"round {rnd} {kind} {tree}: " + "  ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
    before, after = (values[t] for t in args.trees)
    summary = {}
    for name in sorted(set(before) & set(after)):
        pick = min if name.endswith(" s") else max
        b, a = pick(before[name]), pick(after[name])
        summary[name] = {"before": b, "after": a, "after/before": a / b}
        print(f"{name:32s} before {b:9.3f}  after {a:9.3f}  after/before {a / b:6.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"trees": args.trees, "values": values, "summary": summary, "records": records}, fh, indent=1)
    return 0


def main(argv=None):
    return run_main("benchmarks.ab", body, argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
