"""Where a LOBPCG iteration's time goes on a GPU, call by call: the host time and the GPU time (CUDA
events around the call) of every hybridblas product, block update, host transfer, host factorisation and
SpMM, per iteration, on a matrix of 48Cr's size whose SpMM is cheap (profile_lobpcg_dense.synthetic).

GPU time between a call's events includes any gap while the host was still issuing it, so a call whose
GPU time is close to its host time is bound by the host.

    PYTHONPATH=. python3 benchmarks/trace_lobpcg_iteration.py [--rows 1963461] [--dtype float32]
"""
import argparse
import collections
import time

import cupy as cp
import numpy as np
import scipy.sparse as sp

import hybridblas as hb
from cisolver import blocks, dense, iterations, lobpcg, solver
from cisolver.operators import SymmetricOperator
from profile_lobpcg_dense import synthetic

records = collections.defaultdict(list)     # label -> [(host seconds, start event, stop event)]


def wrap(owner, name, label):
    real = getattr(owner, name)

    def traced(*args, **kwargs):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        t0 = time.perf_counter()
        out = real(*args, **kwargs)
        took = time.perf_counter() - t0
        stop.record()
        records[label].append((took, start, stop))
        return out
    setattr(owner, name, traced)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1963461)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--case", default=None, help="a shell-model case of bench_cisolver.py (e.g. 48Cr) instead of "
                                                  "the synthetic matrix: the real SpMM, full storage")
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    if args.case:
        from bench_cisolver import CASES
        from cisolver.data import resolve_interaction
        from cisolver.shellmodel import hamiltonian, snt
        inter, z, n = CASES[args.case]
        hu, _ = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction(inter)), z, n).build(
            storage="upper", dtype=dtype)
        h = (hu + hu.T - sp.diags(hu.diagonal())).tocsr()
        del hu
    else:
        h = synthetic(args.rows, dtype)
    op = SymmetricOperator(h, storage="full", devices=[0])
    rows = h.shape[0]
    del h
    run = lambda: lobpcg(op, 5, block_size=8, tol=1e-30, maxiter=args.iterations, dtype=dtype, seed=1)
    run()                                            # compiles and warms every kernel
    for owner, name, label in [
            (hb, "syrk", "hb.syrk"), (hb, "gemmt", "hb.gemmt"), (hb, "gemm", "hb.gemm"),
            (blocks, "product_into", "blocks.product_into"), (solver, "product_into", "blocks.product_into"),
            (blocks, "subtract_product", "blocks.subtract_product"), (blocks, "times_upper", "blocks.times_upper"),
            (dense, "to_host", "to_host (.get)"), (dense, "cholesky_upper", "host: cholesky_upper"), (solver, "column_sumsq", "column_sumsq"),
            (dense, "scaled_cholesky", "host: scaled_cholesky"), (dense, "predicted_loss", "host: predicted_loss"),
            (blocks, "replace_with_product", "blocks.replace_with_product"),
            (solver, "residual_into", "blocks.residual_into"),
            (iterations, "update_with_residual", "blocks.update_with_residual"),
            (blocks, "tail_update", "blocks.tail_update"), (dense, "_symmetric_host", "host: Gram to host"),
            (dense, "inverse_upper", "host: inverse_upper"), (dense, "next_p_coefficients", "host: next_p"),
            (dense, "orthonormalise_tail", "[orthonormalise_tail]"), (dense, "rayleigh_ritz", "[rayleigh_ritz]"),
            (op, "matmat", "spmm")]:
        wrap(owner, name, label)
    records.clear()
    t0 = time.perf_counter()
    res = run()
    wall = time.perf_counter() - t0
    cp.cuda.Device().synchronize()
    it = res.iterations
    print(f"n = {rows}, {dtype.name}, {it} iterations, {wall / it * 1e3:.2f} ms per iteration (traced); "
          f"phases ms/it: " + ", ".join(f"{k} {v / it * 1e3:.2f}" for k, v in sorted(res.seconds.items())))
    print(f"  {'call':28s} {'per it':>6s} {'host us':>9s} {'GPU us':>9s} {'host ms/it':>10s} {'GPU ms/it':>9s}")
    for label, rows in sorted(records.items(), key=lambda kv: -sum(r[0] for r in kv[1])):
        host = np.array([r[0] for r in rows]) * 1e6
        gpu = np.array([cp.cuda.get_elapsed_time(r[1], r[2]) for r in rows]) * 1e3
        print(f"  {label:28s} {len(rows) / it:6.1f} {np.median(host):9.1f} {np.median(gpu):9.1f} "
              f"{host.sum() / it / 1e3:10.3f} {gpu.sum() / it / 1e3:9.3f}")


if __name__ == "__main__":
    main()
