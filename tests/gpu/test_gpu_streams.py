"""Small cupy calls run inline on the caller's stream; every GPU call waits for the caller's queued work.

The caller's stream is held busy by a spinning kernel, then A is written on it: a call that read A from
its own stream before that write landed would return the product of the old A.
"""
import numpy as np
import pytest

import hybridblas as hb
from blas_cases import random_matrix

pytestmark = pytest.mark.gpu

SPIN = r'''
__device__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0 = now();
    while (now() - t0 < ns) { }
}
'''


def _busy(stream, seconds=0.2):
    """Queue a kernel that keeps ``stream`` busy for ``seconds`` (GPU wall clock)."""
    import cupy
    kernel = cupy.RawKernel(SPIN, "spin")
    with stream:
        kernel((1,), (1,), (np.uint64(seconds * 1e9),))


def _cuda(**kw):
    from hybridblas.devices.cuda import CUDADevice
    return CUDADevice(0, **kw)


def _opened(monkeypatch):
    """Count the tiled runs opened (the inline path opens none)."""
    from hybridblas.devices import cuda
    opened = []
    real = cuda.CUDADevice.open
    monkeypatch.setattr(cuda.CUDADevice, "open", lambda self, p: opened.append(p) or real(self, p))
    return opened


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("name", ["herk", "syrk", "gemmt", "her2k", "gemm"])
def test_small_cupy_call_runs_inline_after_the_callers_work(name, dtype, rng, monkeypatch):
    import cupy
    opened = _opened(monkeypatch)
    x = random_matrix(rng, (4001, 24), dtype)
    y = random_matrix(rng, (4001, 24), dtype)
    c0 = random_matrix(rng, (24, 24), dtype)
    c0[np.triu_indices(24, 1)] = np.nan                        # the triangle that must stay untouched
    if name in ("herk", "her2k"):
        c0[np.diag_indices(24)] = c0.diagonal().real
    src, yd, cd = cupy.asarray(x), cupy.asarray(y), cupy.asarray(c0)
    if name == "gemm":
        cd = cupy.asarray(np.nan_to_num(c0))
    xd = cupy.zeros_like(src)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    _busy(stream)
    ctx = hb.Context(devices=["cuda:0"])
    x, y, c0 = (z.astype(np.complex128) for z in (x, y, c0))  # the reference in double
    with stream:
        xd[...] = src                                          # lands after the spin
        if name == "herk":
            hb.herk(0.5, xd, 0.25, cd, trans="C", context=ctx)
            want = 0.5 * x.conj().T @ x + 0.25 * c0
        elif name == "syrk":
            hb.syrk(0.5, xd, 0.25, cd, trans="T", context=ctx)
            want = 0.5 * x.T @ x + 0.25 * c0
        elif name == "gemmt":
            hb.gemmt(0.5, xd, yd, 0.25, cd, transa="C", context=ctx)
            want = 0.5 * x.conj().T @ y + 0.25 * c0
        elif name == "her2k":
            hb.her2k(0.5, xd, yd, 0.25, cd, trans="C", context=ctx)
            want = 0.5 * (x.conj().T @ y + y.conj().T @ x) + 0.25 * c0
        else:
            hb.gemm(0.5, xd, yd, 0.25, cd, transa="T", context=ctx)
            want = 0.5 * x.T @ y + 0.25 * np.nan_to_num(c0)
        got = cd.get(stream=stream)
        stream.synchronize()
    assert opened == []                                        # no tiled run: the inline path
    ref = want.astype(np.complex128)
    low = np.tril(np.ones((24, 24), bool)) if name != "gemm" else np.ones((24, 24), bool)
    # single precision is accumulated in double: one rounding of each entry
    tol = (1e-5 if dtype in (np.float32, np.complex64) else 1e-12) * np.abs(ref[low]).max()
    assert np.abs(got[low] - ref[low]).max() <= tol
    if name != "gemm":
        assert np.isnan(got[~low]).all()
    if name in ("herk", "her2k"):
        assert (got.diagonal().imag == 0).all()


def test_single_precision_inline_rounds_once(rng):
    """float32 Gram of a long tall block: within a few float32 roundings of the exact value."""
    import cupy
    x = random_matrix(rng, (200003, 8), np.float32) + 0.5
    got = hb.syrk(1.0, cupy.asarray(x), trans="T", context=hb.Context(devices=["cuda:0"])).get()
    ref = x.astype(np.float64).T @ x.astype(np.float64)
    low = np.tril(np.ones((8, 8), bool))
    assert np.abs(got[low] - ref[low]).max() <= 2 * np.finfo(np.float32).eps * np.abs(ref).max()


def test_tiled_run_waits_for_the_callers_stream(rng, monkeypatch):
    import cupy
    opened = _opened(monkeypatch)
    a = random_matrix(rng, (300, 200), np.complex128)
    src = cupy.asarray(a)
    ad = cupy.zeros_like(src)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    _busy(stream)
    ctx = hb.Context(devices=[_cuda(block=64)], strategy="static")     # a fixed block: the tiled run
    with stream:
        ad[...] = src
        c = hb.herk(1.0, ad, context=ctx)
    assert len(opened) == 1
    want = a @ a.conj().T
    low = np.tril(np.ones((300, 300), bool))
    got = c.get()
    assert np.abs(got[low] - want[low]).max() <= 1e-12 * np.abs(want).max()


def test_memory_cap_keeps_small_calls_tiled(rng, monkeypatch):
    import cupy
    opened = _opened(monkeypatch)
    a = cupy.asarray(random_matrix(rng, (2000, 16), np.float64))
    hb.syrk(1.0, a, trans="T", context=hb.Context(devices=[_cuda(memory_limit=1 << 20)]))
    assert len(opened) == 1
