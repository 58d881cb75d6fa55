"""Where the host time of LOBPCG's dense steps goes on a GPU: cProfile over a few iterations.

Where the blocks are small (24Mg, n = 28503) the dense steps' time is host round trips, kernel launches and
Python rather than GPU work. This runs ours on a synthetic symmetric matrix whose SpMM is cheap (a few
nonzeros per row), so the profile is the dense steps, and prints the per-step times and the functions with
the most own time.

    python3 -m benchmarks.cisolver profile --rows 1963461 --dtype float32 [--iterations 20] [--devices 0]
"""
import cProfile
import io
import pstats

import numpy as np
import scipy.sparse as sp

from cisolver import lobpcg
from cisolver.operators import SymmetricOperator
from hybridblas.console import positive_int
from hybridblas.devspec import parse_devices


def synthetic(n, dtype, seed=0):
    """Tridiagonal-plus-random symmetric matrix: a spread spectrum, ~5 nonzeros per row."""
    rng = np.random.default_rng(seed)
    main = np.sort(rng.uniform(-50.0, 50.0, n))
    off = rng.uniform(-1.0, 1.0, n - 1)
    h = sp.diags([off, main, off], [-1, 0, 1], format="csr")
    extra = sp.random(n, n, density=2.0 / n, random_state=rng, format="csr")
    return (h + 0.1 * (extra + extra.T)).tocsr().astype(dtype)


def add_arguments(ap):
    ap.add_argument("--rows", type=positive_int, default=1963461)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--iterations", type=positive_int, default=20)
    ap.add_argument("--devices", default="0", help="cpu, or GPUs: 0, 0,1, all ...")
    ap.add_argument("--top", type=positive_int, default=25)


def run(args):
    dtype = np.dtype(args.dtype)
    devices = list(parse_devices(args.devices, name="--devices").gpus) or "cpu"
    op = SymmetricOperator(synthetic(args.rows, dtype), storage="full", devices=devices)
    run = lambda: lobpcg(op, 5, block_size=8, tol=1e-30, maxiter=args.iterations, dtype=dtype, seed=1)  # noqa: E731
    run()                                       # warm-up: kernels compiled and loaded
    prof = cProfile.Profile()
    res = prof.runcall(run)
    it = max(res.iterations, 1)
    print(f"n = {args.rows}, {dtype}, devices {args.devices}, {it} iterations; ms per iteration:")
    for key, value in sorted(res.seconds.items()):
        print(f"  {key:28s} {value / it * 1e3:8.3f}")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())
    return 0
