"""The BLAS contract with GPU contexts (marked ``gpu``; skipped where no GPU is present).

Every routine x dtype x uplo x trans, sizes 0/1/odd/larger than a tile, strided and both memory orders,
numpy and cupy operands, static and dynamic (with the CPU beside the GPU), out-of-core (capped device
memory), and a cupy pool that runs dry. Compared with a float64 reference on random data, C poisoned.
"""
import contextlib
import gc
import itertools

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import (call_routine, contract_cases, layout, make_case, operand_shape, random_matrix, reference_for,
                        tolerance, triangle_mask)

pytestmark = pytest.mark.gpu

SIZES = [(0, 3), (1, 1), (5, 7), (37, 19)]
LAYOUTS = ["F", "C", "ld", "C-ld", "step", "neg"]


def _cuda(index=0, **kw):
    from hybridblas.devices.cuda import CUDADevice
    return CUDADevice(index, **kw)


def _contexts():
    return {
        "gpu-static-tiles": hb.Context(devices=[_cuda(block=8)], strategy="static"),
        "gpu-whole": hb.Context(devices=["cuda:0"], strategy="static"),
        "cpu+gpu-dynamic": hb.Context(devices=["cpu", _cuda(block=8)], strategy="dynamic", block_size=8,
                                      cpu_min_share=0.0, rates={"cpu": 1.0, "cuda:0": 3.0}),
        "gpu-out-of-core": hb.Context(devices=[_cuda()], strategy="static", memory_limit=24 * 1024),
        "gpu-pinned-host": hb.Context(devices=[_cuda(block=8)], strategy="dynamic"),
    }


@contextlib.contextmanager
def _pin_everything(on):
    """Page-lock host operands of any size (normally only >= 256 MiB), so small cases take the DMA path."""
    from hybridblas import host_pinning
    old = host_pinning.PIN_MIN_BYTES
    host_pinning.PIN_MIN_BYTES = 0 if on else old
    try:
        yield
    finally:
        host_pinning.PIN_MIN_BYTES = old


def to_device(x, how):
    """The same values as a cupy array in layout ``how`` (strided views of a larger device buffer)."""
    import cupy
    host = layout(x, how)
    if how in ("F", "C"):
        return cupy.asarray(host, order=how)
    r, q = x.shape
    if how == "ld":
        big = cupy.full((r + 3, q + 2), np.nan, dtype=x.dtype, order="F")
        big[1:r + 1, 2:q + 2] = cupy.asarray(x)
        return big[1:r + 1, 2:q + 2]
    if how == "C-ld":
        big = cupy.full((r + 2, q + 5), np.nan, dtype=x.dtype)
        big[:r, 3:q + 3] = cupy.asarray(x)
        return big[:r, 3:q + 3]
    if how == "step":
        big = cupy.full((2 * r + 1, 3 * q + 1), np.nan, dtype=x.dtype)
        big[1::2, ::3][:r, :q] = cupy.asarray(x)
        return big[1::2, ::3][:r, :q]
    return cupy.asarray(np.array(x))[::-1, ::-1].copy()[::-1, ::-1]


def _host(x):
    return x if isinstance(x, np.ndarray) else x.get()


def _alpha_beta(name, dtype):
    complex_ = np.dtype(dtype).kind == "c"
    a = 0.7 if (name == "herk" or not complex_) else 0.7 - 0.4j
    b = -1.3 if (name in ("herk", "her2k") or not complex_) else -1.3 + 0.6j
    return [(a, b), (a, 0.0), (0.0, b)]


def check(name, out, expected, c0, lower, tol, where, alpha, beta, k):
    m, n = c0.shape
    got = _host(out)
    mask = np.ones((m, n), bool) if name == "gemm" else triangle_mask(n, lower)
    assert not np.isnan(got[mask]).any(), "NaN in the computed part: " + where
    err = np.abs(got[mask] - expected[mask]).max(initial=0.0)
    assert err <= tol, f"error {err:.3g} > {tol:.3g}: {where}"
    np.testing.assert_array_equal(got[~mask], c0[~mask], err_msg="other triangle touched: " + where)
    if name in ("herk", "her2k") and np.iscomplexobj(got) and not ((alpha == 0 or k == 0) and beta == 1):
        assert (np.diagonal(got).imag == 0).all(), "diagonal not exactly real: " + where


@pytest.mark.parametrize("name,dtype,trans,lower", list(contract_cases()))
@pytest.mark.parametrize("where", ["either", "cupy operands, numpy C"])
def test_gpu_contract_sweep(name, dtype, trans, lower, where, rng):
    """Every routine on every context, operands and C both numpy or both cupy (drawn at random per call), or
    the operands cupy and C numpy: C written where it lives (any layout), the other triangle and the operands
    untouched (a CPU worker cannot read cupy operands and sits those calls out)."""
    contexts = _contexts()
    for (n, k), (alpha, beta) in itertools.product(SIZES, _alpha_beta(name, dtype)):
        m = n + 2 if name == "gemm" else n
        values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m)
        for ctx_name, ctx in contexts.items():
            if where == "either":
                on_gpu = ctx_name != "cpu+gpu-dynamic" and bool(rng.integers(2))
                put_ops = put_c = to_device if on_gpu else layout
                label = "cupy" if on_gpu else "numpy"
            else:
                put_ops, put_c, label = to_device, layout, where
            how = LAYOUTS[rng.integers(len(LAYOUTS))]
            ops = [put_ops(v, LAYOUTS[rng.integers(len(LAYOUTS))]) for v in values]
            c = put_c(c0, how)
            with _pin_everything(ctx_name == "gpu-pinned-host"):
                out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
            at = f"{ctx_name} {label} n={n} k={k} alpha={alpha} beta={beta} c={how}"
            assert out is c, at
            for o, v in zip(ops, values):
                np.testing.assert_array_equal(_host(o), v, err_msg="operand modified: " + at)
            check(name, out, expected, c0, lower, tol, at, alpha, beta, k)


def test_a_gpu_c_with_host_operands_is_refused(rng):
    import cupy
    a = random_matrix(rng, (6, 4), np.complex128)
    c = cupy.zeros((6, 6), np.complex128)
    with pytest.raises(TypeError, match="C may be on the host with the operands on a GPU"):
        hb.herk(1.0, a, 0.0, c, context=hb.Context(devices=["cuda:0"]))
    assert not c.any()


@pytest.mark.parametrize("name", ["herk", "her2k", "gemmt", "syr2k", "gemm"])
@pytest.mark.parametrize("where", ["numpy", "cupy", "cupy operands, numpy C"])
def test_out_of_core_long_k(name, where, rng):
    """A, B and C several times the capped memory: k is chunked, panels evicted and fetched again."""
    import cupy
    dtype = np.complex128
    n, k = 150, 700
    trans = ("C", "N") if name == "gemmt" else (("T", "N") if name == "gemm" else ("N",))
    n_ops = 1 if name == "herk" else 2
    if name in ("gemm", "gemmt"):
        shapes = [operand_shape(trans[0], n, k), operand_shape(trans[1], k, n)]
    else:
        shapes = [(n, k)] * n_ops
    values = [random_matrix(rng, s, dtype) for s in shapes]
    c0 = random_matrix(rng, (n, n), dtype)
    alpha, beta = (0.5 if name == "herk" else 0.5 + 0.25j), (0.75 if name in ("herk", "her2k") else 0.5 - 1j)
    expected = reference_for(name, alpha, values, beta, c0, True, trans)
    limit = 200 * 1024            # operands + C are ~5 MB
    dev = _cuda(memory_limit=limit)
    ctx = hb.Context(devices=[dev], strategy="static")
    put = (lambda v: cupy.asarray(v, order="F")) if where != "numpy" else (lambda v: np.asfortranarray(v))
    c = np.asfortranarray(c0) if where == "cupy operands, numpy C" else put(c0)
    out = call_routine(name, alpha, [put(v) for v in values], beta, c, trans, True, ctx)
    tol = tolerance(dtype, k, alpha, values, beta, c0)
    check(name, out, expected, c0, True, tol, f"out-of-core {name} {where}", alpha, beta, k)


@pytest.mark.parametrize("where", ["numpy", "cupy"])
def test_pool_exhaustion_shrinks_blocks(where, rng):
    """cupy's pool limit far below what the run believes it may use: it must shrink or fall back, not fail."""
    import cupy
    pool = cupy.get_default_memory_pool()
    dtype = np.complex128
    n, k = 300, 200
    a = random_matrix(rng, (n, k), dtype)
    b = random_matrix(rng, (n, k), dtype)
    c0 = random_matrix(rng, (n, n), dtype)
    expected = reference_for("her2k", 0.3 + 0.1j, [a, b], 0.5, c0, False, ("N",))
    args = [cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), cupy.asarray(c0, order="F")] \
        if where == "cupy" else [a, b, np.asfortranarray(c0)]
    pool.free_all_blocks()
    old = pool.get_limit()
    pool.set_limit(size=pool.used_bytes() + 600 * 1024)
    try:
        ctx = hb.Context(devices=[_cuda(memory_limit=1 << 30)], strategy="static")
        out = hb.her2k(0.3 + 0.1j, args[0], args[1], 0.5, args[2], lower=False, context=ctx)
    finally:
        pool.set_limit(size=old)
    tol = tolerance(dtype, k, 0.3, [a, b], 0.5, c0)
    check("her2k", out, expected, c0, False, tol, f"pool exhaustion {where}", 0.3, 0.5, k)


def test_split_k_on_gpu(rng):
    """Tall-skinny Gram products: split-K on the GPU and the CPU, partials reduced on C's side."""
    import cupy
    a = random_matrix(rng, (5000, 40), np.complex128)
    c0 = random_matrix(rng, (40, 40), np.complex128)
    want = reference_for("herk", 1.0, [a], 0.5, c0, True, ("C",))
    ctx = hb.Context(devices=["cpu", "cuda:0"], strategy="static", cpu_min_share=0.0, min_call_seconds=0)
    for put in (np.asfortranarray, lambda v: cupy.asarray(v, order="F")):
        out = hb.herk(1.0, put(a), 0.5, put(c0.copy()), trans="C", lower=True,
                      context=ctx if put is np.asfortranarray else hb.Context("gpu", min_call_seconds=0))
        check("herk", out, want, c0, True, tolerance(np.complex128, 5000, 1.0, [a], 0.5, c0), "split-k", 1.0, 0.5, 5000)


def test_default_context_uses_gpu_and_cupy_stays_on_device(rng):
    import cupy
    a = cupy.asarray(random_matrix(rng, (64, 33), np.complex128))
    c = hb.herk(1.0, a)                       # default context: every device that accepts cupy data
    assert isinstance(c, cupy.ndarray) and c.device.id == a.device.id
    want = reference_for("herk", 1.0, [a.get()], 0.0, np.zeros((64, 64)), True, ("N",))
    np.testing.assert_allclose(np.tril(c.get()), np.tril(want), atol=1e-10)


def test_cpu_dropped_beside_gpus_when_it_does_not_pay():
    from hybridblas.policy import without_idle_cpus
    ctx = hb.Context(devices=["cpu", "cuda:0"])
    devs = ctx.devices
    kept, rates = without_idle_cpus(devs, [1e9, 50e12], 0.05)
    assert [d.name for d in kept] == ["cuda:0"]
    kept, _ = without_idle_cpus(devs, [10e12, 50e12], 0.05)
    assert len(kept) == 2


def test_peers_match_reference(rng):
    """The benchmark peers compute what they claim (device cuBLAS and cuBLASXt on host arrays)."""
    import cupy
    from hybridblas import peers
    n, k = 300, 170
    a = np.asfortranarray(random_matrix(rng, (k, n), np.complex128))
    b = np.asfortranarray(random_matrix(rng, (k, n), np.complex128))
    c0 = np.asfortranarray(random_matrix(rng, (n, n), np.complex128))
    tol = tolerance(np.complex128, k, 1.0, [a, b], 0.5, c0)
    mask = triangle_mask(n, True)
    cases = [("herk", [a], reference_for("herk", 1.0, [a], 0.5, c0, True, ("C",))),
             ("her2k", [a, b], reference_for("her2k", 1.0, [a, b], 0.5, c0, True, ("C",))),
             ("herkx", [a, b], reference_for("herkx", 1.0, [a, b], 0.5, c0, True, ("C",)))]
    for name, ops, want in cases:
        c = c0.copy(order="F")
        getattr(peers, f"cublasxt_{name}")(1.0, *ops, 0.5, c, trans="C", lower=True, devices=(0,))
        if name == "herkx":      # herkx assumes a Hermitian result: cuBLAS(Xt) zeroes the diagonal's imaginary part
            want = want.copy()
            np.fill_diagonal(want, want.diagonal().real)
        assert np.abs(c[mask] - want[mask]).max() <= tol, f"cublasxt_{name}"
        for pinning in (True,):
            c = c0.copy(order="F")
            getattr(peers, f"cublasxt_{name}")(1.0, *ops, 0.5, c, trans="C", lower=True, devices=(0,),
                                               pinning=pinning, block_dim=128)
            assert np.abs(c[mask] - want[mask]).max() <= tol, f"cublasxt_{name} pinned"
        cd = cupy.asarray(c0, order="F")
        getattr(peers, f"cublas_device_{name}")(1.0, *[cupy.asarray(o, order="F") for o in ops], 0.5, cd,
                                                trans="C", lower=True)
        assert np.abs(cd.get()[mask] - want[mask]).max() <= tol, f"cublas_device_{name}"


@pytest.mark.parametrize("name", ["herk", "gemmt"])
def test_large_host_operands_are_pinned_while_they_live(name, rng):
    from hybridblas import host_pinning
    host_pinning.clear()
    n, k = 256, 131072 + 7                       # each factor just over 256 MiB: the pinning threshold
    a = rng.standard_normal((n, k))
    b = rng.standard_normal((k, n)) if name == "gemmt" else None
    c0 = rng.standard_normal((n, n))
    outs = {}
    # unpinned; first pinned call (staged while the lock is taken); a call with the operands locked
    for label, pin in (("ring", False), ("first", True), ("locked", True)):
        ctx = hb.Context(devices=["cuda:0"], strategy="dynamic", block_size=96, pin_host=pin)
        c = c0.copy(order="F")
        if name == "herk":
            outs[label] = hb.syrk(0.5, a, beta=-1.0, c=c, lower=True, context=ctx)
        else:
            outs[label] = hb.gemmt(0.5, a, b, beta=-1.0, c=c, lower=True, context=ctx)
        host_pinning.wait_ready()
        if pin:
            assert host_pinning.pinned_bytes() >= a.nbytes
    want = 0.5 * (a @ a.T if name == "herk" else a @ b) - c0
    low = np.tril(np.ones((n, n), bool))
    for label, got in outs.items():
        assert np.abs(got[low] - want[low]).max() <= 1e-9 * np.abs(want).max(), label
        np.testing.assert_array_equal(got[~low], c0[~low])
        np.testing.assert_array_equal(got[low], outs["ring"][low])
    del a, b
    gc.collect()
    assert host_pinning.pinned_bytes() == 0          # freed arrays were unregistered first


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_single_precision_long_k_gram_is_as_accurate_as_cpu_blas(dtype, rng):
    """LOBPCG's Gram matrices: 24 columns, k ~ 3e4, float32. The GPU result must not be worse than
    a float32 gemm by much (cuBLAS's ssyrk summing all of k in one accumulator was ~10x worse)."""
    import cupy
    x = random_matrix(rng, (28503, 24), dtype) + 0.5
    ref = (x.astype(np.complex128).conj().T @ x.astype(np.complex128))
    scale = np.abs(ref).max()
    xd = cupy.asarray(x)
    ours = hb.herk(1.0, xd, trans="C", context=hb.Context(devices=["cuda:0"])).get() if np.iscomplexobj(x) \
        else hb.syrk(1.0, xd, trans="T", context=hb.Context(devices=["cuda:0"])).get()
    gemm = (xd.conj().T @ xd).get()
    low = np.tril(np.ones((24, 24), bool))
    err_ours = np.abs(ours[low] - ref[low]).max() / scale
    err_gemm = np.abs(gemm[low] - ref[low]).max() / scale
    assert err_ours <= max(3 * err_gemm, 1e-6), (err_ours, err_gemm)


def test_auto_pinning_locks_an_operand_on_its_second_call(rng):
    from hybridblas import host_pinning
    host_pinning.clear()
    a = rng.standard_normal((256, 131072 + 7))      # just over the 256 MiB threshold
    ctx = hb.Context(devices=["cuda:0"], strategy="dynamic", block_size=128)   # pin_host="auto"
    first = hb.syrk(1.0, a, context=ctx)
    host_pinning.wait_ready()
    assert host_pinning.pinned_bytes() == 0 and host_pinning.times_seen(a) == 1
    second = hb.syrk(1.0, a, context=ctx)
    host_pinning.wait_ready()
    assert host_pinning.pinned_bytes() >= a.nbytes
    third = hb.syrk(1.0, a, context=ctx)             # read by DMA
    low = np.tril(np.ones((256, 256), bool))
    np.testing.assert_array_equal(second[low], first[low])
    np.testing.assert_array_equal(third[low], first[low])
    del a
    gc.collect()
    assert host_pinning.pinned_bytes() == 0
