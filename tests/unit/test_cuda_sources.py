"""cisolver's CUDA units compile with NVRTC for sm_80 and sm_90 in both dtypes, every listed kernel in its unit's
cubin (python3 -m benchmarks.cisolver cuda-sources), and cuda_modules keeps a unit's cubin in the cache folder,
compiled once. NVRTC needs no GPU; the tests run wherever CuPy imports with its NVRTC (skipped elsewhere, e.g. in
CI)."""
import os

import numpy as np
import pytest

try:
    from cupy.cuda import nvrtc
except Exception as exc:  # no CuPy, or no NVRTC library
    pytest.skip(f"CuPy's NVRTC is not importable here: {exc}", allow_module_level=True)

from benchmarks.measure import ci_cuda_sources as check_cuda_sources  # noqa: E402
from cisolver import cuda_modules  # noqa: E402


@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_unit_compiles_with_its_kernels(arch, dtype):
    found = check_cuda_sources.check(arch, dtype)
    assert [unit for unit, *_ in found] == [unit for unit, _, _ in cuda_modules.units(dtype)]
    assert all(count > 0 and missing == [] for _, _, _, count, missing in found)


def test_a_broken_source_is_reported():
    with pytest.raises(RuntimeError, match="NVRTC failed for sm_90"):
        check_cuda_sources.compile_module("extern \"C\" __global__ void k() { undeclared(); }", "90")


def test_a_unit_is_compiled_once_into_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cache"))
    _, code, names = cuda_modules.units(np.float32)[1]
    path = cuda_modules._cubin(nvrtc, code, 90)
    assert os.path.dirname(path) == str(tmp_path / "cache") and os.listdir(tmp_path / "cache") == [
        os.path.basename(path)]                                  # no partial file left behind
    assert set(names) <= check_cuda_sources.entry_points(open(path, "rb").read())
    monkeypatch.setattr(nvrtc, "compileProgram", lambda *a: pytest.fail("compiled again"))
    assert cuda_modules._cubin(nvrtc, code, 90) == path


def test_a_unit_that_does_not_compile_names_the_architecture_and_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"(?s)NVRTC could not compile cisolver's kernels for sm_90: .*undeclared"):
        cuda_modules._cubin(nvrtc, "extern \"C\" __global__ void k() { undeclared(); }", 90)
    assert os.listdir(tmp_path) == []
