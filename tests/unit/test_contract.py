"""The netlib contract, swept: every routine x dtype x uplo x trans x special alpha/beta x sizes (0, 1,
odd, larger than a tile) x layouts (both orders, lda > n, non-unit strides) x both strategies with tiny
tiles on several CPU workers. Compared with a float64 reference on random data; C is poisoned."""
import itertools

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import (DTYPES, ROUTINES, call_routine, contract_cases, layout, make_case, random_matrix,
                        reference_for, triangle_mask)

SIZES = [(0, 3), (1, 1), (4, 0), (5, 7), (37, 19)]     # (n, k); 37 > the tiny tiles below
LAYOUTS = ["F", "C", "ld", "C-ld", "step", "neg"]
CONTEXTS = {
    "static-2cpu": dict(devices=["cpu", "cpu"], strategy="static", block_size=8),
    "dynamic-2cpu": dict(devices=["cpu", "cpu"], strategy="dynamic", block_size=8),
    "dynamic-3cpu-sync": dict(devices=["cpu", "cpu", "cpu"], strategy="dynamic", block_size=5, sync=True),
    "whole": dict(devices="cpu"),
}


def _alpha_beta(rng, name, dtype):
    complex_ = np.dtype(dtype).kind == "c"
    real_alpha = name == "herk" or not complex_
    real_beta = name in ("herk", "her2k") or not complex_
    a = 0.7 if real_alpha else 0.7 - 0.4j
    b = -1.3 if real_beta else -1.3 + 0.6j
    return [(a, b), (a, 0.0), (0.0, b), (a, 1.0), (0.0, 1.0)]


@pytest.mark.parametrize("name,dtype,trans,lower", list(contract_cases()))
def test_contract_sweep(name, dtype, trans, lower, rng):
    contexts = {k: hb.Context(**v) for k, v in CONTEXTS.items()}
    for (n, k), (alpha, beta) in itertools.product(SIZES, _alpha_beta(rng, name, dtype)):
        m = n + 2 if name == "gemm" else n
        values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m)
        for ctx_name, ctx in contexts.items():
            how = LAYOUTS[rng.integers(len(LAYOUTS))]
            ops = [layout(v, LAYOUTS[rng.integers(len(LAYOUTS))]) for v in values]
            c = layout(c0, how)
            out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
            where = f"{ctx_name} n={n} k={k} alpha={alpha} beta={beta} c-layout={how}"
            assert out is c, where
            for o, v in zip(ops, values):
                np.testing.assert_array_equal(o, v, err_msg="operand modified: " + where)
            mask = np.ones((m, n), bool) if name == "gemm" else triangle_mask(n, lower)
            got = np.asarray(out)
            assert not np.isnan(got[mask]).any(), "NaN in the computed part: " + where
            err = np.abs(got[mask] - expected[mask]).max(initial=0.0)
            assert err <= tol, f"error {err:.3g} > {tol:.3g}: {where}"
            np.testing.assert_array_equal(got[~mask], c0[~mask], err_msg="other triangle touched: " + where)
            if name in ("herk", "her2k") and np.iscomplexobj(got) and not (
                    (alpha == 0 or k == 0) and beta == 1):
                assert (np.diagonal(got).imag == 0).all(), "diagonal not exactly real: " + where


@pytest.mark.parametrize("name", ["herk", "her2k", "syrk", "syr2k", "gemmt", "herkx", "gemm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_new_c_has_zero_other_triangle(name, dtype, rng):
    n, k = 9, 4
    n_ops = ROUTINES[name][0]
    ops = [random_matrix(rng, (n, k), dtype)] if n_ops == 1 else [
        random_matrix(rng, (n, k), dtype), random_matrix(rng, (k, n) if name in ("gemm", "gemmt") else (n, k), dtype)]
    trans = ("N", "N") if name in ("gemm", "gemmt") else ("N",)
    out = call_routine(name, 1.0, ops, 0.0, None, trans, True, hb.Context("cpu"))
    expected = reference_for(name, 1.0, ops, 0.0, np.zeros((n, n), dtype), True, trans)
    assert out.dtype == np.dtype(dtype) and out.shape == (n, n)
    if name != "gemm":
        assert (np.triu(out, 1) == 0).all()
    mask = np.ones((n, n), bool) if name == "gemm" else triangle_mask(n, True)
    assert np.allclose(out[mask], expected[mask], rtol=1e-4, atol=1e-4)


def test_scipy_style_trans_integers(rng):
    a = random_matrix(rng, (6, 11), np.complex128)
    c0 = random_matrix(rng, (11, 11), np.complex128)
    for t, name in ((0, "N"), (2, "C")):
        x = a if name == "C" else a.T.copy()
        got = hb.herk(1.5, x, 0.5, c0.copy(order="F"), trans=t, lower=False, context=hb.Context("cpu"))
        want = hb.herk(1.5, x, 0.5, c0.copy(order="F"), trans=name, lower=False, context=hb.Context("cpu"))
        np.testing.assert_array_equal(got, want)


def test_matches_scipy_zherk_bitwise_shape(rng):
    """Drop-in: scipy's zherk and ours agree to rounding on the same arguments (positional order too)."""
    from scipy.linalg import blas
    a = random_matrix(rng, (40, 23), np.complex128)
    c = random_matrix(rng, (40, 40), np.complex128)
    want = blas.zherk(0.9, a, 0.3, np.asfortranarray(c), lower=1)
    got = hb.herk(0.9, a, 0.3, np.asfortranarray(c), lower=True, context=hb.Context("cpu"))
    np.testing.assert_allclose(np.tril(got), np.tril(want), rtol=1e-13, atol=1e-12)
