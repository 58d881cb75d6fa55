"""CPU overhead of the hybrid layer: hybridblas herk/gemmt against scipy.linalg.blas zherk and numpy on
the same cores, same arrays, one process. Prints a table and writes JSON.

    python3 -m benchmarks.blas cpu --n 2048 --k 2048 --repeat 5 [--json out.json]
"""
import platform

import numpy as np
from scipy.linalg import blas

import hybridblas as hb
from hybridblas.blas_threads import available_cores, blas_info
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import best_of, write_json


def add_arguments(ap):
    ap.add_argument("--n", type=positive_int, default=2048)
    ap.add_argument("--k", type=positive_int, default=2048)
    ap.add_argument("--repeat", type=positive_int, default=5)
    ap.add_argument("--json", help="write results here")


def run(args):
    check_output_path(args.json, "--json")
    n, k = args.n, args.k
    rng = np.random.default_rng(0)
    a = np.asfortranarray(rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k)))
    b = np.asfortranarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)))
    c = np.zeros((n, n), complex, order="F")
    herk_flops = 4.0 * k * n * (n + 1)          # LAWN 41, complex herk
    gemmt_flops = 4.0 * k * n * (n + 1)         # the triangle of a complex gemm
    gemm_flops = 8.0 * n * n * k
    cpu = hb.Context("cpu")
    two = hb.Context(["cpu", "cpu"], strategy="dynamic", block_size=512)
    rows = [
        ("scipy zherk", herk_flops, lambda: blas.zherk(1.0, a, 0.0, c, lower=1, overwrite_c=1)),
        ("hybridblas herk (cpu)", herk_flops, lambda: hb.herk(1.0, a, 0.0, c, context=cpu)),
        ("hybridblas herk (2 workers, dynamic 512)", herk_flops, lambda: hb.herk(1.0, a, 0.0, c, context=two)),
        ("numpy a @ b (full gemm)", gemm_flops, lambda: np.matmul(a, b)),
        ("scipy zgemm", gemm_flops, lambda: blas.zgemm(1.0, a, b, 0.0, c, overwrite_c=1)),
        ("hybridblas gemmt (cpu)", gemmt_flops, lambda: hb.gemmt(1.0, a, b, 0.0, c, context=cpu)),
    ]
    results = []
    for name, flops, fn in rows:
        best, med = best_of(fn, args.repeat)
        results.append({"name": name, "seconds_best": best, "seconds_median": med, "gflops": flops / best / 1e9})
    base = {r["name"]: r for r in results}
    ratio_herk = base["hybridblas herk (cpu)"]["seconds_best"] / base["scipy zherk"]["seconds_best"]
    ratio_gemmt = base["hybridblas gemmt (cpu)"]["seconds_best"] / base["scipy zgemm"]["seconds_best"]
    shape = f"n = k = {n}" if n == k else f"n = {n}, k = {k}"
    print(f"{shape}, complex128, {available_cores()} cores, {platform.processor() or platform.machine()}")
    print(f"{'call':44s} {'best s':>9s} {'median s':>9s} {'GFLOP/s':>9s}")
    for r in results:
        print(f"{r['name']:44s} {r['seconds_best']:9.4f} {r['seconds_median']:9.4f} {r['gflops']:9.1f}")
    print(f"time ratio hybrid herk / scipy zherk = {ratio_herk:.3f}")
    print(f"time ratio hybrid gemmt / scipy zgemm (full product) = {ratio_gemmt:.3f}")
    write_json(args.json, {"n": n, "k": k, "cores": available_cores(), "blas": blas_info(), "results": results,
                           "ratio_herk_over_zherk": ratio_herk, "ratio_gemmt_over_zgemm": ratio_gemmt})
