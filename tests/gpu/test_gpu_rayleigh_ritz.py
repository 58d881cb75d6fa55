"""cisolver.gpu_rayleigh_ritz: the small Rayleigh-Ritz problem and next P's coefficients on the GPU equal the
host path's (dense.rayleigh_ritz, dense.next_p_coefficients), say when S^T S is not positive definite, and
LOBPCG falls back to the host path then."""
import numpy as np
import pytest
import scipy.sparse as sp

from cisolver import dense, gpu_ortho, gpu_rayleigh_ritz, solver
from cisolver.operators import SymmetricOperator
from hybridblas import lowlevel

pytestmark = pytest.mark.gpu
TOL = {np.float32: 2e-5, np.float64: 1e-10}


def _blocks(rng, rows, k, dtype, scales=None):
    """S (k columns, nearly orthonormal, columns scaled by ``scales``) and H S for a random diagonal H, as
    column ranges of wider row-major buffers."""
    import cupy
    s = np.linalg.qr(rng.standard_normal((rows, k)))[0] + 1e-3 * rng.standard_normal((rows, k))
    if scales is not None:
        s *= scales[None, :]
    h = rng.uniform(-4, 4, rows)
    buf = np.full((rows, k + 3), np.nan)
    hbuf = np.full((rows, k + 3), np.nan)
    buf[:, :k], hbuf[:, :k] = s, h[:, None] * s
    buf, hbuf = buf.astype(dtype), hbuf.astype(dtype)
    return buf[:, :k], hbuf[:, :k], cupy.asarray(buf)[:, :k], cupy.asarray(hbuf)[:, :k]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,k,b", [(3001, 24, 8), (5000, 16, 8), (777, 5, 2), (2000, 32, 10), (400, 3, 1)])
def test_rayleigh_ritz_on_gpu_equals_the_host(dtype, rows, k, b, rng):
    import cupy
    scales = np.where(np.arange(k) % 3 == 2, 1e-3, 1.0)     # a W part of other length: the Jacobi scaling
    s, hs, s_dev, hs_dev = _blocks(rng, rows, k, dtype, scales)
    theta, c, allv, g = dense.rayleigh_ritz(s, hs, b, with_gram=True)
    z, usable = dense.next_p_coefficients(c, g, b)
    rr = gpu_rayleigh_ritz.queue(dense.gram_buffer(s_dev, hs_dev), b, dtype)
    got_theta, largest, got_usable, definite = rr.summary()
    assert definite
    np.testing.assert_allclose(got_theta, theta, rtol=TOL[dtype], atol=TOL[dtype] * np.abs(allv).max())
    np.testing.assert_allclose(cupy.asnumpy(rr.theta), got_theta, rtol=0, atol=0)
    assert largest == pytest.approx(np.abs(allv).max(), rel=TOL[dtype])
    np.testing.assert_array_equal(got_usable, usable)
    m = cupy.asnumpy(rr.m).astype(np.float64)
    assert m.shape == (k, 2 * b) and rr.m.dtype == dtype
    sign = np.sign(np.sum(m[:, :b] * c, axis=0))              # eigenvectors are defined up to their sign
    want = np.hstack([c * sign, z * sign])
    scale = np.abs(want).max(axis=0)
    assert (np.abs(m - want) <= 50 * TOL[dtype] * scale[None, :]).all(), np.abs(m - want).max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rayleigh_ritz_on_gpu_with_repeated_ritz_values(dtype, rng):
    """S spans 8 vectors from each of H's three eigenspaces, mixed by a random rotation: the pencil's
    eigenvalues are -2, 0.5 and 3, eight times each, and the eigenvectors are defined only up to a rotation
    within each eigenspace. The GPU's C must solve the pencil and be S^T S-orthonormal."""
    import cupy
    rows, b = 3000, 8
    h = np.repeat([-2.0, 0.5, 3.0], rows // 3)
    s = np.zeros((rows, 3 * b))
    for g in range(3):
        s[g * 1000:(g + 1) * 1000, g * b:(g + 1) * b] = rng.standard_normal((1000, b)) / 30
    s = s @ np.linalg.qr(rng.standard_normal((3 * b, 3 * b)))[0]
    s_dev, hs_dev = cupy.asarray(s.astype(dtype)), cupy.asarray((h[:, None] * s).astype(dtype))
    both = lowlevel.grams(s_dev, hs_dev)
    rr = gpu_rayleigh_ritz.queue(both, b, dtype)
    theta, largest, usable, definite = rr.summary()
    assert definite
    tol = 1e-5 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(theta, -2.0, atol=tol)
    assert largest == pytest.approx(3.0, abs=tol)
    g, o = both.get()[:, :, 0], both.get()[:, :, 1]
    c = cupy.asnumpy(rr.m)[:, :b].astype(np.float64)
    np.testing.assert_allclose(c.T @ o @ c, np.eye(b), atol=10 * tol)
    np.testing.assert_allclose(g @ c, (o @ c) * theta[None, :], atol=10 * tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rayleigh_ritz_on_gpu_says_when_the_eigensolver_did_not_converge(dtype, rng):
    """cuSOLVER's batched Jacobi solver reports success also when its sweeps ran out (k <= 32): with one
    sweep allowed, the residual check must send the step to the host path, with [C Z] zero."""
    import cupy
    from cupy_backends.cuda.libs import cusolver
    s, hs, s_dev, hs_dev = _blocks(rng, 3001, 24, dtype)
    both = lowlevel.grams(s_dev, hs_dev)
    assert gpu_rayleigh_ritz.queue(both, 8, dtype).summary()[3]            # converged with the default sweeps
    params = gpu_rayleigh_ritz._syevj_params[cupy.cuda.Device().id][0]
    cusolver.xsyevjSetMaxSweeps(params, 1)
    try:
        rr = gpu_rayleigh_ritz.queue(both, 8, dtype)
        assert not rr.summary()[3]
        np.testing.assert_array_equal(cupy.asnumpy(rr.m), 0)
    finally:
        cusolver.xsyevjSetMaxSweeps(params, 100)                          # cuSOLVER's default
    assert gpu_rayleigh_ritz.queue(both, 8, dtype).summary()[3]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rayleigh_ritz_on_gpu_says_when_s_is_singular(dtype, rng):
    s, hs, s_dev, hs_dev = _blocks(rng, 2000, 12, dtype)
    s_dev[:, 7] = s_dev[:, 3]                                  # two equal columns
    hs_dev[:, 7] = hs_dev[:, 3]
    with pytest.raises(dense.NotPositiveDefinite):
        dense.rayleigh_ritz(s_dev, hs_dev, 4)                  # the host path
    assert not gpu_rayleigh_ritz.queue(dense.gram_buffer(s_dev, hs_dev), 4, dtype).summary()[3]
    s_dev[:, 5] = np.nan
    assert not gpu_rayleigh_ritz.queue(dense.gram_buffer(s_dev, hs_dev), 4, dtype).summary()[3]


def test_queue_bad_arguments():
    import cupy
    with pytest.raises(ValueError, match="not covered"):
        gpu_rayleigh_ritz.queue(cupy.zeros((40, 40, 2)), 8, np.float64)     # more than KMAX columns
    with pytest.raises(ValueError, match="not covered"):
        gpu_rayleigh_ritz.queue(cupy.zeros((12, 12, 2)), 13, np.float64)    # b > k
    with pytest.raises(ValueError, match="not covered"):
        gpu_rayleigh_ritz.queue(cupy.zeros((12, 12, 2), dtype=np.complex128), 4, np.float64)


def test_lobpcg_falls_back_to_the_host_when_the_gpu_says_not_definite(rng, monkeypatch):
    """The first three GPU Rayleigh-Ritz steps (the start's and two iterations') report S^T S not positive
    definite: the host path takes those steps from the same blocks, and the eigenpairs are right."""
    a = sp.random(2500, 2500, density=0.01, random_state=rng, format="csr")
    a = (a + a.T + sp.diags(rng.uniform(-5, 5, 2500))).tocsr()
    real = gpu_rayleigh_ritz.Queued.summary
    calls = []

    def first_three_fail(self):
        out = real(self)
        calls.append(out[3])
        return out[:3] + (False,) if len(calls) <= 3 else out
    plain = solver.lobpcg(SymmetricOperator(a, devices=[0]), 5, tol=1e-9, maxiter=600, seed=4)
    monkeypatch.setattr(gpu_rayleigh_ritz.Queued, "summary", first_three_fail)
    res = solver.lobpcg(SymmetricOperator(a, devices=[0]), 5, tol=1e-9, maxiter=600, seed=4)
    assert len(calls) > 3 and res.converged and res.redone == 3 and plain.redone == 0
    np.testing.assert_allclose(res.eigenvalues, np.linalg.eigh(a.toarray())[0][:5], rtol=1e-8)
    # the host redid the same steps from the same blocks: the run follows the plain one
    assert res.iterations == plain.iterations
    np.testing.assert_allclose(np.array(res.history), np.array(plain.history), rtol=1e-4, atol=1e-13)


def test_lobpcg_redoes_the_guessed_pass_when_a_p_column_is_unusable(rng, monkeypatch):
    """The next [P W] pass is queued before the Rayleigh-Ritz summary is read, on the guess that every active
    P column is usable. Here the first P column is made unusable (zero) in every step: the guessed pass
    declines (a column of zeros), the pass is queued again without it, and the eigenpairs are right."""
    a = sp.random(2500, 2500, density=0.01, random_state=rng, format="csr")
    a = (a + a.T + sp.diags(rng.uniform(-5, 5, 2500))).tocsr()
    real_queue, real_pass = gpu_rayleigh_ritz.queue, gpu_ortho.first_pass
    passes = []

    def first_p_unusable(both, b, dtype):
        rr = real_queue(both, b, dtype)
        rr.m[:, b] = 0                      # before the update reads it (same stream)
        summary = rr.summary

        def without_first():
            theta, largest, usable, definite = summary()
            usable = usable.copy()
            usable[0] = False
            return theta, largest, usable, definite
        rr.summary = without_first
        return rr

    def counted(*args, **kwargs):
        passes.append(args[3])
        return real_pass(*args, **kwargs)
    monkeypatch.setattr(gpu_rayleigh_ritz, "queue", first_p_unusable)
    monkeypatch.setattr(gpu_ortho, "first_pass", counted)
    res = solver.lobpcg(SymmetricOperator(a, devices=[0]), 5, tol=1e-9, maxiter=600, seed=4)
    assert res.converged and len(passes) > res.iterations + 1 and res.redone > 0   # guessed passes queued again
    np.testing.assert_allclose(res.eigenvalues, np.linalg.eigh(a.toarray())[0][:5], rtol=1e-8)
