"""cisolver's one CUDA module compiles with NVRTC for sm_80 and sm_90 in both dtypes, every listed kernel in the
cubin (python3 -m benchmarks.cisolver cuda-sources). NVRTC needs no GPU; the test runs wherever CuPy imports with
its NVRTC (skipped elsewhere, e.g. in CI)."""
import numpy as np
import pytest

try:
    from cupy.cuda import nvrtc  # noqa: F401
except Exception as exc:  # no CuPy, or no NVRTC library
    pytest.skip(f"CuPy's NVRTC is not importable here: {exc}", allow_module_level=True)

from benchmarks.measure import ci_cuda_sources as check_cuda_sources  # noqa: E402


@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_module_compiles_with_every_kernel(arch, dtype):
    took, cpu, count, missing = check_cuda_sources.check(arch, dtype)
    assert count > 0 and missing == []


def test_a_broken_source_is_reported():
    with pytest.raises(RuntimeError, match="NVRTC failed for sm_90"):
        check_cuda_sources.compile_module("extern \"C\" __global__ void k() { undeclared(); }", "90")
