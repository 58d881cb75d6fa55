"""hybridblas.lowlevel.grams and grams_preferred without a GPU, on stand-ins for cupy arrays: every refusal names
the argument and its value before any GPU work, and grams_preferred answers (never raises) by the kernels'
coverage, the row limits and the staged kernel's layouts; the kernels' source (hybridblas.devices.cuda_grams) is
self-contained and follows the constants. Their compilation: test_public_api.py."""
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from hybridblas import lowlevel
from hybridblas.devices import cuda_grams

ALIGNED = 1 << 12          # a data pointer on a 16-byte boundary, and one that is not
MISALIGNED = ALIGNED + 8


class DeviceArray:
    """What lowlevel.grams reads of a cupy array: shape, dtype, strides (of a numpy view, which may stand for
    millions of rows of a small buffer: nothing is read), the device's id and the data pointer."""

    def __init__(self, host, device=0, ptr=ALIGNED):
        self.host, self.device, self.data = host, SimpleNamespace(id=device), SimpleNamespace(ptr=ptr)

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    ndim = property(lambda self: self.host.ndim)
    strides = property(lambda self: self.host.strides)
    itemsize = property(lambda self: self.host.itemsize)
    T = property(lambda self: DeviceArray(self.host.T, self.device.id, self.data.ptr))

    def __getitem__(self, index):
        return DeviceArray(self.host[index], self.device.id, self.data.ptr)

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype})"


def block(rows, k, dtype=np.float64, width=None, order="C", **kw):
    """A rows x k stand-in: the first k columns of rows of ``width`` elements (every row aliases one buffer)."""
    dtype = np.dtype(dtype)
    width = width or k
    if order == "F":
        host = np.lib.stride_tricks.as_strided(np.zeros(max(rows, 1), dtype), (rows, k), (dtype.itemsize, 0))
    else:
        host = np.lib.stride_tricks.as_strided(np.zeros(width, dtype), (rows, k), (width * dtype.itemsize,
                                                                                   dtype.itemsize))
    return DeviceArray(host, **kw)


@pytest.fixture
def fake_cupy(monkeypatch):
    """CuPy as far as the checks go: its arrays are DeviceArrays, the current device is 0. Anything further (an
    allocation, a compilation, a launch) would raise AttributeError, so a refusal after GPU work shows."""
    cupy = SimpleNamespace(ndarray=DeviceArray, cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: 0)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


S = block(1000, 8)
REFUSALS = [
    ((np.zeros((10, 8)), None), {}, TypeError, r"s must be a cupy array, got ndarray array\(\[\[0\., "),
    (([[1.0]], None), {}, TypeError, r"s must be a cupy array, got list \[\[1\.0\]\]"),
    ((S, np.zeros((1000, 8))), {}, TypeError, r"hs must be a cupy array, got ndarray"),
    ((DeviceArray(np.zeros(10)), None), {}, ValueError, r"s must be 2-D, got shape \(10,\)"),
    ((S, DeviceArray(np.zeros((2, 1000, 8)))), {}, ValueError, r"hs must be 2-D, got shape \(2, 1000, 8\)"),
    ((block(10, 8, np.complex128), None), {}, TypeError, r"s has dtype complex128; grams takes float32 or float64"),
    ((block(10, 8, np.int32), None), {}, TypeError, r"s has dtype int32; grams takes float32 or float64"),
    ((S, block(1000, 8, np.float16)), {}, TypeError, r"hs has dtype float16; grams takes float32 or float64"),
    ((block(10, 0), None), {}, ValueError, r"s must have 1 to 32 columns, got shape \(10, 0\)"),
    ((block(10, 33), None), {}, ValueError, r"s must have 1 to 32 columns, got shape \(10, 33\)"),
    ((S, block(1000, 8, np.float32)), {}, TypeError, r"hs has dtype float32, unlike s \(float64\): one dtype for both"),
    ((S, block(1000, 7)), {}, ValueError, r"hs must have the shape of s \(1000, 8\), got \(1000, 7\)"),
    ((S, block(999, 8)), {}, ValueError, r"hs must have the shape of s \(1000, 8\), got \(999, 8\)"),
    ((block(1000, 8, order="F"), None), {}, ValueError,
     r"s must be row-major \(unit stride along its rows, a leading dimension\), got shape \(1000, 8\) with strides "
     r"\(8, 0\)"),
    ((S, block(1000, 8, order="F")), {}, ValueError, r"hs must be row-major .*strides \(8, 0\)"),
    ((block(1000, 8)[::-1], None), {}, ValueError, r"s must be row-major .*strides \(-64, 8\)"),
    ((block(1000, 8, width=16)[:, ::2], None), {}, ValueError, r"s must be row-major .*strides \(128, 16\)"),
    ((S, None), {"staged": 1}, TypeError, r"staged must be True or False, got int 1"),
    ((S, None), {"staged": "yes"}, TypeError, r"staged must be True or False, got str 'yes'"),
    ((block(1000, 8, device=1), None), {}, ValueError, r"s lives on GPU 1, not on the current device 0"),
    ((S, block(1000, 8, device=1)), {}, ValueError, r"hs lives on GPU 1, not on the current device 0"),
]


@pytest.mark.parametrize("args,kwargs,exc,match", REFUSALS)
def test_grams_refuses_by_name_before_any_gpu_work(args, kwargs, exc, match, fake_cupy):
    with pytest.raises(exc, match=match):
        lowlevel.grams(*args, **kwargs)
    if not kwargs:                              # blocks grams refuses: not preferred, and no exception
        assert lowlevel.grams_preferred(*args) is False


def test_staged_is_keyword_only(fake_cupy):
    with pytest.raises(TypeError, match="positional argument"):
        lowlevel.grams(S, None, False)


def test_grams_preferred_by_the_row_limits(fake_cupy):
    """float32 blocks up to ROWS_LIMIT rows; float64 blocks whose rows are whole, aligned 16-byte vectors (the
    staged kernel's) up to STAGED_DOUBLE_ROWS_LIMIT, others up to ROWS_LIMIT."""
    limit, staged_limit = cuda_grams.ROWS_LIMIT, cuda_grams.STAGED_DOUBLE_ROWS_LIMIT
    assert limit < staged_limit
    for rows, want in ((0, True), (1, True), (limit, True), (limit + 1, False)):
        s = block(rows, 24, np.float32)
        assert lowlevel.grams_preferred(s) is want and lowlevel.grams_preferred(s, block(rows, 24, np.float32)) is want
    for rows, want in ((limit + 1, True), (staged_limit, True), (staged_limit + 1, False)):
        assert lowlevel.grams_preferred(block(rows, 24)) is want
        assert lowlevel.grams_preferred(block(rows, 24, width=72), block(rows, 24, width=72)) is want
    for s, hs in ((block(limit + 1, 24, ptr=MISALIGNED), None),            # a row off the 16-byte boundary
                  (block(limit + 1, 24), block(limit + 1, 24, ptr=MISALIGNED)),
                  (block(limit + 1, 23, width=24), None),                  # rows of a half vector
                  (block(limit + 1, 24, width=25), None)):                 # a row stride of a half vector
        assert lowlevel.grams_preferred(s, hs) is False                    # not the staged kernel's: ROWS_LIMIT
        assert lowlevel.grams_preferred(s[:limit], None if hs is None else hs[:limit]) is True


def test_grams_preferred_takes_what_the_kernels_cover(fake_cupy):
    assert lowlevel.grams_preferred(block(100, 1)) and lowlevel.grams_preferred(block(100, 32))
    assert lowlevel.grams_preferred(block(100, 5, width=40)[:, :5])          # a column range of a wider buffer
    assert lowlevel.grams_preferred(block(0, 8, order="F"))                  # no rows: zeros, any layout
    assert lowlevel.grams_preferred(block(1, 8), block(1, 8))
    for s in (None, 3.0, "s", np.zeros((10, 8), np.float32)):
        assert lowlevel.grams_preferred(s) is False


def test_the_source_is_self_contained_and_follows_the_constants(monkeypatch):
    for dtype, ctype, vtype in ((np.float32, "float", "float4"), (np.float64, "double", "double2")):
        code = cuda_grams.source(dtype)
        assert code.startswith(f"typedef {ctype} T;\ntypedef {vtype} VT;\n") and "#define VEC " in code
        assert "shared_address(const void* p)" in code
        for name in cuda_grams.SOURCE_CONSTANTS:
            assert f"#define {name} {getattr(cuda_grams, name)}\n" in code
        entries = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(', code)
        assert sorted(entries) == sorted(cuda_grams.KERNELS)
    with pytest.raises(KeyError):
        cuda_grams.source(np.complex64)
    before = cuda_grams.source(np.float64)
    monkeypatch.setattr(cuda_grams, "STAGES", 4)
    assert cuda_grams.source(np.float64) == before.replace("#define STAGES 3\n", "#define STAGES 4\n")
