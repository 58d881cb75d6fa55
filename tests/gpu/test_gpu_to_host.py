"""hybridblas.lowlevel.to_host: a GPU matrix or one triangle of it into a host array, nothing else written,
through the pageable path and the page-locked (DMA) path, column- and row-major, views of larger arrays."""
import numpy as np
import pytest

from hybridblas import host_pinning, lowlevel
from hybridblas import downloads

pytestmark = pytest.mark.gpu


def _rand(rng, shape, dtype, order):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return np.asarray(x, dtype=dtype, order=order)


def _want(src, before, lower):
    if lower is None:
        return src
    keep = np.tril(np.ones(src.shape, bool)) if lower else np.triu(np.ones(src.shape, bool))
    return np.where(keep, src, before)


@pytest.fixture(params=["pageable", "dma"])
def path(request, monkeypatch):
    """The copy route: the pageable one, or page-locking every host array with narrow panels (so that a
    small matrix crosses several panels and both diagonal buffers)."""
    if request.param == "dma":
        monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
        monkeypatch.setattr(downloads, "PANEL", 7)
    yield request.param
    host_pinning.clear()


@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("lower", [None, True, False])
@pytest.mark.parametrize("n", [1, 30, 33])
def test_square_matrix_or_triangle_lands_and_nothing_else(path, dtype, order, lower, n, rng):
    import cupy
    src = _rand(rng, (n, n), dtype, order)
    dst = np.full((n, n), np.nan, dtype=dtype, order=order)
    if np.dtype(dtype).kind == "c":
        dst.imag = np.inf
    before = dst.copy(order=order)
    assert lowlevel.to_host(dst, cupy.asarray(src, order=order), lower=lower) is dst
    np.testing.assert_array_equal(dst, _want(src, before, lower))


@pytest.mark.parametrize("order", ["F", "C"])
def test_column_range_of_a_larger_array_and_a_wide_block(path, order, rng):
    import cupy
    big = np.full((40, 50), -7.0, order=order)
    src = _rand(rng, (40, 20), np.float64, order)
    lowlevel.to_host(big[:, 10:30], cupy.asarray(src, order=order))
    np.testing.assert_array_equal(big[:, 10:30], src)
    assert (big[:, :10] == -7).all() and (big[:, 30:] == -7).all()
    square = np.full((40, 50), -7.0, order=order)
    tri = _rand(rng, (20, 20), np.float64, order)
    lowlevel.to_host(square[5:25, 10:30], cupy.asarray(tri, order=order), lower=True)
    got = square[5:25, 10:30]
    np.testing.assert_array_equal(got, np.where(np.tril(np.ones((20, 20), bool)), tri, -7.0))
    square[5:25, 10:30] = -7.0
    assert (square == -7).all()                                 # nothing outside the view written


def test_a_large_host_array_is_page_locked_and_copied_by_dma(rng):
    """At host_pinning's threshold and above: the copy goes by DMA (the array stays locked while it lives)."""
    import cupy
    n = 5800                                                    # 538 MB of complex128 over PANEL-wide panels
    src = cupy.asarray(_rand(rng, (n, n), np.complex128, "F"), order="F")
    dst = np.full((n, n), np.nan + 0j, order="F")
    try:
        lowlevel.to_host(dst, src, lower=True)
        assert host_pinning.pinned_bytes() >= dst.nbytes
        host = src.get()
        low = np.tril(np.ones((n, n), bool))
        np.testing.assert_array_equal(dst[low], host[low])
        assert np.isnan(dst[~low]).all()
        lowlevel.to_host(dst, src)
        np.testing.assert_array_equal(dst, host)
    finally:
        host_pinning.clear()


def test_refuses_mismatches_before_copying(rng):
    import cupy
    dst = np.full((4, 4), np.nan, order="F")
    with pytest.raises(ValueError, match=r"src must have dst's shape \(4, 4\), got \(4, 3\)"):
        lowlevel.to_host(dst, cupy.zeros((4, 3), order="F"))
    with pytest.raises(TypeError, match="src has dtype float32, unlike dst"):
        lowlevel.to_host(dst, cupy.zeros((4, 4), np.float32, order="F"))
    with pytest.raises(ValueError, match="dst and src must both be column-major or both row-major"):
        lowlevel.to_host(dst, cupy.zeros((4, 4), order="C"))
    with pytest.raises(ValueError, match=r"a triangle \(lower=True\) needs a square matrix"):
        lowlevel.to_host(np.zeros((4, 3), order="F"), cupy.zeros((4, 3), order="F"), lower=True)
    with pytest.raises(TypeError, match="lower must be True, False or None, got int 1"):
        lowlevel.to_host(dst, cupy.zeros((4, 4), order="F"), lower=1)
    ro = np.zeros((4, 4), order="F")
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst must be writeable"):
        lowlevel.to_host(ro, cupy.zeros((4, 4), order="F"))
    assert np.isnan(dst).all()


def test_page_lock_locks_a_large_array_for_later_copies(rng):
    """hybridblas.memory.page_lock: an array of 256 MiB or more is locked now (the copy after it finds it locked)."""
    import cupy
    from hybridblas import memory
    n = 4200                                                    # 282 MB of complex128
    dst = np.zeros((n, n), complex, order="F")
    try:
        assert memory.page_lock(dst) and host_pinning.pinned_bytes() >= dst.nbytes
        assert memory.page_lock(dst)                             # once: a second call finds it locked
        src = cupy.asarray(_rand(rng, (n, n), np.complex128, "F"), order="F")
        lowlevel.to_host(dst, src, lower=False)
        np.testing.assert_array_equal(np.triu(dst), np.triu(src.get()))
    finally:
        host_pinning.clear()


@pytest.mark.parametrize("lower", [True, False, None])
def test_a_queued_copy_on_a_second_stream_beside_products(lower, rng, monkeypatch):
    """wait=False on a second stream (a page-locked target, several panels) while the current stream runs
    products that do not touch src: after wait() dst holds src's triangle and its poison elsewhere, and the
    products are right."""
    import cupy
    n = 1500
    src = cupy.asarray(_rand(rng, (n, n), np.complex128, "F"), order="F")
    a = cupy.asarray(_rand(rng, (n, n), np.complex128, "F"))
    dst = np.full((n, n), np.nan + 0j, order="F")
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)       # locked on the first copy: the DMA route
    try:
        ready = cupy.cuda.Event(disable_timing=True)
        ready.record()
        side = cupy.cuda.Stream(non_blocking=True)
        side.wait_event(ready)
        with side:
            pending = lowlevel.to_host(dst, src, lower=lower, wait=False)
        products = [a @ a for _ in range(3)]
        pending.wait()
        assert host_pinning.pinned_bytes() >= dst.nbytes
        host = src.get()
        keep = np.ones((n, n), bool) if lower is None else (np.tril if lower else np.triu)(np.ones((n, n), bool))
        np.testing.assert_array_equal(dst[keep], host[keep])
        assert np.isnan(dst[~keep]).all()
        want = a.get() @ a.get()
        assert max(float(abs(p.get() - want).max()) for p in products) <= 1e-10 * float(abs(want).max())
    finally:
        host_pinning.clear()

