"""Scheduler, planner and plumbing: strategies agree, split-K, threads, concurrency, errors, the GIL."""
import concurrent.futures
import threading
import time
import traceback

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import random_matrix, triangle_mask
from hybridblas import host_blas, plan, policy, reference
from hybridblas.devices import CPUDevice, DeviceRun
from hybridblas.problem import Operand, build_problem, N, C
from hybridblas.scheduler import static_assignment


def _herk_problem(n, k, dtype=np.complex128, lower=True):
    a = np.ones((n, k), dtype, order="F")       # a column-major C in the problem's own triangle
    return build_problem("herk", 1.0, [a], 0.0, None, [N], lower, None)


def test_strategies_agree_to_rounding(rng):
    a = random_matrix(rng, (301, 157), np.complex128)
    b = random_matrix(rng, (301, 157), np.complex128)
    results = []
    for kw in [dict(devices="cpu"),
               dict(devices=["cpu", "cpu"], strategy="static", min_call_seconds=0),
               dict(devices=["cpu", "cpu", "cpu"], strategy="dynamic", block_size=64),
               dict(devices=["cpu", "cpu"], strategy="dynamic", block_size=50, sync=True)]:
        results.append(hb.her2k(0.5 + 0.25j, a, b, context=hb.Context(**kw)))
    mask = triangle_mask(301, True)
    for r in results[1:]:
        np.testing.assert_allclose(r[mask], results[0][mask], rtol=0, atol=1e-12 * np.abs(results[0]).max())


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
@pytest.mark.parametrize("routine", ["syrk", "gemmt", "herk"])
def test_split_k_tall_skinny(strategy, routine, rng):
    """The CI eigensolver's Gram matrices: small C, huge inner dimension, split over k and reduced."""
    s = random_matrix(rng, (6000, 24), np.float64)
    hs = random_matrix(rng, (6000, 24), np.float64)
    ctx = hb.Context(devices=["cpu", "cpu"], strategy=strategy, min_call_seconds=0)
    prob = build_problem("syrk", 1.0, [s], 0.0, None, [1], True, None)
    assert policy.wants_split_k(prob, 2)
    c0 = random_matrix(rng, (24, 24), np.float64)
    if routine == "gemmt":
        got = hb.gemmt(2.0, s, hs, 0.5, c0.copy(), transa="T", context=ctx)
        want = reference.ref_gemmt(2.0, s, hs, 0.5, c0, "T", "N", True)
    else:
        got = getattr(hb, routine)(2.0, s, 0.5, c0.copy(), trans="T", context=ctx)
        want = reference.ref_syrk(2.0, s, 0.5, c0, "T", True)
    mask = triangle_mask(24, True)
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-12, atol=1e-10)
    np.testing.assert_array_equal(got[~mask], c0[~mask])


def test_static_bands_follow_rates():
    prob = _herk_problem(1000, 10)
    devs = [CPUDevice(0), CPUDevice(1)]
    assignment = static_assignment(prob, devs, [1.0, 3.0], hb.Context(devices=["cpu", "cpu"]))
    flops = [sum(t.flops for t in tasks) for tasks in assignment]
    assert flops[1] / flops[0] == pytest.approx(3.0, rel=0.02)
    assert sum(flops) == pytest.approx(prob.flops())


def test_paper_ng_formula():
    """One CPU and one GPU group: n_g^2 = (m n^2 + 4m)/(m + 1) with m the GPU/CPU rate ratio (§5.3)."""
    n, m = 10000, 9.0
    edges = plan.band_edges(n, [m, 1.0], triangular=True)
    ng = np.sqrt((m * n ** 2 + 4 * m) / (m + 1))
    assert abs(edges[1] - ng) <= 1


def test_tiles_cover_triangle_exactly():
    for lower in (True, False):
        prob = _herk_problem(23, 5, lower=lower)
        cover = np.zeros((23, 23), int)
        tasks = plan.dynamic_order(prob, plan.tiles(prob, 6), tail_fraction=0.3)
        for t in tasks:
            block = np.ones((t.i1 - t.i0, t.j1 - t.j0), int)
            if t.diag:
                block = np.tril(block) if lower else np.triu(block)
            cover[t.i0:t.i1, t.j0:t.j1] += block
        np.testing.assert_array_equal(cover, triangle_mask(23, lower).astype(int))
        assert sum(t.flops for t in tasks) == pytest.approx(prob.flops())
        # big first, and the tail is cut smaller than the head
        assert tasks[0].flops == max(t.flops for t in tasks)
        assert tasks[-1].flops < tasks[0].flops / 2


def _settled_thread_count(target, timeout=2.0):
    """Thread count once it reaches ``target`` (or after ``timeout``): a leak stays above it."""
    deadline = time.monotonic() + timeout
    while threading.active_count() > target and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count()


def _warm_runners(rng, workers=3):
    """Device workers run on pooled runner threads: one call makes sure ``workers`` of them exist."""
    hb.syrk(1.0, rng.standard_normal((100, 10)), context=hb.Context(devices=["cpu"] * workers, block_size=4))


def test_no_thread_leaks(rng):
    """After the first call, calls start no more threads (the runners are reused), with either strategy."""
    a = random_matrix(rng, (200, 50), np.complex128)
    _warm_runners(rng)
    before = threading.active_count()
    for strategy in ("static", "dynamic"):
        ctx = hb.Context(devices=["cpu", "cpu", "cpu"], strategy=strategy, block_size=32)
        for _ in range(5):
            hb.herk(1.0, a, context=ctx)
    assert _settled_thread_count(before) == before


def test_concurrent_callers_get_their_own_workers(rng):
    """Two caller threads at once: each call has its own runners (none is shared), results are exact."""
    a = random_matrix(rng, (300, 40), np.float64)
    expected = a @ a.T                    # float64 products of float64 data: the reference
    ctx = hb.Context(devices=["cpu", "cpu"], block_size=16)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: hb.syrk(1.0, a, context=ctx), range(16)))
    low = np.tril(np.ones((300, 300), dtype=bool))
    for c in outs:
        np.testing.assert_allclose(c[low], expected[low], rtol=1e-12, atol=1e-12 * np.abs(expected).max())


def test_blas_thread_limit_restored(rng):
    from threadpoolctl import threadpool_info
    before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    ctx = hb.Context(devices=["cpu", "cpu"], strategy="dynamic", block_size=32)
    hb.herk(1.0, random_matrix(rng, (100, 40), np.float64), context=ctx)
    after = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    assert before == after


def test_twenty_concurrent_callers(rng):
    inputs = [random_matrix(rng, (90 + i, 30), np.complex128) for i in range(20)]
    contexts = [hb.Context(devices=["cpu", "cpu"], strategy="dynamic", block_size=16),
                hb.Context(devices=["cpu", "cpu"], strategy="static", block_size=20), hb.Context("cpu")]

    def work(i):
        return hb.herk(1.0, inputs[i], context=contexts[i % 3])

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(work, range(20)))
    for a, got in zip(inputs, results):
        n = a.shape[0]
        want = reference.ref_herk(1.0, a, 0.0, np.zeros((n, n)), "N", True)
        mask = triangle_mask(n, True)
        np.testing.assert_allclose(got[mask], want[mask], rtol=1e-12, atol=1e-11)


class _Exploding(CPUDevice):
    """A device whose third task fails, to check exceptions reach the caller with their traceback."""

    def __init__(self):
        super().__init__(index=7)
        self.count = 0
        self.lock = threading.Lock()

    def open(self, problem):
        inner = super().open(problem)
        dev = self

        class Run(DeviceRun):
            def launch(self, task):
                with dev.lock:
                    dev.count += 1
                    n = dev.count
                if n == 3:
                    explode_in_worker(task)
                return inner.launch(task)

            def wait(self, handle):
                return inner.wait(handle)

        return Run()


def explode_in_worker(task):
    raise RuntimeError(f"device failure on block {task.i0}:{task.i1}")


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_failed_device_tiles_rerun_elsewhere(strategy, rng):
    """A device that raises mid-call: its tiles run on the other device, one warning names it, the
    result is exact, no thread leaks, and the Context leaves it out until reset."""
    a = random_matrix(rng, (200, 20), np.float64)
    _warm_runners(rng, 2)
    before = threading.active_count()
    bad = _Exploding()
    ctx = hb.Context(devices=[CPUDevice(0), bad], strategy=strategy, block_size=16,
                     rates={"cpu": 1.0, "cpu#7": 1.0})
    with pytest.warns(hb.DeviceFailureWarning, match=r"cpu#7 failed \(RuntimeError: device failure on block"):
        c = hb.syrk(1.0, a, context=ctx)
    low = np.tril(np.ones((200, 200), dtype=bool))
    np.testing.assert_allclose(c[low], (a @ a.T)[low], rtol=1e-12, atol=1e-12)
    assert list(ctx.failed) == ["cpu#7"]
    assert _settled_thread_count(before) == before
    seen = bad.count
    hb.syrk(1.0, a, context=ctx)
    assert bad.count == seen                       # left out of later calls
    ctx.reset_failed()
    assert ctx.failed == {}


def test_exception_reaches_caller_when_no_device_is_left(rng):
    a = random_matrix(rng, (200, 20), np.float64)
    ctx = hb.Context(devices=[_Exploding()], block_size=16)
    with pytest.raises(hb.DeviceFailure, match="no device of the call is left") as info:
        hb.syrk(1.0, a, context=ctx)
    cause = info.value.__cause__
    frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
    assert "explode_in_worker" in frames
    with pytest.raises(hb.DeviceFailure, match="reset_failed"):
        hb.syrk(1.0, a, context=ctx)


def test_cpu_blas_releases_the_gil(rng):
    """A CPU tile must not stall other Python threads (GPU feeders): count main-thread work meanwhile."""
    n = 1400
    a = np.asfortranarray(random_matrix(rng, (n, n), np.complex128))
    c = np.zeros((n, n), np.complex128, order="F")
    done = threading.Event()

    def tile():
        host_blas.gemm(c, 1.0, Operand(a, N), Operand(a, C), 0.0)
        done.set()

    th = threading.Thread(target=tile)
    t0 = time.perf_counter()
    th.start()
    spins = 0
    while not done.is_set():
        spins += 1
    th.join()
    elapsed = time.perf_counter() - t0
    assert elapsed > 0.05, "the tile was too small to tell"
    # with the GIL held for the whole call the main thread would get ~1 switch interval (5 ms) in total
    assert spins > 20000, f"main thread made only {spins} iterations in {elapsed:.2f} s"
    np.testing.assert_allclose(c[:3, :3], (a @ a.conj().T)[:3, :3], rtol=1e-10)


# ------------------------------------------------------------------ bad input

def _c(n=4, dtype=np.complex128):
    return np.arange(n * n, dtype=dtype).reshape(n, n) + 1


@pytest.mark.parametrize("call,exc,match", [
    (lambda c: hb.herk(1.0, np.ones((4, 3)), 0.0, c.real.copy()), None, None),
    (lambda c: hb.herk(1.0, np.ones((4, 3), complex), 0.0, c, trans="T"), ValueError, r"trans must be 'N' or 'C' \(0 or 2\) for complex herk, got 'T'"),
    (lambda c: hb.herk(1.0, np.ones((4, 3), complex), 0.0, c, trans="X"), ValueError, "trans.*'X'"),
    (lambda c: hb.syrk(1.0, np.ones((4, 3), complex), 0.0, c, trans="C"), ValueError, r"trans must be 'N' or 'T' \(0 or 1\) for complex syrk, got 'C'"),
    (lambda c: hb.herk(1.0, np.ones((5, 3), complex), 0.0, c), ValueError, r"c has shape \(4, 4\), expected \(5, 5\)"),
    (lambda c: hb.herk(1.0, np.ones((4, 3), complex), 0.0, c[:, :3]), ValueError, "c must be square"),
    (lambda c: hb.herk(1.0, np.ones(4, complex), 0.0, c), ValueError, "a must be 2-D"),
    (lambda c: hb.herk(1.0, np.ones((4, 3), np.complex64), 0.0, c), TypeError, "c has dtype complex128 but a has complex64"),
    (lambda c: hb.herk(1.0, np.ones((4, 3), np.int64), 0.0, c), TypeError, "a has dtype int64"),
    (lambda c: hb.herk(1j, np.ones((4, 3), complex), 0.0, c), ValueError, "alpha must be real"),
    (lambda c: hb.her2k(1.0, np.ones((4, 3), complex), np.ones((4, 3), complex), 1j, c), ValueError, "beta must be real"),
    (lambda c: hb.her2k(1.0, np.ones((4, 3), complex), np.ones((4, 2), complex), 0.0, c), ValueError, "a and b must have the same shape"),
    (lambda c: hb.her2k(1.0, np.ones((4, 3), complex), np.ones((4, 3), np.complex64), 0.0, c), TypeError, "b has dtype complex64"),
    (lambda c: hb.gemmt(1.0, np.ones((4, 3), complex), np.ones((2, 4), complex), 0.0, c), ValueError, "inner dimensions differ"),
    (lambda c: hb.gemmt(1.0, np.ones((4, 3), complex), np.ones((3, 5), complex), 0.0, c), ValueError, "square result"),
    (lambda c: hb.gemmt(1.0, np.ones((4, 3), complex), np.ones((3, 4), complex), 0.0, c, transa="Q"), ValueError, "transa.*'Q'"),
    (lambda c: hb.gemm(1.0, np.ones((4, 3), complex), np.ones((3, 4), complex), 0.0, c, transb=5), ValueError, "transb.*5"),
    (lambda c: hb.herk(1.0, np.ones((4, 3), complex), 0.0, c, context="cpu"), TypeError, "context must be a hybridblas.Context"),
    (lambda c: hb.herk(1.0, [[1, 2]], 0.0, c), TypeError, "a has dtype int64"),
    (lambda c: hb.herk(1.0, None, 0.0, c), TypeError, "a must be an array"),
    (lambda c: hb.herk("x", np.ones((4, 3), complex), 0.0, c), TypeError, "alpha must be a scalar"),
])
def test_bad_input_raises_and_leaves_c_untouched(call, exc, match):
    c = _c()
    saved = c.copy()
    if exc is None:   # complex C with a real A: dtype mismatch the other way round
        with pytest.raises(TypeError, match="c has dtype float64|c has dtype"):
            call(c.real.astype(np.float32))
        return
    with pytest.raises(exc, match=match):
        call(c)
    np.testing.assert_array_equal(c, saved)


def test_read_only_c_rejected():
    c = np.zeros((4, 4), complex)
    c.flags.writeable = False
    with pytest.raises(ValueError, match="c is read-only"):
        hb.herk(1.0, np.ones((4, 2), complex), 0.0, c)


@pytest.mark.parametrize("kwargs,match", [
    (dict(strategy="fast"), "strategy must be one of"),
    (dict(block_size=0), "block_size must be a positive integer"),
    (dict(block_size=2.5), "block_size must be a positive integer"),
    (dict(devices="tpu"), "unknown device 'tpu'"),
    (dict(devices=[]), "devices must be"),
    (dict(devices=["cpu", CPUDevice(0)]), "listed twice"),
    (dict(rates={"cpu": -1}), r"rates\['cpu'\] must be a positive number"),
    (dict(min_call_seconds=-1), "min_call_seconds must be a number >= 0"),
])
def test_bad_context(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hb.Context(**kwargs)


class _Recording(CPUDevice):
    """Records the BLAS thread count its tasks run under."""

    def __init__(self, index=0):
        super().__init__(index)
        self.seen = []

    def open(self, problem):
        inner, seen = super().open(problem), self.seen

        class Run(DeviceRun):
            def launch(self, task):
                from hybridblas import blas_threads
                seen.append(blas_threads.current())
                return inner.launch(task)

            def wait(self, handle):
                return inner.wait(handle)

        return Run()


def test_caller_blas_thread_setting_is_respected(rng):
    """A lone CPU worker keeps the user's limit; several workers share the cores one limit at a time."""
    from threadpoolctl import threadpool_limits
    a = random_matrix(rng, (300, 40), np.float64)
    one = _Recording()
    with threadpool_limits(1, user_api="blas"):
        hb.syrk(1.0, a, context=hb.Context(devices=[one]))
    assert one.seen == [1]
    pair = [_Recording(0), _Recording(1)]
    hb.syrk(1.0, a, context=hb.Context(devices=pair, cpu_threads=2, strategy="static", min_call_seconds=0))
    assert all(t == 1 for d in pair for t in d.seen) and all(d.seen for d in pair)


def test_small_calls_stay_on_one_device(rng):
    """A call shorter than min_call_seconds is not split: no threads, no split-K reduction."""
    a = random_matrix(rng, (3000, 8), np.float64)
    pair = [_Recording(0), _Recording(1)]
    got = hb.syrk(1.0, a, trans="T", context=hb.Context(devices=pair, min_call_seconds=10.0))
    assert sorted(len(d.seen) for d in pair) == [0, 1]
    want = reference.ref_syrk(1.0, a, 0.0, np.zeros((8, 8)), "T", True)
    np.testing.assert_allclose(np.tril(got), np.tril(want), rtol=1e-12)
    pair = [_Recording(0), _Recording(1)]
    hb.syrk(1.0, a, trans="T", context=hb.Context(devices=pair, min_call_seconds=0))
    assert all(d.seen for d in pair)


def test_small_call_goes_where_it_finishes_first():
    """Numpy operands: a tiny call stays on the CPU; a mid-size one goes to a much faster device even
    after its operands' trip there."""
    from hybridblas.policy import one_device_if_small
    ctx = hb.Context(devices=["cpu", "cpu"])
    fast = CPUDevice(5)            # stands in for a GPU: not the operands' home in this test
    fast.kind = "cuda"
    devs = [ctx.devices[0], fast]
    tiny = _herk_problem(64, 8)
    kept, _ = one_device_if_small(tiny, devs, [1e11, 50e12], ctx)
    assert kept == [devs[0]]
    mid = _herk_problem(1024, 1024)
    kept, _ = one_device_if_small(mid, devs, [1e11, 50e12], ctx)
    assert kept == [fast]
    big = _herk_problem(2048, 2048)
    kept, _ = one_device_if_small(big, devs, [1e9, 1e11], ctx)
    assert kept == devs            # long enough to share


def test_policy_drops_a_cpu_whose_share_is_below_the_minimum():
    """participants' first rule: beside GPUs a CPU that would do under min_share of the work sits out."""
    from types import SimpleNamespace
    cpu, gpu = SimpleNamespace(kind="cpu", name="cpu"), SimpleNamespace(kind="cuda", name="cuda:0")
    kept, rates = policy.without_idle_cpus([cpu, gpu], [1e9, 50e12], 0.05)
    assert kept == [gpu] and rates == [50e12]
    assert policy.without_idle_cpus([cpu, gpu], [10e12, 50e12], 0.05)[0] == [cpu, gpu]
    assert policy.without_idle_cpus([cpu], [1e9], 0.5)[0] == [cpu]          # a CPU alone stays


def test_host_operands_stay_on_one_gpu_until_splitting_pays():
    """Host operands on GPUs alone: a call one GPU finishes in under HOST_SPLIT_SECONDS runs on the best GPU
    (n = 4096 was slower on two), a longer one on all; device operands keep min_call_seconds."""
    from types import SimpleNamespace
    from hybridblas.policy import HOST_SPLIT_SECONDS, one_device_if_small
    ctx = hb.Context(devices=["cpu", "cpu"], profile=False)          # min_call_seconds 5 ms
    gpus = [SimpleNamespace(kind="cuda", name="cuda:0"), SimpleNamespace(kind="cuda", name="cuda:1")]
    rates = [50e12, 55e12]
    problem = _herk_problem(6144, 6144)
    assert ctx.min_call_seconds < problem.flops() / max(rates) < HOST_SPLIT_SECONDS
    kept, kept_rates = one_device_if_small(problem, gpus, rates, ctx)
    assert kept == [gpus[1]] and kept_rates == [55e12]                # the faster one
    big = _herk_problem(12288, 12288)
    assert big.flops() / max(rates) >= HOST_SPLIT_SECONDS
    assert one_device_if_small(big, gpus, rates, ctx)[0] == gpus
    with_cpu = [ctx.devices[0]] + gpus                                 # a CPU beside them: min_call_seconds
    assert one_device_if_small(problem, with_cpu, [1e12] + rates, ctx)[0] == with_cpu
    off = hb.Context(devices=["cpu", "cpu"], profile=False, min_call_seconds=0)
    assert one_device_if_small(problem, gpus, rates, off)[0] == gpus  # the opt-out splits every call


def test_gpu_operands_stay_on_their_gpu_until_splitting_pays():
    """Operands on a GPU, GPUs alone: a call one GPU finishes in under DEVICE_SPLIT_SECONDS stays on the GPU
    that holds them (n = 4096 was slower split with a peer), a longer one goes to all of them."""
    from types import SimpleNamespace
    from hybridblas.policy import DEVICE_SPLIT_SECONDS, one_device_if_small
    cupy_like = SimpleNamespace(__name__="cupy")
    ctx = hb.Context(devices=["cpu", "cpu"], profile=False)          # min_call_seconds 5 ms
    gpus = [SimpleNamespace(kind="cuda", name="cuda:0"), SimpleNamespace(kind="cuda", name="cuda:1")]
    rates = [40e12, 44e12]

    def on_gpu(n, home):
        problem = _herk_problem(n, n)
        base = SimpleNamespace(device=SimpleNamespace(id=home), nbytes=problem.factors[0].base.nbytes)
        return SimpleNamespace(flops=problem.flops, fxp=cupy_like, xp=cupy_like, operand_xp=None,
                               c=SimpleNamespace(device=SimpleNamespace(id=home), nbytes=problem.c.nbytes),
                               factors=[SimpleNamespace(base=base)])
    small = on_gpu(4096, home=0)
    assert ctx.min_call_seconds < small.flops() / max(rates) < DEVICE_SPLIT_SECONDS
    kept, kept_rates = one_device_if_small(small, gpus, rates, ctx)
    assert kept == [gpus[0]] and kept_rates == [40e12]                # where the operands are, not the faster
    assert one_device_if_small(on_gpu(4096, home=1), gpus, rates, ctx)[0] == [gpus[1]]
    big = on_gpu(8192, home=0)
    assert big.flops() / max(rates) >= DEVICE_SPLIT_SECONDS
    assert one_device_if_small(big, gpus, rates, ctx)[0] == gpus
    off = hb.Context(devices=["cpu", "cpu"], profile=False, min_call_seconds=0)
    assert one_device_if_small(small, gpus, rates, off)[0] == gpus    # the opt-out splits every call
