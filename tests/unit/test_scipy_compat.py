"""scipy.linalg.blas as a drop-in reference: the same positional arguments (alpha, a, [b,] beta, c, trans,
lower, overwrite_c; gemm's trans_a, trans_b) give the same numbers, overwrite_c both ways; and the
documented differences: our default triangle is the lower one (scipy's the upper), our default
overwrite_c is True (C updated in place)."""
import numpy as np
import pytest
from scipy.linalg import blas

import hybridblas as hb
from blas_cases import random_matrix

CPU = hb.Context("cpu")
N_, K_ = 9, 5


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _rank_k_args(rng, name, dtype, trans):
    """Operands for herk/syrk/her2k/syr2k with scipy's integer trans; the scalars scipy's routine takes."""
    shape = (N_, K_) if trans == 0 else (K_, N_)
    ops = [random_matrix(rng, shape, dtype) for _ in range(2 if name.endswith("2k") else 1)]
    complex_ = np.dtype(dtype).kind == "c"
    alpha = 0.8 if name == "herk" or not complex_ else 0.8 - 0.3j
    beta = 0.6 if name in ("herk", "her2k") or not complex_ else 0.6 + 0.2j
    return ops, alpha, beta


RANK_K = [("herk", "z", np.complex128, (0, 2)), ("her2k", "z", np.complex128, (0, 2)),
          ("syrk", "z", np.complex128, (0, 1)), ("syr2k", "z", np.complex128, (0, 1)),
          ("syrk", "d", np.float64, (0, 1, 2)), ("syr2k", "d", np.float64, (0, 1, 2)),
          ("herk", "d", np.float64, (0, 1, 2))]     # real herk is syrk (scipy has no dherk)


def _scipy_rank_k(prefix, name):
    return getattr(blas, prefix + (name.replace("her", "syr") if prefix == "d" else name))


@pytest.mark.parametrize("name,prefix,dtype,transes", RANK_K, ids=[f"{p}{n}" for n, p, _, _ in RANK_K])
@pytest.mark.parametrize("lower", [0, 1])
@pytest.mark.parametrize("overwrite", [0, 1])
def test_rank_k_same_positional_arguments(name, prefix, dtype, transes, lower, overwrite, rng):
    ref = _scipy_rank_k(prefix, name)
    for trans in transes:
        ops, alpha, beta = _rank_k_args(rng, name, dtype, trans)
        c0 = np.asfortranarray(random_matrix(rng, (N_, N_), dtype))
        want = ref(alpha, *ops, beta, c0.copy(order="F"), trans, lower, overwrite)
        c = c0.copy(order="F")
        got = getattr(hb, name)(alpha, *ops, beta, c, trans, lower, overwrite, context=CPU)
        _close(got, want)                          # both triangles: the other one is C's, untouched
        if overwrite:
            assert got is c
        else:
            assert got is not c
            np.testing.assert_array_equal(c, c0)


@pytest.mark.parametrize("prefix,dtype", [("z", np.complex128), ("d", np.float64)])
@pytest.mark.parametrize("overwrite", [0, 1])
@pytest.mark.parametrize("order", ["F", "C"])
def test_gemm_same_positional_and_keyword_arguments(prefix, dtype, overwrite, order, rng):
    ref = getattr(blas, prefix + "gemm")
    for ta in (0, 1, 2):
        for tb in (0, 1, 2):
            a = random_matrix(rng, (7, 4) if ta == 0 else (4, 7), dtype)
            b = random_matrix(rng, (4, 6) if tb == 0 else (6, 4), dtype)
            c0 = np.array(random_matrix(rng, (7, 6), dtype), order=order)
            alpha, beta = (0.7 - 0.2j, 0.4 + 0.1j) if prefix == "z" else (0.7, 0.4)
            want = ref(alpha, a, b, beta, c0.copy(), ta, tb, overwrite)
            c = c0.copy(order="K")
            got = hb.gemm(alpha, a, b, beta, c, ta, tb, overwrite, context=CPU)
            _close(got, want)
            assert (got is c) == bool(overwrite)
            if not overwrite:
                np.testing.assert_array_equal(c, c0)
            kw = hb.gemm(alpha, a, b, beta, c0.copy(), trans_a=ta, trans_b=tb, context=CPU)   # scipy's names
            _close(kw, ref(alpha, a, b, beta, c0.copy(), trans_a=ta, trans_b=tb))


@pytest.mark.parametrize("name", ["herk", "syrk"])
def test_default_triangle_is_lower_scipy_upper(name, rng):
    """Documented difference: hb fills the lower triangle by default, scipy the upper one; the other
    triangle is zero in both new C's, and the filled triangles are each other's (conjugate) transposes."""
    a = random_matrix(rng, (N_, K_), np.complex128)
    ours = getattr(hb, name)(1.0, a, context=CPU)
    theirs = getattr(blas, "z" + name)(1.0, a)
    assert (np.triu(ours, 1) == 0).all() and (np.tril(theirs, -1) == 0).all()
    assert (ours[np.tril_indices(N_, -1)] != 0).all() and (theirs[np.triu_indices(N_, 1)] != 0).all()
    back = theirs.conj().T if name == "herk" else theirs.T
    _close(np.tril(ours), back)
    _close(getattr(hb, name)(1.0, a, lower=False, context=CPU), theirs)   # lower=0 gives scipy's triangle
    _close(ours, getattr(blas, "z" + name)(1.0, a, lower=1))


def test_default_overwrite_differs(rng):
    """Documented difference: a given c is updated in place by default (scipy returns a new array)."""
    a = random_matrix(rng, (N_, K_), np.complex128)
    c0 = np.asfortranarray(random_matrix(rng, (N_, N_), np.complex128))
    theirs_c, ours_c = c0.copy(order="F"), c0.copy(order="F")
    theirs = blas.zherk(1.0, a, 1.0, theirs_c, lower=1)
    ours = hb.herk(1.0, a, 1.0, ours_c, context=CPU)
    np.testing.assert_array_equal(theirs_c, c0)                 # scipy: c as it was
    assert ours is ours_c and not np.array_equal(ours_c, c0)     # ours: c is the result
    _close(ours, theirs)


def test_positional_trans_and_lower_letters(rng):
    """Letters work where scipy takes integers: 'C' = 2, 'L' = 1, 'U' = 0."""
    a = random_matrix(rng, (K_, N_), np.complex128)
    b = random_matrix(rng, (K_, N_), np.complex128)
    c0 = np.asfortranarray(random_matrix(rng, (N_, N_), np.complex128))
    for lower, letter in ((1, "L"), (0, "U")):
        want = blas.zher2k(0.5 + 0.5j, a, b, 0.3, c0.copy(order="F"), 2, lower)
        _close(hb.her2k(0.5 + 0.5j, a, b, 0.3, c0.copy(order="F"), "C", letter, context=CPU), want)
