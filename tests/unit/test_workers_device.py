"""hybridblas.workers hands the submitter's current CUDA device to its jobs (a stand-in CuPy that keeps a
device and a context per thread): a job's device switch then returns to the submitter's device, never to the
runtime's default device 0, whose context a run on other GPUs must not make."""
import threading
import types

import pytest

from hybridblas import workers


class StandIn:
    """CuPy's runtime and driver as workers use them: a current device per thread, a context once it is set;
    ``cuda.Device(i).use()`` as well, failing for a GPU beyond ``count``."""

    def __init__(self, count=2):
        self.local, self.made, self.count = threading.local(), [], count
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=self.get, setDevice=self.set),
                                          driver=types.SimpleNamespace(ctxGetCurrent=self.context),
                                          Device=self.device)

    def device(self, index):
        def use():
            if index >= self.count:
                raise RuntimeError(f"cudaErrorInvalidDevice: {index}")
            self.set(index)
        return types.SimpleNamespace(use=use)

    def get(self):
        return getattr(self.local, "device", 0)

    def set(self, device):
        self.local.device = device
        self.made.append(device)           # CUDA 12's cudaSetDevice makes the device's primary context

    def context(self):
        return 0x1000 + self.local.device if hasattr(self.local, "device") else 0

    def switch_and_back(self, device):
        """What ``with cupy.cuda.Device(device):`` does around a job's GPU work."""
        before = self.get()
        if before != device:
            self.set(device)
        try:
            return self.get()
        finally:
            if before != device:
                self.set(before)


@pytest.fixture
def cupy(monkeypatch):
    fake = StandIn()
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    return fake


def test_a_job_runs_on_the_submitters_device(cupy):
    cupy.set(1)
    assert workers.current_device() == 1
    assert workers.start(cupy.get).result() == 1
    assert workers.start(cupy.switch_and_back, 1).result() == 1
    assert workers.map(lambda _: cupy.get(), range(6), 3) == [1] * 6
    group = workers.Group(2)
    try:
        assert group.map(lambda d: cupy.switch_and_back(d), [1, 1, 1]) == [1, 1, 1]
    finally:
        group.close()
    assert 0 not in cupy.made, cupy.made              # no thread ever went to device 0


def test_a_submitter_without_a_context_leaves_the_device_alone(cupy):
    assert workers.current_device() is None
    made = len(cupy.made)
    workers.start(lambda: None).result()
    assert cupy.made[made:] == []


def test_without_cupy_nothing_is_asked(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "cupy", raising=False)
    assert workers.current_device() is None
    assert workers.start(lambda: 7).result() == 7


def test_a_stand_in_without_a_driver_hands_on_nothing(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", types.SimpleNamespace())
    assert workers.current_device() is None
