"""Single-precision inline calls: k summed in CHUNK-long float32 pieces, the pieces added in double.

Edge k (one short of a chunk, exact chunks, chunks plus a tail), every routine and trans, strided device
views, and the partials split over several strided-batched calls.
"""
import numpy as np
import pytest

import hybridblas as hb
from blas_cases import ROUTINES, call_routine, make_case, trans_choices, triangle_mask
from test_gpu import LAYOUTS, check, to_device
from test_gpu_streams import _opened

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("partials_bytes", [64 << 20, 1])       # 1 byte: one chunk per batched call
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("name", list(ROUTINES))
def test_chunked_single_precision_matches_double_reference(name, dtype, partials_bytes, rng, monkeypatch):
    from hybridblas.devices import cuda_inline
    monkeypatch.setattr(cuda_inline, "PARTIALS_BYTES", partials_bytes)
    opened = _opened(monkeypatch)                                   # tiled runs; the inline path opens none
    chunk = cuda_inline.CHUNK
    ctx = hb.Context(devices=["cuda:0"])
    for trans in trans_choices(name, dtype):
        for k in (chunk - 1, chunk, 3 * chunk, 2 * chunk + 37):
            n = 7
            m = n + 2 if name == "gemm" else n
            lower = None if name == "gemm" else bool(rng.integers(2))
            alpha, beta = (0.7, -1.3) if k % 2 else (0.7, 0.0)
            values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m)
            ops = [to_device(v, LAYOUTS[rng.integers(len(LAYOUTS))]) for v in values]
            c = to_device(c0, LAYOUTS[rng.integers(len(LAYOUTS))])
            out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
            where = f"{name} {''.join(trans)} k={k} beta={beta} partials_bytes={partials_bytes}"
            check(name, out, expected, c0, lower, tol, where, alpha, beta, k)
    assert opened == []


def test_chunked_float32_gram_is_within_a_few_roundings(rng):
    """Positive-mean data, k = 4e5: the chunked sum stays within a few roundings of the exact Gram."""
    import cupy
    x = (rng.standard_normal((400_003, 6)) + 1.0).astype(np.float32)
    xd = cupy.asarray(x)
    ours = hb.syrk(1.0, xd, trans="T", context=hb.Context(devices=["cuda:0"])).get()
    whole = (xd.T @ xd).get()
    ref = x.astype(np.float64).T @ x.astype(np.float64)
    low = triangle_mask(6, True)
    scale = np.abs(ref).max()
    err_ours = np.abs(ours[low] - ref[low]).max() / scale
    err_whole = np.abs(whole[low] - ref[low]).max() / scale
    print(f"relative error: chunked {err_ours:.2e}, whole-k sgemm {err_whole:.2e}")
    assert err_ours <= 4 * np.finfo(np.float32).eps
