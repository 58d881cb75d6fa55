"""Ours on the CPU with the dense steps on 1, 2, 4 ... threads (CISOLVER_THREADS), same matrix and start
block, the sparse product on its default threads: time to 5 pairs and the per-iteration split.

    python3 -m benchmarks.cisolver threads --cases 24Mg,46Ti --threads 1,2,4,8,16 [--json F]
"""
import os
import time

import numpy as np

from cisolver import lobpcg
from cisolver.operators import SymmetricOperator
from hybridblas.console import check_output_path, positive_float

from benchmarks.common import CASES, case_list, full_from_upper, problem, write_json


def add_arguments(ap):
    ap.add_argument("--cases", type=case_list, default="24Mg,46Ti", help=f"comma list from {sorted(CASES)}")
    ap.add_argument("--threads", default="1,2,4,8,16", help="comma list of CISOLVER_THREADS values")
    ap.add_argument("--tol", type=positive_float, default=1e-7)
    ap.add_argument("--json", default=None)


def run(args):
    check_output_path(args.json, "--json")
    rows = []
    keep = os.environ.get("CISOLVER_THREADS")
    for name in args.cases:
        hu, info = problem(name).build(storage="upper")
        hf = full_from_upper(hu)
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
    if keep is None:
        os.environ.pop("CISOLVER_THREADS", None)
    else:
        os.environ["CISOLVER_THREADS"] = keep
    write_json(args.json, rows)
    return 0
