"""Which gemmt calls the one-GPU direct path (devices/cuda_direct) hands to cuBLAS's herkx or syrkx, decided on
the normalised problem (numpy arrays stand in for CuPy's: the decision reads only ops, dtype and beta): both
ops' transposes must differ and, for herkx, the conjugates too and beta be real; a row-major operand flips
its op, and a row-major A^H is a conjugated copy under a transpose, so the layouts decide too."""
import numpy as np
import pytest

from hybridblas import problem as P
from hybridblas.devices import cuda_direct

OPS = {"N": P.N, "T": P.T, "C": P.C}


def _kind(transa, transb, dtype, beta=1.0, orders="FF", n=6, k=4):
    shape = {"N": (n, k), "T": (k, n), "C": (k, n)}
    a = np.ones(shape[transa], dtype, order=orders[0])
    b = np.ones(shape[transb][::-1], dtype, order=orders[1])
    c = np.zeros((n, n), dtype, order="F")
    prob = P.build_problem("gemmt", 1.0, [a, b], beta, c, [OPS[transa], OPS[transb]], True, None)
    found = cuda_direct._rank_kx(prob)
    if found is None:
        return None
    kind, coef, (x, y) = found
    assert coef == 1.0 and x.op == y.op                 # cuBLAS's herkx/syrkx take one op for both
    assert y.base is prob.factors[1].base
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
