"""Iterations, energies and time of ours with the adaptive single CholQR pass against two passes always,
on the same matrix and start block (CPU; --devices 0 for a GPU).

    PYTHONPATH=. python3 benchmarks/check_single_pass.py --cases 44Ti,24Mg --dtype float64 [--devices 0]
"""
import argparse
import time

import numpy as np

from bench_cisolver import CASES
from cisolver import dense, lobpcg
from cisolver.data import resolve_interaction
from cisolver.operators import SymmetricOperator
from cisolver.shellmodel import hamiltonian, snt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="44Ti,24Mg")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--devices", default="cpu")
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    tol = args.tol or (1e-7 if dtype == np.float64 else 1e-5)
    devices = "cpu" if args.devices == "cpu" else [int(d) for d in args.devices.split(",")]
    keep = dense.SINGLE_PASS_LOSS
    for name in args.cases.split(","):
        inter, z, n = CASES[name]
        hu, info = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction(inter)), z, n).build(
            storage="upper", dtype=dtype)
        op = SymmetricOperator(hu, storage="upper", devices=devices)
        x0 = np.random.default_rng(2024).standard_normal((info.dimension, 8)).astype(dtype)
        for label, loss in (("two passes", 0.0), ("adaptive", keep)):
            dense.SINGLE_PASS_LOSS = loss
            t0 = time.perf_counter()
            res = lobpcg(op, 5, block_size=8, x0=x0, tol=tol, dtype=dtype)
            t = time.perf_counter() - t0
            per = {k: round(v / res.iterations * 1e3, 2) for k, v in res.seconds.items() if k.startswith("dense")}
            print(f"{name} {dtype.name} {label:10s}: {t:.2f} s, {res.iterations} it, second passes "
                  f"{res.second_passes}, restarts {res.restarts}, E {np.round(res.eigenvalues, 6)}, "
                  f"res max {res.residual_norms.max():.1e}; ms/it {per}", flush=True)
        dense.SINGLE_PASS_LOSS = keep


if __name__ == "__main__":
    main()
