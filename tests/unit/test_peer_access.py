"""Peer access between GPUs (devices.cuda.peer_access), shared by the tiled and the band runs: the runtime is asked
once per pair and process, also by callers racing on several threads, and a pair that cannot is remembered as
such. CPU only: a stand-in for CuPy's runtime counts the calls."""
import threading
import time
from types import SimpleNamespace

import pytest

from hybridblas.devices import cuda


class _Runtime:
    class CUDARuntimeError(RuntimeError):
        pass

    def __init__(self, reachable, enabled=()):
        self.reachable, self.enabled = set(reachable), set(enabled)
        self.asked, self.enables, self.current = [], [], None

    def deviceCanAccessPeer(self, a, b):
        self.asked.append((a, b))
        time.sleep(0.001)                 # a slow query: racing threads overlap here
        return int((a, b) in self.reachable)

    def deviceEnablePeerAccess(self, b):
        self.enables.append((self.current, b))
        if (self.current, b) in self.enabled:
            raise self.CUDARuntimeError("cudaErrorPeerAccessAlreadyEnabled")
        self.enabled.add((self.current, b))


def _cupy(rt):
    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            self.saved, rt.current = rt.current, self.index

        def __exit__(self, *exc):
            rt.current = self.saved
    return SimpleNamespace(cuda=SimpleNamespace(runtime=rt, Device=Device))


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(cuda, "_peers", {})


def test_each_pair_is_asked_and_enabled_once_with_its_own_device_current(fresh):
    rt = _Runtime(reachable={(0, 1), (1, 0)})
    cp = _cupy(rt)
    for _ in range(3):
        assert cuda.peer_access(cp, 0, 1) and cuda.peer_access(cp, 1, 0)
    assert sorted(rt.asked) == [(0, 1), (1, 0)]
    assert sorted(rt.enables) == [(0, 1), (1, 0)]      # enabled from the reading GPU
    assert rt.current is None                          # the caller's current device is restored


def test_a_pair_without_peer_access_is_remembered_and_never_enabled(fresh):
    rt = _Runtime(reachable={(0, 1)})
    cp = _cupy(rt)
    assert cuda.peer_access(cp, 0, 1)
    assert not cuda.peer_access(cp, 1, 0)
    assert not cuda.peer_access(cp, 1, 0)
    assert rt.asked.count((1, 0)) == 1 and (1, 0) not in rt.enables


def test_access_enabled_before_is_taken_as_enabled(fresh):
    rt = _Runtime(reachable={(0, 1)}, enabled={(0, 1)})     # CuPy's own peer copies enabled it already
    assert cuda.peer_access(_cupy(rt), 0, 1)
    assert rt.enables == [(0, 1)]


def test_racing_callers_enable_each_pair_once(fresh):
    rt = _Runtime(reachable={(a, b) for a in range(3) for b in range(3) if a != b})
    cp = _cupy(rt)
    results, start = [], threading.Barrier(8)

    def call():
        start.wait()
        results.append(all(cuda.peer_access(cp, a, b) for a in range(3) for b in range(3) if a != b))
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 8
    assert sorted(rt.enables) == sorted(rt.reachable) and len(rt.asked) == 6
