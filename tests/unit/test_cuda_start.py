"""hybridblas_cuda_start: which GPUs a tool's command line names, which contexts a process or an MPI rank makes
at start-up, and that a missing or failing driver changes nothing (a stand-in libcuda records the calls)."""
import ctypes

import pytest

import hybridblas_cuda_start as cs


@pytest.mark.parametrize("argv, named", [
    (["spectrum", "--devices", "all"], "every"),
    (["--devices=gpu"], "every"),
    (["--devices", "cuda"], "every"),
    (["--devices", "cpu,gpu"], "every"),
    (["--devices", "0,cuda:1"], (0, 1)),
    (["--devices", " 1 "], (1,)),
    (["--devices", "0", "--devices", "cpu"], None),      # the last one counts, as for argparse
    (["--devices", "cpu"], None),
    ([], None),
    (["--devices"], None),
    (["--devices", "gpu,1"], None),                      # the tool rejects it: no guess
    (["--devices", "tpu"], None),
    (["--devices", "cuda:x"], None),
    (["--devices", "\u0661"], None),                     # a non-ASCII digit is no GPU id
])
def test_named_gpus(argv, named):
    assert cs.named_gpus(argv) == named


@pytest.fixture
def no_mpi(monkeypatch):
    for name in cs.MPI_VARIABLES + cs.LOCAL_RANK_VARIABLES + ("HYBRIDBLAS_MPI",):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_devices_in_one_process(no_mpi):
    assert cs._devices("every", 3, one_per_rank=True) == [0, 1, 2]
    assert cs._devices((2, 0, 5), 3, one_per_rank=False) == [2, 0]        # 5 does not exist: the tool says so


@pytest.mark.parametrize("local, named, count, expected", [
    ("0", "every", 2, [0]), ("1", "every", 2, [1]), ("3", "every", 2, [1]), ("1", (1, 0), 2, [0]),
])
def test_devices_of_an_mpi_rank(no_mpi, local, named, count, expected):
    no_mpi.setenv("PMI_RANK", local)
    no_mpi.setenv("MPI_LOCALRANKID", local)
    assert cs._devices(named, count, one_per_rank=True) == expected


def test_mpi_rank_without_a_known_local_rank_or_rule_makes_no_context(no_mpi):
    no_mpi.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert cs._devices("every", 2, one_per_rank=True) == []               # no local rank in the environment
    no_mpi.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert cs._devices("every", 2, one_per_rank=False) == []              # a tool that spreads GPUs otherwise
    assert cs._devices("every", 2, one_per_rank=True) == [1]


def test_hybridblas_mpi_counts_as_mpi(no_mpi):
    no_mpi.setenv("HYBRIDBLAS_MPI", "1")                                   # a launcher hybridblas does not know
    assert cs._devices("every", 2, one_per_rank=True) == []
    no_mpi.setenv("SLURM_LOCALID", "1")
    assert cs._devices("every", 2, one_per_rank=True) == [1]


class FakeCuda:
    """libcuda.so.1 as ctypes sees it: records the calls; ``modes`` gives each device's compute mode."""

    def __init__(self, count=2, modes=(0, 0), init=0):
        self.count, self.modes, self.init, self.calls = count, modes, init, []

    def cuInit(self, flags):
        self.calls.append(("init",))
        return self.init

    def cuDeviceGetCount(self, out):
        out._obj.value = self.count
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def cuDeviceGetAttribute(self, out, attribute, device):
        assert attribute == cs.COMPUTE_MODE
        out._obj.value = self.modes[device.value]
        return 0

    def cuDevicePrimaryCtxRetain(self, out, device):
        self.calls.append(("retain", device.value))
        return 0


def _with_driver(monkeypatch, fake):
    monkeypatch.setattr(cs.ctypes, "CDLL", lambda name: fake if name == "libcuda.so.1" else pytest.fail(name))


def test_run_retains_the_named_contexts_in_shared_mode_only(no_mpi):
    fake = FakeCuda(count=3, modes=(0, 3, 0))                              # GPU 1: exclusive-process
    _with_driver(no_mpi, fake)
    cs._run("every", one_per_rank=True)
    assert fake.calls == [("init",), ("retain", 0), ("retain", 2)]


def test_run_stops_when_the_driver_does_not_start(no_mpi):
    fake = FakeCuda(init=100)                                              # CUDA_ERROR_NO_DEVICE
    _with_driver(no_mpi, fake)
    cs._run("every", one_per_rank=True)
    assert fake.calls == [("init",)]


def test_run_swallows_a_failing_call(no_mpi):
    fake = FakeCuda()

    def broken(out):
        raise ctypes.ArgumentError("bad argument")
    fake.cuDeviceGetCount = broken
    _with_driver(no_mpi, fake)
    cs._run("every", one_per_rank=True)                                    # no exception, no context
    assert fake.calls == [("init",)]


def test_run_without_a_driver_library_does_nothing(no_mpi):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    no_mpi.setattr(cs.ctypes, "CDLL", missing)
    cs._run("every", one_per_rank=True)                                    # no exception


def test_start_runs_once_and_only_for_gpus(no_mpi):
    fake = FakeCuda()
    _with_driver(no_mpi, fake)
    no_mpi.setattr(cs, "_started", None)
    joins = []
    no_mpi.setattr(cs.atexit, "register", lambda f, *a: joins.append(f))
    assert cs.start(["--devices", "cpu"]) is None
    thread = cs.start(["--devices", "1"])
    thread.join()
    assert fake.calls == [("init",), ("retain", 1)]
    assert joins == [thread.join]                                          # a normal exit waits for it
    assert cs.start(["--devices", "0"]) is None                           # once per process


def test_start_without_a_thread_to_be_had_leaves_cuda_to_the_tool(no_mpi):
    no_mpi.setattr(cs, "_started", None)

    class NoThread:
        def __init__(self, **kw):
            pass

        def start(self):
            raise RuntimeError("can't start new thread")
    no_mpi.setattr(cs.threading, "Thread", NoThread)
    assert cs.start(["--devices", "all"]) is None
    assert cs._started is None


@pytest.mark.parametrize("package, per_rank", [("cisolver", True), ("flapw", False)])
def test_launch_starts_cuda_before_the_tool_loads(monkeypatch, package, per_rank):
    import hybridblas_launcher as launcher
    monkeypatch.delitem(launcher.sys.modules, "mpi4py.MPI", raising=False)   # no MPI exit path in pytest
    seen = []
    monkeypatch.setattr(cs, "start", lambda argv, one_per_rank=False: seen.append((list(argv), one_per_rank)))
    monkeypatch.setattr(launcher.sys, "argv", [package, "build", "--devices", "all"])

    class Tool:
        @staticmethod
        def main():
            assert seen, "the tool loaded before CUDA's start-up began"
            return 0
    monkeypatch.setattr(launcher.importlib, "import_module", lambda name: Tool)
    assert launcher.launch(package) == 0
    assert seen == [(["build", "--devices", "all"], per_rank)]


class ContextState(FakeCuda):
    """The stand-in driver with primary-context states: ``active`` lists the ordinals whose context is active."""

    def __init__(self, active, **kw):
        super().__init__(**kw)
        self.active = active

    def cuDevicePrimaryCtxGetState(self, device, flags, on):
        on._obj.value = int(device.value in self.active)
        return 0


@pytest.mark.parametrize("fake, expected", [
    (ContextState([1]), [1]), (ContextState([0, 1]), [0, 1]), (ContextState([]), []),
    (ContextState([0], init=100), []),                      # CUDA_ERROR_NO_DEVICE: no GPU, no context
])
def test_gpus_with_contexts_reads_the_drivers_state(monkeypatch, fake, expected):
    from hybridblas import testing
    monkeypatch.setattr(testing.ctypes, "CDLL", lambda name: fake if name == "libcuda.so.1" else pytest.fail(name))
    assert testing.gpus_with_contexts() == expected


def test_gpus_with_contexts_without_a_driver(monkeypatch):
    from hybridblas import testing

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(testing.ctypes, "CDLL", missing)
    assert testing.gpus_with_contexts() == []
