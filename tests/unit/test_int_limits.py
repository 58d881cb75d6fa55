"""Calls beyond BLAS's 32-bit integers (scipy's cython_blas and cuBLAS take int m, n, k and leading
dimensions): hybridblas.int_limits cuts them into calls that fit, copying a block whose leading dimension
is out of range into a compact buffer, and never hands BLAS a value that would wrap.

Most tests lower the limit (int_limits.INT_MAX) so that small random matrices cross it, and check every
routine against a float64 reference with C poisoned, every integer BLAS received, and that the calls
were really cut. Three tests cross the real limit on sparse arrays (the flops stay tiny): leading
dimensions past 2**31 (0.5 s), and k past 2**31, which reads 16-32 GiB of zero pages (marked slow)."""
import mmap

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import call_routine, layout, make_case, random_matrix, reference_for, triangle_mask
from hybridblas import host_blas, int_limits
from hybridblas.problem import N, Operand

LAYOUTS = ["F", "C", "ld", "C-ld", "step", "neg"]
TRANS = {   # per routine: trans values for complex data (real data takes the same letters)
    "herk": [("N",), ("C",)], "her2k": [("N",), ("C",)], "herkx": [("N",), ("C",)],
    "syrk": [("N",), ("T",)], "syr2k": [("N",), ("T",)],
    "gemm": [("N", "N"), ("T", "C"), ("C", "N")], "gemmt": [("N", "N"), ("C", "T"), ("T", "N")],
}
LIMITS = {   # (INT_MAX, COPY_ELEMENTS): every size over the limit; lds fit but k does not; tiny copies
    "all-over": (7, 1 << 24), "k-over": (40, 1 << 24), "tiny-copies": (7, 12)}
N_, M_, K_ = 13, 11, 50     # C is N_ x N_ (gemm: M_ x N_), inner dimension K_


def _cases():
    for name, transes in TRANS.items():
        for dtype in (np.float64, np.complex128):
            for trans in transes:
                for lower in ([True] if name == "gemm" else [True, False]):
                    for limit in LIMITS:
                        yield pytest.param(name, dtype, trans, lower, limit,
                                           id=f"{name}-{np.dtype(dtype).name}-{''.join(trans)}-{lower}-{limit}")


def _scalars(name, dtype):
    """(alpha, beta) pairs: beta = 0 (C poisoned, never read) and a general one."""
    complex_ = np.dtype(dtype).kind == "c"
    alpha = 0.7 if name == "herk" or not complex_ else 0.7 - 0.4j
    beta = -1.3 if name in ("herk", "her2k", "herkx") or not complex_ else -1.3 + 0.6j
    return [(alpha, 0.0), (alpha, beta)]


@pytest.fixture
def blas_ints(monkeypatch):
    """Every integer handed to the host BLAS in this test (sizes and leading dimensions)."""
    seen = []
    original = host_blas.Args.int

    def record(self, v):
        seen.append(int(v))
        return original(self, v)
    monkeypatch.setattr(host_blas.Args, "int", record)
    return seen


def _lower_limit(monkeypatch, limit):
    int_max, copy = LIMITS[limit]
    monkeypatch.setattr(int_limits, "INT_MAX", int_max)
    monkeypatch.setattr(int_limits, "COPY_ELEMENTS", copy)
    return int_max


def _check(name, out, c, expected, tol, lower, where):
    m, n = expected.shape
    mask = np.ones((m, n), bool) if name == "gemm" else triangle_mask(n, lower)
    got = np.asarray(out)
    assert not np.isnan(got[mask]).any(), "NaN in the computed part: " + where
    err = np.abs(got[mask] - expected[mask]).max()
    assert err <= tol, f"error {err:.3g} > {tol:.3g}: {where}"
    np.testing.assert_array_equal(got[~mask], c[~mask], err_msg="other triangle touched: " + where)


@pytest.mark.parametrize("name,dtype,trans,lower,limit", list(_cases()))
def test_lowered_limit_matches_reference(name, dtype, trans, lower, limit, rng, monkeypatch, blas_ints):
    """Every routine, transposed or not, operands and C in both orders and strided views, on one
    worker and on tiles of two: the float64 reference, and no BLAS integer above the (lowered) limit."""
    int_max = _lower_limit(monkeypatch, limit)
    contexts = {"whole": hb.Context("cpu"),
                "tiles": hb.Context(devices=["cpu", "cpu"], strategy="dynamic", block_size=8)}
    for alpha, beta in _scalars(name, dtype):
        values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, N_, K_, alpha, beta,
                                              M_ if name == "gemm" else None)
        for ctx_name, ctx in contexts.items():
            how = LAYOUTS[rng.integers(len(LAYOUTS))]
            ops = [layout(v, LAYOUTS[rng.integers(len(LAYOUTS))]) for v in values]
            c = layout(c0, how)
            blas_ints.clear()
            out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
            where = f"{ctx_name} alpha={alpha} beta={beta} c-layout={how}"
            assert out is c, where
            _check(name, out, c0, expected, tol, lower, where)
            assert blas_ints and max(blas_ints) <= int_max, f"BLAS got {max(blas_ints)} > {int_max}: {where}"
            for o, v in zip(ops, values):
                np.testing.assert_array_equal(o, v, err_msg="operand modified: " + where)


@pytest.mark.parametrize("kind", ["gemm", "herk", "her2k", "syrk", "syr2k"])
@pytest.mark.parametrize("lower", [True, False])
def test_pieces_fit_and_copies_stay_small(kind, lower, rng, monkeypatch):
    """int_limits directly, with a kernel that records its calls: every piece within INT_MAX, every
    compact copy within COPY_ELEMENTS, k summed with the caller's beta once, C written everywhere asked."""
    monkeypatch.setattr(int_limits, "INT_MAX", 6)
    monkeypatch.setattr(int_limits, "COPY_ELEMENTS", 10)
    n, k = 14, 23
    dtype = np.complex128
    big = np.asfortranarray(random_matrix(rng, (n + 9, k + 4), dtype))    # ld 23 > 6: every block is copied
    x = Operand(big[2:n + 2, 1:k + 1], N)
    y = Operand(np.asfortranarray(random_matrix(rng, (k, n), dtype)), N) if kind == "gemm" else None
    factors = [x] if kind in ("herk", "syrk") else [x, Operand(np.asfortranarray(big[3:n + 3, 2:k + 2]), N)]
    c0 = random_matrix(rng, (n, n), dtype)
    c = np.asfortranarray(c0)
    pieces = []

    def gemm_kernel(out, alpha, xa, ya, beta):
        pieces.append(("gemm", out.shape, xa, ya))
        host_blas._gemm(out, alpha, xa, ya, beta)

    def rank_kernel(kind_, out, lower_, alpha, fs, beta):
        pieces.append(("rank", out.shape, *fs))
        host_blas._rank_k(kind_, out, lower_, alpha, fs, beta)

    alpha, beta = 0.6 - 0.3j if kind in ("her2k", "syr2k", "gemm") else 0.6, -0.8
    if kind == "gemm":
        int_limits.gemm(gemm_kernel, host_blas._SCRATCH, c, alpha, x, y, beta)
        want = reference_for("gemm", alpha, [x.base, y.base], beta, c0, None, ("N", "N"))
        mask = np.ones((n, n), bool)
    else:
        int_limits.rank_k(rank_kernel, gemm_kernel, host_blas._SCRATCH, kind, c, lower, alpha, factors, beta)
        want = reference_for(kind, alpha, [f.base for f in factors], beta, c0, lower, ("N",))
        mask = triangle_mask(n, lower)
    assert len(pieces) > 1
    for piece in pieces:
        for op in piece[2:]:
            assert max(op.base.shape) <= 6 and op.base.size <= 10 and op.scratch
            assert max(piece[1]) <= 6
    np.testing.assert_allclose(c[mask], want[mask], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(c[~mask], c0[~mask])


def test_c_int_refuses_what_would_wrap():
    assert int_limits.c_int(2**31 - 1).value == 2**31 - 1
    with pytest.raises(OverflowError, match="2147483648 does not fit in 32 bits"):
        int_limits.c_int(2**31)


# ------------------------------------------------------------------ the real limit, on sparse arrays

def _sparse_file(tmp_path, name, shape, dtype=np.float64):
    """A C-ordered np.memmap on a sparse file: pages that are never written cost no disk or memory."""
    return np.memmap(tmp_path / name, dtype=dtype, mode="w+", shape=shape)


def test_leading_dimension_beyond_int32(tmp_path, rng, blas_ints):
    """Rows of a (2, 2**31 + 8) C-ordered array are 2**31 + 8 elements apart: as BLAS operands and as C
    they are copied into compact blocks first, and no leading dimension above 2**31 - 1 reaches BLAS."""
    wide = 2**31 + 8
    src = _sparse_file(tmp_path, "a", (2, wide))
    out = _sparse_file(tmp_path, "c", (3, wide))
    a = src[:, :7]
    a[...] = rng.standard_normal((2, 7))
    ref = np.array(a)
    ctx = hb.Context("cpu")

    c = out[:2, :2]
    c[...] = np.nan
    got = hb.syrk(1.3, a, 0.0, c, context=ctx)
    assert got is c
    np.testing.assert_allclose(np.tril(c), np.tril(1.3 * ref @ ref.T), rtol=1e-13)
    assert np.isnan(c[0, 1])                                     # the upper triangle stays as it was

    b = src[:, 100:103]
    b[...] = rng.standard_normal((2, 3))
    c = out[:, 200:207]                                          # 3 x 7, rows 2**31 + 8 elements apart
    c0 = rng.standard_normal((3, 7))
    c[...] = c0
    hb.gemm(0.5, b, a, -2.0, c, transa="T", context=ctx)
    np.testing.assert_allclose(c, 0.5 * np.array(b).T @ ref - 2.0 * c0, rtol=1e-13)
    assert blas_ints and max(blas_ints) < 2**31


def _sparse_anonymous(rows, cols, dtype):
    """A writable (rows, cols) array on untouched anonymous memory: reads see zero pages, so a huge array
    costs only the pages written (Linux; MAP_NORESERVE keeps the kernel from reserving it)."""
    nbytes = rows * cols * np.dtype(dtype).itemsize
    try:
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, AttributeError) as exc:
        pytest.skip(f"cannot map {nbytes} bytes of sparse anonymous memory here: {exc}")
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)       # reads of untouched memory see the huge zero page: fast
    return np.frombuffer(buf, dtype=dtype).reshape(rows, cols)


def _rows_around_the_limit(x, rng):
    """Random values in a few rows: the first, those around 2**31 and the last ones; returns them."""
    rows = np.r_[0:3, 2**31 - 3:2**31 + 3, x.shape[0] - 3:x.shape[0]]
    x[rows] = rng.standard_normal((len(rows), x.shape[1]))
    return np.array(x[rows])


@pytest.mark.slow
def test_k_beyond_int32(rng, blas_ints):
    """syrk of a (2**31 + 8) x 1 operand (k past 2**31 - 1; 5-8 s on 2 cores, hence slow): the sum over every
    row, k cut into two calls, not the zeros and "illegal value" that one wrapped call gives."""
    a = _sparse_anonymous(2**31 + 8, 1, np.float64)
    used = _rows_around_the_limit(a, rng)
    c = np.full((1, 1), np.nan)
    hb.syrk(1.0, a, 0.0, c, trans="T", context=hb.Context("cpu"))
    np.testing.assert_allclose(c, used.T @ used, rtol=1e-13)
    assert max(blas_ints) < 2**31


@pytest.mark.slow
def test_memmap_syrk_beyond_int32(tmp_path, rng, blas_ints):
    """The reported case: syrk(1.0, a, trans='T') with a of shape (2**31 + 8, 2), a memmap (32 GiB
    sparse file; reading it takes minutes, hence slow)."""
    a = _sparse_file(tmp_path, "tall", (2**31 + 8, 2))
    used = _rows_around_the_limit(a, rng)
    c = hb.syrk(1.0, a, trans="T", context=hb.Context("cpu"))
    want = used.T @ used
    np.testing.assert_allclose(np.tril(c), np.tril(want), rtol=1e-13)
    assert max(blas_ints) < 2**31


# ------------------------------------------------------------------ cuBLAS

@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,trans,lower,limit",
                         [p for p in _cases() if p.values[4] != "k-over"] +
                         [pytest.param("syrk", np.float32, ("T",), True, "all-over", id="syrk-float32-chunks"),
                          pytest.param("gemm", np.float32, ("C", "N"), None, "all-over", id="gemm-float32-chunks")])
def test_lowered_limit_cublas(name, dtype, trans, lower, limit, rng, monkeypatch):
    """The same on cupy arrays: one GPU on the caller's stream (small C; float32 sums k in strided-batched
    chunks, here with k past one chunk) and tiles on device streams."""
    import cupy
    from hybridblas.devices.cuda import CUDADevice
    _lower_limit(monkeypatch, limit)
    k = 1100 if np.dtype(dtype) == np.float32 else K_      # float32: more than two 512-term chunks
    contexts = {"inline": hb.Context(devices=["cuda:0"]),
                "tiles": hb.Context(devices=[CUDADevice(0, block=8)], strategy="static")}
    for alpha, beta in _scalars(name, dtype):
        values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, N_, k, alpha, beta,
                                              M_ if name == "gemm" else None)
        for ctx_name, ctx in contexts.items():
            how = ["F", "C"][rng.integers(2)]
            ops = [cupy.asarray(v, order=["F", "C"][rng.integers(2)]) for v in values]
            c = cupy.asarray(c0, order=how)
            out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
            cupy.cuda.Device().synchronize()
            assert out is c
            _check(name, cupy.asnumpy(out), c0, expected, tol, lower, f"{ctx_name} beta={beta} c-layout={how}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["herkx", "syrkx"])
@pytest.mark.parametrize("lower", [True, False])
def test_cublas_rank_kx_lowered_limit(kind, lower, rng, monkeypatch):
    """cublas.rank_kx (herkx/syrkx) cut by int_limits: the triangle of alpha A B^H (^T) + beta C."""
    import cupy
    from hybridblas import cublas
    monkeypatch.setattr(int_limits, "INT_MAX", 5)
    n, k = 13, 17
    a = random_matrix(rng, (n, k), np.complex128)
    b = random_matrix(rng, (n, k), np.complex128)
    c0 = random_matrix(rng, (n, n), np.complex128)
    c = cupy.asarray(c0, order="F")
    alpha, beta = 0.6 - 0.2j, 0.9
    stream = cupy.cuda.get_current_stream()
    cublas.rank_kx(cupy.cuda.device.get_cublas_handle(), stream.ptr, kind, c, lower, 0, alpha,
                   cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), beta)
    stream.synchronize()
    want = alpha * a @ (b.conj() if kind == "herkx" else b).T + beta * c0
    if kind == "herkx":             # cuBLAS's herkx leaves a Hermitian C: its diagonal is made real
        np.fill_diagonal(want, want.diagonal().real)
    mask = triangle_mask(n, lower)
    got = cupy.asnumpy(c)
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[~mask], c0[~mask])
