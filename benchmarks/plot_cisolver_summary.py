"""One picture of the CI eigensolver against its peers, from bench_cisolver.py JSON of several campaigns.

    PYTHONPATH=. python3 benchmarks/plot_cisolver_summary.py --out docs/img/cisolver_peers.png

Left: time to 5 converged pairs against the M-scheme dimension (24Mg, 46Ti, 47V in float64, 48Cr in
float32), every solver on the same matrix and start block. GPU series (ours in one process on one and two
GPUs, ours on two MPI ranks with one GPU each, and cupyx's lobpcg) are from session 11's last run (2×H200);
the CPU series (ours, eigsh, scipy lobpcg on the node's 32 cores, 24Mg and 46Ti) from session 9's CPU run
(the CPU path has not changed since). Right: the dense steps' share of an iteration on H200s with session
8's code (every small step waits for a host trip), session 9's (whole iterations queued on the GPU),
session 10's (one-pass Grams, cuSOLVER called directly), session 11's two ranks (iterations queued on
both GPUs, NCCL sums), session 12's (faster small kernels), session 13's (staged kernels) and session 14's (the
start queued on the GPU), with the goal of 10 %.
"""
import argparse
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from plotting import save  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
NOW = ["h200x2-2026-11-22-s12/run6-final"]
SESSION14 = ["h200x2-2026-11-22-s14/run4-small-factor", "h200x2-2026-11-22-s14/run6-48cr-ranks",
             "h200x2-2026-11-22-s14/run7-48cr-warm"]     # the later wins (run6's first 48Cr run was not warmed up)
SESSION13 = ["h200x2-2026-11-22-s13/run9-final"]
SESSION13_RANKS = ["h200x2-2026-11-22-s13/run8-w-in-place-tile-rows"]     # 47V only, staged and unstaged alternating
SESSION11 = ["h200x2-2026-11-22-s11/run5-final"]
SESSION10 = ["h200x2-2026-11-22-s10/run8-final", "h200x2-2026-11-22-s10/run9-final-47V-46Ti"]   # the later wins
SESSION9 = ["h200x2-2026-11-22-s9/run3-final"]
PEER = NOW
SESSION8 = ["h200x2-2026-11-22-s8/run3-final"]
CPU = ["h200x2-2026-11-22-s9/run4-cpu-mpi"]
TIMES = [  # label, folders, solver name in the JSON, style
    ("ours, 1 H200", NOW, "cisolver-gpu1", "C0o-"),
    ("ours, 2 H200", NOW, "cisolver-gpu2", "C1s-"),
    ("ours, 2 H200, 2 MPI ranks", NOW, "cisolver-ranks2", "C6D-"),
    ("cupyx lobpcg, 1 H200", PEER, "cupyx-lobpcg", "C3^--"),
    ("ours, CPU (32 cores)", CPU, "cisolver-cpu-full", "C2o:"),
    ("scipy eigsh, CPU", CPU, "scipy-eigsh", "C4v:"),
    ("scipy lobpcg, CPU", CPU, "scipy-lobpcg", "C5d:"),
]
SHARES = [  # the dense share's series: label, folders, solver name in the JSON, style
    ("session 8 (host trips), 1 H200", SESSION8, "cisolver-gpu1", "C7o--"),
    ("session 8 (host trips), 2 H200", SESSION8, "cisolver-gpu2", "C8s--"),
    ("session 9 (queued), 1 H200", SESSION9, "cisolver-gpu1", "C9o:"),
    ("session 9 (queued), 2 H200", SESSION9, "cisolver-gpu2", "C5s:"),
    ("session 10, 1 H200", SESSION10, "cisolver-gpu1", "C0o-"),
    ("session 10, 2 H200", SESSION10, "cisolver-gpu2", "C1s-"),
    ("session 11, 2 H200 on 2 ranks", SESSION11, "cisolver-ranks2", "C6D--"),
    ("session 12, 2 H200 on 2 ranks", NOW, "cisolver-ranks2", "C3D-"),
    ("session 12, 2 H200", NOW, "cisolver-gpu2", "C4s-"),
    ("session 13, 2 H200 on 2 ranks (47V)", SESSION13_RANKS, "cisolver-ranks2-staged", "C2D"),
    ("session 13, 2 H200", SESSION13, "cisolver-gpu2", "C9s-"),
    ("session 14, 2 H200 on 2 ranks", SESSION14, "cisolver-ranks2", "kD-"),
    ("session 14, 1 H200", SESSION14, "cisolver-gpu1", "ko-"),
]


def runs(folders):
    """{(case, solver): (dimension, run record)} from every case JSON under the folders."""
    out = {}
    for folder in folders:
        for path in glob.glob(os.path.join(RESULTS, folder, "ci-*", "cisolver_*.json")):
            with open(path) as fh:
                rec = json.load(fh)
            for r in rec["runs"]:
                if "seconds" in r:
                    out[(rec["case"], r["solver"])] = (rec["dimension"], r)
    return out


def points(folders, solver, value):
    """(dimension, value(run)) of ``solver``'s runs under the folders, by dimension; runs without a value left out."""
    found = ((dim, value(r)) for (case, s), (dim, r) in runs(folders).items() if s == solver)
    return sorted(p for p in found if p[1] is not None)


def dense_share(r):
    pi = r.get("per_iteration", {})
    total = pi.get("spmm", 0.0) + pi.get("precond", 0.0) + pi.get("dense", 0.0)
    return 100.0 * pi.get("dense", 0.0) / total if total else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img/cisolver_peers.png")
    args = ap.parse_args(argv)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, folders, solver, style in TIMES:
        pts = points(folders, solver, lambda r: r["seconds"])
        if pts:
            left.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("M-scheme dimension (24Mg, 46Ti, 47V, 48Cr)")
    left.set_ylabel("seconds to 5 pairs")
    left.set_title("LOBPCG against its peers, same matrix and start")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=8, loc="lower right")
    for label, folders, solver, style in SHARES:
        pts = points(folders, solver, dense_share)
        right.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    right.axhline(10.0, color="k", lw=0.8, ls=":", label="goal (10 %)")
    right.set_xscale("log")
    right.set_ylim(0, 100)
    right.set_xlabel("M-scheme dimension")
    right.set_ylabel("dense steps, % of an iteration")
    right.set_title("H200: dense steps against SpMM")
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=8)
    save(fig, args.out)


if __name__ == "__main__":
    main()
