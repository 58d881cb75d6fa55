"""Host pinning bookkeeping that needs no GPU: which arrays may be registered, and bad settings."""
import numpy as np
import pytest

import hybridblas as hb
from hybridblas import host_pinning


def test_owner_walks_views_to_the_array_that_owns_the_memory():
    a = np.zeros((8, 6))
    assert host_pinning._owner(a) is a
    assert host_pinning._owner(a[2:, ::2].T) is a
    foreign = np.frombuffer(bytearray(64), dtype=np.float64)
    assert host_pinning._owner(foreign) is None          # not numpy's memory: never registered
    assert host_pinning._owner([1.0, 2.0]) is None


def test_small_or_foreign_operands_are_left_to_the_staging_path():
    assert host_pinning.acquire(np.zeros(16)) is None     # under the threshold: no CUDA call at all
    assert host_pinning.acquire(np.frombuffer(bytearray(1 << 10), dtype=np.uint8), min_bytes=0) is None
    host_pinning.release(None)


def test_pin_cap_from_the_environment(monkeypatch):
    monkeypatch.setenv(host_pinning.ENV_MAX_GB, "12.5")
    assert host_pinning.max_bytes() == int(12.5e9)
    monkeypatch.setenv(host_pinning.ENV_MAX_GB, "lots")
    with pytest.raises(ValueError, match="HYBRIDBLAS_PIN_MAX_GB must be a number, got 'lots'"):
        host_pinning.max_bytes()


def test_context_pin_host_values(monkeypatch):
    monkeypatch.delenv("HYBRIDBLAS_PIN_HOST", raising=False)
    assert hb.Context("cpu").pin_host == "auto"
    monkeypatch.setenv("HYBRIDBLAS_PIN_HOST", "off")
    assert hb.Context("cpu").pin_host is False
    assert hb.Context("cpu", pin_host=True).pin_host is True      # the argument wins
    monkeypatch.setenv("HYBRIDBLAS_PIN_HOST", "sometimes")
    with pytest.raises(ValueError, match="HYBRIDBLAS_PIN_HOST.*'sometimes'"):
        hb.Context("cpu")
    monkeypatch.delenv("HYBRIDBLAS_PIN_HOST")
    assert hb.Context("cpu", pin_host=False).pin_host is False
    with pytest.raises(ValueError, match="pin_host.*'yes'"):
        hb.Context("cpu", pin_host="yes")


def test_auto_policy_counts_calls_not_gpus_and_forgets_freed_arrays():
    host_pinning.clear()
    a = np.ones((64, 64))
    call_1, call_2 = object(), object()
    # two GPUs of one call: one sighting; no registration yet under "auto" (after_uses=1)
    assert host_pinning.acquire(a, min_bytes=0, after_uses=1, call=call_1) is None
    assert host_pinning.acquire(a[:8], min_bytes=0, after_uses=1, call=call_1) is None
    assert host_pinning.times_seen(a) == 1
    host_pinning.acquire(a, min_bytes=0, after_uses=1, call=call_2)   # registers where CUDA exists
    assert host_pinning.times_seen(a) == 2
    host_pinning.clear()
    assert host_pinning.times_seen(a) == 0
    b = np.ones((64, 64))
    host_pinning.acquire(b, min_bytes=0, after_uses=5, call=call_1)
    assert host_pinning.times_seen(b) == 1
    ptr = b.ctypes.data
    del b
    assert ptr not in host_pinning._seen          # forgotten with the array


def test_small_or_foreign_operands_are_never_counted():
    host_pinning.clear()
    small = np.ones(8)
    assert host_pinning.acquire(small, after_uses=0) is None
    assert host_pinning.times_seen(small) == 0


class _FakeCudart:
    """Stands in for libcudart: records register/unregister calls, answers with a chosen status."""

    def __init__(self, status=0):
        self.status, self.registered, self.unregistered = status, [], []

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.registered.append((ptr, nbytes))
        return self.status

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0

    def cudaGetLastError(self):
        return 0


@pytest.fixture
def fake_cudart(monkeypatch):
    host_pinning.clear()
    fake = _FakeCudart()
    monkeypatch.setattr(host_pinning, "cudart", lambda: fake)
    yield fake
    host_pinning.clear()


def test_locked_until_the_array_is_freed(fake_cudart):
    a = np.ones((128, 64))
    pin = host_pinning.acquire(a[3:], min_bytes=0)       # a view: its owner is locked
    host_pinning.wait_ready()
    assert host_pinning.is_ready(pin) and fake_cudart.registered == [(a.ctypes.data, a.nbytes)]
    assert host_pinning.pinned_bytes() == a.nbytes
    host_pinning.release(pin)
    again = host_pinning.acquire(a, min_bytes=0)         # the same owner: no second registration
    assert again is pin and len(fake_cudart.registered) == 1
    host_pinning.release(again)
    ptr = a.ctypes.data
    del a, pin, again
    assert fake_cudart.unregistered == [ptr] and host_pinning.pinned_bytes() == 0


def test_only_the_first_caller_after_the_lock_hears_it_is_the_first_dma(fake_cudart):
    a = np.ones((128, 64))
    pin = host_pinning.acquire(a, min_bytes=0)
    assert host_pinning.first_direct_use(None) is False
    host_pinning.wait_ready()
    assert [host_pinning.first_direct_use(pin) for _ in range(3)] == [True, False, False]
    same = host_pinning.acquire(a[5:], min_bytes=0)       # the same memory, another call: not the first any more
    assert same is pin and host_pinning.first_direct_use(same) is False
    host_pinning.release(pin)
    host_pinning.release(same)


def test_failed_registration_leaves_the_operand_staged(fake_cudart):
    fake_cudart.status = 2                               # cudaErrorMemoryAllocation
    a = np.ones((64, 64))
    pin = host_pinning.acquire(a, min_bytes=0)
    host_pinning.wait_ready(timeout=10)                  # returns: the registration has ended
    assert not host_pinning.is_ready(pin) and host_pinning.pinned_bytes() == 0
    host_pinning.release(pin)
    del a
    assert fake_cudart.unregistered == []                # nothing of ours to undo


def test_an_array_freed_by_a_collection_under_the_lock_does_not_hang(fake_cudart):
    """A garbage collection set off by an allocation while the lock is held frees pinned and counted operands
    in a cycle: their finalizers run in that thread and take the lock again."""
    import gc
    import threading
    pinned, seen = np.ones((64, 64)), np.ones((32, 32))
    host_pinning.acquire(pinned, min_bytes=0)
    host_pinning.wait_ready()
    host_pinning.acquire(seen, min_bytes=0, after_uses=5, call=object())
    ptrs = pinned.ctypes.data, seen.ctypes.data
    cycle = [pinned, seen]
    cycle.append(cycle)                                  # freed only by the collector
    del pinned, seen, cycle

    def collect():
        with host_pinning._lock:
            gc.collect()
    worker = threading.Thread(target=collect, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "a finalizer waits for the lock its own thread holds"
    assert fake_cudart.unregistered == [ptrs[0]]
    assert ptrs[0] not in host_pinning._pins and ptrs[1] not in host_pinning._seen


def test_cap_evicts_idle_pins_first(fake_cudart, monkeypatch):
    a, b = np.ones((64, 64)), np.ones((64, 64))
    monkeypatch.setenv(host_pinning.ENV_MAX_GB, str(1.5 * a.nbytes / 1e9))   # room for one
    pa = host_pinning.acquire(a, min_bytes=0)
    host_pinning.wait_ready()
    assert host_pinning.acquire(b, min_bytes=0) is None  # a is in use: no room for b
    host_pinning.release(pa)
    pb = host_pinning.acquire(b, min_bytes=0)            # a is idle now: it makes room
    host_pinning.wait_ready()
    assert host_pinning.is_ready(pb) and fake_cudart.unregistered == [a.ctypes.data]
    host_pinning.release(pb)


def test_copy_threads_from_the_environment(monkeypatch):
    from hybridblas import cuda_transfer
    monkeypatch.setenv("HYBRIDBLAS_COPY_THREADS", "3")
    assert cuda_transfer.copy_threads() == 3
    for bad, why in (("0", "an integer >= 1, got '0'"), ("many", "an integer, got 'many'")):
        monkeypatch.setenv("HYBRIDBLAS_COPY_THREADS", bad)
        with pytest.raises(ValueError, match=f"HYBRIDBLAS_COPY_THREADS must be {why}"):
            cuda_transfer.copy_threads()
    monkeypatch.delenv("HYBRIDBLAS_COPY_THREADS")
    assert 2 <= cuda_transfer.copy_threads() <= cuda_transfer.MAX_COPY_THREADS


class _LoggingCudart:
    def __init__(self, log):
        self.log = log

    def cudaHostUnregister(self, ptr):
        self.log.append(("unregister", ptr))
        return 0

    def cudaGetLastError(self):
        return 0


def test_memory_is_unlocked_only_after_the_gpus_finished_their_queued_work(monkeypatch):
    """A copy queued from page-locked memory (cupy.asarray copies it asynchronously) must land before the memory is
    unregistered: every way a lock of ours is undone (clear, eviction under the cap, numpy freeing the array)
    waits for the GPUs first; a lock that is someone else's, or not in place yet, is left alone."""
    log = []
    monkeypatch.setattr(host_pinning, "cudart", lambda: _LoggingCudart(log))
    monkeypatch.setattr(host_pinning, "quiesce", lambda: log.append("quiesce"))
    monkeypatch.setattr(host_pinning, "_pins", {})

    def locked(ptr, ours=True, ready=True, users=0):
        pin = host_pinning._Pin(ptr, 1 << 20)
        pin.ours, pin.users = ours, users
        if ready:
            pin.ready.set()
        pin.done.set()
        host_pinning._pins[ptr] = pin
        return pin

    locked(0x1000)
    locked(0x2000, ours=False)
    locked(0x3000, ready=False)
    locked(0x4000, users=1)                          # in use by a call: clear() keeps it
    host_pinning.clear()
    assert log == ["quiesce", ("unregister", 0x1000)]
    assert set(host_pinning._pins) == {0x4000}
    log.clear()
    host_pinning._freed(0x4000)                      # numpy frees it
    assert log == ["quiesce", ("unregister", 0x4000)] and not host_pinning._pins
    log.clear()
    pin = locked(0x5000)
    pin.last = 0.0
    monkeypatch.setattr(host_pinning, "max_bytes", lambda: 1 << 20)
    assert host_pinning._make_room(1 << 20)          # evicted to make room
    assert log == ["quiesce", ("unregister", 0x5000)]


def test_quiesce_waits_on_the_gpus_that_have_a_context_only(monkeypatch):
    from types import SimpleNamespace

    from hybridblas import testing
    synced, current = [], []

    class Device:
        def __init__(self, index):
            current.append(index)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def synchronize():
        if current[-1] == 2:
            raise RuntimeError("cudaErrorLaunchFailure")     # a GPU in an error state: passed over
        synced.append(current[-1])

    fake = SimpleNamespace(cuda=SimpleNamespace(Device=Device, runtime=SimpleNamespace(deviceSynchronize=synchronize)))
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    monkeypatch.setattr(testing, "gpus_with_contexts", lambda: [0, 2, 3])
    host_pinning.quiesce()
    assert synced == [0, 3]
    monkeypatch.setattr(testing, "gpus_with_contexts", lambda: [])
    host_pinning.quiesce()
    assert synced == [0, 3]
