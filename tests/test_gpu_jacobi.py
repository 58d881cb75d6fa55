"""cisolver.gpu_jacobi: the one-warp Jacobi eigensolver agrees with LAPACK (eigenvalues, eigenpair residuals,
orthonormal eigenvectors) on random, clustered, diagonal, zero and LOBPCG's own Rayleigh-Ritz matrices, of
every size it takes, reads only the lower triangle (column-major) as cuSOLVER's syevj does, says when it
did not converge, and gives Rayleigh-Ritz the same step as the syevj route."""
import os

import numpy as np
import pytest

from cisolver import dense, gpu_jacobi, gpu_rayleigh_ritz

pytestmark = pytest.mark.gpu
LOBPCG_MATRICES = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results", "h200x2-2026-11-22-s11",
                               "lobpcg_rr_matrices.npy")


def _solve(a_host, poison_lower=False):
    """Eigenpairs of the symmetric a_host through the kernel, w and the output poisoned first."""
    import cupy
    k = a_host.shape[0]
    given = np.array(a_host, dtype=np.float64)
    if poison_lower:                     # the C array's strict lower part is column-major's upper: unread
        given[np.tril_indices(k, -1)] = np.nan
    a = cupy.asarray(given)
    w = cupy.full(k, np.nan)
    info = cupy.full(1, -7, dtype=np.int32)
    gpu_jacobi.eigh_in_place(cupy, a, w, info)
    vecs = cupy.asnumpy(a).T             # eigenvector i is row i of the C array
    return cupy.asnumpy(w), vecs, int(info.get()[0])


def _check(a, w, vecs, tol=1e-13):
    ref = np.linalg.eigvalsh(a)
    scale = max(np.abs(ref).max(), np.finfo(float).tiny)
    assert np.all(np.diff(w) >= 0), w
    np.testing.assert_allclose(w, ref, rtol=0, atol=tol * scale)
    assert np.abs(a @ vecs - vecs * w[None, :]).max() <= tol * scale
    np.testing.assert_allclose(vecs.T @ vecs, np.eye(a.shape[0]), rtol=0, atol=tol)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 16, 23, 24, 31, 32])
def test_random_symmetric_matrices(k, rng):
    m = rng.standard_normal((k, k))
    a = m + m.T
    w, vecs, info = _solve(a)
    assert info == 0
    _check(a, w, vecs)


def test_only_the_lower_triangle_is_read(rng):
    m = rng.standard_normal((24, 24))
    a = m + m.T
    w, vecs, info = _solve(a, poison_lower=True)
    assert info == 0
    _check(a, w, vecs)


def test_lobpcg_rayleigh_ritz_matrices():
    """Every 24 x 24 matrix A = R^-T (S^T H S) R^-1 of CPU LOBPCG runs on 24Mg and 45Ti (session 11)."""
    mats = np.load(LOBPCG_MATRICES)
    assert len(mats) > 50
    for a in mats:
        w, vecs, info = _solve(a)
        assert info == 0
        _check(a, w, vecs)


def test_clustered_and_repeated_eigenvalues(rng):
    """Three eigenvalues eight times each, mixed by a random rotation, and a cluster 1e-12 apart: the
    eigenvectors are defined only up to rotations within each eigenspace, so residuals and orthonormality."""
    q = np.linalg.qr(rng.standard_normal((24, 24)))[0]
    for values in (np.repeat([-2.0, 0.5, 3.0], 8), np.concatenate([1.0 + 1e-12 * np.arange(12), np.arange(12.0)])):
        a = (q * values) @ q.T
        a = (a + a.T) / 2
        w, vecs, info = _solve(a)
        assert info == 0
        _check(a, w, vecs)


def test_diagonal_and_zero_matrices():
    a = np.diag([3.0, -1.0, 2.0, 7.0, -5.0])
    w, vecs, info = _solve(a)
    assert info == 0
    np.testing.assert_array_equal(w, np.sort(np.diag(a)))
    np.testing.assert_array_equal(np.abs(vecs), np.eye(5)[:, np.argsort(np.diag(a))])
    w, vecs, info = _solve(np.zeros((6, 6)))
    assert info == 0
    np.testing.assert_array_equal(w, np.zeros(6))
    np.testing.assert_allclose(vecs.T @ vecs, np.eye(6), rtol=0, atol=0)


def test_non_finite_entry_reports_no_convergence(rng):
    m = rng.standard_normal((24, 24))
    a = m + m.T
    a[3, 5] = a[5, 3] = np.nan
    _, _, info = _solve(a)
    assert info == 1


def test_bad_arguments_are_refused():
    import cupy
    a = cupy.eye(4)
    for bad_a, bad_w in ((cupy.eye(33), cupy.empty(33)), (cupy.eye(4, dtype=np.float32), cupy.empty(4)),
                         (a, cupy.empty(3)), (cupy.asfortranarray(cupy.ones((4, 5)))[:, :4], cupy.empty(4))):
        with pytest.raises(ValueError, match="gpu_jacobi.eigh_in_place"):
            gpu_jacobi.eigh_in_place(cupy, bad_a, bad_w, cupy.empty(1, dtype=np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rayleigh_ritz_step_is_the_same_on_both_routes(dtype, rng, monkeypatch):
    import cupy
    rows, k, b = 4000, 24, 8
    s = np.linalg.qr(rng.standard_normal((rows, k)))[0] + 1e-3 * rng.standard_normal((rows, k))
    hs = rng.uniform(-4, 4, rows)[:, None] * s
    both = dense.gram_buffer(cupy.asarray(s.astype(dtype)), cupy.asarray(hs.astype(dtype)))
    steps = {}
    for route in ("warp", "syevj"):
        monkeypatch.setattr(gpu_rayleigh_ritz, "EIGENSOLVER", route)
        rr = gpu_rayleigh_ritz.queue(both, b, dtype)
        steps[route] = (rr.summary(), cupy.asnumpy(rr.m).astype(np.float64))
    (theta_w, big_w, usable_w, ok_w), m_w = steps["warp"]
    (theta_s, big_s, usable_s, ok_s), m_s = steps["syevj"]
    assert ok_w and ok_s
    np.testing.assert_allclose(theta_w, theta_s, rtol=1e-12)
    assert big_w == pytest.approx(big_s, rel=1e-12)
    np.testing.assert_array_equal(usable_w, usable_s)
    sign = np.sign(np.sum(m_w[:, :b] * m_s[:, :b], axis=0))   # eigenvectors up to their sign
    tol = 1e-5 if dtype == np.float32 else 1e-10
    scale = np.abs(m_s).max(axis=0)
    assert (np.abs(m_w - m_s * np.concatenate([sign, sign])[None, :]) <= tol * scale[None, :]).all()
