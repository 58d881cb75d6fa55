"""A GPU that fails mid-call (marked ``multi_gpu``/``gpu``): its tiles re-run on the other GPU (or the
CPU), one warning, an exact result; an interrupt stops a GPU call within a tile's time."""
import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import call_routine, make_case, triangle_mask


def _gpu_devices(**kw):
    import cupy
    from hybridblas.devices.cuda import CUDADevice
    return [CUDADevice(i, **kw) for i in range(cupy.cuda.runtime.getDeviceCount())]


@pytest.mark.multi_gpu
@pytest.mark.parametrize("name,trans", [("herk", ("N",)), ("her2k", ("C",)), ("gemmt", ("N", "C")),
                                        ("gemm", ("N", "N"))])
@pytest.mark.parametrize("strategy", ["static", "dynamic"])
@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_fault_in_one_of_two_gpus(name, trans, strategy, where, beta, rng):
    import cupy
    dtype = np.complex128
    lower = None if name == "gemm" else True
    alpha = 0.5 if name == "herk" else 0.5 - 0.25j
    values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, 700, 300, alpha, beta)
    ctx = hb.Context(devices=_gpu_devices(block=128), strategy=strategy, min_call_seconds=0,
                     block_size=256 if strategy == "dynamic" else None)
    if where == "host":
        ops, c = [np.asfortranarray(v) for v in values], np.array(c0, order="F")
    else:
        ops, c = [cupy.asarray(v, order="F") for v in values], cupy.asarray(c0, order="F")
    with hb.testing.inject_fault(ctx, 1, after_tiles=0 if strategy == "static" else 1) as fault:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
    got = out if isinstance(out, np.ndarray) else out.get()
    mask = np.ones(c0.shape, bool) if name == "gemm" else triangle_mask(700, lower)
    assert np.abs(got[mask] - expected[mask]).max() <= tol
    np.testing.assert_array_equal(got[~mask], c0[~mask])
    assert fault.fired
    assert [w for w in seen if issubclass(w.category, hb.DeviceFailureWarning)]
    assert list(ctx.failed) == ["cuda:1"]


@pytest.mark.multi_gpu
def test_out_of_memory_on_one_gpu_moves_its_tiles(rng):
    import cupy
    a = rng.standard_normal((2000, 1500)) + 1j * rng.standard_normal((2000, 1500))
    ctx = hb.Context(devices=_gpu_devices(), strategy="dynamic", block_size=256, min_call_seconds=0)
    oom = cupy.cuda.memory.OutOfMemoryError(1 << 34, 1 << 30, 1 << 30)
    with hb.testing.inject_fault(ctx, 0, after_tiles=2, exc=oom):
        with pytest.warns(hb.DeviceFailureWarning, match="cuda:0 failed"):
            c = hb.herk(1.0, a, context=ctx)
    low = np.tril(np.ones((2000, 2000), bool))
    want = a @ a.conj().T
    assert np.abs(c[low] - want[low]).max() / np.abs(want).max() < 1e-13


@pytest.mark.gpu
def test_gpu_fault_falls_back_to_the_cpu(rng):
    a = rng.standard_normal((600, 300))
    ctx = hb.Context(devices=["cpu", "cuda:0"], strategy="dynamic", block_size=128, min_call_seconds=0,
                     rates={"cpu": 1.0, "cuda:0": 10.0})
    with hb.testing.inject_fault(ctx, 1, after_tiles=0):
        with pytest.warns(hb.DeviceFailureWarning, match="cuda:0 failed"):
            c = hb.syrk(1.0, a, context=ctx)
    low = np.tril(np.ones((600, 600), bool))
    np.testing.assert_allclose(c[low], (a @ a.T)[low], rtol=1e-12, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_interrupt_stops_a_gpu_call_quickly(strategy, rng):
    """Host operands on the GPUs; SIGINT after 0.5 s: KeyboardInterrupt within ~1 s, the runs closed,
    and the next call exact."""
    n, k = 12000, 12000
    a = rng.standard_normal((n, k))
    ctx = hb.Context("gpu", strategy=strategy, pin_host=False, min_call_seconds=0,
                     block_size=2048 if strategy == "dynamic" else None)
    c = np.full((n, n), np.nan, order="F")
    timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(100):
                hb.syrk(1.0, a, 0.0, c, context=ctx)
    finally:
        timer.cancel()
    assert time.perf_counter() - start - 0.5 < 1.5
    small = a[:500, :300]
    out = hb.syrk(1.0, small, context=ctx)
    low = np.tril(np.ones((500, 500), bool))
    np.testing.assert_allclose(out[low], (small @ small.T)[low], rtol=1e-12, atol=1e-10)
