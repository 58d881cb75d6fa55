"""cisolver.cuda_modules on GPUs: every kernel of every unit loads, one module (one compilation or cache load) per
unit, device and dtype, also when prepared on background threads; a unit's cubin comes from the on-disk cache
when it is there, and its kernels compute what they should."""
import numpy as np
import pytest

from cisolver import cuda_modules

pytestmark = pytest.mark.gpu


@pytest.fixture
def counted(monkeypatch):
    """Units compiled or loaded (cuda_modules._compile) counted by (device, source); the caches emptied."""
    import cupy
    made = []
    real = cuda_modules._compile

    def counting(cp, code, names):
        made.append((cupy.cuda.runtime.getDevice(), code))
        return real(cp, code, names)
    monkeypatch.setattr(cuda_modules, "_compile", counting)
    for name in ("_modules", "_pending", "_failed", "_functions"):
        monkeypatch.setattr(cuda_modules, name, {})
    return made


def _every_kernel(cupy, dtype, device):
    with cupy.cuda.Device(device):
        return [cuda_modules.function(cupy, dtype, name) for name in cuda_modules.kernel_names(dtype)]


def _one_per_unit(dtype, devices):
    return sorted((device, code) for device in devices for _, code, _ in cuda_modules.units(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_kernel_loads_from_its_unit(counted, dtype):
    import cupy
    assert all(k is not None for k in _every_kernel(cupy, dtype, 0))
    assert counted == [(0, code) for _, code, _ in cuda_modules.units(dtype)]      # each unit once, in order


def test_prepared_units_are_the_ones_the_kernels_use(counted):
    import cupy
    compiling = cuda_modules.prepare(cupy, np.float32, [0])
    with cupy.cuda.Device(0):
        cuda_modules.function(cupy, np.float32, "rows_times_small_16")      # waits for its unit's thread
    compiling.join()
    _every_kernel(cupy, np.float32, 0)
    assert sorted(counted) == _one_per_unit(np.float32, [0])


@pytest.mark.multi_gpu
def test_one_module_per_unit_and_device(counted):
    import cupy
    cuda_modules.prepare(cupy, np.float64, [0, 1]).join()
    for dev in (0, 1):
        _every_kernel(cupy, np.float64, dev)
    assert sorted(counted) == _one_per_unit(np.float64, [0, 1])


def test_a_unit_compiles_once_into_the_cache_folder_and_loads_from_it(tmp_path, monkeypatch):
    import cupy
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    name, code, names = cuda_modules.units(np.float64)[1]         # gpu_fill: small
    with cupy.cuda.Device(0):
        cuda_modules._compile(cupy, code, names)
        files = sorted(p.name for p in tmp_path.iterdir())
        assert len(files) == 1 and files[0].startswith("cisolver-") and files[0].endswith(".cubin")
        monkeypatch.setattr(cupy.cuda.nvrtc, "compileProgram", lambda *a: pytest.fail("compiled again"))
        module = cuda_modules._compile(cupy, code, names)
        assert all(module.get_function(n) is not None for n in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == files
