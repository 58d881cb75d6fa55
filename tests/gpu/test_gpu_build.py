"""H's full rows built on the GPUs (cisolver.gpu_build) on one and two GPUs: each GPU's CSR arrays equal the
host build's rows exactly (indptr, indices and value bits, float64 and float32, small and default groups), the
operator made of them multiplies like the host matrix, and a spectrum whose GPUs build H has the host path's
energies; an MPI rank's rows built alone on one GPU equal the host build of those rows, and DistributedOperator
multiplies rows built on its GPU like uploaded host rows."""
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


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_a_ranks_rows_built_on_one_gpu_are_its_host_rows(mg24, n_ranks):
    import types
    from cisolver.distributed import build_rows, local_rows
    for rank in range(n_ranks):
        lo, hi = local_rows(mg24, types.SimpleNamespace(Get_rank=lambda: rank, Get_size=lambda: n_ranks))
        for dtype in (np.float64, np.float32):
            h = mg24.build("full", dtype=dtype, n_threads=2, rows=(lo, hi))[0]
            (dev, r0, r1, (indptr, indices, data)), = gpu_build.build_rows_on_gpus(mg24, [0], dtype, n_threads=2,
                                                                                    rows=(lo, hi))[0]
            assert (dev, r0, r1) == (0, lo, hi) and indptr.dtype == indices.dtype == np.int32
            np.testing.assert_array_equal(indptr.get(), h.indptr)
            np.testing.assert_array_equal(indices.get(), h.indices)
            assert data.dtype == dtype and data.get().tobytes() == h.data.tobytes()
            rows, seconds = build_rows(mg24, (lo, hi), dtype, n_threads=2, device=0)
            assert data.get().tobytes() == rows[2].get().tobytes() and {"plans", "fill"} <= set(seconds)


def test_distributed_operator_of_gpu_rows_multiplies_like_host_rows(mg24, rng):
    """One rank (MPI.COMM_SELF) holding all rows: from a host matrix (uploaded) and from rows built on the GPU
    (kept); tests/mpi/mpi_jobs/lobpcg_gpu_job.py checks a rank's part of the rows on two ranks."""
    import cupy
    MPI = pytest.importorskip("mpi4py.MPI")
    from cisolver import cuda_modules
    from cisolver.distributed import DistributedOperator, build_rows
    n = mg24.dimension
    cuda_modules.prepare(cupy, np.float64, [0])
    host, _ = build_rows(mg24, (0, n), np.float64, n_threads=2)
    rows, _ = build_rows(mg24, (0, n), np.float64, n_threads=2, device=0)
    x = rng.standard_normal((n, 5))
    ref = host @ x
    for h in (host, rows):
        op = DistributedOperator(h, 0, n, n, MPI.COMM_SELF, device=0)
        assert op.nnz == host.nnz and op.h is None
        with cupy.cuda.Device(0):
            y = op.matmat(cupy.asarray(x)).get()
        assert np.abs(y - ref).max() <= 1e-12 * abs(host).sum(axis=1).max() * np.abs(x).max()


def test_gpu_build_refuses_what_does_not_fit(mg24, monkeypatch):
    monkeypatch.setattr(hb.memory, "gpu_free", lambda index: 1 << 20)
    with pytest.raises(hb.InsufficientMemory, match=r"rows 0:\d+ of H built on GPU 0 needs about"):
        gpu_build.build_rows_on_gpus(mg24, [0], np.float64, n_threads=2)
