"""hybridblas.lowlevel.grams (hybridblas/devices/cuda_grams.py): S^T H S and S^T S of tall row-major blocks in
one pass equal float64 products of the same inputs (double accumulation, also for float32 blocks), are whole
and symmetric, reproducible, read column ranges of wider buffers in place, run on the caller's stream, and are
refused by name where the kernels do not apply; prepare_kernels compiles the module the calls use."""
import numpy as np
import pytest

from hybridblas import lowlevel
from hybridblas.devices import cuda_grams

pytestmark = pytest.mark.gpu


def _poison_pool():
    """Leave NaN in the memory CuPy hands out next, so an output or scratch left unwritten shows."""
    import cupy
    junk = cupy.full(1 << 24, np.nan)
    del junk


def _buffers(rng, rows, k, dtype, width=None):
    """S and H S as the first k columns of row-major buffers of ``width`` columns (the rest NaN)."""
    import cupy
    width = width or k + 3
    s = np.full((rows, width), np.nan)
    hs = np.full((rows, width), np.nan)
    s[:, :k] = rng.standard_normal((rows, k)) + 0.5
    hs[:, :k] = rng.uniform(-3, 3, rows)[:, None] * s[:, :k] + 0.1 * rng.standard_normal((rows, k))
    s, hs = s.astype(dtype), hs.astype(dtype)
    return s[:, :k], hs[:, :k], cupy.asarray(s)[:, :k], cupy.asarray(hs)[:, :k]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,k", [(0, 5), (1, 1), (5, 3), (63, 24), (64, 24), (65, 24), (3001, 16), (4099, 30),
                                    (2000, 32), (300001, 24), (777, 7)])
@pytest.mark.parametrize("staged", [True, False])
def test_grams_equal_float64_products(dtype, rows, k, staged, rng):
    s, hs, s_dev, hs_dev = _buffers(rng, rows, k, dtype)
    _poison_pool()
    got = lowlevel.grams(s_dev, hs_dev, staged=staged).get()
    assert got.shape == (k, k, 2) and got.dtype == np.float64
    s64, hs64 = s.astype(np.float64), hs.astype(np.float64)
    for g, want in enumerate([s64.T @ hs64, s64.T @ s64]):
        scale = max(np.abs(want).max(), 1.0)
        assert np.abs(got[:, :, g] - want).max() <= 1e-12 * scale, (g, np.abs(got[:, :, g] - want).max())
    np.testing.assert_array_equal(got[:, :, 1], got[:, :, 1].T)          # S^T S mirrored exactly


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,k,width", [(100003, 24, 24), (65, 24, 32), (5001, 16, 20), (4099, 32, 32), (7, 4, 4),
                                          (3001, 8, 24)])
@pytest.mark.parametrize("staged", [True, False])
def test_grams_of_aligned_rows(dtype, rows, k, width, staged, rng):
    """Rows that start on 16-byte boundaries are staged by vector loads (the LOBPCG buffers' usual layout):
    by cp.async copies (staged) or through registers."""
    s, hs, s_dev, hs_dev = _buffers(rng, rows, k, dtype, width=width)
    assert cuda_grams._vector_rows(s_dev, k)
    assert cuda_grams._staged(s_dev, hs_dev)          # every shape here fits the staged buffers
    _poison_pool()
    got = lowlevel.grams(s_dev, hs_dev, staged=staged).get()
    s64, hs64 = s.astype(np.float64), hs.astype(np.float64)
    for g, want in enumerate([s64.T @ hs64, s64.T @ s64]):
        assert np.abs(got[:, :, g] - want).max() <= 1e-12 * max(np.abs(want).max(), 1.0)


@pytest.mark.parametrize("rows,k,width", [(5001, 6, 8), (1000, 18, 18), (33, 2, 2), (100003, 10, 12)])
@pytest.mark.parametrize("with_hs", [True, False])
def test_staged_grams_with_padding_columns(rows, k, width, with_hs, rng):
    """float64 rows of whole 16-byte vectors but k not a multiple of 4: the staged kernel's tiles are rows of
    k values padded to the next multiple of 4 (its 4 x 4 tasks), so the copies and the products index a row
    stride other than k."""
    s, hs, s_dev, hs_dev = _buffers(rng, rows, k, np.float64, width=width)
    assert cuda_grams._staged(s_dev, hs_dev if with_hs else None)
    _poison_pool()
    got = lowlevel.grams(s_dev, hs_dev if with_hs else None).get()
    s64, hs64 = s.astype(np.float64), hs.astype(np.float64)
    wants = [s64.T @ hs64 if with_hs else np.zeros((k, k)), s64.T @ s64]
    for g, want in enumerate(wants):
        assert np.abs(got[:, :, g] - want).max() <= 1e-12 * max(np.abs(want).max(), 1.0)
    for _ in range(2):                                                   # reproducible bit for bit
        np.testing.assert_array_equal(lowlevel.grams(s_dev, hs_dev if with_hs else None).get(), got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grams_without_hs_and_reproducible(dtype, rng):
    s, _, s_dev, _ = _buffers(rng, 100003, 24, dtype, width=25)
    first = lowlevel.grams(s_dev).get()
    np.testing.assert_array_equal(first[:, :, 0], 0.0)
    s64 = s.astype(np.float64)
    assert np.abs(first[:, :, 1] - s64.T @ s64).max() <= 1e-12 * np.abs(s64.T @ s64).max()
    for _ in range(3):
        np.testing.assert_array_equal(lowlevel.grams(s_dev).get(), first)


def test_grams_of_float32_beat_float32_accumulation(rng):
    """Double accumulation: two million float32 rows give Grams to float64 accuracy, where a float32 product
    (cuBLAS through cupy) loses digits to the long sum."""
    import cupy
    s = rng.standard_normal((2_000_000, 8)).astype(np.float32) + 1.0
    want = s.astype(np.float64).T @ s.astype(np.float64)
    s_dev = cupy.asarray(s)
    ours = np.abs(lowlevel.grams(s_dev).get()[:, :, 1] - want).max() / np.abs(want).max()
    single = np.abs((s_dev.T @ s_dev).get().astype(np.float64) - want).max() / np.abs(want).max()
    assert ours <= 1e-13 and ours < single / 100, (ours, single)


def test_grams_bad_arguments():
    import cupy
    with pytest.raises(ValueError, match=r"s must have 1 to 32 columns, got shape \(10, 33\)"):
        lowlevel.grams(cupy.zeros((10, 33)))                              # more than KMAX columns
    with pytest.raises(ValueError, match=r"hs must have the shape of s \(10, 8\), got \(10, 7\)"):
        lowlevel.grams(cupy.zeros((10, 8)), cupy.zeros((10, 7)))          # H S of another shape
    with pytest.raises(ValueError, match="s must be row-major"):
        lowlevel.grams(cupy.zeros((10, 8), order="F"))                    # not row-major
    with pytest.raises(ValueError, match="hs must be row-major"):
        lowlevel.grams(cupy.zeros((10, 8)), cupy.zeros((10, 8), order="F"))
    with pytest.raises(TypeError, match="s has dtype complex128; grams takes float32 or float64"):
        lowlevel.grams(cupy.zeros((10, 8), dtype=np.complex128))
    with pytest.raises(TypeError, match=r"hs has dtype float32, unlike s \(float64\)"):
        lowlevel.grams(cupy.zeros((10, 8)), cupy.zeros((10, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"s must be 2-D, got shape \(10,\)"):
        lowlevel.grams(cupy.zeros(10))
    with pytest.raises(TypeError, match="s must be a cupy array, got ndarray"):
        lowlevel.grams(np.zeros((10, 8)))
    with pytest.raises(TypeError, match="staged must be True or False, got int 1"):
        lowlevel.grams(cupy.zeros((10, 8)), staged=1)
    assert not cuda_grams.fits(np.zeros((10, 8)))
    for s, hs in ((cupy.zeros((10, 33)), None), (cupy.zeros((10, 8)), cupy.zeros((10, 7))),
                  (cupy.zeros((10, 8), order="F"), None), (cupy.zeros((10, 8), dtype=np.complex128), None),
                  (np.zeros((10, 8)), None), (cupy.zeros(10), None)):
        assert not lowlevel.grams_preferred(s, hs)                        # refused: not preferred, no exception
    assert lowlevel.grams_preferred(cupy.zeros((10, 8)), cupy.zeros((10, 8)))


def test_grams_preferred_up_to_the_row_limits():
    """Up to ROWS_LIMIT rows, float64 blocks the staged kernel takes up to STAGED_DOUBLE_ROWS_LIMIT."""
    import cupy
    limit, staged_limit = cuda_grams.ROWS_LIMIT, cuda_grams.STAGED_DOUBLE_ROWS_LIMIT
    for dtype in (np.float32, np.float64):
        assert lowlevel.grams_preferred(cupy.zeros((limit, 8), dtype=dtype))
        assert lowlevel.grams_preferred(cupy.zeros((limit + 1, 8), dtype=dtype)) == (dtype == np.float64)
    assert lowlevel.grams_preferred(cupy.zeros((staged_limit, 8)))
    assert not lowlevel.grams_preferred(cupy.zeros((staged_limit + 1, 8)))
    assert not lowlevel.grams_preferred(cupy.zeros((limit + 1, 9)))     # 9 columns: not the staged kernel's


@pytest.mark.parametrize("staged", [True, False])
def test_grams_run_on_the_callers_stream(staged, rng):
    """The blocks written on a non-blocking stream and the Grams queued there: only that stream is waited for."""
    import cupy
    s = rng.standard_normal((70001, 16))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        s_dev = cupy.empty((70001, 16))
        s_dev.set(s, stream=stream)
        s_dev *= 2.0
        got = lowlevel.grams(s_dev, s_dev, staged=staged)
        host = cupy.empty_like(got)
        host[...] = got
    stream.synchronize()
    want = 4.0 * s.T @ s
    for g in range(2):
        assert np.abs(host.get()[:, :, g] - want).max() <= 1e-12 * np.abs(want).max()


@pytest.mark.multi_gpu
def test_grams_refuse_a_block_of_another_gpu():
    import cupy
    with cupy.cuda.Device(1):
        s = cupy.zeros((10, 8))
    with cupy.cuda.Device(0):                  # whatever an earlier test left current
        with pytest.raises(ValueError, match="s lives on GPU 1, not on the current device 0"):
            lowlevel.grams(s)
        assert not lowlevel.grams_preferred(s)
    with cupy.cuda.Device(1):
        assert lowlevel.grams(s).device.id == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prepared_gram_kernels_are_the_ones_the_calls_use(dtype, monkeypatch, rng):
    monkeypatch.setattr(cuda_grams, "_modules", {})
    lowlevel.prepare_kernels(dtype, [0]).join()
    key = (0, np.dtype(dtype), cuda_grams._constants())
    kernels = cuda_grams._modules[key]
    s, hs, s_dev, hs_dev = _buffers(rng, 5000, 8, dtype)
    got = lowlevel.grams(s_dev, hs_dev).get()
    s64 = s.astype(np.float64)
    assert np.abs(got[:, :, 1] - s64.T @ s64).max() <= 1e-12 * np.abs(s64.T @ s64).max()
    assert cuda_grams._modules[key] is kernels                              # not compiled again
