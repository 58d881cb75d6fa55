"""cisolver.start: LOBPCG's start queued on the GPU gives the host path's start (the same Ritz values, the
same Ritz vectors up to their signs, H X and residuals, and the rest of the buffers untouched), and hands a
start block the GPU pass declines to the host path."""
import numpy as np
import pytest
import scipy.sparse as sp

import hybridblas as hb
from cisolver import dense, start
from cisolver.arrays import Timer
from cisolver.operators import SymmetricOperator

pytestmark = pytest.mark.gpu


def _matrix(n, rng):
    a = sp.random(n, n, density=0.01, random_state=rng, format="csr")
    return (a + a.T + sp.diags(rng.uniform(-5, 5, n))).tocsr()


def _start(op, x0, queued, dtype):
    """first_block on poisoned buffers: (theta, largest, sums, X, H X, R, the buffers' other columns, and
    whether the host path redid a queued start)."""
    import cupy
    n, b = x0.shape
    x = cupy.asarray(x0.astype(dtype))
    s, hs = (cupy.full((n, 3 * b), np.nan, dtype=dtype) for _ in range(2))
    r = cupy.full((n, b), np.nan, dtype=dtype)
    theta, largest, sums, redone = start.first_block(op, x, s, hs, r, context=None, comm=None, timer=Timer(cupy),
                                                     queued=queued, agree=lambda value: value)
    return (theta, largest, sums, s[:, :b].get().astype(np.float64), hs[:, :b].get().astype(np.float64),
            r.get().astype(np.float64), np.hstack([s[:, b:].get(), hs[:, b:].get()]), redone)


@pytest.fixture
def host_calls(count_calls):
    """The host path's starts, counted."""
    return count_calls(start, "_on_host_path")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("b", [1, 5, 8])
def test_queued_start_equals_the_host_path(dtype, b, rng, host_calls):
    n = 3000
    op = SymmetricOperator(_matrix(n, rng), devices=[0], dtype=dtype)
    x0 = rng.standard_normal((n, b))
    got = _start(op, x0, True, dtype)
    assert host_calls == [] and got[7] == 0                   # the GPU took it
    want = _start(op, x0, False, dtype)
    assert host_calls == [1] and want[7] == 0
    theta, largest, sums, x, hx, r, rest, _ = got
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(theta, want[0], rtol=tol, atol=tol * want[1])
    assert largest == pytest.approx(want[1], rel=tol)
    sign = np.sign(np.sum(x * want[3], axis=0))              # Ritz vectors are defined up to their signs
    vec_tol = 1e-9 if dtype == np.float64 else 2e-3
    np.testing.assert_allclose(x * sign, want[3], rtol=0, atol=vec_tol)
    np.testing.assert_allclose(hx * sign, want[4], rtol=0, atol=vec_tol * largest)
    np.testing.assert_allclose(r * sign, want[5], rtol=0, atol=vec_tol * largest)
    np.testing.assert_allclose(x.T @ x, np.eye(b), rtol=0, atol=1e-12 if dtype == np.float64 else 1e-5)
    np.testing.assert_allclose(sums, (r ** 2).sum(axis=0), rtol=1e-10 if dtype == np.float64 else 1e-5)
    assert np.isnan(rest).all()


def test_queued_start_hands_an_ill_conditioned_block_to_the_host_path(rng, host_calls):
    """Two start columns 1e-7 apart: one Cholesky-QR pass would leave them far from orthonormal, so the GPU
    pass declines and the host path (two passes) starts from the same block."""
    n, b = 3000, 8
    op = SymmetricOperator(_matrix(n, rng), devices=[0])
    x0 = rng.standard_normal((n, b))
    x0[:, 3] = x0[:, 2] + 1e-7 * rng.standard_normal(n)
    got = _start(op, x0, True, np.float64)
    assert host_calls == [1] and got[7] == 1
    want = _start(op, x0, False, np.float64)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[3], want[3], rtol=0, atol=1e-10)    # the host path from the same block


def test_queued_start_with_hybridblas_grams(rng, host_calls, monkeypatch):
    """Blocks beyond hybridblas.lowlevel.grams' row limits take hb.gemmt and hb.syrk (dense.gram_buffer): the
    same start."""
    n, b = 3000, 8
    op = SymmetricOperator(_matrix(n, rng), devices=[0])
    x0 = rng.standard_normal((n, b))
    want = _start(op, x0, True, np.float64)
    monkeypatch.setattr(hb.lowlevel, "grams_preferred", lambda *blocks: False)
    got = _start(op, x0, True, np.float64)
    assert host_calls == [] and got[7] == 0
    np.testing.assert_allclose(got[0], want[0], rtol=1e-11)
    sign = np.sign(np.sum(got[3] * want[3], axis=0))
    np.testing.assert_allclose(got[3] * sign, want[3], rtol=0, atol=1e-9)


def test_queued_start_with_a_nan_fails_clearly(rng, host_calls):
    """A NaN in the start block: the GPU declines, and the host path raises NotPositiveDefinite as it did."""
    n, b = 3000, 8
    op = SymmetricOperator(_matrix(n, rng), devices=[0])
    x0 = rng.standard_normal((n, b))
    x0[17, 3] = np.nan
    with pytest.raises(dense.NotPositiveDefinite):
        _start(op, x0, True, np.float64)
    assert host_calls == [1]
