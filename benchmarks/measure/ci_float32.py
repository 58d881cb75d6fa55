"""float32 LOBPCG energies on a GPU against float64 (24Mg, USDB), varying one thing at a time.

The same solve with the Gram products computed in different ways (the default context, hybridblas with no
minimum call size, float64 on the host, cupy's float32 matmul), then the Gram kernel alone with k cut into
chunks of 1024 or not cut at all, against cupy: relative errors against a float64 reference.

    python3 -m benchmarks.cisolver float32 > float32-diagnosis.txt
(benchmarks/results/h200x4-2026-11-22/float32-diagnosis.txt)
"""
import time

import numpy as np

import hybridblas as hb
from cisolver import dense
from cisolver import solver as lobpcg_solver
from cisolver.data import resolve_interaction
from cisolver.operators import SymmetricOperator
from cisolver.shellmodel import hamiltonian, snt
from hybridblas.devices import cuda as hb_cuda


def add_arguments(ap):
    pass


def run(args):
    import cupy as cp
    inter = snt.read_snt(resolve_interaction("usdb"))
    problem = hamiltonian.ShellModelProblem(inter, 4, 4, None)
    h64, _ = problem.build(storage="upper", dtype="float64")
    exact = lobpcg_solver.lobpcg(SymmetricOperator(h64, storage="upper", devices="cpu"), 5, tol=1e-10,
                                 seed=0).eigenvalues
    h32, _ = problem.build(storage="upper", dtype="float32")

    def run(label, devices, **kw):
        op = SymmetricOperator(h32, storage="upper", devices=devices)
        t0 = time.perf_counter()
        res = lobpcg_solver.lobpcg(op, 5, tol=1e-5, seed=0, dtype="float32", **kw)
        err = (np.asarray(res.eigenvalues) - exact) / abs(exact)
        print(f"{label:45s} it={res.iterations} rel err {np.array2string(err, precision=2)} "
              f"{time.perf_counter() - t0:.2f}s", flush=True)

    run("cpu", "cpu")
    run("gpu default", [0])
    run("gpu ctx cuda:0 min_call 0", [0], context=hb.Context(devices=["cuda:0"], min_call_seconds=0))
    run("gpu ctx cuda:0 static", [0], context=hb.Context(devices=["cuda:0"]))
    original = dense._lower_product
    try:
        def float64_on_host(a, b, context):
            a64 = cp.asnumpy(a).astype(np.float64)
            return a64.T @ (a64 if b is None else cp.asnumpy(b).astype(np.float64))
        dense._lower_product = float64_on_host
        run("gpu, Gram in float64 on host", [0])
        dense._lower_product = lambda a, b, context: a.T @ (a if b is None else b)
        run("gpu, Gram by cupy matmul (float32)", [0])
    finally:
        dense._lower_product = original

    # the kernel alone: a float32 Gram matrix with k = 28503, k chunks of 1024 against one chunk
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((28503, 24)) + 0.5).astype(np.float32)
    ref = x.astype(np.float64).T @ x.astype(np.float64)
    xd = cp.asarray(x)
    low = np.tril(np.ones((24, 24), bool))
    saved = hb_cuda.SINGLE_K
    try:
        for kc in (1024, 10**9):
            hb_cuda.SINGLE_K = kc
            got = hb.syrk(1.0, xd, trans="T", context=hb.Context(devices=["cuda:0"])).get()
            print(f"syrk float32 k chunk {kc}: max rel err {np.abs(got[low] - ref[low]).max() / np.abs(ref).max():.2e}")
    finally:
        hb_cuda.SINGLE_K = saved
    print(f"cupy matmul float32: max rel err {np.abs((xd.T @ xd).get() - ref).max() / np.abs(ref).max():.2e}")
    return 0
