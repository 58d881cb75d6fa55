"""One picture of the CI eigensolver against its peers, from the `cisolver solve` JSON in benchmarks/results.

    python3 -m benchmarks.cisolver plot --out docs/img/cisolver_peers.png

Left: time to 5 converged pairs against the M-scheme dimension (24Mg, 46Ti, 47V in float64, 48Cr in
float32), every solver on the same matrix and start block: ours in one process on one and two H200s, ours on
two MPI ranks with one H200 each (`cisolver ranks`, median of the repeats), cupyx's lobpcg on one
H200, and on the node's 32 cores ours, scipy's eigsh and scipy's lobpcg (24Mg and 46Ti). Right: the dense
steps' share of an iteration, dense / (SpMM + preconditioner + dense), on the same GPU runs, with the
10 % mark.
"""
import glob
import json
import os
import statistics

from benchmarks.plotting import pyplot, save

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "h200x2-2026-11-22",
                       "cisolver")
GPU, RANKS, CPU = "gpu", "ranks", "cpu"
TIMES = [  # label, folder, solver name in the JSON, style
    ("ours, 1 H200", GPU, "cisolver-gpu1", "C0o-"),
    ("ours, 2 H200, one process", GPU, "cisolver-gpu2", "C1s-"),
    ("ours, 2 H200, 2 MPI ranks", RANKS, "cisolver-ranks2", "C6D-"),
    ("cupyx lobpcg, 1 H200", GPU, "cupyx-lobpcg", "C3^--"),
    ("ours, CPU (32 cores)", CPU, "cisolver-cpu-full", "C2o:"),
    ("scipy eigsh, CPU", CPU, "scipy-eigsh", "C4v:"),
    ("scipy lobpcg, CPU", CPU, "scipy-lobpcg", "C5d:"),
]
SHARES = [  # the dense share's series: label, folder, solver name in the JSON, style
    ("1 H200", GPU, "cisolver-gpu1", "C0o-"),
    ("2 H200, one process", GPU, "cisolver-gpu2", "C1s-"),
    ("2 H200, one process, upper storage", GPU, "cisolver-gpu2-upper", "C9s:"),
    ("2 H200, 2 MPI ranks", RANKS, "cisolver-ranks2", "C6D-"),
]


def runs(folder):
    """{(case, solver): (dimension, run)} from every case JSON in the folder; of repeated runs, the median."""
    found = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, folder, "cisolver_*.json"))):
        with open(path) as fh:
            rec = json.load(fh)
        for r in rec["runs"]:
            if "seconds" in r:
                found.setdefault((rec["case"], r["solver"]), (rec["dimension"], []))[1].append(r)
    out = {}
    for key, (dim, rs) in found.items():
        median = statistics.median_low(r["seconds"] for r in rs)
        out[key] = (dim, next(r for r in rs if r["seconds"] == median))
    return out


def points(folder, solver, value):
    """(dimension, value(run)) of ``solver``'s runs in the folder, by dimension; runs without a value left out."""
    found = ((dim, value(r)) for (case, s), (dim, r) in runs(folder).items() if s == solver)
    return sorted(p for p in found if p[1] is not None)


def dense_share(r):
    pi = r.get("per_iteration", {})
    total = pi.get("spmm", 0.0) + pi.get("precond", 0.0) + pi.get("dense", 0.0)
    return 100.0 * pi.get("dense", 0.0) / total if total else None


def add_arguments(ap):
    ap.add_argument("--out", default="docs/img/cisolver_peers.png")


def run(args):
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, folder, solver, style in TIMES:
        pts = points(folder, solver, lambda r: r["seconds"])
        if pts:
            left.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("M-scheme dimension (24Mg, 46Ti, 47V, 48Cr)")
    left.set_ylabel("seconds to 5 pairs")
    left.set_title("LOBPCG against its peers, same matrix and start")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=8, loc="lower right")
    for label, folder, solver, style in SHARES:
        pts = points(folder, solver, dense_share)
        right.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    right.axhline(10.0, color="k", lw=0.8, ls=":", label="10 %")
    right.set_xscale("log")
    right.set_ylim(0, 100)
    right.set_xlabel("M-scheme dimension")
    right.set_ylabel("dense steps, % of an iteration")
    right.set_title("H200: dense steps against SpMM")
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=8)
    save(fig, args.out)
    return 0
