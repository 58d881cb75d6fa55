"""Which gemmt calls the one-GPU direct path (devices/cuda_direct) hands to cuBLAS's herkx or syrkx, decided on
the normalised problem (numpy arrays stand in for CuPy's: the decision reads only ops, dtype and beta): both
ops' transposes must differ and, for herkx, the conjugates too and beta be real; a row-major operand flips
its op, and a row-major A^H is a conjugated copy under a transpose, so the layouts decide too. The calls the
direct path then makes, run on numpy stand-ins for cuBLAS (herkx's diagonal made real, strided batches that may
not read past their operands), give the reference gemmt."""
import itertools

import numpy as np
import pytest

from blas_cases import random_matrix, triangle_mask
from hybridblas import problem as P
from hybridblas.devices import cuda_direct

OPS = {"N": P.N, "T": P.T, "C": P.C}


def _kind(transa, transb, dtype, beta=1.0, orders="FF", n=6, k=4):
    shape = {"N": (n, k), "T": (k, n), "C": (k, n)}
    a = np.ones(shape[transa], dtype, order=orders[0])
    b = np.ones(shape[transb][::-1], dtype, order=orders[1])
    c = np.zeros((n, n), dtype, order="F")
    prob = P.build_problem("gemmt", 1.0, [a, b], beta, c, [OPS[transa], OPS[transb]], True, None)
    found = cuda_direct.rank_kx(prob)
    if found is None:
        return None
    kind, coef, x, y = found
    assert coef == 1.0 and all(f.base is g.base and f.op == g.op for f, g in zip((x, y), prob.factors, strict=True))
    return kind


@pytest.mark.parametrize("transa,transb,dtype,beta,want", [
    ("C", "N", np.complex128, 1.0, "herkx"),
    ("N", "C", np.complex128, 0.0, "herkx"),
    ("N", "T", np.complex128, 0.5 - 0.5j, "syrkx"),
    ("T", "N", np.complex128, 1.0, "syrkx"),
    ("T", "N", np.float64, 0.5, "syrkx"),
    ("N", "T", np.float64, 1.0, "syrkx"),
    ("C", "N", np.complex128, 0.5 - 0.5j, None),        # herkx's beta is real
    ("N", "N", np.complex128, 1.0, None),
    ("C", "T", np.complex128, 1.0, None),               # op(B) = conj(B'): neither routine
    ("N", "N", np.float64, 1.0, None),
])
def test_gemmt_ops_that_make_a_herkx_or_syrkx(transa, transb, dtype, beta, want):
    assert _kind(transa, transb, dtype, beta) == want


def test_a_row_major_operand_changes_the_answer():
    assert _kind("C", "N", np.complex128, orders="FF") == "herkx"
    assert _kind("C", "N", np.complex128, orders="FC") is None
    assert _kind("C", "N", np.complex128, orders="CC") == "syrkx"     # A copied conjugated: op(A) = conj(A)^T


def test_host_arrays_never_take_the_direct_path():
    a = np.ones((4, 600), complex, order="F")
    prob = P.build_problem("herk", 1.0, [a], 0.0, np.zeros((600, 600), complex, order="F"), [P.C], True, None)

    class Gpu:
        kind, index, memory_limit, block = "cuda", 0, None, None
    assert not cuda_direct.applies(prob, Gpu())


class _NumpyCublas:
    """cuBLAS's calls as the direct path makes them, in numpy: rank_k computes the whole product and writes the
    requested triangle, herkx (like herk) with the diagonal made real, as cuBLAS does."""
    xp, handle = np, 0
    stream = type("Stream", (), {"ptr": 0})

    @staticmethod
    def _op(x):
        v = np.conj(x.base) if x.op & P.R else x.base
        return v.T if x.op & P.T else v

    def rank_k(self, kind, c, lower, alpha, factors, beta):
        full = sum(coef * self._op(x) @ self._op(y) for coef, x, y in P.product_terms(kind, alpha, factors))
        full = full + beta * c if beta != 0 else full
        if kind in ("herk", "her2k", "herkx"):
            np.fill_diagonal(full, full.diagonal().real)
        keep = np.tril(np.ones(c.shape, bool)) if lower else np.triu(np.ones(c.shape, bool))
        c[keep] = full[keep]


def _strided_batched(handle, stream, parts, alpha, x, stride_x, y, stride_y, beta):
    """cublas.gemm_strided_batched in numpy: batch b reads x and y moved on by b strides, never past their arrays."""
    def batches(f, stride):
        owner = f.base
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        start = f.base.__array_interface__["data"][0]
        strides = (stride * f.base.itemsize,) + f.base.strides
        last = start + sum((size - 1) * st for size, st in zip((len(parts),) + f.base.shape, strides))
        assert owner.__array_interface__["data"][0] <= start and last < owner.__array_interface__["data"][0] + \
            owner.nbytes, "a batch reads past its operand"
        return np.lib.stride_tricks.as_strided(f.base, (len(parts),) + f.base.shape, strides)
    for b, (xb, yb) in enumerate(zip(batches(x, stride_x), batches(y, stride_y))):
        product = alpha * _NumpyCublas._op(P.Operand(xb, x.op)) @ _NumpyCublas._op(P.Operand(yb, y.op))
        parts[b] = product.T + (beta * parts[b] if beta else 0)


@pytest.mark.parametrize("k", [1, 2, 9])
@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
def test_gemmt_plan_on_numpy_cublas(k, dtype, rng, monkeypatch):
    """_gemmt's calls (herkx/syrkx with one op for both factors, the diagonal recomputed after a herkx by
    strided dot products, beta applied once) give the reference gemmt for every trans, layout, triangle and
    beta it takes, on numpy stand-ins for cuBLAS that make herkx's diagonal real."""
    monkeypatch.setattr(cuda_direct.cublas, "gemm_strided_batched", _strided_batched)
    monkeypatch.setattr(cuda_direct, "_diagonal", lambda c: np.lib.stride_tricks.as_strided(
        c, (c.shape[0],), (c.strides[0] + c.strides[1],)))
    n, ran = 7, 0
    letters = "NTC" if np.dtype(dtype).kind == "c" else "NT"
    for transa, transb, orders, lower, beta in itertools.product(letters, letters, ("FF", "FC", "CF", "CC"),
                                                                 (True, False), (0.0, 0.5, 0.3 - 0.2j)):
        if np.dtype(dtype).kind != "c" and isinstance(beta, complex):
            continue
        a = random_matrix(rng, (n, k) if transa == "N" else (k, n), dtype)
        b = random_matrix(rng, (k, n) if transb == "N" else (n, k), dtype)
        c0 = random_matrix(rng, (n, n), dtype)
        a, b = np.asarray(a, order=orders[0]), np.asarray(b, order=orders[1])
        c = np.array(c0, order=orders[0])
        alpha = 0.8 - 0.6j if np.dtype(dtype).kind == "c" else 0.8
        prob = P.build_problem("gemmt", alpha, [a, b], beta, c, [OPS[transa], OPS[transb]], lower, None)
        if cuda_direct.rank_kx(prob) is None:
            continue
        ran += 1
        cuda_direct._gemmt(_NumpyCublas(), prob)
        full = alpha * _NumpyCublas._op(P.Operand(a, OPS[transa])) @ _NumpyCublas._op(P.Operand(b, OPS[transb]))
        want = np.where(triangle_mask(n, lower), full + beta * c0, c0)
        assert np.abs(prob.out - want).max() <= 1e-12 * np.abs(want).max(), (transa, transb, orders, lower, beta)
    assert ran >= (24 if np.dtype(dtype).kind == "c" else 8)
