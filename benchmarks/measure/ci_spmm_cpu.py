"""CPU SpMM y = H x on a shell-model Hamiltonian: scipy backend against MKL's sparse block product, full and
upper storage, and the single-vector CSR product ARPACK's eigsh makes. One process, same matrix and x.

    python3 -m benchmarks.cisolver spmm-cpu [--case 24Mg] [--k 8] [--repeat 20] [--json out.json]

MKL rows need the optional extra (pip install mkl); without it they are skipped. "mkl ... 1 thread" runs
under threadpool_limits(1, "blas"); inside cisolver.lobpcg MKL's sparse product keeps all its threads (only
the dense steps' BLAS is limited).
"""
import os
import platform
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from cisolver import mkl_sparse
from cisolver.operators import SymmetricOperator
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import CASES, best_of as timed, command_line, full_from_upper, problem, write_json


def add_arguments(ap):
    ap.add_argument("--case", default="24Mg", choices=sorted(CASES))
    ap.add_argument("--k", type=positive_int, default=8, help="columns of x")
    ap.add_argument("--repeat", type=positive_int, default=20)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--json", help="write the results here")


def run(args):
    check_output_path(args.json, "--json")
    dtype = np.dtype(args.dtype)
    hu, info = problem(args.case).build(storage="upper", dtype=dtype)
    hf = full_from_upper(hu)
    dim, k = info.dimension, args.k
    rng = np.random.default_rng(0)
    x = rng.standard_normal((dim, k)).astype(dtype)
    v = np.ascontiguousarray(x[:, 0])
    print(f"{args.case}: n {dim}, nnz upper {hu.nnz}, full {hf.nnz}, {dtype}, k {k}, "
          f"{len(os.sched_getaffinity(0))} cores, MKL {'yes' if mkl_sparse.available() else 'no'}")

    rows = [("scipy csr @ v (eigsh's SpMV)", "full", 1, lambda: hf @ v)]
    ops = {}
    for backend in ("scipy", "mkl"):
        if backend == "mkl" and not mkl_sparse.available():
            continue
        for storage, h in (("full", hf), ("upper", hu)):
            op = ops[backend, storage] = SymmetricOperator(h, storage=storage, backend=backend)
            rows.append((f"{backend} {storage}", storage, k, lambda op=op: op.matmat(x)))
    if ("mkl", "full") in ops:
        for storage in ("full", "upper"):
            op = ops["mkl", storage]

            def one_thread(op=op):
                with threadpool_limits(1, user_api="blas"):
                    return op.matmat(x)
            rows.append((f"mkl {storage} 1 thread", storage, k, one_thread))
        rows.append(("mkl full, one vector", "full", 1, lambda: ops["mkl", "full"].matmat(v[:, None])))
    # every x-block product gives the same y (a check that the timed thing is the right thing)
    want = ops["scipy", "full"].matmat(x)
    for label, _, cols, fn in rows:
        if cols == k:
            err = np.abs(fn() - want).max() / np.abs(want).max()
            assert err < (1e-12 if dtype == np.float64 else 1e-5), (label, err)

    results = []
    print(f"{'product':34s} {'cols':>4s} {'min ms':>8s} {'median ms':>10s} {'ms/vector':>10s}")
    for label, storage, cols, fn in rows:
        best, med = timed(fn, args.repeat)
        results.append({"product": label, "storage": storage, "columns": cols, "min_s": best, "median_s": med})
        print(f"{label:34s} {cols:4d} {best * 1e3:8.2f} {med * 1e3:10.2f} {med * 1e3 / cols:10.2f}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
                "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                "numpy": np.__version__, "threadpools": threadpool_info(), "command": command_line()}
        write_json(args.json, {"case": args.case, "dimension": dim, "nnz_upper": int(hu.nnz), "nnz_full": int(hf.nnz),
                               "dtype": str(dtype), "k": k, "results": results, "meta": meta})
    return 0
