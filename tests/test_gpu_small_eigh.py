"""cisolver.gpu_small_eigh: the one-warp eigensolver gives numpy's eigenvalues and orthonormal eigenvectors on
random, structured and LOBPCG-like matrices of every size it takes, fills its outputs whatever they held, and
says when it did not converge."""
from pathlib import Path

import numpy as np
import pytest

from cisolver import gpu_small_eigh

pytestmark = pytest.mark.gpu

LOBPCG_MATRICES = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200x2-2026-11-22-s11"
                   / "lobpcg_rr_matrices.npy")


def _solve(a, max_steps=None):
    """(eigenvalues, eigenvectors as columns, status) from the kernel, its outputs poisoned first."""
    import cupy
    k = a.shape[0]
    a_dev = cupy.asarray(np.ascontiguousarray(a, dtype=np.float64))
    w = cupy.full(k, np.nan)
    info = cupy.full(1, -7, dtype=np.int32)
    gpu_small_eigh.eigh_in_place(cupy, a_dev, w, info, max_steps)
    return cupy.asnumpy(w), cupy.asnumpy(a_dev).T, int(info.get()[0])


def _check(a, tol=1e-13):
    w, v, status = _solve(a)
    k = a.shape[0]
    scale = max(np.abs(a).max(), np.finfo(np.float64).tiny)
    assert status == 0
    assert np.all(np.diff(w) >= 0)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), rtol=0, atol=tol * scale * k)
    np.testing.assert_allclose(v.T @ v, np.eye(k), rtol=0, atol=tol * k)
    np.testing.assert_allclose(a @ v, v * w[None, :], rtol=0, atol=tol * scale * k)


def _symmetric(rng, k):
    m = rng.standard_normal((k, k))
    return (m + m.T) / 2


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 16, 23, 24, 31, 32])
def test_random_matrices(k, rng):
    for _ in range(3):
        _check(_symmetric(rng, k))


def test_structured_matrices(rng):
    k = 24
    q = np.linalg.qr(rng.standard_normal((k, k)))[0]
    cases = {
        "zero": np.zeros((k, k)),
        "identity": np.eye(k),
        "diagonal": np.diag(rng.standard_normal(k)),
        "three eigenvalues eight times each": q @ np.diag(np.repeat([-3.0, 1.0, 2.0], 8)) @ q.T,
        "graded 1e-12 to 1e3": q @ np.diag(10.0 ** np.linspace(-12, 3, k)) @ q.T,
        "eigenvalues 1e-13 apart": q @ np.diag(1 + 1e-13 * np.arange(k)) @ q.T,
        "tridiagonal (Wilkinson)": (np.diag(np.abs(np.arange(k) - (k - 1) / 2)) + np.diag(np.ones(k - 1), 1)
                                    + np.diag(np.ones(k - 1), -1)),
        "tiny entries": 1e-200 * _symmetric(rng, k),
        "huge entries": 1e200 * _symmetric(rng, k),
        "a zero column": np.pad(_symmetric(rng, k - 1), ((0, 1), (0, 1))),
    }
    for name, a in cases.items():
        try:
            _check(a)
        except AssertionError as exc:
            raise AssertionError(name) from exc


def test_lobpcg_like_matrix(rng):
    """Ritz values on the leading diagonal, small coupling: A as it looks near convergence."""
    k = 24
    a = np.diag(np.concatenate([np.linspace(-80, -70, 8), rng.uniform(-60, 60, k - 8)]))
    _check(a + 1e-4 * _symmetric(rng, k))


@pytest.mark.skipif(not LOBPCG_MATRICES.exists(), reason="LOBPCG's saved Rayleigh-Ritz matrices are not here")
def test_lobpcg_own_matrices():
    mats = np.load(LOBPCG_MATRICES)
    for a in mats:
        _check((a + a.T) / 2)


def test_says_when_it_did_not_converge(rng):
    a = _symmetric(rng, 24)
    assert _solve(a, max_steps=1)[2] == 1
    assert _solve(a)[2] == 0
    a[3, 5] = a[5, 3] = np.nan
    assert _solve(a)[2] == 1


def test_bad_arguments():
    import cupy
    w, info = cupy.empty(4), cupy.empty(1, dtype=np.int32)
    for a, w_ in ((cupy.zeros((4, 5)), w), (cupy.zeros((33, 33)), cupy.empty(33)), (cupy.zeros((4, 4), np.float32), w),
                  (cupy.zeros((4, 4)).T[:, :], w), (cupy.zeros((4, 4)), cupy.empty(3))):
        with pytest.raises(ValueError, match="not covered"):
            gpu_small_eigh.eigh_in_place(cupy, a, w_, info)
