"""One picture of the TiO2 H/S build against Kmax, from the `flapw build` JSON in benchmarks/results.

    python3 -m benchmarks.flapw plot --out docs/img/flapw_tio2.png

Series: the 2-core CPU box; one, two (2×H200 node) and four H200s (4×H200 node) with the arrays on the GPU;
two H200s with host arrays through hybridblas and through cuBLASXt. End-to-end TFLOP/s (LAWN 41) on the
left, the BLAS part on the right, on log scales.
"""
import glob
import json
import os

from benchmarks.plotting import pyplot, save

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
DEVICE = "h200x2-2026-11-22/flapw-tio2-device/summary.json"
HOST = "h200x2-2026-11-22/flapw-tio2-host/summary.json"
FOUR = "h200x4-2026-11-22/flapw-tio2/summary.json"
SERIES = [  # label, files (glob patterns), what a result must match, style
    ("CPU, 2 cores (hybridblas)", "cpu-2core-2026-11-22/flapw/TiO2_k*_refined_cpu_hybridblas.json", {}, "k:"),
    ("1 H200, device arrays", DEVICE, {"devices": "cuda:0"}, "C0o-"),
    ("2 H200, device arrays", DEVICE, {"devices": "all"}, "C1o-"),
    ("4 H200, device arrays", FOUR, {"devices": "all"}, "C4*"),
    ("2 H200, host arrays, hybridblas", HOST, {"blas": "hybridblas"}, "C2s--"),
    ("2 H200, host arrays, cuBLASXt", HOST, {"blas": "cublasxt"}, "C3^--"),
]


def load(pattern, match):
    """(kmax, end-to-end TF/s, BLAS TF/s) of the TiO2 results that match, by Kmax."""
    points = {}
    for path in glob.glob(os.path.join(RESULTS, pattern)):
        with open(path) as fh:
            doc = json.load(fh)
        for r in doc.get("results", [doc]):
            if r["system"] == "TiO2" and all(r.get(k) == v for k, v in match.items()):
                points[r["kmax"]] = (r["kmax"], r["total_tflops"], r["blas_tflops"])
    return [points[k] for k in sorted(points)]


def add_arguments(ap):
    ap.add_argument("--out", default="docs/img/flapw_tio2.png")


def run(args):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for label, pattern, match, style in SERIES:
        pts = load(pattern, match)
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
    return 0
