"""cisolver.cuda_modules on GPUs: every kernel of the one module loads, one module (one compilation or cache
load) per device and dtype, also when prepared on a background thread."""
import numpy as np
import pytest

from cisolver import cuda_modules

pytestmark = pytest.mark.gpu


@pytest.fixture
def counted(monkeypatch):
    """cupy.RawModule counted by the (device, dtype line) it is made for; cuda_modules' caches emptied."""
    import cupy
    made = []
    real = cupy.RawModule

    def counting(*args, **kwargs):
        made.append((cupy.cuda.runtime.getDevice(), kwargs["code"].split("\n", 1)[0]))
        return real(*args, **kwargs)
    monkeypatch.setattr(cupy, "RawModule", counting)
    for name in ("_modules", "_pending", "_failed", "_functions"):
        monkeypatch.setattr(cuda_modules, name, {})
    return made


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_kernel_loads_from_one_module(counted, dtype):
    import cupy
    with cupy.cuda.Device(0):
        kernels = [cuda_modules.function(cupy, dtype, name) for name in cuda_modules.kernel_names(dtype)]
    assert all(k is not None for k in kernels)
    ctype = "float" if np.dtype(dtype) == np.float32 else "double"
    assert counted == [(0, f"typedef {ctype} T;")]


def test_prepared_module_is_the_one_the_kernels_use(counted):
    import cupy
    thread = cuda_modules.prepare(cupy, np.float32, [0])
    with cupy.cuda.Device(0):
        cuda_modules.function(cupy, np.float32, "rows_times_small_16")      # waits for the thread's module
    thread.join()
    assert counted == [(0, "typedef float T;")]


@pytest.mark.multi_gpu
def test_one_module_per_device(counted):
    import cupy
    cuda_modules.prepare(cupy, np.float64, [0, 1]).join()
    for dev in (0, 1):
        with cupy.cuda.Device(dev):
            cuda_modules.function(cupy, np.float64, "ortho_factor")
    assert sorted(counted) == [(0, "typedef double T;"), (1, "typedef double T;")]
