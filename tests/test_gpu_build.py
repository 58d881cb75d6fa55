"""H's full rows built on the GPUs (cisolver.gpu_build) on one and two GPUs: each GPU's CSR arrays equal the
host build's rows exactly (indptr, indices and value bits, float64 and float32, small and default groups), the
operator made of them multiplies like the host matrix, and a spectrum whose GPUs build H has the host path's
energies."""
import numpy as np
import pytest

import hybridblas as hb
from cisolver import gpu_build
from cisolver.operators import SymmetricOperator
from cisolver.shellmodel import hamiltonian, snt
from cisolver.spectrum import compute_spectrum
from ci_data import DATA

pytestmark = pytest.mark.gpu
DEVICE_SETS = [[0], pytest.param([0, 1], marks=pytest.mark.multi_gpu)]


@pytest.fixture(scope="module")
def mg24():
    return hamiltonian.ShellModelProblem(snt.read_snt(DATA / "usdb.snt"), 4, 4)


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("group_entries", [20_000, None])
def test_gpu_rows_are_the_host_rows(mg24, devices, dtype, group_entries):
    h = mg24.build("full", dtype=dtype, n_threads=2)[0]
    parts, seconds = gpu_build.build_rows_on_gpus(mg24, devices, dtype, n_threads=2, group_entries=group_entries)
    assert [p[0] for p in parts] == devices and set(seconds) == {"plans", "allocation", "fill"}
    assert parts[0][1] == 0 and parts[-1][2] == mg24.dimension
    for (_, _, r1, _), (_, r0, _, _) in zip(parts, parts[1:]):
        assert r1 == r0
    for dev, r0, r1, (indptr, indices, data) in parts:
        assert r1 > r0                                        # 24Mg has rows enough for two GPUs
        assert indptr.device.id == indices.device.id == data.device.id == dev
        assert indptr.dtype == indices.dtype == np.int32 and data.dtype == dtype
        rows = h[r0:r1]
        np.testing.assert_array_equal(indptr.get(), rows.indptr)
        np.testing.assert_array_equal(indices.get(), rows.indices)
        assert data.get().tobytes() == rows.data.tobytes()


@pytest.mark.parametrize("devices", DEVICE_SETS)
def test_operator_of_gpu_rows_multiplies_like_the_host_matrix(mg24, devices, rng):
    import cupy
    h = mg24.build("full", n_threads=2)[0]
    parts, _ = gpu_build.build_rows_on_gpus(mg24, devices, np.float64, n_threads=2)
    op = SymmetricOperator.on_gpus(parts, mg24.dimension, np.float64)
    assert op.nnz == h.nnz and op.gpu.storage == "full" and op.devices == devices
    x = rng.standard_normal((mg24.dimension, 5))
    with cupy.cuda.Device(devices[0]):
        y = op.matmat(cupy.asarray(x)).get()
    ref = h @ x
    assert np.abs(y - ref).max() <= 1e-12 * abs(h).sum(axis=1).max() * np.abs(x).max()


@pytest.mark.parametrize("devices", DEVICE_SETS)
def test_spectrum_built_on_gpus_has_the_host_energies(devices):
    kw = dict(nev=4, tol=1e-10, observables=False)
    host = compute_spectrum("usdb", 4, 4, **kw)
    gpu = compute_spectrum("usdb", 4, 4, devices=",".join(map(str, devices)), **kw)
    assert gpu["storage"] == "full (built on the GPUs)" and gpu["devices"] == devices
    assert gpu["nnz_stored"] == hamiltonian.ShellModelProblem(
        snt.read_snt(DATA / "usdb.snt"), 4, 4).stored_nonzeros("full").sum()
    assert {"plans", "allocation", "fill"} <= set(gpu["seconds"]["build_detail"])
    np.testing.assert_allclose(gpu["energies"], host["energies"], atol=1e-9, rtol=0)


def test_gpu_build_refuses_what_does_not_fit(mg24, monkeypatch):
    monkeypatch.setattr(hb.memory, "gpu_free", lambda index: 1 << 20)
    with pytest.raises(hb.InsufficientMemory, match=r"rows 0:\d+ of H built on GPU 0 needs about"):
        gpu_build.build_rows_on_gpus(mg24, [0], np.float64, n_threads=2)
