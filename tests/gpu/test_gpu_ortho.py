"""cisolver.gpu_ortho: the first orthonormalisation pass factored on the GPU gives the host path's pass, or
leaves the blocks exactly as they were and says why; LOBPCG queueing whole iterations on a GPU finds the
same eigenpairs as the host-trip path and the CPU."""
import numpy as np
import pytest
import scipy.sparse as sp

from cisolver import dense, gpu_ortho, solver
from cisolver.operators import SymmetricOperator

pytestmark = pytest.mark.gpu
TOL = {np.float32: 3e-6, np.float64: 1e-12}


def _blocks(rng, rows, b, n_p, n_w, dtype, w=None, p=None):
    """s = [X | P | W] (X orthonormal, P orthogonal to X and unit, as LOBPCG keeps them) and hs = [H X | H P | nan]
    as column ranges of 3b-wide row-major buffers, with an odd leading dimension; H a random diagonal."""
    import cupy
    x = np.linalg.qr(rng.standard_normal((rows, b)))[0]
    if p is None:
        p = rng.standard_normal((rows, n_p))
        p -= x @ (x.T @ p)
        p /= np.linalg.norm(p, axis=0)
    if w is None:
        w = rng.standard_normal((rows, n_w)) + 2.0 * x[:, :n_w] + 0.5 * p[:, :min(n_p, n_w)].sum(axis=1, keepdims=True)
    h = rng.uniform(-3, 3, rows)
    width = 3 * b + 1
    s = np.full((rows, width), np.nan)
    hs = np.full((rows, width), np.nan)
    k = b + n_p + n_w
    s[:, :k] = np.hstack([x, p, w])
    hs[:, :b + n_p] = h[:, None] * np.hstack([x, p])
    s, hs = s.astype(dtype), hs.astype(dtype)
    return s, hs, cupy.asarray(s), cupy.asarray(hs), h, k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,b,n_p,n_w", [(5001, 8, 0, 8), (5001, 8, 8, 8), (4099, 5, 3, 4), (300001, 8, 6, 7),
                                            (1000, 1, 1, 1), (2000, 16, 16, 16)])
def test_first_pass_equals_the_host_pass(dtype, rows, b, n_p, n_w, rng):
    import cupy
    s, hs, s_dev, hs_dev, h, k = _blocks(rng, rows, b, n_p, n_w, dtype)
    passes = dense.orthonormalise_tail(s[:, :k], hs[:, :k], b, n_p, adaptive=True)
    assert passes == 1
    flag = gpu_ortho.first_pass(s_dev[:, :k], hs_dev[:, :k], b, n_p)
    assert int(flag.get()[0]) == gpu_ortho.OK
    got, got_h = cupy.asnumpy(s_dev), cupy.asnumpy(hs_dev)
    np.testing.assert_allclose(got[:, :k], s[:, :k], rtol=0, atol=50 * TOL[dtype])
    np.testing.assert_allclose(got_h[:, :b + n_p], hs[:, :b + n_p], rtol=0, atol=200 * TOL[dtype])
    assert np.isnan(got[:, k:]).all() and np.isnan(got_h[:, b + n_p:]).all()      # nothing beyond the range
    v = got[:, :k].astype(np.float64)
    np.testing.assert_allclose(v.T @ v, np.eye(k), atol=100 * TOL[dtype] + 20 * dense.SINGLE_PASS_LOSS)
    hp = h[:, None] * v[:, b:b + n_p]                          # H P still H times P
    assert np.abs(got_h[:, b:b + n_p] - hp).max(initial=0.0) <= 300 * TOL[dtype] * np.abs(h).max()


def _near_parallel(rng, rows, dtype):
    x = np.linalg.qr(rng.standard_normal((rows, 8)))[0]
    w = rng.standard_normal((rows, 5)) + 2.0 * x[:, :5]
    # kappa ~ 1e3 (float32) or 1e7 (float64): one pass would leave too much loss, the Cholesky still holds
    w[:, 4] = w[:, 3] + (3e-3 if dtype == np.float32 else 1e-7) * rng.standard_normal(rows)
    return w


def _inside_x(rng, rows, dtype):
    x = np.linalg.qr(rng.standard_normal((rows, 8)))[0]
    return x[:, :5] @ rng.standard_normal((5, 5)) + 1e-3 * rng.standard_normal((rows, 5))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case,bit", [("near_parallel", gpu_ortho.SECOND_PASS), ("duplicate", gpu_ortho.NOT_DEFINITE),
                                      ("nan", gpu_ortho.NOT_DEFINITE), ("inside_x", gpu_ortho.CANCELS)])
def test_first_pass_declines_and_leaves_the_blocks(dtype, case, bit, rng):
    """Where the host path would do a second pass, fail, or project first, the GPU pass sets that bit of
    its flag and S and H S are bit for bit what they were (a NaN in W is the exception: the identity
    update's zero times NaN spreads it over the row, and the run fails as on the host path, below)."""
    import cupy
    rows, b, n_p = 3001, 8, 3
    x_rng = np.random.default_rng(7)
    w = {"near_parallel": lambda: _near_parallel(x_rng, rows, dtype), "inside_x": lambda: _inside_x(x_rng, rows, dtype),
         "duplicate": lambda: np.repeat(rng.standard_normal((rows, 1)), 5, axis=1),
         "nan": lambda: np.where(np.arange(5) == 2, np.nan, rng.standard_normal((rows, 5)))}[case]()
    # the X of the functions above: the same seeded draw
    rng_x = np.random.default_rng(7)
    s, hs, s_dev, hs_dev, h, k = _blocks(rng_x, rows, b, n_p, 5, dtype, w=w)
    flag = int(gpu_ortho.first_pass(s_dev[:, :k], hs_dev[:, :k], b, n_p).get()[0])
    # two equal columns leave a pivot of rounding size: its sign is chance (failed, or a second pass wanted)
    assert flag & bit if case != "duplicate" else flag != gpu_ortho.OK, (case, flag)
    if case == "nan":
        return
    np.testing.assert_array_equal(cupy.asnumpy(s_dev), s)
    np.testing.assert_array_equal(cupy.asnumpy(hs_dev), hs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("q", [1, 2, 5, 8, 32])
def test_first_pass_with_no_x_is_one_cholesky_qr_pass(dtype, q, rng):
    """b = 0 (LOBPCG's start, cisolver.start): the pass makes the whole block orthonormal as one host Cholesky-QR
    pass does, and touches nothing beyond it."""
    import cupy
    rows = 4099
    x = rng.standard_normal((rows, q)) * rng.uniform(0.5, 2.0, q)[None, :]
    buf = np.full((rows, q + 3), np.nan)
    buf[:, :q] = x
    buf = buf.astype(dtype)
    dev = cupy.asarray(buf)
    flag = gpu_ortho.first_pass(dev[:, :q], dev[:, :q], 0, 0)
    assert int(flag.get()[0]) == gpu_ortho.OK
    want = buf[:, :q].astype(np.float64)
    r = dense.cholesky_upper(want.T @ want)
    want = want @ dense.inverse_upper(r)
    got = cupy.asnumpy(dev)
    np.testing.assert_allclose(got[:, :q], want, rtol=0, atol=50 * TOL[dtype])
    assert np.isnan(got[:, q:]).all()
    v = got[:, :q].astype(np.float64)
    np.testing.assert_allclose(v.T @ v, np.eye(q), atol=100 * TOL[dtype] + 20 * dense.SINGLE_PASS_LOSS)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_pass_with_no_x_declines_and_leaves_the_block(dtype, rng):
    """Two columns nearly parallel: one pass would not do, the block stays bit for bit as it was; two equal
    columns: declined too."""
    import cupy
    rows, q = 3001, 8
    for case in ("near_parallel", "duplicate"):
        x = rng.standard_normal((rows, q))
        x[:, 5] = x[:, 4] + ((3e-3 if dtype == np.float32 else 1e-7) * rng.standard_normal(rows)
                             if case == "near_parallel" else 0.0)
        x = x.astype(dtype)
        dev = cupy.asarray(x)
        flag = int(gpu_ortho.first_pass(dev, dev, 0, 0).get()[0])
        assert flag & gpu_ortho.SECOND_PASS if case == "near_parallel" else flag != gpu_ortho.OK, (case, flag)
        np.testing.assert_array_equal(cupy.asnumpy(dev), x)


def test_one_block_kernels_want_a_multiple_of_32_threads(monkeypatch):
    import cupy
    s = cupy.asarray(np.random.default_rng(1).standard_normal((500, 16)))
    monkeypatch.setattr(gpu_ortho, "THREADS", 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        gpu_ortho.first_pass(s, s, 8, 0)


def test_first_pass_bad_arguments():
    import cupy
    s = cupy.zeros((100, 60))
    with pytest.raises(ValueError, match="not covered"):
        gpu_ortho.first_pass(s, s, 8, 0)                       # 52 columns of [P W]: more than QMAX
    with pytest.raises(ValueError, match="not covered"):
        gpu_ortho.first_pass(s[:, :24], s[:, :10], 8, 8)       # H P's columns missing


def _symmetric(n, rng):
    a = sp.random(n, n, density=0.02, random_state=rng, format="csr")
    return (a + a.T + sp.diags(rng.uniform(-5, 5, n))).tocsr()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lobpcg_queued_iterations_equal_the_host_trip_path(dtype, rng):
    """Whole iterations queued (GPU pass, residuals read one pass late) against the path that waits at every
    trip, and the CPU: the same eigenvalues, iterations within a few, every residual in the history."""
    a = _symmetric(3000, rng)
    ref = np.linalg.eigh(a.toarray())[0][:5]
    tol = 1e-9 if dtype == np.float64 else 1e-5
    runs = {}
    for queued in (True, False):
        runs[queued] = solver.lobpcg(SymmetricOperator(a, devices=[0], dtype=dtype), 5, tol=tol, maxiter=600, seed=2,
                                     queued=queued)
    cpu = solver.lobpcg(a, 5, tol=tol, maxiter=600, seed=2, dtype=dtype)
    for res in (runs[True], runs[False], cpu):
        assert res.converged
        np.testing.assert_allclose(res.eigenvalues, ref, rtol=1e-8 if dtype == np.float64 else 2e-5)
        assert len(res.history) == res.iterations
        assert (res.residual_norms <= (10 if dtype == np.float32 else 1.5) * tol).all()
    assert abs(runs[True].iterations - runs[False].iterations) <= 3
    # the queued path stayed on the GPU (a path that handed every step to the host would pass the above):
    # in float64 it declines nothing here; in float32 [P W] wants a second pass in about half the
    # iterations, and after three declines the run takes the trip path
    queued = runs[True]
    assert queued.declined <= max(3, queued.iterations // 10)
    assert queued.redone <= queued.iterations // 10
    assert set(runs[True].seconds) >= {"dense:orthonormalise", "dense:rayleigh_ritz", "spmm"}


def test_lobpcg_queued_iterations_fall_back_on_a_rank_deficient_w(rng):
    """A preconditioner that repeats a column of W: the GPU pass declines every such iteration, the host
    path takes W apart (host QR, P kept), and the eigenpairs are right."""
    class Duplicating:
        def apply(self, r, theta):
            w = r.copy()
            if w.shape[1] >= 2:
                w[:, -1] = w[:, 0]
            return w
    a = _symmetric(1500, rng)
    res = solver.lobpcg(SymmetricOperator(a, devices=[0]), 4, tol=1e-9, maxiter=800, seed=3, precond=Duplicating())
    assert res.converged and res.declined > 0 and res.restarts == 0
    np.testing.assert_allclose(res.eigenvalues, np.linalg.eigh(a.toarray())[0][:4], rtol=1e-8)


@pytest.mark.parametrize("queued", [True, False])
def test_lobpcg_on_gpu_fails_clearly_on_a_nan_preconditioner(queued, rng):
    class Poisoning:
        def apply(self, r, theta):
            w = r.copy()
            w[::7, 0] = np.nan
            return w
    a = _symmetric(1200, rng)
    with pytest.raises(dense.NotPositiveDefinite):
        solver.lobpcg(SymmetricOperator(a, devices=[0]), 4, tol=1e-9, maxiter=50, seed=3, precond=Poisoning(),
                      queued=queued)


def test_an_unread_later_holds_its_pinned_buffer_until_the_copy_lands():
    """A Later nobody reads (the last orthonormalisation flag of a run) must not give its pinned buffer back
    while the copy into it is still queued: the next small upload would be staged there and overwritten."""
    import cupy
    from cisolver.arrays import Later
    big = cupy.random.default_rng(1).standard_normal((4000, 4000))
    for _ in range(4):                     # a few ms of work ahead of the copy
        big = big @ big
        big /= cupy.abs(big).max()
    Later(cupy.full(2, 123456789, dtype=np.int32))          # dropped unread
    for _ in range(20):
        up = cupy.asarray(np.array([5, 6], dtype=np.int32))
        np.testing.assert_array_equal(up.get(), [5, 6])
