"""cisolver.host_blocks and the host branch of cisolver.blocks: BLAS on strided column ranges, rows split
over threads; checked against float64 numpy on random data with poisoned outputs."""
import numpy as np
import pytest

from cisolver import blocks, host_blocks


@pytest.fixture
def pieces(monkeypatch):
    """Row pieces of 7 rows, so that small blocks are cut into several pieces on 3 threads."""
    monkeypatch.setattr(host_blocks, "MIN_ROWS_PER_THREAD", 7)
    monkeypatch.setattr(host_blocks, "cores", lambda: 3)


def _close(got, expected, dtype):
    tol = 50 * np.finfo(dtype).eps * max(1.0, np.abs(expected).max(initial=0.0))
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 6, 31])
def test_updates_on_column_ranges_in_row_pieces(dtype, rows, rng, pieces):
    buf = rng.standard_normal((rows, 24)).astype(dtype)
    ref = buf.astype(np.float64)
    out = np.full((rows, 30), np.nan, dtype=dtype)
    m = rng.standard_normal((24, 13))
    host_blocks.product(out[:, 3:16], buf, m)
    _close(out[:, 3:16], ref @ m.astype(dtype).astype(np.float64), dtype)
    assert np.isnan(out[:, :3]).all() and np.isnan(out[:, 16:]).all()
    host_blocks.product(out[:, 3:16], buf, m, beta=-0.5)                 # beta: out is read
    _close(out[:, 3:16], 0.5 * ref @ m.astype(dtype).astype(np.float64), dtype)

    u, c = np.triu(rng.standard_normal((15, 15))) + 3 * np.eye(15), rng.standard_normal((9, 15))
    s = buf.copy()
    blocks.tail_update(s, 9, c, u + np.tril(np.ones((15, 15)), -1))     # below the diagonal is not read
    _close(s[:, 9:], ref[:, 9:] @ u + ref[:, :9] @ c, dtype)
    np.testing.assert_array_equal(s[:, :9], buf[:, :9])

    theta = rng.standard_normal(8)
    r = np.full((rows, 8), np.nan, dtype=dtype)
    sq = blocks.residual_into(r, buf[:, 16:], buf[:, 2:10], theta)
    expected = ref[:, 16:] - ref[:, 2:10] * theta.astype(dtype)
    _close(r, expected, dtype)
    np.testing.assert_allclose(sq, (expected ** 2).sum(axis=0), rtol=50 * np.finfo(dtype).eps, atol=1e-30)


def test_row_pieces_cover_every_row_once(pieces):
    seen = []
    host_blocks.by_rows(31, lambda r0, r1: seen.append((r0, r1)))
    assert sorted(seen) == [(0, 10), (10, 20), (20, 31)]
    seen.clear()
    host_blocks.by_rows(31, lambda r0, r1: seen.append((r0, r1)), threads=1)
    assert seen == [(0, 31)]


def test_empty_product_zeroes_or_scales(rng):
    out = np.full((5, 3), np.nan)
    host_blocks.gemm(out, np.empty((5, 0)), np.empty((0, 3)), 0.0)
    assert (out == 0).all()
    out[...] = 2.0
    host_blocks.gemm(out, np.empty((5, 0)), np.empty((0, 3)), 0.5)
    assert (out == 1.0).all()


def test_blocks_blas_cannot_read_fall_back_to_numpy(rng):
    """Column-major blocks, mixed precisions and a product into its own operand are not BLAS-ready for
    the row-major calls: blocks falls back to numpy and gets the same answer."""
    a = np.asfortranarray(rng.standard_normal((40, 6)))
    m = rng.standard_normal((6, 4))
    assert not host_blocks.blas_ready(a)
    out = np.full((40, 4), np.nan)
    blocks.product_into(out, a, m)
    _close(out, a @ m, np.float64)
    out32 = np.full((40, 4), np.nan, dtype=np.float32)
    blocks.product_into(out32, a, m)                                  # float64 a into float32 out
    _close(out32, a @ m, np.float32)
    buf = rng.standard_normal((40, 12))
    ref = buf.copy()
    blocks.replace_with_product(buf[:, 4:10], buf[:, :8], np.eye(8)[:, :6])   # in place, shifted columns
    _close(buf[:, 4:10], ref[:, :6], np.float64)
    f = np.asfortranarray(rng.standard_normal((40, 12)))
    ff = f.copy()
    blocks.tail_update(f, 4, np.ones((4, 8)), np.eye(8))              # column-major: the numpy route
    _close(f[:, 4:], ff[:, 4:] + ff[:, :4] @ np.ones((4, 8)), np.float64)


def test_thread_cap_and_environment(monkeypatch):
    monkeypatch.setattr(host_blocks, "cores", lambda: 8)
    assert host_blocks.threads_for(100 * host_blocks.MIN_ROWS_PER_THREAD) == 8
    assert host_blocks.threads_for(3 * host_blocks.MIN_ROWS_PER_THREAD) == 3
    assert host_blocks.threads_for(10) == 1
    with host_blocks.limit(2):
        assert host_blocks.threads_for(100 * host_blocks.MIN_ROWS_PER_THREAD) == 2
    assert host_blocks.threads_for(100 * host_blocks.MIN_ROWS_PER_THREAD) == 8
    monkeypatch.undo()
    monkeypatch.setenv("CISOLVER_THREADS", "3")
    assert host_blocks.cores() == 3
    monkeypatch.setenv("CISOLVER_THREADS", "two")
    with pytest.raises(ValueError, match="CISOLVER_THREADS must be a positive integer, got 'two'"):
        host_blocks.cores()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lobpcg_with_row_pieces_matches_one_thread(dtype, rng, monkeypatch):
    """A whole solve with the dense steps cut into row pieces on 3 threads and the Gram products split
    over 3 hybridblas CPU workers gives the one-thread result, and eigh's."""
    import scipy.sparse as sp
    from cisolver import lobpcg, solver
    from cisolver.operators import SymmetricOperator
    a = sp.random(900, 900, density=0.01, random_state=rng, format="csr")
    a = (a + a.T + sp.diags(rng.uniform(-5, 5, 900))).tocsr().astype(dtype)
    op = SymmetricOperator(a, storage="full")
    one = lobpcg(op, 5, tol=1e-5 if dtype == np.float32 else 1e-9, seed=4, dtype=dtype)
    monkeypatch.setattr(host_blocks, "MIN_ROWS_PER_THREAD", 250)
    monkeypatch.setattr(host_blocks, "cores", lambda: 3)
    used = []
    real = solver.host_context
    monkeypatch.setattr(solver, "host_context", lambda t: used.append(t) or real(t))
    three = lobpcg(op, 5, tol=1e-5 if dtype == np.float32 else 1e-9, seed=4, dtype=dtype)
    assert used == [3]
    assert [d.kind for d in real(3).devices] == ["cpu"] * 3           # no GPU for host blocks
    exact = np.linalg.eigvalsh(a.toarray().astype(np.float64))[:5]
    tol = 1e-4 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(three.eigenvalues, exact, rtol=0, atol=tol * np.abs(exact).max())
    np.testing.assert_allclose(three.eigenvalues, one.eigenvalues, rtol=0, atol=tol * np.abs(exact).max())
    assert abs(three.iterations - one.iterations) <= 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_end_of_iteration_with_a_copy_of_r(dtype, rng):
    """blocks.update_with_residual on host blocks: new X, P, H X, H P, R against float64 products, and R's
    copy (the next basis's W columns) equal to R, the columns beside it untouched."""
    rows, b = 3001, 4
    s = rng.standard_normal((rows, 3 * b)).astype(dtype)
    hs = rng.standard_normal((rows, 3 * b)).astype(dtype)
    m = rng.standard_normal((3 * b, 2 * b))
    theta = rng.standard_normal(b)
    x_next, hx_next = np.full_like(s, np.nan), np.full_like(s, np.nan)
    r = np.full((rows, b), np.nan, dtype=dtype)
    sq = blocks.update_with_residual(x_next[:, :2 * b], s, hx_next[:, :2 * b], hs, m, r, theta,
                                     r_copy=x_next[:, 2 * b:])
    x64, hx64 = s.astype(np.float64) @ m, hs.astype(np.float64) @ m
    tol = 64 * np.finfo(dtype).eps * np.abs(m).sum(axis=0).max() * 4
    np.testing.assert_allclose(x_next[:, :2 * b], x64, rtol=0, atol=tol)
    np.testing.assert_allclose(hx_next[:, :2 * b], hx64, rtol=0, atol=tol)
    np.testing.assert_allclose(r, hx64[:, :b] - x64[:, :b] * theta, rtol=0, atol=4 * tol)
    np.testing.assert_array_equal(x_next[:, 2 * b:], r)
    assert np.isnan(hx_next[:, 2 * b:]).all()
    np.testing.assert_allclose(sq, (r.astype(np.float64) ** 2).sum(axis=0), rtol=1e-4 if dtype == np.float32 else 1e-12)
