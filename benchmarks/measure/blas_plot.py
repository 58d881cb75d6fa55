"""Plots of `blas gpu` results: merge one or more bench_blas_gpu.json files into --out and draw them.

    python3 -m benchmarks.blas plot benchmarks/results/h100x2-2026-11-26/blas-host/bench_blas_gpu.json --out DIR

writes DIR/bench_blas_gpu.json (the merged results) and DIR/bench_blas_gpu.png (TF/s against n, one panel per
routine); when the files hold several GPU counts, also DIR/bench_blas_gpu_scaling.png (TF/s against GPUs).
"""
from benchmarks.measure import blas_gpu


def add_arguments(ap):
    ap.add_argument("files", nargs="+", metavar="JSON", help="bench_blas_gpu.json files of `blas gpu` runs")
    ap.add_argument("--out", required=True, help="folder for the merged JSON and the plots")


def run(args):
    blas_gpu.pyplot(required=True)          # refuse before writing anything when matplotlib is missing
    blas_gpu.merge_and_plot(args.files, args.out)
    return 0
