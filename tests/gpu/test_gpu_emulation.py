"""FP64 products emulated on INT8 tensor cores (Context(emulation="int8"), hybridblas.devices.cuda_ozaki).

Every routine, trans and triangle against the float64 reference, with the emulation forced on small blocks;
bit-for-bit equality with the host arithmetic (hybridblas.ozaki); accuracy against exactly rounded sums beside
cuBLAS's own; k in several INT32 chunks; moduli in several groups; rows far apart in scale; infinities;
several GPUs with host operands; concurrent callers.
"""
import itertools
import threading

import numpy as np
import pytest

import hybridblas as hb
from hybridblas import ozaki, reference
from blas_cases import ROUTINES, call_routine, make_case, random_matrix, trans_choices, triangle_mask
from test_gpu import LAYOUTS, check, to_device

pytestmark = pytest.mark.gpu


@pytest.fixture
def emulated(monkeypatch, count_calls):
    """Emulation on blocks of any size, in small output blocks and strips; counts the emulated products."""
    from hybridblas.devices import cuda_ozaki
    monkeypatch.setattr(cuda_ozaki, "MIN_EDGE", 1)
    monkeypatch.setattr(cuda_ozaki, "MIN_K", dict.fromkeys(cuda_ozaki.MIN_K, 1))
    monkeypatch.setattr(cuda_ozaki, "SUB", 40)
    monkeypatch.setattr(cuda_ozaki, "STRIP", 16)
    return count_calls(cuda_ozaki, "product")   # the emulated products, counted


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("name", list(ROUTINES))
def test_every_routine_matches_the_float64_reference(name, dtype, emulated, rng):
    contexts = {"whole": hb.Context(devices=["cuda:0"], strategy="static", emulation="int8"),
                "tiles": hb.Context(devices=["cuda:0"], strategy="dynamic", block_size=24, emulation="int8")}
    complex_ = np.dtype(dtype).kind == "c"
    for trans, (ctx_name, ctx) in itertools.product(trans_choices(name, dtype), contexts.items()):
        for n, k, beta in ((37, 53, 0.0), (50, 1, -1.3 + (0.6j if complex_ and name not in ("herk", "her2k") else 0))):
            m = n + 3 if name == "gemm" else n
            lower = None if name == "gemm" else bool(rng.integers(2))
            alpha = 0.7 if name == "herk" or not complex_ else 0.7 - 0.4j
            values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m)
            ops = [to_device(v, LAYOUTS[rng.integers(len(LAYOUTS))]) for v in values]
            c = to_device(c0, LAYOUTS[rng.integers(len(LAYOUTS))])
            before = len(emulated)
            out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
            where = f"{name} {''.join(trans)} {ctx_name} n={n} k={k} beta={beta} lower={lower}"
            assert len(emulated) > before, "no emulated product: " + where
            check(name, out, expected, c0, lower, tol / 10, where, alpha, beta, k)
            if lower is not None:        # the other triangle is the caller's, untouched (NaN when beta = 0)
                got, other = out.get(), ~triangle_mask(n, lower)
                np.testing.assert_array_equal(got[other], c0[other], err_msg="other triangle: " + where)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("chunk,work,bits", [(None, None, 54), (32, 1, 54), (None, None, 62)])
def test_bit_for_bit_the_host_arithmetic(dtype, chunk, work, bits, emulated, monkeypatch, rng):
    """The same integers, moduli and reconstruction as hybridblas.ozaki.gemm on the host: equal to the last bit,
    also with k in INT32 chunks of 32, one modulus per group of residue planes and C in panels, and at the most
    bits a Context takes."""
    import cupy
    from hybridblas.devices import cuda_ozaki
    if chunk:
        monkeypatch.setattr(cuda_ozaki, "K_CHUNK", chunk)
        monkeypatch.setattr(cuda_ozaki, "WORK_BYTES", work)
        monkeypatch.setattr(cuda_ozaki, "PANEL_MIN", 8)
    m, k, n = 93, 257, 71
    a = random_matrix(rng, (m, k), dtype) * np.exp(rng.uniform(-20, 20, (m, 1)))
    b = random_matrix(rng, (k, n), dtype) * np.exp(rng.uniform(-20, 20, (1, n)))
    ctx = hb.Context(devices=["cuda:0"], emulation="int8", emulation_bits=bits)
    got = hb.gemm(1.0, cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), context=ctx).get()
    count = ozaki.moduli_for(k, ctx.emulation_bits, np.dtype(dtype).kind == "c")
    host = ozaki.gemm(a, b, n_moduli=count)
    assert emulated
    np.testing.assert_array_equal(got, host)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_as_accurate_as_cublas_against_exact_sums(dtype, rng):
    """n = k = 2048, normal data: sampled entries against the exactly rounded sum; the emulated product's
    largest relative error is at most cuBLAS's FP64 one on the same inputs."""
    import cupy
    from hybridblas import cublas
    from hybridblas.problem import N, Operand
    n = 2048
    a = random_matrix(rng, (n, n), dtype)
    b = random_matrix(rng, (n, n), dtype)
    ad, bd = cupy.asarray(a, order="F"), cupy.asarray(b, order="F")
    ours = hb.gemm(1.0, ad, bd, context=hb.Context(devices=["cuda:0"], emulation="int8")).get()
    native = cupy.zeros((n, n), dtype=dtype, order="F")
    cublas.gemm(cupy.cuda.device.get_cublas_handle(), cupy.cuda.get_current_stream().ptr, native, 1.0,
                Operand(ad, N), Operand(bd, N), 0.0)
    native = native.get()
    rows, cols = rng.integers(0, n, 300), rng.integers(0, n, 300)
    exact = reference.exact_entries(a, b, rows, cols)
    err_ours = np.max(np.abs(ours[rows, cols] - exact) / np.abs(exact))
    err_native = np.max(np.abs(native[rows, cols] - exact) / np.abs(exact))
    print(f"{np.dtype(dtype).name}: max relative error emulated {err_ours:.3e}, cuBLAS {err_native:.3e}")
    assert err_ours <= err_native


def test_rows_far_apart_in_scale_and_infinities(emulated, rng):
    """Rows of A from 1e-200 to 1e200 keep their relative accuracy; a row holding an infinity gives NaN in
    its row of C and nowhere else."""
    import cupy
    m, k, n = 60, 80, 50
    a = rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-200, 200, (m, 1))
    b = rng.standard_normal((k, n))
    ctx = hb.Context(devices=["cuda:0"], emulation="int8")
    got = hb.gemm(1.0, cupy.asarray(a), cupy.asarray(b), context=ctx).get()
    ref = a @ b
    scale = np.abs(a).max(axis=1, keepdims=True) * np.abs(b).sum(axis=0, keepdims=True)
    assert np.max(np.abs(got - ref) / scale) < 5e-15
    a[7, 3] = np.inf
    got = hb.gemm(1.0, cupy.asarray(a), cupy.asarray(b), context=ctx).get()
    assert np.isnan(got[7]).all()
    rest = np.arange(m) != 7
    assert np.max(np.abs(got[rest] - ref[rest]) / scale[rest]) < 5e-15


def test_small_blocks_stay_native(monkeypatch, rng, count_calls):
    """Below MIN_EDGE and MIN_K the product is cuBLAS's own (emulation loses there)."""
    import cupy
    from hybridblas.devices import cuda_ozaki
    calls = count_calls(cuda_ozaki, "product")
    a = cupy.asarray(random_matrix(rng, (cuda_ozaki.MIN_EDGE - 1, cuda_ozaki.MIN_K["c", True] + 5), np.complex128))
    hb.herk(1.0, a, context=hb.Context(devices=["cuda:0"], emulation="int8", min_call_seconds=0))
    assert calls == []


@pytest.mark.multi_gpu
def test_two_gpus_host_operands_through_the_tiles(monkeypatch, rng, count_calls):
    """zherk and zgemm with numpy operands over two GPUs: tiles of at least MIN_EDGE are emulated (any k here)."""
    from hybridblas.devices import cuda_ozaki
    monkeypatch.setattr(cuda_ozaki, "MIN_K", dict.fromkeys(cuda_ozaki.MIN_K, 1))
    n, k = 2 * cuda_ozaki.MIN_EDGE + 301, 1101
    a = random_matrix(rng, (n, k), np.complex128)
    b = random_matrix(rng, (k, n), np.complex128)
    ctx = hb.Context(devices=["cuda:0", "cuda:1"], emulation="int8", min_call_seconds=0, block_size=n // 2 + 1)
    calls = count_calls(cuda_ozaki, "product")
    c = np.full((n, n), np.nan, dtype=np.complex128, order="F")
    hb.herk(1.0, a, 0.0, c, context=ctx, lower=True)
    g = hb.gemm(1.0, a, b, context=ctx)
    assert calls
    low = triangle_mask(n, True)
    ref = a @ a.conj().T
    scale = np.abs(a).max() ** 2 * k
    assert np.max(np.abs(c[low] - ref[low])) < 4e-16 * scale
    assert np.isnan(c[~low]).all()
    assert np.max(np.abs(g - a @ b)) < 4e-16 * scale


def test_concurrent_callers_on_one_gpu(emulated, rng):
    """Four threads, each its own data, all emulated on GPU 0 at once: each gets its own product."""
    import cupy
    ctx = hb.Context(devices=["cuda:0"], emulation="int8")
    cases = [(random_matrix(rng, (150, 170), np.complex128), random_matrix(rng, (170, 130), np.complex128))
             for _ in range(4)]
    results, errors = [None] * 4, []

    def work(t):
        try:
            with cupy.cuda.Device(0):
                a, b = cases[t]
                for _ in range(5):
                    results[t] = hb.gemm(1.0, cupy.asarray(a), cupy.asarray(b), context=ctx).get()
        except Exception as exc:      # reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (a, b), got in zip(cases, results):
        ref = a @ b
        assert np.max(np.abs(got - ref)) < 1e-14 * np.abs(ref).max()


def test_nothing_is_allocated_after_c_is_first_written(emulated, monkeypatch, rng):
    """her2k in several panels (two products into one C): every GPU buffer is taken before the first write into
    C, so running out of memory can only happen while C is untouched (the tile is then computed again)."""
    import cupy
    from hybridblas.devices import cuda_ozaki
    monkeypatch.setattr(cuda_ozaki, "WORK_BYTES", 1)
    monkeypatch.setattr(cuda_ozaki, "PANEL_MIN", 8)
    state = {"written": False, "late": 0}
    rebuild, product = cuda_ozaki._Panel.rebuild, cuda_ozaki.product

    def watched_rebuild(self, *args, **kw):
        state["written"] = True
        return rebuild(self, *args, **kw)

    def watched_product(*args, **kw):
        try:
            return product(*args, **kw)
        finally:
            state["written"] = False
    monkeypatch.setattr(cuda_ozaki._Panel, "rebuild", watched_rebuild)
    monkeypatch.setattr(cuda_ozaki, "product", watched_product)
    pool = cupy.get_default_memory_pool()

    def allocate(size):
        state["late"] += state["written"]
        return pool.malloc(size)
    n, k = 90, 70
    a, b = (random_matrix(rng, (n, k), np.complex128) for _ in range(2))
    c0 = random_matrix(rng, (n, n), np.complex128)
    ctx = hb.Context(devices=["cuda:0"], emulation="int8", sync=True)
    with cupy.cuda.using_allocator(allocate):
        out = hb.her2k(0.7 - 0.4j, cupy.asarray(a), cupy.asarray(b), -1.3, cupy.asarray(c0), context=ctx).get()
    assert state["late"] == 0
    low = triangle_mask(n, True)
    expected = reference.ref_her2k(0.7 - 0.4j, a, b, -1.3, c0, "N", True)
    assert np.max(np.abs(out[low] - expected[low])) < 1e-13 * np.abs(expected).max()


def test_prepared_kernels_are_the_ones_the_products_use(monkeypatch, rng, count_calls):
    """hybridblas.lowlevel.prepare_kernels compiles the emulation's kernels for the moduli counts up to k on a
    background thread; the products then use that module (nothing compiled again)."""
    import cupy
    from hybridblas import lowlevel
    from hybridblas.devices import cuda_ozaki
    monkeypatch.setattr(cuda_ozaki, "_modules", {})
    monkeypatch.setattr(cuda_ozaki, "MIN_EDGE", 1)
    monkeypatch.setattr(cuda_ozaki, "MIN_K", dict.fromkeys(cuda_ozaki.MIN_K, 200))
    calls = count_calls(cuda_ozaki, "product")
    lowlevel.prepare_kernels(np.complex128, [0], emulation_bits=54, k=257).join()
    prepared = {key: v for key, v in cuda_ozaki._modules.items() if isinstance(key, tuple) and key[0] == 0
                and isinstance(key[1], int)}
    count = ozaki.moduli_for(257, 54, True)
    assert (0, count) in prepared
    a = random_matrix(rng, (90, 257), np.complex128)
    b = random_matrix(rng, (257, 70), np.complex128)
    got = hb.gemm(1.0, cupy.asarray(a), cupy.asarray(b),
                  context=hb.Context(devices=["cuda:0"], emulation="int8")).get()
    assert calls
    np.testing.assert_array_equal(got, ozaki.gemm(a, b, n_moduli=count))
    assert all(cuda_ozaki._modules[key] is kernels for key, kernels in prepared.items())
