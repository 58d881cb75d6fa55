"""console.use_first_gpu and console.gpu_kept (a stand-in CuPy that keeps a device and a context per thread):
a tool's run on GPU 1 starts on GPU 1, so its device switches come back there and never make device 0's
context; a caller that had a GPU current gets it back, a caller that had none is not switched to device 0."""
from hybridblas import console
from test_workers_device import cupy  # noqa: F401  (the fixture: a stand-in CuPy with a device per thread)


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
