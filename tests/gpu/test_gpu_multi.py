"""Several GPUs in one call (marked ``multi_gpu``): static bands and dynamic tiles across GPUs, host
operands shared between GPUs over NVLink, cupy operands on one GPU and C on another (or on the host),
out-of-core."""
import numpy as np
import pytest

import hybridblas as hb
from blas_cases import operand_shape, random_matrix, reference_for, tolerance
from blas_cases import call_routine
from test_gpu import check

pytestmark = pytest.mark.multi_gpu


def _gpus(**kw):
    import cupy
    from hybridblas.devices.cuda import CUDADevice
    return [CUDADevice(i, **kw) for i in range(cupy.cuda.runtime.getDeviceCount())]


@pytest.mark.parametrize("name,trans", [("herk", ("N",)), ("her2k", ("C",)), ("gemmt", ("C", "N")),
                                        ("syrk", ("T",)), ("gemm", ("N", "C"))])
@pytest.mark.parametrize("strategy", ["static", "dynamic"])
@pytest.mark.parametrize("where", ["numpy", "cupy-split", "cupy-host-c"])
@pytest.mark.parametrize("lower", [True, False])
def test_multi_gpu(name, trans, strategy, where, lower, rng):
    import cupy
    dtype = np.complex128
    n, k = 333, 121
    n_ops = 1 if name in ("herk", "syrk") else 2
    if name in ("gemm", "gemmt"):
        shapes = [operand_shape(trans[0], n, k), operand_shape(trans[1], k, n)]
    else:
        shapes = [operand_shape(trans[0], n, k)] * n_ops
    values = [random_matrix(rng, s, dtype) for s in shapes]
    c0 = random_matrix(rng, (n, n), dtype)
    alpha = 0.5 if name == "herk" else 0.5 - 0.2j
    beta = 0.25 if name in ("herk", "her2k") else 0.25 + 1j
    expected = reference_for(name, alpha, values, beta, c0, lower, trans)
    ctx = hb.Context(devices=_gpus(block=64), strategy=strategy, block_size=96 if strategy == "dynamic" else None,
                     min_call_seconds=0)       # small on purpose: every GPU must take part
    if where == "numpy":
        ops, c = [np.asfortranarray(v) for v in values], np.array(c0, order="C")
    else:   # operands on the last GPU, C on the first (or in host memory)
        with cupy.cuda.Device(cupy.cuda.runtime.getDeviceCount() - 1):
            ops = [cupy.asarray(v, order="F") for v in values]
        c = cupy.asarray(c0, order="F") if where == "cupy-split" else np.array(c0, order="C")
    out = call_routine(name, alpha, ops, beta, c, trans, None if name == "gemm" else lower, ctx)
    assert out is c
    tol = tolerance(dtype, k, alpha, values, beta, c0)
    check(name, out, expected, c0, lower, tol, f"{strategy} {where}", alpha, beta, k)


def test_multi_gpu_out_of_core_and_default_context(rng):
    dtype = np.complex128
    n, k = 400, 500
    a = random_matrix(rng, (n, k), dtype)
    b = random_matrix(rng, (n, k), dtype)
    c0 = random_matrix(rng, (n, n), dtype)
    want = reference_for("her2k", 1.0 + 0.5j, [a, b], 0.0, c0, True, ("N",))
    for ctx in (hb.Context(devices=_gpus(memory_limit=600 * 1024), strategy="static", min_call_seconds=0),
                hb.Context(devices=_gpus(memory_limit=600 * 1024), strategy="dynamic", min_call_seconds=0),
                hb.Context("all")):
        out = hb.her2k(1.0 + 0.5j, a, b, 0.0, np.full((n, n), np.nan, dtype, order="F"), context=ctx)
        poisoned = np.full((n, n), np.nan, dtype)
        check("her2k", out, want, poisoned, True, tolerance(dtype, k, 1.0, [a, b], 0.0, c0), repr(ctx),
              1.0, 0.0, k)
