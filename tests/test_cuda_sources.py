"""cisolver's one CUDA module compiles with NVRTC for sm_80 and sm_90 in both dtypes, every listed kernel in the
cubin (benchmarks/check_cuda_sources.py). NVRTC needs no GPU; the test runs wherever CuPy imports with its NVRTC
(skipped elsewhere, e.g. in CI)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

try:
    from cupy.cuda import nvrtc  # noqa: F401
except Exception as exc:  # no CuPy, or no NVRTC library
    pytest.skip(f"CuPy's NVRTC is not importable here: {exc}", allow_module_level=True)

_spec = importlib.util.spec_from_file_location(
    "check_cuda_sources", Path(__file__).resolve().parents[1] / "benchmarks" / "check_cuda_sources.py")
check_cuda_sources = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("check_cuda_sources", check_cuda_sources)
_spec.loader.exec_module(check_cuda_sources)


@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_module_compiles_with_every_kernel(arch, dtype):
    took, cpu, count, missing = check_cuda_sources.check(arch, dtype)
    assert count > 0 and missing == []


def test_a_broken_source_is_reported():
    with pytest.raises(RuntimeError, match="NVRTC failed for sm_90"):
        check_cuda_sources.compile_module("extern \"C\" __global__ void k() { undeclared(); }", "90")
