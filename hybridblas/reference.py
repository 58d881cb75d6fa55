"""Plain numpy reference of the netlib contract, computed in float64/complex128.

Used by the tests as the oracle and by users who want to check a result. Slow on purpose: it forms the
full product and then applies the netlib rules (only the triangle, beta = 0 does not read C, real diagonal
for herk/her2k, quick return when alpha or k is zero and beta is one).
"""
import math

import numpy as np

__all__ = ["ref_herk", "ref_her2k", "ref_syrk", "ref_syr2k", "ref_gemmt", "ref_gemm", "exact_entries"]


def _wide(x):
    return np.asarray(x, dtype=np.complex128 if np.iscomplexobj(x) else np.float64)


def _op(x, trans):
    x = _wide(x)
    return {"N": x, "T": x.T, "C": x.conj().T}[trans]


def _apply(c, full, beta, lower, hermitian, k, alpha):
    """C[tri] <- full + beta*C[tri] with the netlib special cases; returns a new float64/complex128 array."""
    out = _wide(c).copy()
    n = out.shape[0]
    mask = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
    if (alpha == 0 or k == 0) and beta == 1:
        return out
    old = np.zeros_like(out) if beta == 0 else beta * out
    new = np.where(mask, full + old, out)
    if hermitian and np.iscomplexobj(new):
        idx = np.arange(n)
        new[idx, idx] = new[idx, idx].real
    return new


def ref_herk(alpha, a, beta, c, trans="N", lower=True):
    x = _op(a, "N" if trans == "N" else "C")
    return _apply(c, alpha * (x @ x.conj().T), beta, lower, True, x.shape[1], alpha)


def ref_her2k(alpha, a, b, beta, c, trans="N", lower=True):
    t = "N" if trans == "N" else "C"
    x, y = _op(a, t), _op(b, t)
    full = alpha * (x @ y.conj().T) + np.conj(alpha) * (y @ x.conj().T)
    return _apply(c, full, beta, lower, True, x.shape[1], alpha)


def ref_syrk(alpha, a, beta, c, trans="N", lower=True):
    x = _op(a, "N" if trans == "N" else "T")
    return _apply(c, alpha * (x @ x.T), beta, lower, False, x.shape[1], alpha)


def ref_syr2k(alpha, a, b, beta, c, trans="N", lower=True):
    t = "N" if trans == "N" else "T"
    x, y = _op(a, t), _op(b, t)
    return _apply(c, alpha * (x @ y.T + y @ x.T), beta, lower, False, x.shape[1], alpha)


def ref_gemmt(alpha, a, b, beta, c, transa="N", transb="N", lower=True):
    x, y = _op(a, transa), _op(b, transb)
    return _apply(c, alpha * (x @ y), beta, lower, False, x.shape[1], alpha)


def ref_gemm(alpha, a, b, beta, c, transa="N", transb="N"):
    x, y = _op(a, transa), _op(b, transb)
    out = _wide(c).copy()
    if (alpha == 0 or x.shape[1] == 0) and beta == 1:
        return out
    old = np.zeros_like(out) if beta == 0 else beta * out
    return alpha * (x @ y) + old


def exact_entries(a, b, rows, cols):
    """Entries (rows[t], cols[t]) of a @ b, each rounded once from its exact value: every product split
    exactly in two doubles (Dekker), the sum by math.fsum. float64 or complex128 host arrays whose products
    neither overflow nor underflow (|entries| below ~1e300, where Dekker's split stays finite); the yardstick
    for the accuracy of a BLAS product. ``rows`` and ``cols``: integer sequences of one length, in range."""
    a, b = _wide(a), _wide(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a and b must be m x k and k x n, got shapes {a.shape} and {b.shape}")
    rows, cols = np.asarray(rows), np.asarray(cols)
    for name, idx, limit in (("rows", rows, a.shape[0]), ("cols", cols, b.shape[1])):
        if idx.ndim != 1 or (idx.size and (idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= limit)):
            raise ValueError(f"{name} must be a sequence of integers in 0..{limit - 1}, got {idx!r:.80}")
    if len(rows) != len(cols):
        raise ValueError(f"rows and cols must have one length, got {len(rows)} and {len(cols)}")
    out = []
    for i, j in zip(rows, cols):
        x, y = a[i], b[:, j]
        if np.iscomplexobj(x) or np.iscomplexobj(y):
            x, y = x.astype(np.complex128), y.astype(np.complex128)
            re = math.fsum(_exact_products(x.real, y.real) + _exact_products(-x.imag, y.imag))
            im = math.fsum(_exact_products(x.real, y.imag) + _exact_products(x.imag, y.real))
            out.append(complex(re, im))
        else:
            out.append(math.fsum(_exact_products(x, y)))
    return np.array(out)


def _exact_products(x, y):
    """x_i y_i as the exact sums p_i + e_i, returned as one list [p..., e...]."""
    p = x * y

    def halves(v):
        t = v * 134217729.0           # 2^27 + 1: v = hi + lo with hi, lo of 26 bits each
        hi = t - (t - v)
        return hi, v - hi
    xh, xl = halves(x)
    yh, yl = halves(y)
    e = ((xh * yh - p) + xh * yl + xl * yh) + xl * yl
    return list(p) + list(e)
