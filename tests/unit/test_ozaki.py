"""hybridblas.ozaki: float64 and complex128 products from exact modular products (Ozaki scheme II), checked
against exact rational references: the reconstruction is exact, the products are at least as accurate as
numpy's float64 ones on random data, and the accuracy follows the number of moduli."""
import math
from fractions import Fraction

import numpy as np
import pytest

from hybridblas import ozaki


def _exact(a, b):
    """A B in exact rationals, rounded once to float64 (complex: each part)."""
    def one(x, y):
        fx = [[Fraction(float(v)) for v in row] for row in x]
        fy = [[Fraction(float(v)) for v in col] for col in y.T]
        return np.array([[float(sum(p * q for p, q in zip(r, c))) for c in fy] for r in fx])
    if a.dtype.kind != "c" and b.dtype.kind != "c":
        return one(a, b)
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    return one(np.hstack([ar, -ai]), np.vstack([br, bi])) + 1j * one(np.hstack([ar, ai]), np.vstack([bi, br]))


def _normwise(c, ref, a, b):
    """max |c - ref| / (|A| |B|) entrywise: the error on the scale a float64 product's bound uses."""
    bound = np.abs(a) @ np.abs(b)
    return float(np.max(np.abs(c - ref) / np.where(bound > 0, bound, 1.0)))


def test_moduli_are_pairwise_coprime_and_fit_int8_residues():
    assert all(math.gcd(p, q) == 1 for i, p in enumerate(ozaki.MODULI) for q in ozaki.MODULI[i + 1:])
    assert max(ozaki.MODULI) <= 256 and list(ozaki.MODULI) == sorted(ozaki.MODULI, reverse=True)


@pytest.mark.parametrize("count", [1, 3, 7, 8, 16, 20])
def test_reconstruction_is_exact_in_the_balanced_range(count, rng):
    moduli = ozaki.MODULI[:count]
    big = math.prod(moduli) // 4
    values = [0, 1, -1, big - 1, -(big - 1)] + [int(v) for v in rng.integers(-2 ** 62, 2 ** 62, 40)]
    values = [v % big if v >= 0 else -((-v) % big) for v in values]
    residues = [np.array([v % p for v in values]) for p in moduli]
    got = ozaki.reconstruct(residues, moduli)
    assert [float(g) for g in got] == [float(v) for v in values]      # each rounded once to float64


def test_bits_leave_room_for_the_sum():
    for count, k in ((16, 1), (16, 16384), (20, 100000), (4, 3)):
        moduli = ozaki.MODULI[:count]
        for complex_data in (False, True):
            bits = ozaki.bits_for(k, moduli, complex_data)
            terms = 2 * k if complex_data else k
            assert terms * 4 ** bits <= math.prod(moduli) // 4
    assert ozaki.bits_for(16384, ozaki.MODULI[:16]) >= 54          # a float64 mantissa and a bit more
    assert ozaki.bits_for(1, ozaki.MODULI) == ozaki.MAX_BITS          # int64 on a GPU bounds the integers
    with pytest.raises(ValueError, match="k must be at least 1"):
        ozaki.bits_for(0, ozaki.MODULI[:4])
    with pytest.raises(ValueError, match="leave no bits"):
        ozaki.bits_for(1 << 20, ozaki.MODULI[:2])


@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 3, 7), (31, 40, 17), (24, 64, 9)])
@pytest.mark.parametrize("kind", ["real", "complex"])
def test_products_as_accurate_as_float64(shape, kind, rng):
    m, k, n = shape
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    if kind == "complex":
        a, b = a + 1j * rng.standard_normal((m, k)), b + 1j * rng.standard_normal((k, n))
    ref = _exact(a, b)
    got = ozaki.gemm(a, b)
    assert got.dtype == (np.complex128 if kind == "complex" else np.float64) and got.shape == (m, n)
    ours, native = _normwise(got, ref, a, b), _normwise(a @ b, ref, a, b)
    assert ours <= max(native, 2 ** -53), (ours, native)


def test_accuracy_follows_the_number_of_moduli(rng):
    a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 12))
    ref = _exact(a, b)
    errors = [_normwise(ozaki.gemm(a, b, n_moduli=c), ref, a, b) for c in (6, 8, 10, 12, 14)]
    assert all(e1 > e2 for e1, e2 in zip(errors, errors[1:]) if e1 > 2 ** -52), errors
    assert errors[0] > 1e-8 and errors[-1] < 1e-14


def test_rows_and_columns_of_very_different_scale(rng):
    """Each row of A and column of B has its own power of two: rows 1e-200 and 1e200 apart stay accurate."""
    a = rng.standard_normal((6, 25)) * np.array([1e-200, 1e-5, 1.0, 1e5, 1e150, 3e200])[:, None]
    b = rng.standard_normal((25, 5)) * np.array([1e-100, 1.0, 1e80, 7.0, 1e-30])[None, :]
    ref = _exact(a, b)
    got = ozaki.gemm(a, b)
    assert _normwise(got, ref, a, b) <= max(_normwise(a @ b, ref, a, b), 2 ** -53)


def test_zeros_and_empty_shapes(rng):
    a = rng.standard_normal((4, 6))
    a[2] = 0.0
    b = rng.standard_normal((6, 3))
    b[:, 1] = 0.0
    got = ozaki.gemm(a, b)
    assert (got[2] == 0).all() and (got[:, 1] == 0).all()
    np.testing.assert_allclose(got, a @ b, rtol=0, atol=1e-14)
    assert ozaki.gemm(np.zeros((0, 3)), np.zeros((3, 2))).shape == (0, 2)
    assert (ozaki.gemm(np.ones((2, 0)), np.ones((0, 3))) == 0).all()


def test_a_given_matmul_receives_small_integers(rng):
    seen = []

    def matmul(x, y):
        seen.append((np.abs(x).max(initial=0), np.abs(y).max(initial=0), np.array_equal(x, np.trunc(x))))
        return x @ y
    a, b = rng.standard_normal((7, 9)), rng.standard_normal((9, 4))
    ozaki.gemm(a + 1j * a, b, n_moduli=5, matmul=matmul)
    assert len(seen) == 15                              # three products (Karatsuba) per modulus
    assert all(mx <= 128 and my <= 128 and whole for mx, my, whole in seen)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_moduli must be in 1..20, got 0"):
        ozaki.gemm(np.ones((2, 2)), np.ones((2, 2)), n_moduli=0)
    with pytest.raises(ValueError, match=r"got shapes \(2, 3\) and \(2, 2\)"):
        ozaki.gemm(np.ones((2, 3)), np.ones((2, 2)))


def test_moduli_for_a_requested_accuracy():
    def bits(k, count, complex_data):
        try:
            return ozaki.bits_for(k, ozaki.MODULI[:count], complex_data)
        except ValueError:
            return 0
    for k in (1, 100, 16384, 100000):
        for complex_data in (False, True):
            count = ozaki.moduli_for(k, 54, complex_data)
            assert bits(k, count, complex_data) >= 54 > bits(k, count - 1, complex_data)     # the fewest
    assert ozaki.moduli_for(16384) == 16 and ozaki.moduli_for(16384, 40) == 13
    with pytest.raises(ValueError, match="keep fewer than 90 bits"):
        ozaki.moduli_for(16384, 90)


def test_exact_entries_are_correctly_rounded(rng):
    """reference.exact_entries against exact rational sums, real and complex."""
    from fractions import Fraction
    from hybridblas import reference
    for complex_ in (False, True):
        a = rng.standard_normal((5, 300)) * 10.0 ** rng.integers(-8, 8, (5, 300))
        b = rng.standard_normal((300, 4))
        if complex_:
            a = a + 1j * rng.standard_normal((5, 300))
            b = b + 1j * rng.standard_normal((300, 4))
        rows, cols = [0, 3, 4], [1, 0, 3]
        got = reference.exact_entries(a, b, rows, cols)
        for t, (i, j) in enumerate(zip(rows, cols)):
            parts = [(a[i].real, b[:, j].real, 1), (a[i].imag, b[:, j].imag, -1)] if complex_ else \
                [(a[i], b[:, j], 1)]
            re = sum(s * Fraction(float(x)) * Fraction(float(y)) for xs, ys, s in parts for x, y in zip(xs, ys))
            assert got[t].real == float(re)
            if complex_:
                im = sum(Fraction(float(x)) * Fraction(float(y)) for xs, ys in
                         ((a[i].real, b[:, j].imag), (a[i].imag, b[:, j].real)) for x, y in zip(xs, ys))
                assert got[t].imag == float(im)


@pytest.mark.parametrize("cplx", [False, True])
def test_a_row_or_column_with_an_infinity_or_nan_gives_nan_there_only(cplx):
    """As the GPU emulation does: the entries of C that a non-finite row of A or column of B touches are NaN,
    the others exact to the scheme's accuracy."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((6, 9)), rng.standard_normal((9, 5))
    if cplx:
        a, b = a + 1j * rng.standard_normal((6, 9)), b + 1j * rng.standard_normal((9, 5))
    a[2, 4], b[7, 3] = np.nan, np.inf
    got = ozaki.gemm(a, b)
    bad = np.zeros((6, 5), bool)
    bad[2, :] = bad[:, 3] = True
    assert np.isnan(got[bad]).all() and np.isfinite(got[~bad]).all()
    ref = np.where(bad, 0, np.nan_to_num(a, nan=0, posinf=0) @ np.nan_to_num(b, nan=0, posinf=0))
    np.testing.assert_allclose(got[~bad], ref[~bad], rtol=1e-13, atol=1e-13)
