"""Shared cases and checks for the BLAS-contract tests (CPU here, GPU contexts in test_gpu*)."""
import itertools

import numpy as np
import pytest

from hybridblas import reference

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
EPS = {np.dtype(np.float32): np.finfo(np.float32).eps, np.dtype(np.complex64): np.finfo(np.float32).eps,
       np.dtype(np.float64): np.finfo(np.float64).eps, np.dtype(np.complex128): np.finfo(np.float64).eps}

# (routine name, number of operands, trans keyword(s), legal trans values for complex data)
ROUTINES = {
    "herk": (1, ("trans",), ["N", "C"]),
    "her2k": (2, ("trans",), ["N", "C"]),
    "syrk": (1, ("trans",), ["N", "T"]),
    "syr2k": (2, ("trans",), ["N", "T"]),
    "herkx": (2, ("trans",), ["N", "C"]),
    "gemmt": (2, ("transa", "transb"), ["N", "T", "C"]),
    "gemm": (2, ("transa", "transb"), ["N", "T", "C"]),
}


def random_matrix(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def layout(x, how, rng=None):
    """The same values as x in a chosen memory layout: F, C, ld (F with lda > rows), C-ld, step, neg."""
    r, q = x.shape
    if how == "F":
        return np.array(x, order="F")
    if how == "C":
        return np.array(x, order="C")
    if how == "ld":
        big = np.full((r + 3, q + 2), np.nan, dtype=x.dtype, order="F")
        big[1:r + 1, 2:q + 2] = x
        return big[1:r + 1, 2:q + 2]
    if how == "C-ld":
        big = np.full((r + 2, q + 5), np.nan, dtype=x.dtype)
        big[:r, 3:q + 3] = x
        return big[:r, 3:q + 3]
    if how == "step":
        big = np.full((2 * r + 1, 3 * q + 1), np.nan, dtype=x.dtype)
        big[1::2, ::3][:r, :q] = x
        return big[1::2, ::3][:r, :q]
    if how == "neg":
        return np.array(x[::-1, ::-1])[::-1, ::-1]
    raise ValueError(how)


def operand_shape(trans, rows, inner):
    """Shape of the stored operand whose op() is rows x inner."""
    return (rows, inner) if trans == "N" else (inner, rows)


def reference_for(name, alpha, ops, beta, c, lower, trans):
    if name == "herk":
        return reference.ref_herk(alpha, ops[0], beta, c, trans[0], lower)
    if name == "her2k":
        return reference.ref_her2k(alpha, ops[0], ops[1], beta, c, trans[0], lower)
    if name == "syrk":
        return reference.ref_syrk(alpha, ops[0], beta, c, trans[0], lower)
    if name == "syr2k":
        return reference.ref_syr2k(alpha, ops[0], ops[1], beta, c, trans[0], lower)
    if name == "herkx":
        tb = "C" if trans[0] == "N" else "N"
        return reference.ref_gemmt(alpha, ops[0], ops[1], beta, c, trans[0], tb, lower)
    if name == "gemmt":
        return reference.ref_gemmt(alpha, ops[0], ops[1], beta, c, trans[0], trans[1], lower)
    return reference.ref_gemm(alpha, ops[0], ops[1], beta, c, trans[0], trans[1])


def tolerance(dtype, k, alpha, ops, beta, c):
    scale = abs(alpha) * np.prod([np.abs(o).max() if o.size else 0.0 for o in ops])
    if len(ops) == 2 and ops[0].size and ops[1].size:
        scale *= 2
    cmax = np.nanmax(np.abs(c)) if c.size and np.isfinite(c).any() else 0.0
    return 30 * EPS[np.dtype(dtype)] * ((k + 2) * scale + abs(beta) * cmax + 1e-30)


def triangle_mask(n, lower):
    return np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))


def make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m=None):
    """Random operands (values), a C poisoned with NaN when beta = 0, the float64 expectation and the
    tolerance for one call; ``m`` rows of C for gemm (default n)."""
    m = n if m is None else m
    if name in ("gemm", "gemmt"):
        shapes = [operand_shape(trans[0], m, k), operand_shape(trans[1], k, n)]
    else:
        shapes = [operand_shape(trans[0], n, k)] * ROUTINES[name][0]
    values = [random_matrix(rng, s, dtype) for s in shapes]
    c0 = random_matrix(rng, (m, n), dtype)
    if beta == 0:
        c0[...] = np.nan                 # beta = 0 must not read C
    expected = reference_for(name, alpha, values, beta, c0, lower, trans)
    tol = tolerance(dtype, k, alpha, values, beta, np.where(np.isnan(c0), 0, c0))
    return values, c0, expected, tol


def trans_choices(name, dtype):
    """Every legal trans (gemm/gemmt: both) of a routine for real or complex ``dtype``."""
    legal = ROUTINES[name][2] if np.dtype(dtype).kind == "c" else ["N", "T"]
    if name in ("gemm", "gemmt"):
        return [(a, b) for a in legal for b in legal]
    return [(t,) for t in legal]


def contract_cases():
    """pytest params (routine, dtype, trans, lower) covering every legal trans combination and uplo."""
    for name, (_, _, legal) in ROUTINES.items():
        for dtype in DTYPES:
            values = legal if np.dtype(dtype).kind == "c" else ["N", "T", "C"]
            combos = list(itertools.product(values, values)) if name in ("gemm", "gemmt") else [(t,) for t in values]
            for trans in combos:
                for lower in ([None] if name == "gemm" else [True, False]):
                    yield pytest.param(name, dtype, trans, lower,
                                       id=f"{name}-{np.dtype(dtype).name}-{''.join(trans)}-{lower}")


def call_routine(name, alpha, ops, beta, c, trans, lower, ctx):
    """hb.<name>(alpha, *ops, beta, c, ...) with the routine's own trans/uplo keywords."""
    import hybridblas as hb
    kw = {"context": ctx}
    if name in ("gemm", "gemmt"):
        kw.update(transa=trans[0], transb=trans[1])
    else:
        kw.update(trans=trans[0])
    if name != "gemm":
        kw["lower"] = lower
    return getattr(hb, name)(alpha, *ops, beta, c, **kw)
