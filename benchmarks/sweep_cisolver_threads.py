"""Ours on the CPU with the dense steps on 1, 2, 4 ... threads (CISOLVER_THREADS), same matrix and start
block, the sparse product on its default threads: time to 5 pairs and the per-iteration split.

    PYTHONPATH=. python3 benchmarks/sweep_cisolver_threads.py --cases 24Mg,46Ti --threads 1,2,4,8,16 [--json F]
"""
import argparse
import json
import os
import time

import numpy as np
import scipy.sparse as sp

from bench_cisolver import CASES
from cisolver import lobpcg
from cisolver.data import resolve_interaction
from cisolver.operators import SymmetricOperator
from cisolver.shellmodel import hamiltonian, snt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="24Mg,46Ti")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--tol", type=float, default=1e-7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for name in args.cases.split(","):
        inter, z, n = CASES[name]
        hu, info = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction(inter)), z, n).build(storage="upper")
        hf = (hu + hu.T - sp.diags(hu.diagonal())).tocsr()
        op = SymmetricOperator(hf)
        x0 = np.random.default_rng(2024).standard_normal((info.dimension, 8))
        for t in args.threads.split(","):
            os.environ["CISOLVER_THREADS"] = t
            t0 = time.perf_counter()
            res = lobpcg(op, 5, block_size=8, x0=x0, tol=args.tol)
            took = time.perf_counter() - t0
            per = {k: round(v / res.iterations * 1e3, 2) for k, v in res.seconds.items()}
            rows.append({"case": name, "dense_threads": int(t), "spmm_threads": len(op.pieces), "seconds": took,
                         "iterations": res.iterations, "ms_per_iteration": per})
            print(f"{name} dense threads {t:>2}: {took:.3f} s, {res.iterations} it, spmm {per['spmm']} ms/it, "
                  f"dense {per['dense']} ms/it {per}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
