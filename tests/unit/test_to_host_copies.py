"""hybridblas.lowlevel.to_host's copy plan, run on the CPU: a stand-in for the few CuPy calls it makes (device
arrays in host memory, memcpy2DAsync as row-by-row memmoves, page-locked buffers as ctypes arrays, a
cudaHostRegister that succeeds) checks every panel, pitch and triangle of both routes (straight into a
page-locked target, and through the two staging buffers) against numpy, with the target poisoned outside what
may be written. The GPU test (tests/gpu/test_gpu_to_host.py) runs the same on CuPy."""
import ctypes
import itertools
import sys
import types

import numpy as np
import pytest

from hybridblas import downloads, host_pinning, lowlevel


class _Device:
    def __init__(self, index=0):
        self.id = index


class _Memory:
    def __init__(self, ptr):
        self.ptr = ptr


class _DeviceArray:
    """A 'GPU' array: numpy memory behind CuPy's attributes."""

    def __init__(self, a):
        self._a = a
        self.device = _Device()

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    T = property(lambda self: _DeviceArray(self._a.T))
    data = property(lambda self: _Memory(self._a.ctypes.data))

    def __getitem__(self, key):
        return _DeviceArray(self._a[key])

    def get(self, *args, **kwargs):
        raise AssertionError("to_host must not copy through ndarray.get (a GPU temporary)")


_DeviceArray.__module__ = "cupy"


def _fake_cupy(log):
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.SimpleNamespace(memcpyDeviceToHost=2)

    def memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind == runtime.memcpyDeviceToHost and width <= dpitch and width <= spitch
        log.append(("dma", width, height))
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)
    runtime.memcpy2DAsync = memcpy2d
    runtime.getDeviceCount = lambda: 1
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: log.append(("sync",)))
    cuda.runtime = runtime
    cuda.get_current_stream = lambda: stream
    cuda.Device = lambda index=None: types.SimpleNamespace(id=0)
    cuda.Event = lambda disable_timing=False: types.SimpleNamespace(record=lambda s=None: None,
                                                                  synchronize=lambda: None)
    cuda.alloc_pinned_memory = lambda n: log.append(("staging", n)) or (ctypes.c_char * n)()
    cupy.cuda = cuda
    cupy.ndarray = _DeviceArray
    return cupy


class _Runtime:
    def cudaHostRegister(self, ptr, n, flags):
        return 0

    def cudaHostUnregister(self, ptr):
        return 0

    def cudaGetLastError(self):
        return 0


@pytest.fixture
def fake_gpu(monkeypatch):
    log = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(log))
    monkeypatch.setattr(host_pinning, "_cudart", _Runtime())
    yield log
    host_pinning.clear()


def _want(src, before, lower):
    if lower is None:
        return src
    keep = np.tril(np.ones(src.shape, bool)) if lower else np.triu(np.ones(src.shape, bool))
    return np.where(keep, src, before)


@pytest.mark.parametrize("route", ["dma", "staged"])
def test_every_layout_and_triangle_lands_and_nothing_else(fake_gpu, route, monkeypatch, rng):
    """Square and wide/tall blocks, both memory orders, views inside larger host and device buffers, panels
    and staging buffers smaller than the matrix: dst equals src where asked and its poison elsewhere."""
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0 if route == "dma" else 1 << 40)
    monkeypatch.setattr(downloads, "PANEL", 7)
    monkeypatch.setattr(downloads, "STAGE_BYTES", 200)
    for (n, m), order, lower, dtype in itertools.product([(1, 1), (8, 8), (30, 30), (13, 5), (5, 13)], "FC",
                                                          [None, True, False], [np.float64, np.complex64]):
        if lower is not None and n != m:
            continue
        src = np.asarray(rng.standard_normal((n, m)), dtype=dtype, order=order)
        device = np.full((n + 3, m + 4), 5, dtype=dtype, order=order)
        device[1:1 + n, 2:2 + m] = src
        host = np.full((n + 5, m + 9), -7, dtype=dtype, order=order)
        before = host.copy()
        got = lowlevel.to_host(host[3:3 + n, 4:4 + m], _DeviceArray(device)[1:1 + n, 2:2 + m], lower=lower)
        assert np.shares_memory(got, host)
        want = before.copy()
        want[3:3 + n, 4:4 + m] = _want(src, before[3:3 + n, 4:4 + m], lower)
        np.testing.assert_array_equal(host, want, err_msg=f"{route} {n}x{m} {order} lower={lower} {dtype}")
    assert ("sync",) in fake_gpu


def test_row_major_columns_and_rows_are_accepted(fake_gpu):
    """A column of a row-major device matrix into a C-ordered host column (both row-major) and a row of a
    column-major one into an F-ordered host row."""
    device = np.arange(12.0).reshape(4, 3)
    col = np.zeros((4, 1))
    lowlevel.to_host(col, _DeviceArray(device)[:, :1])
    np.testing.assert_array_equal(col.ravel(), [0, 3, 6, 9])
    row = np.zeros((1, 4), order="F")
    lowlevel.to_host(row, _DeviceArray(np.asfortranarray(device)).T[:1, :])
    np.testing.assert_array_equal(row.ravel(), [0, 3, 6, 9])


def test_large_targets_go_straight_into_place_small_ones_through_two_buffers(fake_gpu, monkeypatch, rng):
    """A page-locked target is written by DMA (no staging buffer for a whole copy); one that is not goes
    through two buffers of at most STAGE_BYTES."""
    src = rng.standard_normal((64, 64))
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    dst = np.zeros((64, 64))
    lowlevel.to_host(dst, _DeviceArray(src))
    assert not [e for e in fake_gpu if e[0] == "staging"]
    np.testing.assert_array_equal(dst, src)
    fake_gpu.clear()
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 1 << 40)
    monkeypatch.setattr(downloads, "STAGE_BYTES", 64 * 8 * 10)
    dst = np.zeros((64, 64))
    lowlevel.to_host(dst, _DeviceArray(src))
    staging = [e[1] for e in fake_gpu if e[0] == "staging"]
    assert len(staging) == 2 and max(staging) <= downloads.STAGE_BYTES
    np.testing.assert_array_equal(dst, src)


def test_pin_host_off_leaves_targets_unlocked(fake_gpu, monkeypatch, rng):
    """$HYBRIDBLAS_PIN_HOST=off: to_host copies through the staging buffers and locks nothing, and
    memory.page_lock declines."""
    from hybridblas import memory
    monkeypatch.setenv("HYBRIDBLAS_PIN_HOST", "off")
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    src = rng.standard_normal((40, 40))
    dst = np.zeros((40, 40))
    lowlevel.to_host(dst, _DeviceArray(src), lower=True)
    np.testing.assert_array_equal(dst, np.tril(src))
    assert host_pinning.pinned_bytes() == 0 and [e for e in fake_gpu if e[0] == "staging"]
    assert memory.page_lock(dst) is False and host_pinning.pinned_bytes() == 0
    monkeypatch.setenv("HYBRIDBLAS_PIN_HOST", "auto")
    assert memory.page_lock(dst) is True and host_pinning.pinned_bytes() >= dst.nbytes


def test_a_queued_copy_lands_when_waited_for(fake_gpu, monkeypatch, rng):
    """wait=False: the panels' DMA is queued at once and the diagonal blocks' triangles are put in place by
    wait(); then dst equals src's triangle and its poison elsewhere; a second wait() does nothing. The pageable
    route copies inside wait()."""
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    monkeypatch.setattr(downloads, "PANEL", 8)
    n = 29
    src = rng.standard_normal((n, n))
    dst = np.full((n, n), -3.0, order="F")
    pending = lowlevel.to_host(dst, _DeviceArray(np.asfortranarray(src)), lower=True, wait=False)
    diagonal = np.zeros((n, n), bool)
    for c0 in range(0, n, 8):
        diagonal[c0:c0 + 8, c0:c0 + 8] = True
    assert (dst[diagonal] == -3.0).all()                       # not yet: the host's part runs in wait()
    assert ("sync",) not in fake_gpu
    assert [e[1] % downloads.BLOCKS_GRAIN for e in fake_gpu if e[0] == "staging"] == [0]    # one buffer, whole grains
    pending.wait()
    np.testing.assert_array_equal(dst, np.where(np.tril(np.ones((n, n), bool)), src, -3.0))
    assert ("sync",) in fake_gpu
    pending.wait()
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 1 << 40)
    dst = np.full((n, n), -3.0, order="F")
    pending = lowlevel.to_host(dst, _DeviceArray(np.asfortranarray(src)), wait=False)
    assert (dst == -3.0).all()
    pending.wait()
    np.testing.assert_array_equal(dst, src)
    with pytest.raises(TypeError, match=r"wait must be True or False, got str 'no'"):
        lowlevel.to_host(dst, _DeviceArray(np.asfortranarray(src)), wait="no")


def test_a_queued_copy_dropped_unwaited_is_finished_by_its_finalizer(fake_gpu, monkeypatch, rng):
    """A handle dropped without wait(): its finalizer finishes the copy (the stream waited for, the diagonal blocks
    in place), so no DMA outlives the buffers it writes."""
    import gc
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    monkeypatch.setattr(downloads, "PANEL", 8)
    src = rng.standard_normal((20, 20))
    dst = np.full((20, 20), -3.0, order="F")
    pending = lowlevel.to_host(dst, _DeviceArray(np.asfortranarray(src)), lower=True, wait=False)
    del pending
    gc.collect()
    assert ("sync",) in fake_gpu
    np.testing.assert_array_equal(dst, np.where(np.tril(np.ones((20, 20), bool)), src, -3.0))
