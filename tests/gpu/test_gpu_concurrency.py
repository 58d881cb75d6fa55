"""Many threads calling hybridblas at once on GPUs (marked ``gpu``): every result exact.

Every shared structure of a GPU run (staging rings, the call's panel index, page-locked operands, module
caches) is exercised by concurrent callers: one Context shared by all, and one Context per thread; host
(numpy) and device (cupy) operands. Each result is compared with a float64 reference computed once per
input on the host.
"""
import concurrent.futures
import threading

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import random_matrix

pytestmark = pytest.mark.gpu

THREADS, CALLS = 24, 10


def _inputs(rng, count, n, k):
    out = []
    for i in range(count):
        a = random_matrix(rng, (n + 7 * i, k), np.complex128)
        out.append((a, a @ a.conj().T))
    return out


def _err(got, want):
    low = np.tril(np.ones(want.shape, bool))
    return np.abs(got[low] - want[low]).max() / np.abs(want[low]).max()


def _hammer(contexts, inputs, where, beta=0.0):
    """THREADS threads x CALLS calls; thread t uses contexts[t % len(contexts)]; returns the bad calls."""
    import cupy
    gpus = cupy.cuda.runtime.getDeviceCount()
    bad, lock = [], threading.Lock()

    def work(t):
        ctx = contexts[t % len(contexts)]
        for j in range(CALLS):
            a, want = inputs[(t + j) % len(inputs)]
            n = a.shape[0]
            c0 = np.full((n, n), 2.0 + 0j) if beta else np.full((n, n), np.nan + 0j)
            if where == "host":
                c = np.array(c0, order="F")
                out = hb.herk(1.0, a, beta, c, context=ctx)
                got = out
            else:
                with cupy.cuda.Device((t + j) % gpus):
                    ad = cupy.asarray(a)
                    cd = cupy.asarray(c0, order="F")
                    out = hb.herk(1.0, ad, beta, cd, context=ctx)
                    got = out.get()
            expect = want + beta * np.tril(c0) if beta else want
            err = _err(got, expect)
            if not err < 1e-12:
                with lock:
                    bad.append((t, j, where, err))

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(work, range(THREADS)))
    return bad


@pytest.mark.parametrize("where", ["host", "device"])
def test_24_threads_share_one_context(where, rng):
    inputs = _inputs(rng, 4, 1500, 2000)
    contexts = [hb.Context("gpu", strategy="dynamic", pin_host=False),
                hb.Context("all", strategy="static", pin_host=False)]
    assert _hammer(contexts[:1], inputs, where) == []
    assert _hammer(contexts[1:], inputs, where, beta=0.5) == []


@pytest.mark.parametrize("where", ["host", "device"])
def test_24_threads_with_their_own_contexts(where, rng):
    inputs = _inputs(rng, 4, 1500, 2000)
    contexts = [hb.Context("gpu", strategy=("dynamic", "static")[t % 2], pin_host=("auto", False)[t % 2])
                for t in range(THREADS)]
    assert _hammer(contexts, inputs, where, beta=0.5) == []


def test_issue_case_herk_3000_by_6000_eight_threads(rng):
    """The case that used to give 17-21 wrong results out of 32: one staging ring shared by every run."""
    inputs = _inputs(rng, 2, 3000, 6000)
    for devices, split in (("gpu", None), ("gpu", 0), ("all", None)):     # 0: every call split over both GPUs
        ctx = hb.Context(devices, strategy="dynamic", pin_host=False,
                         **({} if split is None else {"min_call_seconds": split}))
        bad = []

        def work(t):
            for j in range(4):
                a, want = inputs[(t + j) % 2]
                err = _err(hb.herk(1.0, a, context=ctx), want)
                if not err < 1e-12:
                    bad.append((t, j, err))

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
        assert bad == [], devices


def test_staging_rings_are_lent_not_shared(rng):
    """Concurrent runs on one GPU each hold their own ring; the pool keeps no more than its limit."""
    from hybridblas.devices import cuda
    ctx = hb.Context(["cuda:0"], strategy="static", pin_host=False, min_call_seconds=0)
    inputs = _inputs(rng, 2, 800, 900)
    _hammer([ctx], inputs, "host")
    pool = ctx.devices[0].ring_pool("in")
    assert 1 <= pool.made <= cuda.STAGING_RINGS
    assert len(pool._idle) == pool.made          # every ring came back
