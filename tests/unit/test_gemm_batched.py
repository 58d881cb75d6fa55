"""hybridblas.gemm_batched: c[i] = alpha a[i] @ b[i] + beta c[i], host and GPU, against float64 references."""
import numpy as np
import pytest

import hybridblas as hb
from hybridblas.batched import _blas_view, _one_to_one

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
TOL = {np.float32: 2e-5, np.float64: 1e-12, np.complex64: 2e-5, np.complex128: 1e-12}


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _reference(alpha, a, b, beta, c0):
    a64 = a.astype(np.complex128)
    b64 = b.astype(np.complex128)
    out = alpha * np.matmul(a64, b64)
    if beta != 0:
        out += beta * c0.astype(np.complex128)
    return out


def _blocks(big, j0, j1, width):
    """Columns j0*width..j1*width of a (rows, n*width) array as a (j1-j0, rows, width) view (as flapw's atoms)."""
    s0, s1 = big.strides
    return np.lib.stride_tricks.as_strided(big[:, j0 * width:], shape=(j1 - j0, big.shape[0], width),
                                           strides=(width * s1, s0, s1))


def _check(xp, dtype, a, b, beta, c, alpha=0.7):
    c0 = None if c is None else (c.get() if hasattr(c, "get") else c).copy()
    host = [x.get() if hasattr(x, "get") else x for x in (a, b)]
    out = hb.gemm_batched(alpha, a, b, beta, c)
    got = out.get() if hasattr(out, "get") else out
    want = _reference(alpha, *host, beta, c0 if c0 is not None else 0)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() / scale <= TOL[dtype] if want.size else True
    if c is not None:
        assert out is c
    return out


CASES = [  # (batch, m, k, n)
    (3, 17, 9, 9), (1, 1, 1, 1), (5, 33, 4, 7), (2, 8, 16, 3), (4, 1, 5, 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,m,k,n", CASES)
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_host_contiguous(dtype, batch, m, k, n, shared, beta):
    rng = np.random.default_rng(batch * 100 + m)
    a = _rand(rng, (batch, m, k), dtype)
    b = _rand(rng, (k, n) if shared else (batch, k, n), dtype)
    c = _rand(rng, (batch, m, n), dtype)
    if beta == 0:
        c[...] = np.nan                      # not read when beta = 0
    _check(np, dtype, a, b, beta, c)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_host_strided_block_views_and_orders(dtype):
    """The blocks of one wide array as a strided (atoms, rows, width) view, in and out, both memory orders."""
    rng = np.random.default_rng(7)
    rows, width, atoms = 29, 5, 6
    src = _rand(rng, (rows, atoms * width), dtype)
    dst = np.full((rows, atoms * width), np.nan, dtype=dtype)
    t = _rand(rng, (width, width), dtype)
    out = hb.gemm_batched(1.0, _blocks(src, 1, 5, width), t, 0.0, _blocks(dst, 1, 5, width))
    for j in range(1, 5):
        np.testing.assert_allclose(dst[:, j * width:(j + 1) * width], src[:, j * width:(j + 1) * width] @ t,
                                   rtol=1e-12, atol=1e-12)
    assert np.isnan(dst[:, :width]).all() and np.isnan(dst[:, 5 * width:]).all()     # outside: untouched
    assert out.base is not None
    f = np.asfortranarray(_rand(rng, (3, 11, 4), dtype).transpose(0, 2, 1)).transpose(0, 2, 1)
    _check(np, dtype, f, np.asfortranarray(t[:4, :3]), 0.5, np.asfortranarray(_rand(rng, (3, 11, 3), dtype)))


def test_new_output_and_zero_sizes():
    rng = np.random.default_rng(1)
    a, b = _rand(rng, (2, 3, 4), np.float64), _rand(rng, (4, 5), np.float64)
    out = hb.gemm_batched(2.0, a, b)
    np.testing.assert_allclose(out, 2.0 * (a @ b), rtol=1e-14)
    assert hb.gemm_batched(1.0, np.zeros((0, 3, 4)), b).shape == (0, 3, 5)
    c = _rand(rng, (2, 3, 5), np.float64)
    c0 = c.copy()
    hb.gemm_batched(1.0, np.ones((2, 3, 0)), np.ones((0, 5)), 0.5, c)        # k = 0: c = beta c
    np.testing.assert_allclose(c, 0.5 * c0)


def test_bad_input_named_and_untouched():
    rng = np.random.default_rng(2)
    a, b = _rand(rng, (2, 3, 4), np.float64), _rand(rng, (4, 5), np.float64)
    c = _rand(rng, (2, 3, 5), np.float64)
    c0 = c.copy()
    with pytest.raises(ValueError, match=r"a must be 3-D"):
        hb.gemm_batched(1.0, a[0], b)
    with pytest.raises(ValueError, match=r"b must have shape \(4, n\)"):
        hb.gemm_batched(1.0, a, b[:3])
    with pytest.raises(ValueError, match=r"b must have shape \(2, 4, n\)"):
        hb.gemm_batched(1.0, a, np.ones((3, 4, 5)))
    with pytest.raises(ValueError, match=r"c must have shape \(2, 3, 5\)"):
        hb.gemm_batched(1.0, a, b, 0.0, c[:, :2])
    with pytest.raises(TypeError, match="b must have a's dtype float64, got float32"):
        hb.gemm_batched(1.0, a, b.astype(np.float32))
    with pytest.raises(TypeError, match="a must be float32, float64"):
        hb.gemm_batched(1.0, a.astype(np.int64), b)
    with pytest.raises(TypeError, match="alpha must be a finite number, got nan"):
        hb.gemm_batched(float("nan"), a, b, 0.0, c)
    with pytest.raises(TypeError, match=r"beta must be real for float64 data, got 1j"):
        hb.gemm_batched(1.0, a, b, 1j, c)
    with pytest.raises(ValueError, match="beta must be 0 when c is None"):
        hb.gemm_batched(1.0, a, b, 1.0)
    with pytest.raises(ValueError, match="c must not overlap a"):
        hb.gemm_batched(1.0, a, np.ones((4, 4)), 0.0, a)
    with pytest.raises(ValueError, match="c's blocks overlap one another"):
        hb.gemm_batched(1.0, a, b, 0.0, np.lib.stride_tricks.as_strided(c, c.shape, (0,) + c.strides[1:]))
    ro = c.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="c must be writeable"):
        hb.gemm_batched(1.0, a, b, 0.0, ro)
    np.testing.assert_array_equal(c, c0)


def test_blas_views():
    """The column-major description cuBLAS gets of each kind of block view."""
    x = np.zeros((4, 6, 5))
    assert _blas_view(x) == (True, 5, 30)                        # row-major blocks: ld = row stride
    assert _blas_view(x.transpose(0, 2, 1)) == (False, 5, 30)    # column-major blocks
    wide = np.zeros((7, 40))
    assert _blas_view(_blocks(wide, 2, 6, 5)) == (True, 40, 5)    # flapw's atom blocks: ld = full width
    assert _blas_view(np.zeros((6, 5))) == (True, 5, 0)          # shared b: batch stride 0
    assert _blas_view(x[:, :, ::2]) is None                       # no unit stride: copied first
    assert _blas_view(x[:, ::-1]) is None
    assert _blas_view(np.zeros((3, 1, 4))) == (True, 4, 4)
    assert _one_to_one((4, 7, 5), _blocks(wide, 0, 4, 5).strides, 8)
    assert not _one_to_one((4, 7, 5), (8, 320, 8), 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,m,k,n", CASES)
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("beta", [0.0, -0.5])
def test_gpu_contiguous(dtype, batch, m, k, n, shared, beta):
    import cupy
    rng = np.random.default_rng(batch * 100 + m)
    a = cupy.asarray(_rand(rng, (batch, m, k), dtype))
    b = cupy.asarray(_rand(rng, (k, n) if shared else (batch, k, n), dtype))
    c = cupy.asarray(_rand(rng, (batch, m, n), dtype))
    if beta == 0:
        c[...] = np.nan
    _check(cupy, dtype, a, b, beta, c)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
@pytest.mark.parametrize("order", ["C", "F"])
def test_gpu_strided_views(dtype, order):
    """flapw's case (atom blocks of wide arrays, in and out), column-major blocks, and views that need a copy."""
    import cupy
    rng = np.random.default_rng(11)
    rows, width, atoms = 301, 9, 7
    src = _rand(rng, (rows, atoms * width), dtype)
    dst = np.full((rows, atoms * width), np.nan, dtype=dtype)
    t = _rand(rng, (width, width), dtype)
    t_dev = cupy.asarray(t, order=order)
    src_d, dst_d = cupy.asarray(src), cupy.asarray(dst)
    view = lambda big, j0, j1: cupy.lib.stride_tricks.as_strided(            # noqa: E731
        big[:, j0 * width:], shape=(j1 - j0, rows, width), strides=(width * big.strides[1], *big.strides))
    hb.gemm_batched(1.0, view(src_d, 2, 6), t_dev, 0.0, view(dst_d, 2, 6))
    hb.gemm_batched(0.5, view(src_d, 2, 6), t_dev, 1.0, view(dst_d, 2, 6))
    got = dst_d.get()
    for j in range(2, 6):
        cols = slice(j * width, (j + 1) * width)
        want = 1.5 * (src[:, cols].astype(np.complex128) @ t.astype(np.complex128))
        assert np.abs(got[:, cols] - want).max() / np.abs(want).max() <= TOL[dtype]
    assert np.isnan(got[:, :2 * width]).all() and np.isnan(got[:, 6 * width:]).all()
    f = cupy.asarray(np.asfortranarray(_rand(rng, (3, 4, 11), dtype))).transpose(0, 2, 1)    # column-major blocks
    _check(cupy, dtype, f, cupy.asarray(t[:4, :5], order=order), 0.0, cupy.full((3, 11, 5), np.nan, dtype=dtype))
    step = cupy.asarray(_rand(rng, (3, 12, 8), dtype))[:, ::2, ::2]                           # copied first
    out = cupy.asarray(_rand(rng, (3, 12, 10), dtype))[:, ::2, ::2]                          # through a block
    _check(cupy, dtype, step, cupy.asarray(t[:4, :5]), -1.0, out)


@pytest.mark.gpu
def test_gpu_wrong_device_or_module():
    import cupy
    a = cupy.ones((2, 3, 4))
    with pytest.raises(TypeError, match="b must be a cupy array like a"):
        hb.gemm_batched(1.0, a, np.ones((4, 5)))
    if cupy.cuda.runtime.getDeviceCount() > 1:
        with cupy.cuda.Device(1):
            b = cupy.ones((4, 5))
        with pytest.raises(ValueError, match="b is on GPU 1, not on the current device 0"):
            hb.gemm_batched(1.0, a, b)


def test_empty_scalars_alpha_zero_and_disjoint_views():
    """An empty c is returned as it is; real-valued complex and numpy scalars work on real data; alpha = 0
    reads neither a nor b (NaN there stays out of c); disjoint strided views of one array are accepted."""
    rng = np.random.default_rng(5)
    empty = np.zeros((2, 3, 0))
    assert hb.gemm_batched(1.0, np.ones((2, 3, 4)), np.ones((4, 0)), 0.0, empty) is empty
    a, b = _rand(rng, (2, 3, 4), np.float64), _rand(rng, (4, 5), np.float64)
    c0 = _rand(rng, (2, 3, 5), np.float64)
    for alpha, beta in ((2 + 0j, 0.5 + 0j), (np.float32(2), np.complex64(0.5)), (np.array(2.0), np.int64(0))):
        c = c0.copy()
        hb.gemm_batched(alpha, a, b, beta, c)
        np.testing.assert_allclose(c, 2 * a @ b + float(np.real(beta)) * c0, rtol=1e-13)
    poisoned = a.copy()
    poisoned[0, 0, 0] = np.nan
    c = c0.copy()
    hb.gemm_batched(0.0, poisoned, b, 1.0, c)
    np.testing.assert_array_equal(c, c0)
    hb.gemm_batched(0.0, poisoned, b, 0.0, c)
    np.testing.assert_array_equal(c, 0.0)
    x = rng.standard_normal((3, 4, 10))
    left = x[:, :, 5:].copy()
    hb.gemm_batched(1.0, x[:, :, 5:], np.eye(5), 0.0, x[:, :, :5])
    np.testing.assert_array_equal(x[:, :, :5], left)


def test_scalars_and_b_refused_with_their_names():
    a, b = np.ones((2, 3, 4)), np.ones((4, 5))
    for alpha in (np.complex64(1j), 1j):
        with pytest.raises(TypeError, match=r"alpha must be real for float64 data, got 1j"):
            hb.gemm_batched(alpha, a, b)
    for beta in (np.array("x"), 10 ** 400, None, np.inf):
        with pytest.raises(TypeError, match="beta must be a finite number, got "):
            hb.gemm_batched(1.0, a, b, beta, np.ones((2, 3, 5)))
    with pytest.raises(TypeError, match="b must be a numpy or cupy array, got NoneType None"):
        hb.gemm_batched(1.0, a, None)
