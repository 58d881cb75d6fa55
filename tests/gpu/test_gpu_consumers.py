"""The consumers on GPUs: FLAPW H/S builds and the CI eigensolver give the CPU results (run on a GPU node)."""
import numpy as np
import pytest

import flapw
import hybridblas as hb


def _rel(x, ref):
    x = x.get() if hasattr(x, "get") else x
    return np.abs(x - ref).max() / np.abs(ref).max()


@pytest.fixture(scope="module")
def nacl_cpu():
    cell = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1))
    return cell, flapw.build_hs(cell, interstitial=True, context=hb.Context("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["refined", "original"])
@pytest.mark.parametrize("devices,strategy", [(["cuda:0"], "static"), ("all", "static"), ("all", "dynamic")])
def test_flapw_build_on_gpu_equals_cpu(nacl_cpu, method, devices, strategy):
    cell, (h_cpu, s_cpu) = nacl_cpu
    if method == "original":
        h_cpu, s_cpu = flapw.build_hs(cell, method="original", interstitial=True, context=hb.Context("cpu"))
    ctx = hb.Context(devices=devices, strategy=strategy, block_size=64 if strategy == "dynamic" else None)
    h, s = flapw.build_hs(cell, method=method, interstitial=True, context=ctx)
    assert _rel(h, h_cpu) <= 1e-12 and _rel(s, s_cpu) <= 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["refined", "original"])
@pytest.mark.parametrize("lower_only", [False, True])
def test_flapw_host_arrays_with_gpu_operands_equal_cpu(nacl_cpu, method, lower_only):
    """Host H and S, A, B, X and the T products on the GPU (the default for host arrays on a GPU context)."""
    cell, (h_cpu, s_cpu) = nacl_cpu
    if method == "original":
        h_cpu, s_cpu = flapw.build_hs(cell, method="original", interstitial=True, context=hb.Context("cpu"))
    h, s, rep = flapw.build_hs(cell, method=method, interstitial=True, context=hb.Context(devices=["cuda:0"]),
                               batch_atoms=3, lower_only=lower_only, return_report=True)
    assert rep.operands == "device" and isinstance(h, np.ndarray) and isinstance(s, np.ndarray)
    if lower_only:
        h, s, h_cpu, s_cpu = np.tril(h), np.tril(s), np.tril(h_cpu), np.tril(s_cpu)
    assert _rel(h, h_cpu) <= 1e-12 and _rel(s, s_cpu) <= 1e-12


@pytest.mark.multi_gpu
def test_flapw_host_arrays_with_gpu_operands_on_two_gpus_equal_cpu(nacl_cpu):
    cell, (h_cpu, s_cpu) = nacl_cpu
    ws = flapw.Workspace()
    for _ in range(2):                   # the second build reuses the workspace's host H and S
        h, s, rep = flapw.build_hs(cell, interstitial=True, context=hb.Context(devices=["cuda:0", "cuda:1"],
                                   min_call_seconds=0), workspace=ws, return_report=True)
        assert rep.operands == "device"
        assert _rel(h, h_cpu) <= 1e-12 and _rel(s, s_cpu) <= 1e-12


@pytest.mark.gpu
def test_flapw_device_arrays_equal_cpu(nacl_cpu):
    cell, (h_cpu, s_cpu) = nacl_cpu
    h, s = flapw.build_hs(cell, interstitial=True, arrays="device", context=hb.Context(devices=["cuda:0"]))
    assert type(h).__module__.startswith("cupy")
    assert _rel(h, h_cpu) <= 1e-12 and _rel(s, s_cpu) <= 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("storage", ["full", "upper"])
def test_ci_spmm_and_lobpcg_on_gpu(storage):
    from cisolver.spectrum import compute_spectrum
    cpu = compute_spectrum("usdb", 4, 4, nev=5, tol=1e-9, storage=storage)
    gpu = compute_spectrum("usdb", 4, 4, nev=5, tol=1e-9, storage=storage, devices="0")
    assert gpu["converged"]
    np.testing.assert_allclose(gpu["energies"], cpu["energies"], rtol=1e-8, atol=0)
    np.testing.assert_allclose(gpu["j"], cpu["j"], atol=1e-6)


@pytest.mark.gpu
def test_ci_float32_on_gpu():
    from cisolver.spectrum import compute_spectrum
    cpu = compute_spectrum("usdb", 4, 4, nev=5, tol=1e-9)
    gpu = compute_spectrum("usdb", 4, 4, nev=5, tol=1e-5, dtype="float32", devices="0")
    np.testing.assert_allclose(gpu["energies"], cpu["energies"], rtol=2e-6, atol=0)


@pytest.mark.multi_gpu
def test_ci_two_gpus_equal_one():
    from cisolver.spectrum import compute_spectrum
    one = compute_spectrum("usdb", 4, 4, nev=5, tol=1e-9, devices="0")
    two = compute_spectrum("usdb", 4, 4, nev=5, tol=1e-9, devices="0,1")
    np.testing.assert_allclose(two["energies"], one["energies"], rtol=1e-8, atol=0)


@pytest.mark.multi_gpu
def test_flapw_two_gpus_equal_cpu(nacl_cpu):
    cell, (h_cpu, s_cpu) = nacl_cpu
    h, s = flapw.build_hs(cell, interstitial=True, context=hb.Context(devices=["cuda:0", "cuda:1"]))
    assert _rel(h, h_cpu) <= 1e-12 and _rel(s, s_cpu) <= 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["F", "C"])
def test_hermitian_fill_on_gpu_equals_host(order, rng):
    import cupy
    from flapw.hsdla import hermitian_fill
    n = 4500                                   # three 2048-wide panels, the last one short
    a = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    a = np.asarray(a, order=order)
    want = hermitian_fill(a.copy(order=order))
    got = hermitian_fill(cupy.asarray(a, order=order), xp=cupy).get()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.tril(got), np.tril(a, -1) + np.diag(np.diag(a).real))


@pytest.mark.gpu
def test_tile_preconditioner_on_gpu_equals_host():
    import cupy
    from cisolver.data import resolve_interaction
    from cisolver.preconditioner import TilePreconditioner, configuration_labels
    from cisolver.shellmodel import hamiltonian, snt
    prob = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction("usdb")), 3, 4, None)
    h, _ = prob.build(storage="upper")
    labels = configuration_labels(prob)
    r = np.random.default_rng(1).standard_normal((h.shape[0], 6))
    theta = np.linspace(-70.0, -66.0, 6)
    host = TilePreconditioner(h, labels, upper=True, dense_max=50).apply(r, theta)
    dev = TilePreconditioner(h, labels, upper=True, dense_max=50, xp=cupy).apply(cupy.asarray(r), theta)
    assert np.abs(dev.get() - host).max() <= 1e-10 * np.abs(host).max()
