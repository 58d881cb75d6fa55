"""The chunk arithmetic of the single-precision inline GPU path, run on the CPU.

``cublas.call`` is replaced by an emulator of cublas<t>gemmStridedBatched that takes the very ctypes
arguments the library passes (op codes, m, n, k, raw pointers, leading dimensions, 64-bit element strides,
batch count) and reads each batch from raw memory through them, refusing any read outside the operands'
allocations. So the argument order, the strides, the leading dimensions of the first-chunk views, the
split into several batched calls and the tail of ``cuda_inline._chunked_full`` are all checked in CI, on
every operand layout. The same path on a GPU is tested in test_gpu_inline_chunks.py.
"""
import ctypes
import itertools

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import ROUTINES, call_routine, layout, make_case
from hybridblas import cublas, host_blas, routines
from hybridblas.devices import cuda_inline

_DTYPE = {"S": np.dtype(np.float32), "C": np.dtype(np.complex64)}


class _NumpyBackend:
    xp = np
    handle = 0
    stream = type("Stream", (), {"ptr": 0})()
    gemm = staticmethod(host_blas.gemm)


class _Emulator:
    """cublas.call for gemmStridedBatched on host memory; ``allowed`` lists the readable (start, end)."""

    def __init__(self):
        self.allowed = []
        self.calls = 0

    def matrix(self, ptr, rows, cols, ld, dt, check=True):
        assert ld >= max(1, rows), f"leading dimension {ld} < rows {rows}"
        span = ((cols - 1) * ld + rows) * dt.itemsize
        if check:
            assert any(lo <= ptr and ptr + span <= hi for lo, hi in self.allowed), "read outside an operand"
        flat = np.frombuffer((ctypes.c_char * span).from_address(ptr), dtype=dt)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols), (dt.itemsize, ld * dt.itemsize))

    def __call__(self, name, handle, stream_ptr, *args):
        assert name.startswith("cublas") and name.endswith("gemmStridedBatched"), name
        dt = _DTYPE[name[len("cublas")]]
        transa, transb, m, n, k = (a.value for a in args[:5])
        alpha, a_ptr, lda, stride_a, b_ptr, ldb, stride_b, beta, c_ptr, ldc, stride_c, batch = args[5:]
        for stride in (stride_a, stride_b, stride_c):
            assert isinstance(stride, ctypes.c_longlong), "strides are 64-bit"
        scalar = lambda p: np.frombuffer((ctypes.c_char * dt.itemsize).from_address(p.value), dt)[0]  # noqa: E731
        op = lambda x, t: x if t == 0 else (x.T if t == 1 else x.conj().T)  # noqa: E731
        it = dt.itemsize
        for b in range(batch.value):
            a = self.matrix(a_ptr.value + b * stride_a.value * it, *((m, k) if transa == 0 else (k, m)), lda.value, dt)
            y = self.matrix(b_ptr.value + b * stride_b.value * it, *((k, n) if transb == 0 else (n, k)), ldb.value, dt)
            c = self.matrix(c_ptr.value + b * stride_c.value * it, m, n, ldc.value, dt, check=False)
            prod = scalar(alpha) * (op(a, transa) @ op(y, transb))
            c[...] = prod if scalar(beta) == 0 else prod + scalar(beta) * c
        self.calls += 1


def _allocation(x):
    while isinstance(x.base, np.ndarray):
        x = x.base
    start = x.__array_interface__["data"][0]
    return start, start + x.nbytes


def _combos(name, dtype):
    legal = ROUTINES[name][2] if np.dtype(dtype).kind == "c" else ["N", "T"]
    if name in ("gemm", "gemmt"):
        return list(itertools.product(legal, legal))
    return [(t,) for t in legal]


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("how", ["F", "C", "ld", "C-ld", "step"])
@pytest.mark.parametrize("name", list(ROUTINES))
def test_chunks_cover_k_once(name, how, dtype, rng, monkeypatch):
    captured = []
    emulator = _Emulator()
    monkeypatch.setattr(routines.scheduler, "execute", lambda prob, ctx: captured.append(prob))
    monkeypatch.setattr(cublas, "call", emulator)
    monkeypatch.setattr(cublas, "_ptr", lambda x: ctypes.c_void_p(x.__array_interface__["data"][0]))
    monkeypatch.setattr(cuda_inline, "CHUNK", 8)
    shapes = [(1, 1), (4, 1), (1, 4), (5, 5)] if name == "gemm" else [(1, 1), (5, 5)]
    for partials, trans, (m, n), k in itertools.product((1 << 20, 1), _combos(name, dtype), shapes, (8, 24, 21)):
        beta = -1.3 if k % 2 else 0.0                     # beta = 0: C is NaN and must not be read
        values, c0, expected, tol = make_case(rng, name, dtype, trans, True, n, k, 0.7, beta, m)
        monkeypatch.setattr(cuda_inline, "PARTIALS_BYTES", partials)
        ops = [layout(v, how) for v in values]
        call_routine(name, 0.7, ops, beta, np.asfortranarray(c0), trans, True, hb.Context(devices=["cpu"]))
        prob = captured.pop()
        emulator.allowed = [_allocation(f.base) for f in prob.factors]
        full = cuda_inline._chunked_full(_NumpyBackend, prob)
        if name in ("herk", "her2k"):       # BLAS ignores Im C_ii; _store keeps the real part
            np.fill_diagonal(full, full.diagonal().real)
        mask = np.ones(c0.shape, bool) if name == "gemm" else np.tril(np.ones(c0.shape, bool))
        err = np.abs(full[mask] - expected[mask]).max()
        assert err <= tol, (trans, m, n, k, partials, err)
    assert emulator.calls > 0
