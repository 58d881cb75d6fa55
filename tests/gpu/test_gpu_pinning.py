"""hybridblas.host_pinning on a GPU: memory it page-locked is copied by CuPy straight from where it lies and
asynchronously (cupy.asarray returns before the copy lands); every way the lock is undone (clear, eviction under
the cap, numpy freeing the array) lets such a copy land first. A copy from memory unregistered under it faults,
and the fault ends the process's CUDA context. Each test checks the copy's values and that CUDA still works."""
import gc

import numpy as np
import pytest

from hybridblas import host_pinning

pytestmark = pytest.mark.gpu

SIZE = 1 << 26             # complex128 entries: 1 GiB, a copy of some 20 ms at PCIe 5.0 rates


def _locked(rng):
    x = np.empty(SIZE, np.complex128)
    x.real = rng.standard_normal(SIZE)
    x.imag = np.arange(SIZE, dtype=np.float64)
    pin = host_pinning.acquire(x, min_bytes=0)
    host_pinning.wait_ready()
    assert host_pinning.is_ready(pin)
    return x, pin


def _still_works(cupy, gpu):
    with cupy.cuda.Device(gpu):
        assert float(cupy.arange(4.0).sum()) == 6.0
        cupy.cuda.Device().synchronize()


@pytest.fixture(params=[0, 1])
def gpu(request):
    import cupy
    if request.param >= cupy.cuda.runtime.getDeviceCount():
        pytest.skip(f"no GPU {request.param}")
    host_pinning.clear()
    yield request.param
    host_pinning.clear()


def test_clear_lets_a_copy_from_locked_memory_land(gpu, rng):
    import cupy
    x, pin = _locked(rng)
    host_pinning.release(pin)
    with cupy.cuda.Device(gpu):
        y = cupy.asarray(x)                 # queued from the locked memory itself
        host_pinning.clear()
        np.testing.assert_array_equal(cupy.asnumpy(y), x)
    _still_works(cupy, gpu)


def test_freeing_a_locked_array_lets_its_copy_land(gpu, rng):
    import cupy
    x, pin = _locked(rng)
    host_pinning.release(pin)
    want = x.copy()
    with cupy.cuda.Device(gpu):
        y = cupy.asarray(x)
        del x                               # its finalizer unlocks the memory, then numpy frees it
        gc.collect()
        np.testing.assert_array_equal(cupy.asnumpy(y), want)
    _still_works(cupy, gpu)


def test_eviction_under_the_cap_lets_a_copy_land(gpu, rng, monkeypatch):
    import cupy
    x, pin = _locked(rng)
    host_pinning.release(pin)
    other = np.ones(SIZE // 4, np.complex128)
    monkeypatch.setattr(host_pinning, "max_bytes", lambda: x.nbytes)      # room for one of them only
    with cupy.cuda.Device(gpu):
        y = cupy.asarray(x)
        second = host_pinning.acquire(other, min_bytes=0)           # evicts x's lock
        assert not host_pinning.is_ready(pin)
        np.testing.assert_array_equal(cupy.asnumpy(y), x)
    host_pinning.wait_ready()
    host_pinning.release(second)
    _still_works(cupy, gpu)
