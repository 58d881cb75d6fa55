"""Float64 matrix products from exact small-integer products: the Ozaki scheme II (Ozaki, Uchino and Imamura,
2025), the arithmetic that lets INT8 tensor cores stand in for FP64 units.

For C = A B (A m x k, B k x n, float64 or complex128):

1. Scaling. Each row i of A is scaled by 2^mu_i and each column j of B by 2^nu_j, then truncated to integers
   A', B' whose entries stay below 2^bits in magnitude. ``bits`` is chosen so that every entry of A' B' (for
   complex data, of its real and imaginary parts) is below P / 4 in magnitude, P the product of the moduli.
   The truncation is the only rounding of the inputs: relative to the largest entry of its row (or column),
   each entry keeps ``bits`` bits.
2. Residues. For each modulus p (pairwise coprime, at most 256) the residues of A' and B' are taken in
   [-128, 127]: one exact ``fmod`` of a float64 integer each (IEEE fmod is exact).
3. Products. One product of the residue matrices per modulus, exact: each entry is a sum of k products of
   magnitude at most 2^14, so INT8 x INT8 -> INT32 tensor-core products are exact for k < 2^17, and float64
   products (the CPU) for any k below 2^39. Complex data takes three per modulus (Karatsuba: Re Re, Im Im, and
   (Re + Im)(Re + Im)).
4. Reconstruction. The residues of each entry of A' B' give its value by the Chinese remainder theorem. Here
   through Garner's mixed-radix digits, each taken in the balanced range (-p/2, p/2]: the entry is
   v_1 + p_1 (v_2 + p_2 (v_3 + ...)), with small-integer arithmetic only for the digits; the innermost
   digits are summed exactly in 64-bit integers, the outer ones in float64 (one rounding each). Then the
   scaling is undone: C = diag(2^-mu) (A' B') diag(2^-nu).

The number of moduli sets the accuracy: 16 moduli (P ~ 2^125) keep about 55 bits of every row of A and column of
B at k = 16384, the accuracy of a float64 product. This module is the arithmetic, on numpy or cupy arrays; the
products go through a function given by the caller (``matmul``).
"""
import math
from functools import reduce

import numpy as np

from .problem import array_module

__all__ = ["MODULI", "INT32_K", "MAX_BITS", "bits_for", "moduli_for", "modular_product", "garner_weights", "reconstruct", "gemm"]

# pairwise coprime, the largest at most 256 (balanced residues fit in int8), largest first
MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199, 197, 193, 191, 181, 179, 173)
INT32_K = 1 << 17          # k below this: INT8 x INT8 -> INT32 products of residues in [-128, 127] are exact
_EXACT_DIGITS = 7          # innermost Garner digits summed in int64: 7 moduli of at most 2^8 stay below 2^62


def _product(values):
    return reduce(lambda x, y: x * y, values, 1)


MAX_BITS = 62              # the scaled integers are held in int64 on a GPU


def bits_for(k, moduli, complex_data=False):
    """Bits per entry of A' and B' for inner dimension ``k``: sum |a'| |b'| over k (2k terms for complex) must
    stay below P / 4, P the product of ``moduli``; at most MAX_BITS."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k!r}")
    terms = 2 * k if complex_data else k
    headroom = _product(moduli).bit_length() - 1 - 2 - math.ceil(math.log2(terms))
    bits = headroom // 2
    if bits < 1:
        raise ValueError(f"{len(moduli)} moduli leave no bits for k = {k}")
    return min(bits, MAX_BITS)


def moduli_for(k, bits=54, complex_data=False):
    """The fewest moduli that keep ``bits`` bits of every row of A and column of B at inner dimension ``k``
    (54: a float64 mantissa and one bit more)."""
    for count in range(1, len(MODULI) + 1):
        try:
            if bits_for(k, MODULI[:count], complex_data) >= bits:
                return count
        except ValueError:
            continue
    raise ValueError(f"{len(MODULI)} moduli keep fewer than {bits} bits at k = {k}")


def _exponents(x, axis, bits, xp):
    """Per row (axis 1) or column (axis 0): the power of two that brings the largest |entry| below 2^bits."""
    top = xp.abs(x).max(axis=axis) if x.shape[axis] else xp.zeros(x.shape[1 - axis])
    _, e = xp.frexp(top)                        # top = f 2^e, f in [0.5, 1): top < 2^e
    return xp.where(top > 0, bits - e, 0).astype(np.int64)


def _integers(x, mu, axis, xp):
    scale = mu[:, None] if axis == 1 else mu[None, :]
    return xp.trunc(xp.ldexp(x, scale.astype(np.int32)))


def _residues(x, p, xp):
    """Balanced residues of the float64 integers x modulo p, in [-128, 127] (float64 holding integers)."""
    r = xp.fmod(x, float(p))                      # exact, |r| < p
    r = xp.where(r > 127, r - p, r)
    return xp.where(r < -128, r + p, r)


def modular_product(ra, rb, p, matmul):
    """(ra rb) mod p in [0, p) as int64, ``matmul`` giving the exact integer product of the residue matrices."""
    xp = array_module(ra)
    s = xp.asarray(matmul(ra, rb), dtype=np.float64)
    r = xp.fmod(s, float(p))
    return xp.where(r < 0, r + p, r).astype(np.int64)


def garner_weights(moduli):
    """Per modulus p_i: (w, q) with w[j] = p_0 ... p_(j-1) mod p_i for j < i and q the inverse of
    p_0 ... p_(i-1) modulo p_i. Garner's digit i is then ((r_i - sum_j d_j w[j]) q) mod p_i: one pass per digit,
    the sum small enough for 32-bit integers (at most 20 terms below 2^15 each)."""
    out = []
    for i, p in enumerate(moduli):
        w = [_product(moduli[:j]) % p for j in range(i)]
        out.append((w, pow(_product(moduli[:i]) % p, -1, p)))
    return out


def reconstruct(residues, moduli):
    """The integers x with x = residues[i] (mod moduli[i]) and |x| < P / 4, rounded to float64.

    Garner's digits v_i (balanced) from the residues (garner_weights); then
    x = v_1 + p_1 (v_2 + p_2 (... + p_n-1 v_n)), the innermost digits summed exactly in int64, the outer ones in
    double-double arithmetic (each step p * (hi + lo) + v with an exact product of the small p by the high part
    split in two): the result is x rounded once, up to a relative 2^-100 or so."""
    xp = array_module(residues[0])
    n = len(moduli)
    digits = []
    for (w, q), p, r in zip(garner_weights(moduli), moduli, residues):
        s = r.astype(np.int64)
        for d, wj in zip(digits, w):
            s = s - d * wj
        t = (s % p) * q % p
        digits.append(xp.where(t > p // 2, t - p, t))
    inner = min(n, _EXACT_DIGITS)
    y = digits[n - 1]
    for i in range(n - 2, n - 1 - inner, -1):     # exact: |y| < p_i ... p_n < 2^62
        y = digits[i] + moduli[i] * y
    hi = y.astype(np.float64)
    lo = (y - hi.astype(np.int64)).astype(np.float64)
    for i in range(n - 1 - inner, -1, -1):
        hi, lo = _times_small_plus(moduli[i], hi, lo, digits[i].astype(np.float64))
    return hi + lo


def _times_small_plus(p, hi, lo, v):
    """p (hi + lo) + v in double-double, p an integer below 2^9: hi is split (Veltkamp) into a part of 44 bits,
    whose product by p is exact, and a part of 9 bits, likewise."""
    t = hi * float((1 << 9) + 1)
    top = t - (t - hi)
    low = hi - top
    ph = p * top                                  # exact
    pl = p * low + p * lo                         # p * low exact; p * lo: a rounding far below hi's last bit
    s = ph + v                                    # two-sum of ph and v
    b = s - ph
    e = (ph - (s - b)) + (v - b) + pl
    head = s + e                                  # renormalised: |e| is far below |s|
    return head, e - (head - s)


def gemm(a, b, n_moduli=16, matmul=None):
    """C = A B for float64 or complex128 A (m x k) and B (k x n), numpy or cupy, from ``n_moduli`` exact
    modular products each (three for complex data). ``matmul(x, y)`` multiplies two float64 matrices holding
    integers of magnitude at most 128 exactly (default: the array module's own product, exact in float64)."""
    xp = array_module(a)
    if not 1 <= n_moduli <= len(MODULI):
        raise ValueError(f"n_moduli must be in 1..{len(MODULI)}, got {n_moduli!r}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a and b must be m x k and k x n, got shapes {a.shape} and {b.shape}")
    matmul = matmul or (lambda x, y: x @ y)
    moduli = MODULI[:n_moduli]
    m, k = a.shape
    n = b.shape[1]
    complex_data = a.dtype.kind == "c" or b.dtype.kind == "c"
    out_dtype = np.complex128 if complex_data else np.float64
    if m == 0 or n == 0 or k == 0:
        return xp.zeros((m, n), dtype=out_dtype)
    # a row of A or column of B holding an infinity or NaN gives NaN in its entries of C (as on the GPU)
    bad_rows, bad_cols = ~xp.isfinite(a).all(axis=1), ~xp.isfinite(b).all(axis=0)
    a = xp.where(bad_rows[:, None], 0, a)
    b = xp.where(bad_cols[None, :], 0, b)
    bits = bits_for(k, moduli, complex_data)
    parts_a = (a.real, a.imag) if complex_data else (a,)
    parts_b = (b.real, b.imag) if complex_data else (b,)
    mu = _exponents(xp.maximum(*map(xp.abs, parts_a)) if complex_data else a, 1, bits, xp)
    nu = _exponents(xp.maximum(*map(xp.abs, parts_b)) if complex_data else b, 0, bits, xp)
    ia = [_integers(xp.asarray(x, dtype=np.float64), mu, 1, xp) for x in parts_a]
    ib = [_integers(xp.asarray(x, dtype=np.float64), nu, 0, xp) for x in parts_b]
    real, imag = [], []
    for p in moduli:
        ra = [_residues(x, p, xp) for x in ia]
        rb = [_residues(x, p, xp) for x in ib]
        if not complex_data:
            real.append(modular_product(ra[0], rb[0], p, matmul))
            continue
        rr = modular_product(ra[0], rb[0], p, matmul)
        ii = modular_product(ra[1], rb[1], p, matmul)
        ss = modular_product(_residues(ra[0] + ra[1], p, xp), _residues(rb[0] + rb[1], p, xp), p, matmul)
        real.append((rr - ii) % p)
        imag.append((ss - rr - ii) % p)
    scale = -(mu[:, None] + nu[None, :]).astype(np.int32)
    c = xp.ldexp(reconstruct(real, moduli), scale)
    if complex_data:
        c = c + 1j * xp.ldexp(reconstruct(imag, moduli), scale)
    bad = bad_rows[:, None] | bad_cols[None, :]
    return xp.where(bad, xp.asarray(complex(np.nan, np.nan) if complex_data else np.nan, dtype=out_dtype), c)
