"""Time each dense step of one LOBPCG iteration on a GPU, for tall blocks like 48Cr's (n ~ 2e6).

Names the pieces of an iteration's dense steps: Gram products (hybridblas against cupy matmul, on the
row-major S buffer and on strided column ranges of it), w R^{-1} (cuBLAS trsm through cupyx against a gemm
with the small inverse), the block updates (cupy matmul against cisolver.blocks, one cuBLAS call on the
strided ranges), and whole CholQR2 / orthonormalisation / Rayleigh-Ritz calls of cisolver.dense.

    python3 -m benchmarks.cisolver dense-steps --rows 1963461 --block 8 --dtype float32 [--json F]
"""
import numpy as np
import scipy.linalg as sla

import hybridblas as hb
from cisolver import dense
from cisolver.blocks import product_into
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import write_json
from benchmarks.gputime import device_name, per_call


def _project_then_cholqr2(x, w, ctx):
    """The W step without BCGS-PIP, for comparison: W -= X (X^T W) twice, then CholQR2 (four host trips)."""
    import cupy as cp
    for _ in range(2):
        w -= x @ cp.asarray(cp.asnumpy(x.T @ w))
    return dense.cholqr2(w, context=ctx)


def _orthonormalise_tail(buf, hbuf, b, ctx):
    """One W step of the solver: [P W] of the buffer orthonormalised against X, in place (after the first
    call [P W] is orthonormal already; the passes do the same work)."""
    return dense.orthonormalise_tail(buf, hbuf, b, b, context=ctx)


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, default=1963461)
    ap.add_argument("--block", type=positive_int, default=8, help="LOBPCG block size b (S has 3b columns)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--reps", type=positive_int, default=20)
    ap.add_argument("--json", default=None)


def run(args):
    check_output_path(args.json, "--json")
    import cupy as cp
    n, b, dt = args.rows, args.block, np.dtype(args.dtype)
    rng = np.random.default_rng(0)
    s = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dt))
    hs = cp.asarray(rng.standard_normal((n, 3 * b)).astype(dt))
    w = cp.asarray(np.linalg.qr(rng.standard_normal((n, b)))[0].astype(dt))
    ctx = hb.Context(devices=["cuda:0"])
    r = sla.cholesky(cp.asnumpy(w.T @ w).astype(np.float64) + np.eye(b), lower=False)
    rinv = cp.asarray(sla.solve_triangular(r, np.eye(b)), dtype=dt)
    rr = cp.asarray(r, dtype=dt)
    cd = cp.asarray(rng.standard_normal((3 * b, b)).astype(dt))
    hsym = s @ (s.T @ s)            # S^T hsym = (S^T S)^2: symmetric, like S^T H S
    x = cp.asarray(np.linalg.qr(rng.standard_normal((n, b)))[0].astype(dt))    # Ritz vectors
    from cupyx.scipy.linalg import solve_triangular
    # the solver's buffer [X | P | W]: X orthonormal, P and W random
    buf = cp.concatenate([x, cp.asarray(rng.standard_normal((n, 2 * b)).astype(dt))], axis=1)
    hbuf = buf.copy()
    cz = rng.standard_normal((3 * b, 2 * b)) / np.sqrt(3 * b)
    cz_dev = cp.asarray(cz, dtype=dt)
    theta = rng.standard_normal(b)
    theta_dev = cp.asarray(theta, dtype=dt)
    res = cp.empty((n, b), dtype=dt)
    cases = {
        "gram S^T S, hybridblas syrk": lambda: hb.syrk(1.0, s, trans="T", context=ctx),
        "gram S^T S, cupy matmul": lambda: s.T @ s,
        "gram S^T HS, hybridblas gemmt": lambda: hb.gemmt(1.0, s, hs, transa="T", context=ctx),
        "gram S^T HS, cupy matmul": lambda: s.T @ hs,
        "w R^-1, cupyx solve_triangular": lambda: solve_triangular(rr, w.T, trans="T", lower=False).T,
        "w R^-1, gemm with inverse": lambda: w @ rinv,
        "S C (3b -> b)": lambda: s @ cd,
        "concatenate [X W P]": lambda: cp.concatenate([s[:, :b], s[:, b:2 * b], s[:, 2 * b:]], axis=1),
        "project x^T w, to host": lambda: cp.asnumpy(s[:, :b].T @ w),
        "cholqr2(W) (cisolver.dense)": lambda: dense.cholqr2(w.copy(), context=ctx),
        "one CholQR pass of P, HP (cisolver.dense)": lambda: dense.cholqr2(w.copy(), w.copy(), context=ctx, passes=1),
        "W ⟂ X: project twice + cholqr2 (four host trips)": lambda: _project_then_cholqr2(x, w.copy(), ctx),
        "[P W] ⟂ X: BCGS-PIP2 on the buffer (cisolver.dense)": lambda: _orthonormalise_tail(buf, hbuf, b, ctx),
        "gram [X P W]^T [P W], hybridblas gemm": lambda: hb.gemm(1.0, buf, buf[:, b:], transa="T", context=ctx),
        "gram [X P W]^T [P W], cupy matmul": lambda: buf.T @ buf[:, b:],
        "update [X P] <- S [C Z], cupy matmul + copy": lambda: buf[:, :2 * b].__setitem__(Ellipsis, buf @ cz_dev),
        "update [X P] <- S [C Z], blocks.product_into": lambda: product_into(hbuf[:, :2 * b], buf, cz),
        "residual HX - X theta, cupy": lambda: hs[:, :b] - s[:, :b] * theta_dev[None, :],
        "residual HX - X theta, cupy subtract into r": lambda: cp.subtract(hs[:, :b], s[:, :b] * theta_dev[None, :],
                                                                          out=res),
        "rayleigh_ritz(S, HS) (cisolver.dense)": lambda: dense.rayleigh_ritz(s, hsym, b, context=ctx),
    }
    out = {"rows": n, "block": b, "dtype": str(dt), "device": device_name(),
           "ms": {}, "gram_rel_error": {}}
    print(f"n = {n}, b = {b}, {dt}, {out['device']}")
    for name, fn in cases.items():
        ms = per_call(fn, args.reps) * 1e3
        out["ms"][name] = ms
        print(f"  {name:40s} {ms:8.3f} ms", flush=True)
    # accuracy of each way to the Gram matrix S^T HS, against float64 products of the same inputs
    ref = cp.asnumpy(s.astype(np.float64).T @ hs.astype(np.float64))
    low = np.tril(np.ones(ref.shape, bool))
    ways = {"hybridblas gemmt": lambda: hb.gemmt(1.0, s, hs, transa="T", context=ctx),
            "cupy matmul": lambda: s.T @ hs}
    for name, fn in ways.items():
        got = cp.asnumpy(fn()).astype(np.float64)
        err = float(np.abs(got[low] - ref[low]).max() / np.abs(ref).max())
        out["gram_rel_error"][name] = err
        print(f"  S^T HS rel. error, {name:28s} {err:.2e}", flush=True)
    write_json(args.json, out)
