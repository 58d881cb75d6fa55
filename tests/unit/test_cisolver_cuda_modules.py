"""cisolver.cuda_modules on the CPU: the one CUDA module's source (deterministic, every kernel listed, every
section's macros undefined after it, following the families' constants) and its compilation once per device
and dtype, also from a background thread, against a stand-in for CuPy."""
import re
import threading

import numpy as np
import pytest

from cisolver import cuda_modules, row_kernels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_module_source_is_deterministic_and_lists_every_kernel(dtype):
    code, names = cuda_modules.source(dtype)
    assert cuda_modules.source(dtype) == (code, names)
    assert len(set(names)) == len(names)
    for name in names:                           # each listed kernel is an extern "C" entry point of the text
        direct = re.search(rf'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?{name}\(', code)
        expanded = re.match(r"(\w+)_(\d+)$", name)
        macro = expanded and re.search(rf"^(ROW|STAGED)_KERNELS\({expanded.group(2)}\)$", code, re.M)
        assert direct or macro, name
    for kernel in ("ortho_factor", "rr_prepare", "rr_finish", "gram_partials", "gram_total", "residual_sumsq",
                   "full_rows", "row_flags", "full_row_counts", "raised_squares", "column_squares"):
        assert kernel in names
    for q in row_kernels.QMAX_CHOICES:
        assert f"rows_times_small_{q}" in names and f"update_residual_{q}" in names
        assert (f"staged_update_{q}" in names) == (np.dtype(dtype) == np.float64)   # float32 takes no staged kernel
    assert f"typedef {'float' if np.dtype(dtype) == np.float32 else 'double'} T;" in code


def test_module_sections_undefine_their_macros():
    code, _ = cuda_modules.source(np.float64)
    sections = code.split("// ---- cisolver.")[1:]
    assert [s.split(" ", 1)[0] for s in sections] == [name for name, _ in cuda_modules.FAMILIES]
    for text in sections:
        defined = set(re.findall(r"^\s*#define\s+(\w+)", text, re.M))
        undefined = set(re.findall(r"^#undef (\w+)$", text, re.M))
        assert defined <= undefined, text.split("\n", 1)[0]
    assert "#undef STAGE_ROWS\n" in code and "#undef CHUNK\n" in code and "#undef ASYNC_WAIT\n" in code


def test_module_source_follows_the_families_constants(monkeypatch):
    code, _ = cuda_modules.source(np.float64)
    monkeypatch.setattr(row_kernels, "STAGE_ROWS", 16)
    changed, _ = cuda_modules.source(np.float64)
    assert "#define STAGE_ROWS 16\n" in changed and "#define STAGE_ROWS 48\n" in code and changed != code


def test_module_refuses_other_dtypes():
    with pytest.raises(TypeError, match="float32 or float64, got int32"):
        cuda_modules.source(np.int32)


class _FakeCupy:
    """What cuda_modules uses of CuPy: RawModule (counting compilations), the current device, Device()."""

    def __init__(self, fail=False, delay=None):
        fake = self
        self.compiled, self.fail, self.delay = [], fail, delay
        self.local = threading.local()

        class RawModule:
            def __init__(self, code, options):
                self.code, self.loaded = code, None

            def get_function(self, name):
                if self.loaded is None:
                    if fake.delay is not None:
                        fake.delay.wait(5)
                    if fake.fail:
                        raise RuntimeError("NVRTC failed")
                    self.loaded = fake.current()
                    fake.compiled.append((self.loaded, self.code))
                return (self.loaded, name)

        class Device:
            def __init__(self, i):
                self.i = i

            def __enter__(self):
                self.prev, fake.local.device = fake.current(), self.i

            def __exit__(self, *exc):
                fake.local.device = self.prev

        class runtime:
            getDevice = staticmethod(lambda: fake.current())

        class cuda:
            pass
        cuda.runtime, cuda.Device = runtime, Device
        self.RawModule, self.cuda = RawModule, cuda

    def current(self):
        return getattr(self.local, "device", 0)


@pytest.fixture
def fresh_modules(monkeypatch):
    for name in ("_modules", "_pending", "_failed", "_functions"):
        monkeypatch.setattr(cuda_modules, name, {})


def test_function_compiles_once_per_device_and_dtype(fresh_modules, monkeypatch):
    cp = _FakeCupy()
    a = cuda_modules.function(cp, np.float32, "rows_times_small_8")
    b = cuda_modules.function(cp, np.float32, "ortho_factor")
    assert a == (0, "rows_times_small_8") and b == (0, "ortho_factor") and len(cp.compiled) == 1
    cuda_modules.function(cp, np.float64, "ortho_factor")
    with cp.cuda.Device(1):
        assert cuda_modules.function(cp, np.float32, "rows_times_small_8") == (1, "rows_times_small_8")
    assert [(dev, code == cuda_modules.source(np.float32)[0]) for dev, code in cp.compiled] == \
        [(0, True), (0, False), (1, True)]
    cuda_modules.function(cp, np.float32, "gram_total")
    assert len(cp.compiled) == 3
    monkeypatch.setattr(row_kernels, "MIN_BLOCKS", 3)        # another constant: another module
    cuda_modules.function(cp, np.float32, "rows_times_small_8")
    assert len(cp.compiled) == 4 and "#define MIN_BLOCKS 3\n" in cp.compiled[-1][1]


def test_prepare_compiles_in_the_background_and_function_waits_for_it(fresh_modules):
    gate = threading.Event()
    cp = _FakeCupy(delay=gate)
    thread = cuda_modules.prepare(cp, np.float32, [0, 1, 0])
    assert thread.is_alive() and cp.compiled == []
    got = []
    waiter = threading.Thread(target=lambda: got.append(cuda_modules.function(cp, np.float32, "gram_total")))
    waiter.start()
    gate.set()
    waiter.join(5)
    thread.join(5)
    assert got == [(0, "gram_total")]
    assert sorted(dev for dev, _ in cp.compiled) == [0, 1]      # each device once, none compiled twice
    with cp.cuda.Device(1):
        cuda_modules.function(cp, np.float32, "gram_total")
    assert len(cp.compiled) == 2
    assert cuda_modules.prepare(cp, np.float32, [0, 1]) is None       # nothing left to do


def test_a_failed_background_compilation_is_raised_where_the_module_is_needed(fresh_modules):
    cp = _FakeCupy(fail=True)
    cuda_modules.prepare(cp, np.float64, [0]).join(5)
    with pytest.raises(RuntimeError, match="NVRTC failed"):
        cuda_modules.function(cp, np.float64, "rr_prepare")
