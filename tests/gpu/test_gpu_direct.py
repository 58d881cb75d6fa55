"""Double-precision calls on one GPU that holds every operand, C wider than 512 (devices/cuda_direct): every
routine, trans, triangle and C layout against float64 numpy references on random data, C poisoned with NaN
when beta = 0, the other triangle left bit for bit, operands as strided views; the call is ordered after the
caller's queued work on a non-default stream; two threads on two GPUs at once get the same answers; a
fixed block size, k far above n and single precision keep the tiled run."""
import threading

import numpy as np
import pytest

import hybridblas as hb
from blas_cases import call_routine, make_case, trans_choices, triangle_mask
from hybridblas.devices import cuda_direct

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu
ROUTINES = ["herk", "her2k", "syrk", "syr2k", "herkx", "gemmt", "gemm"]


def _case(rng, name, dtype, trans, lower, n, k, beta, how="F", orders=("F", "C")):
    alpha = 0.7 if name == "herk" or np.dtype(dtype).kind != "c" else 0.7 - 0.3j
    values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta,
                                          n - 37 if name == "gemm" else None)
    ops = [cupy.asarray(v, order=orders[i % 2]) for i, v in enumerate(values)]
    c = cupy.asarray(c0, order=how)
    return alpha, ops, c, c0, expected, tol


def _check(out, c0, expected, tol, lower=None):
    """The computed part (the triangle, or all of a gemm's C) within tol, the rest bit for bit as it was."""
    got = cupy.asnumpy(out)
    done = np.ones(c0.shape, bool) if lower is None else triangle_mask(c0.shape[0], lower)
    assert np.isfinite(got[done]).all()
    assert np.abs(got[done] - expected[done]).max() <= tol
    np.testing.assert_array_equal(got[~done], c0[~done])          # the other triangle (NaN kept)


@pytest.mark.parametrize("name", ROUTINES)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("lower", [True, False])
def test_every_routine_and_trans_equals_the_reference(name, dtype, lower, rng, count_calls):
    if name in ("herk", "her2k", "herkx") and np.dtype(dtype).kind != "c":
        pytest.skip("Hermitian routines: complex data")
    if name == "gemm" and not lower:
        pytest.skip("gemm has no triangle")
    runs = count_calls(cuda_direct, "run")
    ctx = hb.Context(devices=["cuda:0"])
    n, k = 613, 301
    with cupy.cuda.Device(0):
        for trans in trans_choices(name, dtype):
            for beta, how in ((0.0, "F"), (0.4, "C")):
                alpha, ops, c, c0, expected, tol = _case(rng, name, dtype, trans, lower, n, k, beta, how)
                uplo = lower if name != "gemm" else None
                out = call_routine(name, alpha, ops, beta, c, trans, uplo, ctx)
                assert out is c
                _check(out, c0, expected, tol, uplo)
    if name not in ("gemmt", "herkx"):                              # gemmt: when its ops make a herkx/syrkx
        assert len(runs) == 2 * len(trans_choices(name, dtype))


@pytest.mark.parametrize("n", [513, 1031, 2049])
@pytest.mark.parametrize("trans,dtype,beta,direct", [(("C", "N"), np.complex128, 1.0, True),
                                                      (("N", "C"), np.complex128, 0.0, True),
                                                      (("N", "T"), np.complex128, 0.5 - 0.5j, True),
                                                      (("T", "N"), np.float64, 0.5, True),
                                                      (("C", "N"), np.complex128, 0.5 - 0.5j, False),
                                                      (("N", "N"), np.complex128, 1.0, False)])
def test_gemmt_as_herkx_or_syrkx_and_the_diagonal(n, trans, dtype, beta, direct, rng, count_calls):
    """Operands both column-major: herkx (the diagonal made exact after it, imaginary part included), syrkx,
    or the tiles (complex beta with herkx's ops; ops no cuBLAS routine takes)."""
    runs = count_calls(cuda_direct, "run")
    ctx = hb.Context(devices=["cuda:0"])
    with cupy.cuda.Device(0):
        for lower in (True, False):
            alpha = 0.8 - 0.6j if np.dtype(dtype).kind == "c" else 0.8
            values, c0, expected, tol = make_case(rng, "gemmt", dtype, trans, lower, n, 97, alpha, beta)
            ops = [cupy.asarray(v, order="F") for v in values]
            c = cupy.asarray(c0, order="F")
            hb.gemmt(alpha, *ops, beta, c, transa=trans[0], transb=trans[1], lower=lower, context=ctx)
            _check(c, c0, expected, tol, lower)
            if np.dtype(dtype).kind == "c":
                assert np.abs(np.diagonal(expected).imag).min() > 0      # a diagonal that is not real
    assert len(runs) == (2 if direct else 0)


def test_strided_views_of_larger_arrays(rng):
    ctx = hb.Context(devices=["cuda:0"])
    n, k = 700, 90
    with cupy.cuda.Device(0):
        big_a = cupy.asarray(rng.standard_normal((k + 5, 2 * n + 3)) + 1j * rng.standard_normal((k + 5, 2 * n + 3)))
        a = big_a[2:k + 2, 3:3 + 2 * n:2]                              # neither stride one after the step
        big_c = cupy.full((n + 9, n + 4), np.nan + 0j, order="F")
        c = big_c[4:n + 4, 1:n + 1]
        c[...] = cupy.asarray(rng.standard_normal((n, n)))
        c0 = cupy.asnumpy(c)
        hb.herk(1.0, a, 0.5, c, trans="C", lower=True, context=ctx)
        want = np.tril(cupy.asnumpy(a).conj().T @ cupy.asnumpy(a) + 0.5 * c0) + np.triu(c0, 1)
        np.fill_diagonal(want, want.diagonal().real)
        got = cupy.asnumpy(c)
        assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
        assert np.isnan(cupy.asnumpy(big_c[:4])).all() and np.isnan(cupy.asnumpy(big_c[:, 0])).all()


def test_ordered_after_the_callers_stream(rng):
    ctx = hb.Context(devices=["cuda:0"])
    n, k = 800, 3000
    with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=True) as stream:
        a = cupy.zeros((k, n), complex, order="F")
        src = cupy.asarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)), order="F")
        for _ in range(20):                          # queued work that is still running when the call starts
            a[...] = src * 1.0
        c = cupy.zeros((n, n), complex, order="F")
        hb.herk(1.0, a, 0.0, c, trans="C", context=ctx)
        stream.synchronize()
        want = np.tril(cupy.asnumpy(src).conj().T @ cupy.asnumpy(src))
        assert np.abs(np.tril(cupy.asnumpy(c)) - want).max() <= 1e-11 * np.abs(want).max()


@pytest.mark.multi_gpu
def test_two_callers_on_two_gpus_at_once(rng, count_calls):
    runs = count_calls(cuda_direct, "run")
    seeds = rng.integers(1 << 30, size=2)
    results, errors = {}, []

    def caller(dev):
        try:
            r = np.random.default_rng(seeds[dev])
            ctx = hb.Context(devices=[f"cuda:{dev}"])
            with cupy.cuda.Device(dev):
                for i in range(6):
                    name, trans = [("gemmt", ("C", "N")), ("herk", ("C",)), ("her2k", ("N",))][i % 3]
                    alpha, ops, c, c0, expected, tol = _case(r, name, np.complex128, trans, bool(i % 2), 900 + dev,
                                                             200, 1.0, orders=("F", "F"))
                    call_routine(name, alpha, ops, 1.0, c, trans, bool(i % 2), ctx)
                    _check(c, c0, expected, tol, bool(i % 2))
            results[dev] = True
        except BaseException as exc:             # reported in the main thread
            errors.append(exc)
    threads = [threading.Thread(target=caller, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {0: True, 1: True} and len(runs) == 12


def test_tiles_kept_where_they_belong(rng, count_calls):
    runs = count_calls(cuda_direct, "run")
    with cupy.cuda.Device(0):
        a = cupy.asarray(rng.standard_normal((600, 700)))
        hb.syrk(1.0, a, trans="T", context=hb.Context(devices=["cuda:0"], block_size=256))   # a fixed block
        hb.syrk(1.0, a.astype(np.float32), trans="T", context=hb.Context(devices=["cuda:0"]))  # single precision
        tall = cupy.asarray(rng.standard_normal((600 * (cuda_direct.K_RATIO + 1), 600)))
        hb.syrk(1.0, tall, trans="T", context=hb.Context(devices=["cuda:0"]))              # k > K_RATIO n
        assert runs == []
        hb.syrk(1.0, a, trans="T", context=hb.Context(devices=["cuda:0"]))
        assert len(runs) == 1
