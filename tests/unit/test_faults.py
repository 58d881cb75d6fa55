"""A device that fails mid-call: its unfinished tiles run on the others, the answer stays exact.

CPU workers stand in for GPUs here (several CPUDevices in one Context are separate workers); the GPU
twins are in test_gpu_faults.py. Faults come from hybridblas.testing.inject_fault, which raises in the
device's worker just before a tile, as a CUDA error or an out-of-memory would.
"""
import threading
import warnings

import numpy as np
import pytest

import hybridblas as hb
from hybridblas.devices import CPUDevice
from hybridblas.devices.base import DeviceRun
from blas_cases import call_routine, make_case, triangle_mask

ROUTINE_CASES = [("herk", ("N",)), ("her2k", ("C",)), ("gemmt", ("N", "C")), ("syrk", ("T",)),
                 ("gemm", ("C", "N"))]


def _cpus(n):
    return hb.Context(devices=["cpu"] * n, block_size=24, rates={f"cpu#{i}" if i else "cpu": 1.0 for i in range(n)})


def _check(name, out, expected, c0, lower, tol):
    if name == "gemm":
        np.testing.assert_allclose(out, expected, rtol=0, atol=tol)
        return
    mask = triangle_mask(out.shape[0], lower)
    np.testing.assert_allclose(out[mask], expected[mask], rtol=0, atol=tol)
    np.testing.assert_array_equal(out[~mask], c0[~mask])          # the other triangle never written


@pytest.mark.parametrize("name,trans", ROUTINE_CASES)
@pytest.mark.parametrize("strategy", ["static", "dynamic"])
@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("sync", [False, True])
def test_injected_fault_is_survived(name, trans, strategy, beta, sync, rng):
    dtype = np.complex128
    lower = None if name == "gemm" else False
    alpha = 0.7 if name == "herk" else 0.7 - 0.3j
    values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, 150, 37, alpha, beta)
    ctx = hb.Context(devices=["cpu"] * 3, strategy=strategy, block_size=24, sync=sync,
                     rates={"cpu": 1.0, "cpu#1": 1.0, "cpu#2": 1.0})
    c = np.array(c0, order="F")
    # the dynamic queue gives every device two tiles at once, so its second launch is certain under any load
    with hb.testing.inject_fault(ctx, 1, after_tiles=1) as fault:
        with pytest.warns(hb.DeviceFailureWarning, match=r"cpu#1 failed \(RuntimeError: injected fault on cpu#1"):
            out = call_routine(name, alpha, values, beta, c, trans, lower, ctx)
    assert fault.fired and out is c
    _check(name, out, expected, c0, lower, tol)
    assert list(ctx.failed) == ["cpu#1"]


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
@pytest.mark.parametrize("after", [0, 1, 3])
def test_split_k_partial_of_a_failed_device_is_redone(strategy, after, rng):
    """Tall-skinny products split k across devices; a failed device's partial sum is lost with it, so
    every k range it had taken (finished ones too) is computed again elsewhere."""
    a = rng.standard_normal((20000, 12))
    c0 = rng.standard_normal((12, 12))
    ctx = hb.Context(devices=["cpu"] * 3, strategy=strategy, block_size=1000 if strategy == "dynamic" else None,
                     rates={"cpu": 1.0, "cpu#1": 1.0, "cpu#2": 1.0}, min_call_seconds=0)
    c = np.array(c0, order="F")
    with hb.testing.inject_fault(ctx, 2, after_tiles=after):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hb.DeviceFailureWarning)
            hb.syrk(0.5, a, 2.0, c, trans="T", context=ctx)
    want = 0.5 * a.T @ a + 2.0 * c0
    low = np.tril(np.ones((12, 12), bool))
    np.testing.assert_allclose(c[low], want[low], rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(c[~low], c0[~low])


def test_failed_device_stays_out_until_reset(rng):
    a = rng.standard_normal((120, 30))
    ctx = _cpus(2)
    with hb.testing.inject_fault(ctx, 0, after_tiles=0, exc=MemoryError("GPU out of memory (test)")):
        with pytest.warns(hb.DeviceFailureWarning, match=r"cpu failed \(MemoryError: GPU out of memory \(test\)\)"):
            hb.syrk(1.0, a, context=ctx)
    assert isinstance(ctx.failed["cpu"], MemoryError)
    seen = []
    spy = hb.Context(devices=ctx.devices)      # same device objects, no failure recorded

    class Counting(CPUDevice):
        def open(self, problem):
            seen.append(self.name)
            return super().open(problem)
    ctx.devices[0].__class__ = Counting
    try:
        hb.syrk(1.0, a, context=ctx)
        assert "cpu" not in seen                # left out of later calls of this Context
        hb.syrk(1.0, a, context=spy)
        assert "cpu" in seen                    # a failure belongs to the Context, not the device
        ctx.reset_failed("cpu")
        seen.clear()
        hb.syrk(1.0, a, context=ctx)
        assert "cpu" in seen
    finally:
        ctx.devices[0].__class__ = CPUDevice


def test_no_device_left_raises_and_c_holds_old_or_new_tiles(rng):
    """Every device fails: DeviceFailure names them, and each tile of C holds either its old value or
    its new one (none half-written)."""
    a = rng.standard_normal((200, 40))
    c0 = rng.standard_normal((200, 200))
    c = np.array(c0, order="F")
    ctx = hb.Context(devices=["cpu", "cpu"], strategy="dynamic", block_size=25, rates={"cpu": 1.0, "cpu#1": 1.0})
    with hb.testing.inject_fault(ctx, 0, after_tiles=3), hb.testing.inject_fault(ctx, 1, after_tiles=5):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hb.DeviceFailureWarning)
            with pytest.raises(hb.DeviceFailure, match=r"cpu: RuntimeError.*cpu#1: RuntimeError|"
                                                       r"cpu#1: RuntimeError.*cpu: RuntimeError") as info:
                hb.syrk(1.0, a, 1.0, c, context=ctx)
    assert "partly updated" in str(info.value)
    new = a @ a.T + c0
    done = 0
    for i0 in range(0, 200, 25):
        for j0 in range(0, i0 + 1, 25):
            blk = (slice(i0, i0 + 25), slice(j0, j0 + 25))
            mask = triangle_mask(25, True) if i0 == j0 else np.ones((25, 25), bool)
            got = c[blk][mask]
            if np.allclose(got, new[blk][mask], rtol=1e-12, atol=1e-10):
                done += 1
            else:
                np.testing.assert_array_equal(got, c0[blk][mask])
    assert 0 < done < 36
    with pytest.raises(hb.DeviceFailure, match="reset_failed"):
        hb.syrk(1.0, a, context=ctx)


def test_small_call_on_one_device_moves_to_another(rng):
    """A call small enough to run on one device: if that one fails, another device of the Context
    takes it over."""
    a = rng.standard_normal((40, 8))
    ctx = hb.Context(devices=["cpu", "cpu"], rates={"cpu": 2.0, "cpu#1": 1.0}, min_call_seconds=1e9)
    with hb.testing.inject_fault(ctx, 0):
        with pytest.warns(hb.DeviceFailureWarning, match="cpu failed"):
            c = hb.syrk(1.0, a, context=ctx)
    low = np.tril(np.ones((40, 40), bool))
    np.testing.assert_allclose(c[low], (a @ a.T)[low], rtol=1e-13, atol=1e-12)


class _Tearing(CPUDevice):
    """A device that writes part of a tile into C and then fails: the tile is torn."""

    def __init__(self):
        super().__init__(index=5)

    def open(self, problem):
        class Run(DeviceRun):
            def launch(self, task):
                problem.c[task.i0, task.j0] = 1e300        # half a write, then the fault
                raise RuntimeError("lost while writing")

            def wait(self, handle):
                return None

            def remainder(self, task):
                return [], [task]
        return Run()


def test_torn_tile_with_beta_nonzero_raises_and_with_beta_zero_is_rewritten(rng):
    a = rng.standard_normal((60, 10))
    ctx = hb.Context(devices=[CPUDevice(0), _Tearing()], strategy="static", block_size=20,
                     rates={"cpu": 1.0, "cpu#5": 1.0})
    c = rng.standard_normal((60, 60))
    with pytest.raises(hb.DeviceFailure, match="being written when cpu#5 failed") as info:
        hb.syrk(1.0, a, 1.0, np.asfortranarray(c), context=ctx)
    assert info.value.torn
    ctx.reset_failed()
    with pytest.warns(hb.DeviceFailureWarning):
        out = hb.syrk(1.0, a, 0.0, np.asfortranarray(c), context=ctx)    # beta = 0: C is not read
    low = np.tril(np.ones((60, 60), bool))
    np.testing.assert_allclose(out[low], (a @ a.T)[low], rtol=1e-13, atol=1e-12)


def test_many_callers_one_context_with_a_fault(rng):
    """Concurrent calls through one Context while one device fails: every result exact."""
    inputs = [rng.standard_normal((80 + i, 20)) for i in range(12)]
    ctx = hb.Context(devices=["cpu"] * 3, strategy="dynamic", block_size=16,
                     rates={"cpu": 1.0, "cpu#1": 1.0, "cpu#2": 1.0})
    out = [None] * len(inputs)

    def work(i):
        out[i] = hb.syrk(1.0, inputs[i], context=ctx)

    with hb.testing.inject_fault(ctx, 2, after_tiles=7):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hb.DeviceFailureWarning)
            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    for a, c in zip(inputs, out):
        low = np.tril(np.ones((a.shape[0],) * 2, bool))
        np.testing.assert_allclose(c[low], (a @ a.T)[low], rtol=1e-13, atol=1e-12)
    assert list(ctx.failed) == ["cpu#2"]


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"device_index": 3}, ValueError, r"device_index must be an index into context.devices \(0..1\), got 3"),
    ({"device_index": True}, ValueError, "device_index .* got True"),
    ({"device_index": 0, "after_tiles": -1}, ValueError, "after_tiles must be an integer >= 0, got -1"),
    ({"device_index": 0, "exc": "boom"}, TypeError, "exc must be an Exception class or instance .*, got 'boom'"),
    ({"device_index": 0, "exc": KeyboardInterrupt()}, TypeError, "not an interrupt or SystemExit"),
    ({"device_index": 0, "exc": SystemExit(3)}, TypeError, "exc must be an Exception class or instance"),
])
def test_inject_fault_bad_input(kwargs, exc, match):
    ctx = hb.Context(devices=["cpu", "cpu"])
    with pytest.raises(exc, match=match):
        with hb.testing.inject_fault(ctx, **kwargs):
            pass
    assert ctx._faults == {}


def test_inject_fault_needs_a_context():
    with pytest.raises(TypeError, match="context must be a hybridblas.Context, got str"):
        with hb.testing.inject_fault("cpu", 0):
            pass


def test_cublas_out_of_memory_is_a_memory_error():
    """CUBLAS_STATUS_ALLOC_FAILED raises an error that is both a CublasError and a MemoryError (what flapw's
    out-of-memory retries catch); other failures stay CublasErrors only."""
    from hybridblas import cublas
    with pytest.raises(MemoryError, match=r"cublasZherk_v2 failed with cublasStatus 3 \(ALLOC_FAILED\)") as info:
        cublas.check(3, "cublasZherk_v2")
    assert isinstance(info.value, cublas.CublasError)
    with pytest.raises(cublas.CublasError, match="EXECUTION_FAILED") as info:
        cublas.check(13, "cublasZgemm_v2")
    assert not isinstance(info.value, MemoryError)
    cublas.check(0, "cublasZgemm_v2")
