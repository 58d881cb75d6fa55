"""devices.cuda_tri_store: one triangle of a GPU block stored by a kernel straight into page-locked host memory,
the diagonal included, every other entry of the host array (the other triangle, the rows past the block in a
larger array) left as it was; float64 and complex128, views with a leading dimension on both sides, sizes 1,
odd and past one thread block's stride, the whole triangle by the kernel and in panels of 1, 16 and 128 columns
(the parts outside the panels' diagonal blocks by DMA), the kernel's and the DMA's parts queued together or on two
streams at once; no device address for memory that is not page-locked."""
import numpy as np
import pytest

from hybridblas import host_pinning
from hybridblas.devices import cuda_tri_store

pytestmark = pytest.mark.gpu


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return np.asarray(x, dtype=dtype, order="F")


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("panel", [0, 1, 16, 128])
@pytest.mark.parametrize("n", [1, 2, 37, 130, 300])
@pytest.mark.parametrize("split", [False, True])
def test_stores_the_triangle_and_nothing_else(n, lower, dtype, panel, split, rng):
    import cupy
    big = _rand(rng, (n + 5, n + 3), dtype)                 # the host array: C with a leading dimension n + 5
    before = big.copy()
    pin = host_pinning.acquire(big, min_bytes=0)
    try:
        host_pinning.wait_ready()
        assert host_pinning.is_ready(pin)
        dst = big[2:n + 2, 1:n + 1]
        src_all = cupy.asarray(_rand(rng, (n + 4, n + 6), dtype), order="F")
        src = src_all[3:n + 3, 2:n + 2]                     # a view with a leading dimension n + 4
        where = cuda_tri_store.address(cupy, dst)
        assert where is not None
        stream, other = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        if split:                       # the band call's way: the kernel on its compute stream, the DMA beside it
            cuda_tri_store.queue_diagonals(cupy, dst, where, src, lower, other, panel=panel)
            cuda_tri_store.queue_off_diagonal(dst, src, lower, stream, panel=panel)
        else:
            cuda_tri_store.queue(cupy, dst, where, src, lower, stream, panel=panel)
        stream.synchronize()
        other.synchronize()
        keep = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
        want = before.copy()
        want[2:n + 2, 1:n + 1] = np.where(keep, cupy.asnumpy(src), before[2:n + 2, 1:n + 1])
        np.testing.assert_array_equal(big, want)
    finally:
        host_pinning.release(pin)
        host_pinning.clear()


def test_no_address_for_memory_that_is_not_page_locked(rng):
    import cupy
    dst = _rand(rng, (64, 64), np.complex128)
    assert cuda_tri_store.address(cupy, dst) is None
    cupy.cuda.runtime.getDeviceCount()                      # no CUDA error left behind for the next call
    cupy.cuda.Device().synchronize()


def test_prepare_kernels_compiles_the_store_for_double_precision(monkeypatch):
    import cupy
    from hybridblas import lowlevel
    monkeypatch.setattr(cuda_tri_store, "_kernels", {})
    lowlevel.prepare_kernels(np.float32, [0]).join()
    assert cuda_tri_store._kernels == {}                    # single precision never takes the band path
    lowlevel.prepare_kernels(np.complex128, [0]).join()
    assert 0 in cuda_tri_store._kernels
    assert cuda_tri_store.prepare(cupy, [0]) is None        # nothing left to do
