"""One picture of the TiO2 H/S build against Kmax, from bench_flapw.py JSON of several campaigns.

    PYTHONPATH=. python3 benchmarks/plot_flapw_summary.py --out docs/img/flapw_tio2.png

Each series is a (label, folder, file pattern) below: the 2-core CPU box, one and two H200s with the
arrays on the GPU, and two H200s with host arrays through hybridblas and through cuBLASXt. End-to-end
TFLOP/s (LAWN 41) on the left, the BLAS part on the right, on log scales.
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
SERIES = [
    ("CPU, 2 cores (hybridblas)", ["cpu-2core-2026-11-22/flapw"], "TiO2_k*_refined_cpu_hybridblas.json", "k:"),
    ("1 H200, device arrays", ["h200x2-2026-11-22-s3/run4-dense-ci-mpi-flapw-curve/flapw-all"],
     "TiO2_k*_refined_cuda0_hybridblas.json", "C0o-"),
    ("2 H200, device arrays", ["h200x2-2026-11-22-s3/run4-dense-ci-mpi-flapw-curve/flapw-all"],
     "TiO2_k*_refined_all_hybridblas.json", "C1o-"),
    ("2 H200, host arrays, hybridblas", ["h200x2-2026-11-22/flapw-k25", "h200x2-2026-11-22-s4/run4-flapwxt/flapw-xt"],
     "TiO2_k*_refined_all_hybridblas.json", "C2s--"),
    ("2 H200, host arrays, cuBLASXt", ["h200x2-2026-11-22/flapw-k25", "h200x2-2026-11-22-s4/run4-flapwxt/flapw-xt"],
     "TiO2_k*_refined_all_cublasxt.json", "C3^--"),
]


def load(folders, pattern):
    """(kmax, end-to-end TF/s, BLAS TF/s) per Kmax; a later folder replaces an earlier one's point."""
    points = {}
    for folder in folders:
        for path in glob.glob(os.path.join(RESULTS, folder, pattern)):
            with open(path) as fh:
                r = json.load(fh)
            points[r["kmax"]] = (r["kmax"], r["total_tflops"], r["blas_tflops"])
    return [points[k] for k in sorted(points)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img/flapw_tio2.png")
    args = ap.parse_args(argv)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for label, folders, pattern, style in SERIES:
        pts = load(folders, pattern)
        if not pts:
            print(f"no results for {label!r}")
            continue
        for ax, col in ((axes[0], 1), (axes[1], 2)):
            ax.plot([p[0] for p in pts], [p[col] for p in pts], style, label=label)
    for ax, title in ((axes[0], "end-to-end"), (axes[1], "BLAS part")):
        ax.set_yscale("log")
        ax.set_xlabel("Kmax (1/bohr)")
        ax.set_title(f"TiO2 (384 atoms) H and S, one k-point, {title}")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("TFLOP/s (LAWN 41)")
    axes[1].legend(fontsize=8)
    save(fig, args.out)


if __name__ == "__main__":
    main()
