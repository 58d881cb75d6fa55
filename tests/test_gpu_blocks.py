"""cisolver.blocks on a GPU (one cuBLAS gemm / trmm on strided column ranges) against numpy on the same
data: both precisions, column ranges of row-major buffers, edge sizes, and layouts that are not row-major
(the cupy fallback)."""
import numpy as np
import pytest

from cisolver.blocks import product_into, subtract_product, times_upper

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 127, 100_003])
@pytest.mark.parametrize("order", ["C", "F"])
def test_block_updates_on_gpu_match_numpy(dtype, rows, order, rng):
    import cupy
    host = rng.standard_normal((rows, 24)).astype(dtype)
    other = np.full((rows, 24), np.nan, dtype=dtype)
    dev, other_dev = cupy.asarray(host, order=order), cupy.asarray(other, order=order)
    m = rng.standard_normal((20, 16))
    m2 = rng.standard_normal((8, 16))
    u = np.triu(rng.standard_normal((16, 16))) + 4 * np.eye(16)
    for x, o in ((host, other), (dev, other_dev)):
        product_into(o[:, 4:20], x[:, :20], m)
        subtract_product(x[:, 8:24], x[:, :8], m2)
        times_upper(x[:, 8:24], u)
    tol = 64 * np.finfo(dtype).eps
    for got, expected, what in ((other_dev.get(), other, "product_into"), (dev.get(), host, "subtract, times_upper")):
        finite = ~np.isnan(expected)
        assert (np.isnan(got) == ~finite).all(), what
        scale = max(np.abs(expected[finite]).max(initial=0.0), 1.0)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=0, atol=tol * scale, err_msg=what)
