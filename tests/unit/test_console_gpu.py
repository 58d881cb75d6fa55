"""console.use_first_gpu and console.gpu_kept (a stand-in CuPy that keeps a device and a context per thread):
a tool's run on GPU 1 starts on GPU 1, so its device switches come back there and never make device 0's
context; a caller that had a GPU current gets it back, a caller that had none is not switched to device 0."""
import types

import pytest

from hybridblas import console
from test_workers_device import StandIn


class WithDevice(StandIn):
    """The stand-in with ``cupy.cuda.Device(i).use()``, failing for a GPU that is not there."""

    def __init__(self, count=2):
        super().__init__()
        self.count = count
        self.cuda.Device = self.device

    def device(self, index):
        def use():
            if index >= self.count:
                raise RuntimeError(f"cudaErrorInvalidDevice: {index}")
            self.set(index)
        return types.SimpleNamespace(use=use)


@pytest.fixture
def cupy(monkeypatch):
    fake = WithDevice()
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    return fake


def test_the_first_gpu_is_current_and_switches_come_back_to_it(cupy):
    console.use_first_gpu([1, 0])
    assert cupy.get() == 1
    assert cupy.switch_and_back(1) == 1 and cupy.switch_and_back(0) == 0
    assert cupy.get() == 1                              # back on GPU 1, not on device 0
    assert cupy.made == [1, 0, 1]


def test_a_thread_with_a_current_gpu_keeps_it(cupy):
    cupy.set(0)                                          # the caller works on GPU 0: its switches come back there
    console.use_first_gpu([1])
    assert cupy.get() == 0 and cupy.made == [0]


def test_no_gpu_or_a_missing_one_changes_nothing(cupy):
    console.use_first_gpu([])
    console.use_first_gpu(())
    console.use_first_gpu([5])                           # not there: the tool's own check reports it
    assert cupy.made == []


def test_a_caller_with_a_gpu_gets_it_back(cupy):
    cupy.set(0)
    with console.gpu_kept():
        cupy.set(1)                                      # the run made its GPU current
    assert cupy.get() == 0


def test_a_caller_without_a_gpu_is_not_switched_to_device_0(cupy):
    with console.gpu_kept():
        console.use_first_gpu([1])
    assert cupy.made == [1]                              # no switch to 0: that would make device 0's context


def test_without_cupy_nothing_happens(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", None)
    console.use_first_gpu([0])
    with console.gpu_kept() as kept:
        assert kept.before is None
