"""Host operands by bands (devices.cuda_bands) on one GPU and on every GPU: each routine, triangle, layout and
beta against float64 references with C poisoned where beta = 0, the other triangle untouched; page-locked and
staged host memory; concurrent callers; a GPU that fails mid-call; out of GPU memory going to the tiles; parts of
the last blocks handed between GPUs (band_tail), with a fault on either side."""
import threading
import time
import warnings

import numpy as np
import pytest

import hybridblas as hb
from hybridblas import host_pinning
from hybridblas.devices import cuda_bands
from blas_cases import call_routine, layout, make_case, triangle_mask
from test_gpu import check

CASES = [("herk", np.complex128, ("N",)), ("herk", np.complex128, ("C",)), ("her2k", np.complex128, ("N",)),
         ("her2k", np.complex128, ("C",)), ("syrk", np.float64, ("T",)), ("syr2k", np.complex128, ("N",)),
         ("gemmt", np.complex128, ("C", "N")), ("gemmt", np.complex128, ("N", "T")),
         ("gemmt", np.float64, ("T", "N")), ("gemm", np.complex128, ("N", "C")), ("gemm", np.float64, ("T", "N"))]


def _gpus():
    import cupy
    from hybridblas.devices.cuda import CUDADevice
    return [CUDADevice(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def _bands_always(monkeypatch):
    """Bands also where the uploads dominate and on one GPU (the rules that would send a call to the tiles)."""
    monkeypatch.setattr(cuda_bands, "UPLOAD_SHARE", float("inf"))
    monkeypatch.setattr(cuda_bands, "SHARED_SHARE", float("inf"))
    monkeypatch.setattr(cuda_bands, "ONE_GPU_MODEL", float("inf"))


@pytest.fixture(params=["k", "outer", "outer-steps"])    # (ORDERS)
def small_units(request, monkeypatch):
    """Units of a few hundred kB, so that a small call has many pieces, several steps and blocks; each test
    in the k order, in the outer order from k = 0, and in the outer order after steps along k (a triangle
    with beta = 0: others go by the k order)."""
    from hybridblas import band_outer, band_plan
    monkeypatch.setattr(band_plan, "UNIT_BYTES", 256 << 10)
    monkeypatch.setattr(band_plan, "UNIT_K", 0)
    monkeypatch.setattr(band_outer, "CORNER_FIRST", 64)         # gemmt's corner order in many strips
    monkeypatch.setattr(band_plan, "STEP_K", 128)
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)     # small operands page-locked too (pin_host=True)
    _bands_always(monkeypatch)
    order = request.param

    def forced(problem, rates, writeback_rate, upload_rate, shared=True, speeds=None, mixes=None, sms=None,
               ahead=None):
        lay = band_plan.BandLayout(problem, rates, writeback_rate, upload_rate, shared=shared, speeds=speeds,
                                   mixes=mixes, sms=sms)
        if order == "k" or not problem.triangular or problem.beta != 0:
            return lay
        start = lay.units[len(lay.units) // 2][0] if order == "outer-steps" else 0
        return band_plan.BandLayout(problem, rates, writeback_rate, upload_rate, shared=shared, speeds=speeds,
                                    order="outer", blocks=5, final_start=start, mixes=mixes, sms=sms)
    monkeypatch.setattr(cuda_bands, "layout_for", forced)


def _path(ctx):
    from hybridblas.devices.cuda import last_stats
    return {last_stats.get(d.name, {}).get("path") for d in ctx.devices}


def _run(name, dtype, trans, lower, beta, ctx, rng, n=517, k=301, how_c="F", how_ops="F"):
    alpha = 0.75 if name in ("herk", "syrk") else 0.5 - 0.25j if np.dtype(dtype).kind == "c" else -0.5
    if name == "gemm":
        lower = None
    m = n + 7 if name == "gemm" else n
    values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m)
    ops = [layout(v, how_ops) for v in values]
    c = layout(c0, how_c)
    before = [o.copy() for o in ops]
    out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
    assert out is c
    check(name, out, expected, c0, True if lower is None else lower, tol, f"{name} {trans} {how_c}", alpha,
          beta, k)
    for o, b in zip(ops, before):
        np.testing.assert_array_equal(o, b, err_msg="an operand changed")


ORDERS = ["k", "outer", "outer-steps"]
# the outer order applies to triangles with beta = 0; other calls are run once, in the k order
REFERENCE = [(name, dtype, trans, beta, order) for name, dtype, trans in CASES for beta in (0.0, 0.5)
             for order in (ORDERS if name != "gemm" and beta == 0 else ORDERS[:1])]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,trans,beta,small_units", REFERENCE, indirect=["small_units"])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("gpus", ["one", "all"])
def test_bands_match_the_reference(name, dtype, trans, lower, beta, gpus, small_units, rng):
    devices = _gpus()[:1] if gpus == "one" else _gpus()
    if name == "gemmt" and dtype == np.complex128 and beta:
        beta = 0.5 + 0.25j               # a complex beta on gemmt (herkx takes a real one: added on the GPU)
    ctx = hb.Context(devices=devices, min_call_seconds=0, pin_host=True)
    _run(name, dtype, trans, lower, beta, ctx, rng)
    assert _path(ctx) == {"bands"}
    host_pinning.wait_ready()
    _run(name, dtype, trans, lower, beta, ctx, rng)      # page-locked by now: DMA both ways
    assert _path(ctx) == {"bands"}
    _products_cover(ctx, 517 + 7 if name == "gemm" else 517, 517, 301, name != "gemm")


def _products_cover(ctx, m, n, k, triangular):
    """The call's products (last_stats, each with its block of C and k range) add up to all of C over all of k,
    each with a time."""
    from hybridblas.devices.cuda import last_stats
    products = [x for d in ctx.devices for x in last_stats[d.name]["products"]]
    cells = sum(((i1 - i0) * (i1 - i0 + 1) // 2 if diag else (i1 - i0) * (j1 - j0)) * (k1 - k0)
                for i0, i1, j0, j1, k0, k1, diag, _t in products)
    assert cells == (n * (n + 1) // 2 if triangular else m * n) * k
    assert all(t > 0 for *_, t in products)


@pytest.mark.gpu
@pytest.mark.parametrize("how_c,how_ops", [("C", "F"), ("ld", "C-ld"), ("step", "ld"), ("C-ld", "step")])
@pytest.mark.parametrize("pin", [False, True])
def test_bands_layouts_and_staging(how_c, how_ops, pin, small_units, rng):
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0, pin_host=pin)
    for name, dtype, trans in [("herk", np.complex128, ("C",)), ("gemmt", np.complex128, ("C", "N")),
                               ("gemm", np.float64, ("N", "T"))]:
        for beta in (0.0, 0.5):
            _run(name, dtype, trans, False, beta, ctx, rng, n=389, k=211, how_c=how_c, how_ops=how_ops)
            assert _path(ctx) == {"bands"}


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1, 1), (1, 700), (2, 3), (65, 1), (130, 4099)])
def test_bands_edge_sizes(n, k, small_units, rng):
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0)
    for name, dtype, trans in [("herk", np.complex128, ("N",)), ("her2k", np.complex128, ("C",)),
                               ("gemm", np.complex128, ("C", "N"))]:
        _run(name, dtype, trans, True, 0.5, ctx, rng, n=n, k=k)


@pytest.mark.gpu
def test_bands_same_array_twice(small_units, rng):
    """her2k(a, a): one factor uploaded once, read as both."""
    a = rng.standard_normal((400, 300)) + 1j * rng.standard_normal((400, 300))
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0)
    c = hb.her2k(1.0, a, a, context=ctx)
    want = 2 * (a @ a.conj().T)
    low = np.tril(np.ones((400, 400), bool))
    assert np.abs(c[low] - want[low]).max() <= 1e-12 * np.abs(want).max()
    assert _path(ctx) == {"bands"}


def _exact_under_threads(cases, call, rounds):
    """``call(*case)`` ``rounds`` times in a thread of its own per case, each time (C, the exact product): the errors
    (a relative error of C's lower triangle of 1e-13 or more, or what raised)."""
    errors = []

    def one(case):
        try:
            for _ in range(rounds):
                c, want = call(*case)
                low = np.tril(np.ones(c.shape, bool))
                err = np.abs(c[low] - want[low]).max() / np.abs(want).max()
                if not err < 1e-13:
                    errors.append(err)
        except Exception as exc:              # noqa: BLE001 - reported by the caller
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(case,)) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.gpu
def test_bands_concurrent_callers(small_units, rng):
    """Eight threads, each its own operands and C, share one Context of every GPU: every result exact."""
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0)
    cases = [(rng.standard_normal((300 + 17 * i, 250)) + 1j * rng.standard_normal((300 + 17 * i, 250)),)
             for i in range(8)]

    def herk(a):
        c = np.full((a.shape[0], a.shape[0]), np.nan + 0j, order="F")
        return hb.herk(1.0, a, 0.0, c, context=ctx), a @ a.conj().T
    assert not _exact_under_threads(cases, herk, 4)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("after", [0, 3])
def test_bands_fault_on_one_gpu(beta, after, small_units, rng):
    name, trans = "her2k", ("N",)
    values, c0, expected, tol = make_case(rng, name, np.complex128, trans, True, 600, 400, 0.5 - 0.25j, beta)
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0)
    c = np.array(c0, order="F")
    with hb.testing.inject_fault(ctx, 1, after_tiles=after) as fault:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = call_routine(name, 0.5 - 0.25j, values, beta, c, trans, True, ctx)
    assert fault.fired
    assert [w for w in seen if issubclass(w.category, hb.DeviceFailureWarning)]
    assert list(ctx.failed) == ["cuda:1"]
    mask = triangle_mask(600, True)
    assert np.abs(out[mask] - expected[mask]).max() <= tol
    np.testing.assert_array_equal(out[~mask], c0[~mask])


@pytest.fixture
def forced_parts(monkeypatch):
    """GPU 0 taken as far behind at each of its last blocks (band_tail.Balance.split told so once another GPU has
    reported when it ends), so it hands the most of their k it may to the GPU free first; the others never give."""
    from hybridblas import band_tail
    split = band_tail.Balance.split

    def forced(self, g, now, left, block, cost, k0, k1, align, after=0.0):
        if g != 0:                      # the others only take
            self.ends[g] = now + left
            return None
        deadline = time.perf_counter() + 5.0
        while all(e is None for t, e in enumerate(self.ends) if t != g) and time.perf_counter() < deadline:
            time.sleep(1e-3)
        return split(self, g, now, left + 10.0, block, cost, k0, k1, align)     # what a split adds not counted
    monkeypatch.setattr(band_tail.Balance, "split", forced)
    monkeypatch.setattr(band_tail, "MIN_MOVE", 0.0)


PART_CASES = [("gemmt", np.complex128, ("C", "N")), ("gemmt", np.complex128, ("N", "T")),
              ("gemmt", np.float64, ("T", "N")), ("herk", np.complex128, ("N",)), ("her2k", np.complex128, ("C",)),
              ("syrk", np.float64, ("T",)), ("syr2k", np.complex128, ("N",))]


@pytest.mark.multi_gpu
@pytest.mark.parametrize("name,dtype,trans", PART_CASES)
@pytest.mark.parametrize("lower", [True, False])
def test_parts_of_the_last_blocks_handed_between_gpus(name, dtype, trans, lower, small_units, forced_parts, rng):
    """Staged, then page-locked: GPU 0 gives parts, GPU 1 takes them, C matches the reference and the products of
    both add up to all of C over all of k."""
    from hybridblas.devices.cuda import last_stats
    ctx = hb.Context(devices=_gpus()[:2], min_call_seconds=0, pin_host=True)
    for _ in range(2):
        _run(name, dtype, trans, lower, 0.0, ctx, rng, n=517, k=640)
        assert _path(ctx) == {"bands"}
        given, taken = last_stats["cuda:0"].get("given", []), last_stats["cuda:1"].get("taken", [])
        assert bool(given) == (last_stats["cuda:0"]["final_k"] >= 128)     # a final range of one ALIGN: no cut
        assert len(given) == len(taken)
        assert all(to == "cuda:1" for *_, to in given) and all(fr == "cuda:0" for fr, *_ in taken)
        assert "given" not in last_stats["cuda:1"] and "taken" not in last_stats["cuda:0"]
        _products_cover(ctx, 517, 517, 640, True)
        host_pinning.wait_ready()


@pytest.mark.multi_gpu
def test_parts_under_concurrent_callers(small_units, forced_parts, rng):
    """Six threads share one Context of two GPUs, each handing parts between them in every call: every C exact."""
    ctx = hb.Context(devices=_gpus()[:2], min_call_seconds=0)
    cases = [(rng.standard_normal((640, 300 + 23 * i)) + 1j * rng.standard_normal((640, 300 + 23 * i)),
              rng.standard_normal((640, 300 + 23 * i)) + 1j * rng.standard_normal((640, 300 + 23 * i)))
             for i in range(6)]

    def gemmt(a, b):
        c = np.full((a.shape[1], a.shape[1]), np.nan + 0j, order="F")
        return hb.gemmt(1.0, a, b, 0.0, c, trans_a="C", context=ctx), a.conj().T @ b
    assert not _exact_under_threads(cases, gemmt, 3)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("where", [0, 1])
@pytest.mark.parametrize("after", [1, 4, 7, 10])
def test_a_fault_while_parts_are_handed(where, after, small_units, forced_parts, rng):
    """A fault on the giver or the taker at any step of the call: C is right all the same (the blocks not written
    run on the GPU left), the GPU that failed is left out."""
    name, trans = "gemmt", ("C", "N")
    values, c0, expected, tol = make_case(rng, name, np.complex128, trans, True, 517, 640, 0.5 - 0.25j, 0.0)
    ctx = hb.Context(devices=_gpus()[:2], min_call_seconds=0)
    c = np.array(c0, order="F")
    with hb.testing.inject_fault(ctx, where, after_tiles=after) as fault:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hb.DeviceFailureWarning)
            out = call_routine(name, 0.5 - 0.25j, values, 0.0, c, trans, True, ctx)
    mask = triangle_mask(517, True)
    assert np.abs(out[mask] - expected[mask]).max() <= tol
    np.testing.assert_array_equal(out[~mask], c0[~mask])
    assert list(ctx.failed) == ([f"cuda:{where}"] if fault.fired else [])


@pytest.mark.gpu
def test_bands_out_of_memory_goes_to_the_tiles(small_units, rng):
    """A GPU out of memory before anything was written: the call runs tiled, no warning, no GPU left out."""
    import cupy
    a = rng.standard_normal((500, 300)) + 1j * rng.standard_normal((500, 300))
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0)
    oom = cupy.cuda.memory.OutOfMemoryError(1 << 34, 1 << 30, 1 << 30)
    with hb.testing.inject_fault(ctx, 0, after_tiles=0, exc=oom) as fault:
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.DeviceFailureWarning)
            c = hb.herk(1.0, a, context=ctx)
    assert fault.fired and not ctx.failed
    low = np.tril(np.ones((500, 500), bool))
    want = a @ a.conj().T
    assert np.abs(c[low] - want[low]).max() / np.abs(want).max() < 1e-13
    assert "bands" not in _path(ctx)


@pytest.mark.gpu
@pytest.mark.parametrize("small_units", ["k"], indirect=True)        # gemm goes by the k order only
@pytest.mark.parametrize("how", ["F", "C"])
@pytest.mark.parametrize("trans", [("N", "N"), ("T", "T"), ("N", "T"), ("C", "N")])
def test_bands_gemm_of_one_array_with_itself(how, trans, small_units, rng):
    """gemm(a, a): one array read along k by columns on one side and by rows on the other is two uploads."""
    a = layout(rng.standard_normal((389, 389)) + 1j * rng.standard_normal((389, 389)), how)
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0)
    c = np.full((389, 389), np.nan + 0j, order="F")
    hb.gemm(0.5, a, a, 0.0, c, transa=trans[0], transb=trans[1], context=ctx)
    ops = {"N": lambda x: x, "T": lambda x: x.T, "C": lambda x: x.conj().T}
    want = 0.5 * ops[trans[0]](a) @ ops[trans[1]](a)
    assert np.abs(c - want).max() <= 1e-12 * np.abs(want).max()
    assert _path(ctx) == {"bands"}


@pytest.mark.multi_gpu
def test_bands_and_tiles_share_one_staging_ring(small_units, monkeypatch, rng):
    """One staging ring per GPU and direction: calls by bands (which need a ring of every GPU at once) beside
    calls by tiles (which hold one GPU's ring while another GPU of theirs waits) all finish, exactly."""
    from hybridblas.devices import cuda as cuda_mod
    monkeypatch.setattr(cuda_mod, "STAGING_RINGS", 1)
    devices = _gpus()
    contexts = [hb.Context(devices=devices, min_call_seconds=0, pin_host=False),
                hb.Context(devices=devices, min_call_seconds=0, pin_host=False, strategy="dynamic", block_size=96)]
    errors = []

    def one(i):
        a = rng_a[i]
        try:
            for _ in range(3):
                c = hb.herk(1.0, a, context=contexts[i % 2])
                want = a @ a.conj().T
                low = np.tril(np.ones(c.shape, bool))
                if not np.abs(c[low] - want[low]).max() <= 1e-12 * np.abs(want).max():
                    errors.append(i)
        except Exception as exc:              # noqa: BLE001 - reported below
            errors.append(exc)
    rng_a = [rng.standard_normal((260 + 9 * i, 200)) + 1j * rng.standard_normal((260 + 9 * i, 200)) for i in range(8)]
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a call is still waiting for a staging ring"
    assert not errors


@pytest.mark.gpu
def test_bands_keep_their_memory_for_the_next_call_and_give_it_up_under_pressure(monkeypatch, rng):
    """A call's stream set and its arena's blocks serve the next call (no cudaMalloc per call); the blocks
    kept are released when another stream's allocation needs the memory."""
    import cupy
    _bands_always(monkeypatch)
    n, k = 3000, 2500
    a = rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k))
    ctx = hb.Context(devices=_gpus()[:1], min_call_seconds=0)
    pool = cupy.get_default_memory_pool()
    with cupy.cuda.Device(0):
        for _ in range(2):
            c = hb.herk(1.0, a, 0.0, np.full((n, n), np.nan + 0j, order="F"), context=ctx)
            assert _path(ctx) == {"bands"}
        kept = pool.total_bytes()
        assert pool.free_bytes() >= a.nbytes                  # the factors' block waits for the next call
        for _ in range(2):
            hb.herk(1.0, a, 0.0, c, context=ctx)
        assert pool.total_bytes() == kept
        free, _ = cupy.cuda.runtime.memGetInfo()
        big = cupy.empty(free + a.nbytes // 2, dtype=np.uint8)   # needs the kept blocks: the pool frees them
        del big
        pool.free_all_blocks()
    low = np.tril(np.ones((n, n), bool))
    want = a @ a.conj().T
    assert np.abs(c[low] - want[low]).max() / np.abs(want).max() < 1e-13


def _locked_herk(monkeypatch, rng):
    """A herk on the band path whose operands are page-locked from its first call on (pin_host=True), no rates
    calibrated yet: (a, c (NaN), the Context, its first GPU, the speeds' size)."""
    _bands_always(monkeypatch)
    monkeypatch.setattr(cuda_bands, "_calibration", {})
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    host_pinning.clear()
    n, k = 1500, 1200
    a = rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k))
    c = np.full((n, n), np.nan + 0j, order="F")
    gpus = _gpus()
    return a, c, hb.Context(devices=gpus, min_call_seconds=0, pin_host=True), gpus[0], (n, k, len(gpus))


def _assert_herk(a, c):
    low = np.tril(np.ones(c.shape, bool))
    want = a @ a.conj().T
    assert np.abs(c[low] - want[low]).max() / np.abs(want).max() < 1e-13


@pytest.mark.gpu
def test_locked_pieces_go_from_the_calling_thread_and_a_feeder_only_for_the_rest(small_units, monkeypatch, rng):
    """The calling thread queues the pieces of page-locked operands (CALLER_UPLOADS) and starts no feeder where
    none is left; where C's old values go up too (beta != 0) it queues a GPU's first HEAD_PIECES and its feeder
    the rest; an operand not yet locked (staged) leaves its first piece and those after it to the feeder; every
    result matches the reference, the other triangle untouched."""
    from hybridblas.devices.cuda import last_stats
    monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    host_pinning.clear()
    fed, real = [], cuda_bands._Call._feed

    def feed(self, gpu):
        fed.append((gpu.fed, len(self.layout.uploads(gpu.slot))))
        return real(self, gpu)
    monkeypatch.setattr(cuda_bands._Call, "_feed", feed)
    n, k = 517, 301
    a, b = (np.asfortranarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))) for _ in range(2))
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0, pin_host=True)
    low = np.tril(np.ones((n, n), bool))

    def call(b, beta=0.0):
        if beta == 0:
            c = np.full((n, n), np.nan + 0j, order="F")
        else:
            c = np.asfortranarray(np.tril(np.full((n, n), 1 - 2j), -1))
        want = np.where(low, a.conj().T @ b + (beta * c if beta else 0), c)
        fed.clear()
        out = hb.gemmt(1.0, a, b, beta, c, transa="C", transb="N", lower=True, context=ctx)
        assert _path(ctx) == {"bands"}
        assert np.abs(out[low] - want[low]).max() / np.abs(want[low]).max() < 1e-13
        assert np.array_equal(out[~low], c[~low], equal_nan=True)
        return [last_stats[d.name] for d in ctx.devices]
    try:
        call(b)                                         # staged while the locks are made
        host_pinning.wait_ready()
        stats = call(b)                                 # every piece by DMA from the calling thread
        assert fed == [] and all("upload_gbps" in s for s in stats if s.get("bytes_from_host"))
        call(b, beta=0.5)                               # C's old values: a feeder each, after the first pieces
        assert fed and all(done == min(owned, cuda_bands.HEAD_PIECES) for done, owned in fed)
        fresh = b.copy(order="F")                       # not locked yet: its pieces are staged by the feeders
        ready = host_pinning.is_ready                   # (its lock is never ready, however fast it is made)
        monkeypatch.setattr(host_pinning, "is_ready", lambda pin: ready(pin) and pin.ptr != fresh.ctypes.data)
        call(fresh)
        assert fed and any(done < owned for done, owned in fed)
    finally:
        host_pinning.clear()


@pytest.mark.gpu
def test_the_first_call_to_copy_freshly_locked_arrays_calibrates_nothing(monkeypatch, rng):
    """A call whose operands or C were page-locked since the last call (their first copies by DMA) records no
    link rate and no speed; the next one records both."""
    a, c, ctx, dev, size = _locked_herk(monkeypatch, rng)
    try:
        hb.herk(1.0, a, 0.0, c, context=ctx)                   # staged while the lock is made; loads the kernels
        host_pinning.wait_ready()
        hb.herk(1.0, a, 0.0, c, context=ctx)                   # the first copies by DMA
        assert _path(ctx) == {"bands"}
        assert cuda_bands.calibrated(dev, "h2d_pinned") is None and cuda_bands.calibrated(dev, "d2h_pinned") is None
        assert cuda_bands.calibrated(dev, "herk", size) is None
        hb.herk(1.0, a, 0.0, c, context=ctx)
        assert cuda_bands.calibrated(dev, "d2h_pinned") is not None
        assert cuda_bands.calibrated(dev, "herk", size) is not None
    finally:
        host_pinning.clear()
    _assert_herk(a, c)


@pytest.mark.gpu
def test_no_speed_from_a_layouts_first_call_nor_from_one_beside_a_layout_build(monkeypatch, rng):
    """A call that stages operands while their page-locks are being made, a layout's first call (its shapes'
    kernels load) and a call while a worker thread makes a layout (its products are queued late) record no
    speed; the next quiet call by DMA on a layout it has run before does."""
    from collections import OrderedDict

    from hybridblas import band_plan
    monkeypatch.setattr(band_plan, "_cache", OrderedDict())
    a, c, ctx, dev, size = _locked_herk(monkeypatch, rng)
    try:
        with monkeypatch.context() as locking:                 # the locks not made yet: every call stages
            locking.setattr(host_pinning, "is_ready", lambda pin: False)
            for _ in range(2):
                hb.herk(1.0, a, 0.0, c, context=ctx)
            assert cuda_bands.calibrated(dev, "herk", size) is None
        host_pinning.wait_ready()
        hb.herk(1.0, a, 0.0, c, context=ctx)                   # the first copies by DMA
        band_plan._cache.clear()
        from hybridblas.devices.cuda import last_stats
        hb.herk(1.0, a, 0.0, c, context=ctx)                   # a new layout's first call
        assert _path(ctx) == {"bands"}
        assert cuda_bands.calibrated(dev, "herk", size) is None
        assert last_stats[dev.name]["new_layout"] and not last_stats[dev.name]["beside_build"]
        monkeypatch.setattr(cuda_bands, "rebuilding", lambda: True)
        hb.herk(1.0, a, 0.0, c, context=ctx)
        assert cuda_bands.calibrated(dev, "herk", size) is None
        assert last_stats[dev.name]["beside_build"] and not last_stats[dev.name]["new_layout"]
        monkeypatch.setattr(cuda_bands, "rebuilding", band_plan.rebuilding)
        hb.herk(1.0, a, 0.0, c, context=ctx)
        assert cuda_bands.calibrated(dev, "herk", size) is not None
        assert not (last_stats[dev.name]["new_layout"] or last_stats[dev.name]["beside_build"])
    finally:
        host_pinning.clear()
    _assert_herk(a, c)


@pytest.mark.gpu
def test_a_stream_sets_compute_handle_is_its_own_bound_to_its_compute_stream_and_kept(small_units, rng):
    """Whichever pooled threads run a call's jobs, its products go on the stream set's own cuBLAS handle (bound to
    s_comp), made once for the set: calls from two caller threads at once each get results right, and a later
    call reuses the handles the sets made."""
    import ctypes

    from hybridblas import cublas
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0, pin_host=True)
    for _ in range(2):
        _run("herk", np.complex128, ("N",), True, 0.0, ctx, rng)
    errors = []

    def caller():
        try:
            _run("gemmt", np.complex128, ("C", "N"), True, 0.0, ctx, rng)
        except BaseException as exc:            # noqa: BLE001 - reported by the test's thread
            errors.append(exc)
    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    host_pinning.wait_ready()
    kept = {}
    for d in ctx.devices:
        for streams in cuda_bands._idle_sets.get(d.index, []):
            comp = streams.streams[2]
            if comp.ptr not in streams._handles:
                continue
            h = streams._handles[comp.ptr]
            bound = ctypes.c_void_p()
            cublas.check(cublas.lib().cublasGetStream_v2(ctypes.c_void_p(h), ctypes.byref(bound)), "get stream")
            assert bound.value == comp.ptr
            kept[(d.index, comp.ptr)] = h
    assert {i for i, _ in kept} == {d.index for d in ctx.devices}
    _run("herk", np.complex128, ("N",), True, 0.0, ctx, rng)
    for d in ctx.devices:
        for streams in cuda_bands._idle_sets.get(d.index, []):
            comp = streams.streams[2]
            if (d.index, comp.ptr) in kept:
                assert streams._handles[comp.ptr] == kept[(d.index, comp.ptr)]


@pytest.mark.gpu
@pytest.mark.parametrize("beta", [0.0, 0.5 + 0.25j])
def test_gemmt_diagonals_on_the_side_stream(beta, small_units, monkeypatch, rng):
    """zgemmt's herkx diagonals computed on each GPU's side stream while the herkx runs: the side stream did
    compute them, and every entry (the diagonal's imaginary parts, which herkx itself zeroes, included) is the
    reference's, as with the diagonals on the compute stream."""
    n, k = 517, 301
    a = np.asfortranarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)))    # A^H B: herkx
    b = np.asfortranarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)))
    c0 = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    low = np.tril(np.ones((n, n), bool))
    want = a.conj().T @ b + (beta * c0 if beta else 0)
    if not beta:
        c0[low] = np.nan                        # beta = 0: C is not read
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0, pin_host=True)
    sides = []
    made = cuda_bands._Side.dots

    def counted(self, *args):
        sides.append(self.streams.s_side.ptr)
        return made(self, *args)
    monkeypatch.setattr(cuda_bands._Side, "dots", counted)
    for on in (True, False, True):
        monkeypatch.setattr(cuda_bands, "SIDE_DOTS", on)
        before = len(sides)
        c = np.array(c0, order="F")
        hb.gemmt(1.0, a, b, beta, c, transa="C", transb="N", lower=True, context=ctx)
        assert _path(ctx) == {"bands"}
        assert (len(sides) > before) == on
        assert np.abs(c[low] - want[low]).max() <= 1e-13 * np.abs(want).max()
        assert np.abs(np.diag(c).imag - np.diag(want).imag).max() <= 1e-13 * np.abs(want).max()
        np.testing.assert_array_equal(c[~low], c0[~low])


@pytest.mark.multi_gpu
def test_a_call_whose_rates_moved_runs_on_the_kept_layout_while_a_worker_makes_the_new_one(monkeypatch, rng):
    """Rates that moved past the kept layout (here: each GPU's given rate): the call runs on the kept layout, exact,
    a worker makes the new one, and the next call runs on that one, exact; shares that moved far (a GPU slowed
    down) get their new layout in the call, exact."""
    from collections import OrderedDict
    from hybridblas import band_plan
    _bands_always(monkeypatch)
    monkeypatch.setattr(band_plan, "_cache", OrderedDict())
    monkeypatch.setattr(band_plan, "_rebuilds", {})
    monkeypatch.setattr(band_plan, "REBUILD_GAIN", -1.0)     # the new layout, however small the model's gain (a
                                                             # call this small is the uploads': its own unit test)
    used = []
    real_init = cuda_bands._Call.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        used.append(self.layout)
    monkeypatch.setattr(cuda_bands._Call, "__init__", init)
    gpus = _gpus()[:2]
    n, k = 1400, 900
    a = rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))
    b = rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))
    want = a.conj().T @ b
    low = np.tril(np.ones((n, n), bool))

    def call(shares):
        ctx = hb.Context(devices=gpus, min_call_seconds=0, rates={d.name: r for d, r in zip(gpus, shares)})
        c = np.full((n, n), np.nan + 0j, order="F")
        hb.gemmt(1.0, a, b, 0.0, c, transa="C", transb="N", lower=True, context=ctx)
        assert _path(ctx) == {"bands"}
        assert np.abs(c[low] - want[low]).max() / np.abs(want).max() < 1e-13
        assert np.isnan(c[~low]).all()                          # the other triangle untouched
    call([1e13, 1e13])
    first = used[-1]
    first.build_s = 0.0                                         # shares served by SHARE_SLACK alone
    call([1e13, 1.3e13])                                        # GPU 1 1.3 times as fast: the kept layout
    assert used[-1] is first
    assert band_plan.wait_rebuilds(timeout=60)
    call([1e13, 1.3e13])
    second = used[-1]
    assert second is not first and second.edges[1] < first.edges[1]        # GPU 1's band the larger now
    second.build_s = 0.0
    call([1e13, 4e13])                                          # shares moved past STALE_SHARE: made in the call
    assert used[-1] is not second and used[-1].edges[1] < second.edges[1] and not band_plan.rebuilding()


PRIVATE = [("herk", np.complex128, ("N",), True), ("her2k", np.complex128, ("C",), False),
           ("syrk", np.float64, ("T",), True), ("gemmt", np.complex128, ("C", "N"), False),
           ("gemm", np.float64, ("T", "N"), None)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,trans,lower", PRIVATE)
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_bands_where_each_gpu_uploads_what_it_reads(name, dtype, trans, lower, beta, small_units, monkeypatch, rng):
    """GPUs without peer access (each uploads every piece it reads, no peer copy, no part handed over): the
    reference, in every order, and no byte comes from another GPU."""
    from hybridblas.devices.cuda import last_stats
    monkeypatch.setattr(cuda_bands, "_peer_access", lambda ids: False)
    ctx = hb.Context(devices=_gpus(), min_call_seconds=0, pin_host=True)
    for _ in range(2):
        _run(name, dtype, trans, lower, beta, ctx, rng)
        assert _path(ctx) == {"bands"}
        assert all(last_stats[d.name]["bytes_from_peer"] == 0 for d in ctx.devices)

