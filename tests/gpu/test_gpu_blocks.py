"""cisolver.blocks on a GPU (cuBLAS gemms on strided column ranges, the residual kernel) against numpy on
the same data: both precisions, column ranges of row-major buffers, edge sizes, and layouts that are not
row-major (the cupy fallback)."""
import numpy as np
import pytest

from cisolver.blocks import (product_into, product_into_both, replace_with_product, residual_into, subtract_product,
                             times_upper)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 127, 100_003])
@pytest.mark.parametrize("order", ["C", "F"])
def test_block_updates_on_gpu_match_numpy(dtype, rows, order, rng):
    import cupy
    host = rng.standard_normal((rows, 24)).astype(dtype)
    other = np.full((rows, 24), np.nan, dtype=dtype)
    dev, other_dev = cupy.asarray(host, order=order), cupy.asarray(other, order=order)
    pair = np.full((rows, 32), np.nan, dtype=dtype)
    pair_dev = cupy.asarray(pair, order=order)
    m = rng.standard_normal((20, 16))
    m2 = rng.standard_normal((8, 16))
    u = np.triu(rng.standard_normal((16, 16))) + 4 * np.eye(16)
    for x, o, two in ((host, other, pair), (dev, other_dev, pair_dev)):
        product_into(o[:, 4:20], x[:, :20], m)
        subtract_product(x[:, 8:24], x[:, :8], m2)
        times_upper(x[:, 8:24], u)
        replace_with_product(x[:, 4:20], x[:, :20], m)           # in place: the same rows of one buffer
        product_into_both(two[:, :16], x[:, 4:24], two[:, 16:], x[:, :20] * 0.5, m)
    tol = 64 * np.finfo(dtype).eps
    for got, expected, what in ((other_dev.get(), other, "product_into"), (dev.get(), host, "subtract, times_upper"),
                                (pair_dev.get(), pair, "product_into_both")):
        finite = ~np.isnan(expected)
        assert (np.isnan(got) == ~finite).all(), what
        scale = max(np.abs(expected[finite]).max(initial=0.0), 1.0)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=0, atol=tol * scale, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 255, 100_003])
@pytest.mark.parametrize("order", ["C", "F"])
def test_residual_on_gpu_matches_numpy(dtype, rows, order, rng):
    """r <- hx - x diag(theta) into a poisoned r, and its column sums of squares (double), on strided
    column ranges; F order takes the cupy fallback."""
    import cupy
    s = rng.standard_normal((rows, 24)).astype(dtype)
    hs = rng.standard_normal((rows, 24)).astype(dtype)
    theta = rng.standard_normal(8) * 10
    r = np.full((rows, 8), np.nan, dtype=dtype)
    sq = residual_into(r, hs[:, :8], s[:, :8], theta)
    s_d, hs_d = cupy.asarray(s, order=order), cupy.asarray(hs, order=order)
    r_d = cupy.full((rows, 8), np.nan, dtype=dtype)
    before = s_d.get(), hs_d.get()
    sq_d = residual_into(r_d, hs_d[:, :8], s_d[:, :8], theta)
    tol = 8 * np.finfo(dtype).eps * max(np.abs(hs).max(initial=0) + 10 * np.abs(s).max(initial=0), 1.0)
    np.testing.assert_allclose(r_d.get(), r, rtol=0, atol=tol)
    exact = (hs[:, :8].astype(np.float64) - s[:, :8].astype(np.float64) * theta.astype(dtype)) ** 2
    np.testing.assert_allclose(sq_d, exact.sum(axis=0), rtol=1e-5 if dtype == np.float32 else 1e-12, atol=0)
    np.testing.assert_allclose(sq, exact.sum(axis=0), rtol=1e-5 if dtype == np.float32 else 1e-12, atol=0)
    np.testing.assert_array_equal(s_d.get(), before[0])
    np.testing.assert_array_equal(hs_d.get(), before[1])
    again = residual_into(r_d, hs_d[:, :8], s_d[:, :8], theta)
    np.testing.assert_array_equal(again, sq_d)                      # reproducible bit for bit


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 255, 100_003])
@pytest.mark.parametrize("b, k", [(8, 24), (8, 21), (5, 13), (4, 12), (10, 20)])
@pytest.mark.parametrize("staged", [True, False])
def test_update_with_residual_on_gpu_matches_numpy(dtype, rows, b, k, staged, rng):
    """The end-of-iteration kernel (new X, P, H X, H P, residual and its norms in one launch) against
    numpy: full and partial bases (k odd: no vector loads), b = 5 (rows of 5: no vector stores), poisoned
    outputs, columns beyond the outputs untouched, bit-reproducible sums; staged (cp.async tiles, float64 with
    k even: b = 8, 4 and 10, the last with 32 accumulators) and thread-per-row kernels; R's copy into a
    column range, 16-byte aligned rows or not (the callers' route: staged where it fits)."""
    import cupy
    from cisolver import row_kernels
    from cisolver.blocks import update_with_residual
    s = rng.standard_normal((rows, 3 * b)).astype(dtype)
    hs = rng.standard_normal((rows, 3 * b)).astype(dtype)
    m = rng.standard_normal((k, 2 * b))
    theta = rng.standard_normal(b) * 10
    x_next = np.full((rows, 3 * b), np.nan, dtype=dtype)
    hx_next = np.full((rows, 3 * b), np.nan, dtype=dtype)
    r = np.full((rows, b), np.nan, dtype=dtype)
    sq = update_with_residual(x_next[:, :2 * b], s[:, :k], hx_next[:, :2 * b], hs[:, :k], m, r, theta)
    d = [cupy.asarray(a) for a in (s, hs, np.full_like(x_next, np.nan), np.full_like(hx_next, np.nan),
                                   np.full_like(r, np.nan))]
    s_d, hs_d, x_d, hx_d, r_d = d
    took = row_kernels.update_with_residual(x_d[:, :2 * b], s_d[:, :k], hx_d[:, :2 * b], hs_d[:, :k], m, r_d,
                                            theta, staged=staged) is not None
    assert took or rows == 0                                                      # the kernel took it
    first = [x_d.get(), hx_d.get(), r_d.get()]
    expect_staged = dtype == np.float64 and k % 2 == 0
    assert row_kernels._staged_fits([s_d[:, :k], hs_d[:, :k]], k, 2 * b) == expect_staged
    for lead in (2, 1):                  # R's copy into a column range: rows 16-byte aligned (b + 2 wide) or not
        w_d = cupy.full((rows, b + lead), np.nan, dtype=dtype)
        if expect_staged and rows:        # (no rows: the caller's route, no kernel)
            assert row_kernels._copy_target(w_d[:, lead:], r_d) is not None    # the kernel writes it itself
        sq_d = update_with_residual(x_d[:, :2 * b], s_d[:, :k], hx_d[:, :2 * b], hs_d[:, :k], m, r_d, theta,
                                    r_copy=w_d[:, lead:])
        np.testing.assert_array_equal(w_d[:, lead:].get(), r_d.get())
        assert np.isnan(w_d[:, :lead].get()).all()
    scale = max(np.abs(m).sum(axis=0).max() * max(np.abs(s).max(initial=0), np.abs(hs).max(initial=0)), 1.0)
    tol = 32 * np.finfo(dtype).eps * scale
    for got_x, got_hx, got_r in (first, (x_d.get(), hx_d.get(), r_d.get())):     # this kernel's, the callers'
        for got, want in ((got_x, x_next), (got_hx, hx_next)):
            assert np.isnan(got[:, 2 * b:]).all()
            np.testing.assert_allclose(got[:, :2 * b], want[:, :2 * b], rtol=0, atol=tol)
        np.testing.assert_allclose(got_r, r, rtol=0, atol=(2 + np.abs(theta).max()) * tol)
    exact = (hs[:, :k].astype(np.float64) @ m[:, :b] - (s[:, :k].astype(np.float64) @ m[:, :b]) * theta) ** 2
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(sq_d, exact.sum(axis=0), rtol=rtol, atol=1e-300)
    np.testing.assert_allclose(sq, exact.sum(axis=0), rtol=rtol, atol=1e-300)
    again = update_with_residual(x_d[:, :2 * b], s_d[:, :k], hx_d[:, :2 * b], hs_d[:, :k], m, r_d, theta)
    np.testing.assert_array_equal(again, sq_d)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cols", [(0, 20, 4, 20), (1, 18, 3, 17), (0, 24, 0, 40)])
def test_row_kernel_in_place_and_fallbacks(dtype, cols, rng):
    """v <- a m in place over the same rows: aligned column ranges (vector loads and stores), misaligned
    ones (scalar), and an output wider than the kernel's accumulators (the cuBLAS route)."""
    import cupy
    from cisolver import row_kernels
    from cisolver.blocks import replace_with_product
    a0, a1, v0, v1 = cols
    width = max(a1, v1) + 3
    host = rng.standard_normal((10_007, width)).astype(dtype)
    m = rng.standard_normal((a1 - a0, v1 - v0))
    expected = host.astype(np.float64)
    expected[:, v0:v1] = host[:, a0:a1].astype(np.float64) @ m
    dev = cupy.asarray(host)
    took = row_kernels.product(dev[:, v0:v1], dev[:, a0:a1], m)
    assert took == (v1 - v0 <= max(row_kernels.QMAX_CHOICES))         # wider: the cuBLAS route
    dev = cupy.asarray(host)
    replace_with_product(dev[:, v0:v1], dev[:, a0:a1], m)
    got = dev.get()
    tol = 32 * np.finfo(dtype).eps * max(np.abs(expected).max(), 1.0) * np.sqrt(a1 - a0)
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)
    untouched = np.ones(width, dtype=bool)
    untouched[v0:v1] = False
    np.testing.assert_array_equal(got[:, untouched], host[:, untouched])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 31, 33, 4099, 100_003])
@pytest.mark.parametrize("p, q", [(24, 16), (24, 8), (16, 3), (32, 32), (8, 20), (12, 5)])
@pytest.mark.parametrize("in_place", [False, True])
def test_staged_and_thread_per_row_products_match_numpy(dtype, rows, p, q, in_place, rng):
    """out <- a m by the staged kernel (float64; tiles of STAGE_ROWS rows through shared memory: edge tiles,
    one row, an empty block) and by the thread-per-row kernel, against float64 numpy: aligned column ranges of
    a wider buffer, in place over the same rows or into another buffer, poisoned outputs, other columns
    untouched."""
    import cupy
    from cisolver import row_kernels
    width = -(-(p + q + 8) // 4) * 4    # rows 16-byte aligned in both precisions
    host = rng.standard_normal((rows, width)).astype(dtype)
    host[:, p:] = np.nan
    m = rng.standard_normal((p, q))
    expected = host.astype(np.float64)
    if in_place:                       # out: columns [p - (p % 8 or 8), ...) overlap a's last columns
        o0 = p - 8 if p >= 8 else 0
        o1 = o0 + q
    else:
        o0, o1 = p + 4, p + 4 + q      # 16 bytes past a in both precisions
    expected[:, o0:o1] = host[:, :p].astype(np.float64) @ m
    tol = 32 * np.finfo(dtype).eps * max(np.abs(host[:, :p]).max(initial=0.0), 1.0) * np.abs(m).sum(axis=0).max()
    for staged in (True, False):
        dev = cupy.asarray(host)
        a, out = dev[:, :p], dev[:, o0:o1]
        assert row_kernels._staged_fits([a], p, q) == (dtype == np.float64)
        assert row_kernels.product(out, a, m, staged=staged) or rows == 0      # an empty block: the caller's route
        got = dev.get().astype(np.float64)
        np.testing.assert_allclose(got[:, o0:o1], expected[:, o0:o1], rtol=0, atol=tol, err_msg=f"staged={staged}")
        untouched = np.ones(width, dtype=bool)
        untouched[o0:o1] = False
        np.testing.assert_array_equal(got[:, untouched], expected[:, untouched])


@pytest.mark.parametrize("staged", [True, False])
def test_long_float64_blocks_take_cublas_at_the_end_of_iteration(staged, rng, monkeypatch):
    """Beyond DOUBLE_ROWS_LIMIT rows a float64 end of iteration goes to cuBLAS where the thread-per-row kernel
    would take it (cuBLAS is faster there), not where the staged kernel does; float32 stays on the kernel, and
    so does a product of one block (cuBLAS would need a scratch block and a copy back)."""
    import cupy
    from cisolver import row_kernels
    from cisolver.blocks import update_with_residual
    monkeypatch.setattr(row_kernels, "DOUBLE_ROWS_LIMIT", 100)
    for dtype, kernel in ((np.float64, staged), (np.float32, True)):
        s = cupy.asarray(rng.standard_normal((255, 24)).astype(dtype))
        out = cupy.full((255, 16), np.nan, dtype=dtype)
        m = rng.standard_normal((24, 16))
        assert row_kernels.product(out, s, m, staged=staged)
        assert row_kernels.product(out, s, m, long_double=False, staged=staged) == kernel
        np.testing.assert_allclose(out.get(), s.get().astype(np.float64) @ m, rtol=0,
                                   atol=1e-4 * np.abs(s.get().astype(np.float64) @ m).max())
        r = cupy.empty((255, 8), dtype=dtype)
        took = row_kernels.update_with_residual(out, s, cupy.empty_like(out), s, m, r, np.ones(8),
                                                staged=staged) is not None
        assert took == kernel
        out[...] = np.nan
        sq = update_with_residual(out, s, cupy.empty_like(out), s, m, r, np.ones(8))
        expected = s.get().astype(np.float64) @ m
        np.testing.assert_allclose(out.get(), expected, rtol=0, atol=1e-4 * np.abs(expected).max())
        np.testing.assert_allclose(sq, np.zeros(8), atol=1e-6 * (expected ** 2).sum())   # hx = x, theta = 1
