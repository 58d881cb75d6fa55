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
    with pytest.raises(ValueError, match="HYBRIDBLAS_PIN_MAX_GB.*'lots'"):
        host_pinning.max_bytes()


def test_context_pin_host_values():
    assert hb.Context("cpu").pin_host == "auto"
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
