"""A new C takes the operands' memory order where that saves copying them: complex herk and her2k on
row-major operands get a row-major C, and their factors are the caller's arrays, not conjugated copies."""
import numpy as np
import pytest

import hybridblas as hb
from hybridblas.problem import C, N, build_problem


def _operands(rng, kind, order, shape=(9, 6)):
    def one():
        x = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        return np.asfortranarray(x) if order == "F" else np.ascontiguousarray(x)
    return [one() for _ in range(1 if kind == "herk" else 2)]


@pytest.mark.parametrize("kind", ["herk", "her2k"])
@pytest.mark.parametrize("trans", ["N", "C"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_new_c_follows_the_operands_and_copies_none(rng, kind, trans, order):
    arrays = _operands(rng, kind, order)
    op = N if trans == "N" else C
    prob = build_problem(kind, 1.0, arrays, 0.0, None, [op] * len(arrays), True, None)
    assert prob.out.flags.c_contiguous == (order == "C")
    assert not any(f.scratch for f in prob.factors)
    assert all(any(f.base.base is x or f.base is x for x in arrays) for f in prob.factors)


@pytest.mark.parametrize("kind", ["herk", "her2k"])
@pytest.mark.parametrize("trans", ["N", "C"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_row_major_operands_give_the_reference_triangle(rng, kind, trans, dtype):
    arrays = [x.astype(dtype) for x in _operands(rng, kind, "C", shape=(11, 7))]
    alpha = 0.7 if kind == "herk" else 0.7 - 0.3j
    ops = [x if trans == "N" else x.conj().T for x in arrays]
    a64 = [o.astype(np.complex128) for o in ops]
    if kind == "herk":
        c = hb.herk(alpha, arrays[0], trans=trans, context=hb.Context("cpu"))
        want = alpha * a64[0] @ a64[0].conj().T
    else:
        c = hb.her2k(alpha, arrays[0], arrays[1], trans=trans, context=hb.Context("cpu"))
        want = alpha * a64[0] @ a64[1].conj().T + np.conj(alpha) * a64[1] @ a64[0].conj().T
    tol = 1e-5 if dtype == np.complex64 else 1e-13
    np.testing.assert_allclose(np.tril(c), np.tril(want), rtol=0, atol=tol * np.abs(want).max())
    assert not np.triu(c, 1).any()
    assert np.all(np.diag(c).imag == 0)


@pytest.mark.parametrize("view", ["F", "C", "strided", "narrow"])
def test_conjugated_copy_on_the_cores_equals_numpy(view, rng, monkeypatch):
    """Large host operands are conjugated by column ranges on every core: the copy is column-major and
    equal to numpy's conj bit for bit, for either memory order and strided views; the source is untouched."""
    from hybridblas import problem
    monkeypatch.setattr(problem, "PARALLEL_CONJ_BYTES", 1 << 10)
    a = rng.standard_normal((301, 203)) + 1j * rng.standard_normal((301, 203))
    x = {"F": np.asfortranarray(a), "C": a, "strided": a[::3, 1::2], "narrow": np.asfortranarray(a)[:, :1]}[view]
    before = x.copy()
    got = problem.conj_copy(x, np)
    assert got.flags.f_contiguous and got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.conj(before))
    np.testing.assert_array_equal(x, before)
