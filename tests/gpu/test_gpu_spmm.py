"""cisolver.gpu_spmm: row-major cuSPARSE products on one and two GPUs against a float64 scipy reference,
with strided column ranges, poisoned outputs, odd sizes and back-to-back calls on non-default streams; the
GPU set-up of H's rows (full rows made from the upper triangle, or the upper triangle kept with its transpose
made on the GPU) against scipy's rows and transposes, exactly.

Products are checked to |y - H x| <= TOL[dtype] * max_i sum_j |H_ij| * max |x| (float32 2e-5, float64 1e-12):
the storages differ by the order of their sums only."""

import numpy as np
import pytest
import scipy.sparse as sp

from cisolver.operators import SymmetricOperator
from ci_data import DATA

pytestmark = pytest.mark.gpu
DEVICE_SETS = [[0], pytest.param([0, 1], marks=pytest.mark.multi_gpu)]
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _symmetric(n, density, seed):
    a = sp.random(n, n, density=density, random_state=seed, format="csr")
    return (a + a.T + sp.diags(np.random.default_rng(seed).uniform(-3, 3, n))).tocsr()


# "full": H on the host and the GPUs; "upper": its upper triangle on the host, full rows made on the GPUs;
# "upper-kept": the upper triangle on the GPUs too, with its transpose made there
STORAGES = ["full", "upper", "upper-kept"]


def _operator(h, storage, devices, dtype):
    stored = sp.triu(h, format="csr") if storage != "full" else h
    gpu = {"full": "auto", "upper": "full", "upper-kept": "upper"}[storage]
    return SymmetricOperator(stored, storage="full" if storage == "full" else "upper", devices=devices,
                             dtype=dtype, gpu_storage=gpu)


def _check(y, h, x, dtype):
    import cupy
    ref = h.astype(np.float64) @ x.astype(np.float64)
    got = cupy.asnumpy(y).astype(np.float64)
    assert np.isfinite(got).all()
    scale = np.abs(h).sum(axis=1).max() * np.abs(x).max()
    assert np.abs(got - ref).max() <= TOL[dtype] * scale


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,k", [(777, 8), (301, 1), (64, 5)])
def test_product_equals_scipy(devices, storage, dtype, n, k):
    import cupy
    h = _symmetric(n, 0.03, seed=n + k)
    x = np.random.default_rng(k).standard_normal((n, k)).astype(dtype)
    op = _operator(h, storage, devices, dtype)
    with cupy.cuda.Device(devices[0]):
        y = op.matmat(cupy.asarray(x))
    _check(y, h, x, dtype)


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_column_ranges_in_and_out_in_place(devices, storage, offset):
    """x a column range of a wider row-major block (odd offsets: not 16-byte aligned), written into a
    column range of a poisoned block; the columns around it stay untouched."""
    import cupy
    n, k, width = 513, 5, 24
    h = _symmetric(n, 0.05, seed=offset)
    rng = np.random.default_rng(offset)
    s = rng.standard_normal((n, width))
    op = _operator(h, storage, devices, np.float64)
    with cupy.cuda.Device(devices[0]):
        s_dev = cupy.asarray(s)
        hs = cupy.full((n, width), np.nan)
        out = op.matmat(s_dev[:, offset:offset + k], out=hs[:, offset:offset + k])
        assert out.data.ptr == hs[:, offset:offset + k].data.ptr
        got = cupy.asnumpy(hs)
    _check(cupy.asarray(got[:, offset:offset + k]), h, s[:, offset:offset + k], np.float64)
    assert np.isnan(np.delete(got, np.s_[offset:offset + k], axis=1)).all()
    np.testing.assert_array_equal(cupy.asnumpy(s_dev), s)              # x untouched


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("storage", STORAGES)
def test_back_to_back_calls_on_a_side_stream(devices, storage):
    """Calls queued without waiting, on a non-default stream, reusing the devices' scratch blocks: each
    result is the product of its own x."""
    import cupy
    n, k = 2001, 8
    h = _symmetric(n, 0.02, seed=7)
    op = _operator(h, storage, devices, np.float64)
    xs = [np.random.default_rng(i).standard_normal((n, k)) for i in range(4)]
    with cupy.cuda.Device(devices[0]):
        with cupy.cuda.Stream(non_blocking=True) as stream:
            xd = [cupy.asarray(x) for x in xs]
            ys = [op.matmat(x) for x in xd]
            for x in xd:
                x.fill(np.nan)          # queued after the products: must not reach them
            stream.synchronize()
    for y, x in zip(ys, xs):
        _check(y, h, x, np.float64)


def test_rows_without_nonzeros_and_empty_blocks():
    import cupy
    h = sp.csr_matrix((50, 50))
    h[3, 7] = h[7, 3] = 2.0
    h = h.tocsr()
    op = _operator(h, "full", [0], np.float64)
    x = np.random.default_rng(0).standard_normal((50, 3))
    _check(op.matmat(cupy.asarray(x)), h, x, np.float64)
    assert op.matmat(cupy.zeros((50, 0))).shape == (50, 0)


@pytest.mark.parametrize("layout,alg", [("col", None), ("row", None), ("row", 0), ("row", 6), ("col", 4)])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_device_csr_layouts_on_column_ranges(layout, alg, beta):
    """Both layouts, y = A x + beta y, on column ranges of row-major blocks (odd offsets), rectangular A."""
    import cupy
    from cisolver.gpu_spmm import DeviceCsr
    rng = np.random.default_rng(11)
    a = sp.random(301, 257, density=0.05, random_state=3, format="csr")
    s = rng.standard_normal((257, 13))
    y0 = rng.standard_normal((301, 13))
    dev = DeviceCsr(a, 0, np.float64, layout=layout, alg=alg)
    with cupy.cuda.Device(0):
        y = cupy.asarray(y0)
        dev.multiply_into(y[:, 3:8], cupy.asarray(s)[:, 1:6], beta=beta)
        got = cupy.asnumpy(y)
    expected = y0.copy()
    expected[:, 3:8] = a @ s[:, 1:6] + beta * y0[:, 3:8]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


def test_device_csr_rejects_wrong_device_dtype_and_shapes():
    import cupy
    from cisolver.gpu_spmm import DeviceCsr
    a = sp.random(40, 30, density=0.2, random_state=1, format="csr")
    dev = DeviceCsr(a, 0, np.float64)
    with cupy.cuda.Device(0):
        with pytest.raises(ValueError, match="shapes"):
            dev.multiply_into(cupy.zeros((40, 2)), cupy.zeros((31, 2)))
        with pytest.raises(TypeError, match="float64"):
            dev.multiply_into(cupy.zeros((40, 2), dtype=np.float32), cupy.zeros((30, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="layout"):
        DeviceCsr(a, 0, np.float64, layout="diagonal")


@pytest.mark.parametrize("devices", DEVICE_SETS)
def test_block_in_another_precision_than_the_matrix(devices):
    """A float64 H times a float32 block gives a float32 result (the CPU path does the same)."""
    import cupy
    h = _symmetric(301, 0.05, seed=5)
    op = _operator(h, "upper", devices, np.float64)
    x = np.random.default_rng(5).standard_normal((301, 4)).astype(np.float32)
    with cupy.cuda.Device(devices[0]):
        y = op.matmat(cupy.asarray(x))
        out = cupy.full((301, 6), np.nan, dtype=np.float32)
        op.matmat(cupy.asarray(x), out=out[:, 1:5])
    assert y.dtype == np.float32
    _check(y, h, x, np.float32)
    _check(out[:, 1:5], h, x, np.float32)




def _with_gaps(n, seed):
    """A random symmetric matrix with empty rows and rows without a diagonal entry."""
    h = _symmetric(n, 0.04, seed).tolil()
    for r in (0, n // 3, n - 1):
        h[r, :] = 0
        h[:, r] = 0
    for r in (1, n // 2):
        h[r, r] = 0
    h = h.tocsr()
    h.eliminate_zeros()
    return h


def _device_rows(dev_csr):
    import cupy
    return sp.csr_matrix((cupy.asnumpy(dev_csr.data), cupy.asnumpy(dev_csr.indices), cupy.asnumpy(dev_csr.indptr)),
                         shape=dev_csr.shape)


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_full_rows_made_on_the_gpus_are_scipys_rows(devices, dtype):
    """The upper triangle in, H's full rows out on each GPU: the same indices and values as scipy's rows of
    U + U^T - D, in ascending column order, the parts of near-equal nonzeros covering every row."""
    n = 611
    h = _with_gaps(n, seed=4).astype(dtype)
    op = SymmetricOperator(sp.triu(h, format="csr"), storage="upper", devices=devices, dtype=dtype,
                           gpu_storage="full")
    assert op.gpu.storage == "full" and not op.gpu.upper
    parts = op.gpu.parts
    assert parts[0].r0 == 0 and parts[-1].r1 == n and all(a.r1 == b.r0 for a, b in zip(parts, parts[1:]))
    for part in parts:
        got, ref = _device_rows(part.rows), h[part.r0:part.r1]
        assert part.rows_t is None and got.shape == (part.r1 - part.r0, n)
        np.testing.assert_array_equal(got.indptr, ref.indptr)
        np.testing.assert_array_equal(got.indices, ref.indices)
        np.testing.assert_array_equal(got.data, ref.data)
    if len(parts) == 2:
        assert abs(parts[0].rows.nnz - parts[1].rows.nnz) <= np.diff(h.indptr).max()


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kept_upper_triangle_has_the_host_transposes(devices, dtype):
    """U's rows on each GPU, and U_p^T made there: the matrices the host used to build (h[r0:r1, r0:].T)."""
    n = 611
    u = sp.triu(_with_gaps(n, seed=5), format="csr").astype(dtype)
    op = SymmetricOperator(u, storage="upper", devices=devices, dtype=dtype, gpu_storage="upper")
    assert op.gpu.storage == "upper" and op.gpu.upper
    for part in op.gpu.parts:
        rows, rows_t = _device_rows(part.rows), _device_rows(part.rows_t)
        for got, ref in ((rows, u[part.r0:part.r1]), (rows_t, u[part.r0:part.r1, part.r0:].T.tocsr())):
            ref.sort_indices()
            assert got.shape == ref.shape
            np.testing.assert_array_equal(got.indptr, ref.indptr)
            np.testing.assert_array_equal(got.indices, ref.indices)
            np.testing.assert_array_equal(got.data, ref.data)


@pytest.mark.skipif(not DATA.is_dir(), reason=f"interaction data folder absent: {DATA}")
@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shell_model_hamiltonian_20ne(devices, storage, dtype):
    from cisolver.shellmodel import hamiltonian, snt
    problem = hamiltonian.ShellModelProblem(snt.read_snt(DATA / "usdb.snt"), 2, 2)
    h, _ = problem.build(storage="full")
    x = np.random.default_rng(20).standard_normal((h.shape[0], 8)).astype(dtype)
    op = _operator(h, storage, devices, dtype)
    import cupy
    with cupy.cuda.Device(devices[0]):
        y = op.matmat(cupy.asarray(x))
    _check(y, h, x, dtype)


@pytest.mark.parametrize("gpu_storage", ["full", "upper"])
def test_entries_below_the_diagonal_are_refused(gpu_storage):
    u = sp.triu(_symmetric(101, 0.05, seed=8), format="lil")
    u[60, 3] = 1.5
    with pytest.raises(ValueError, match="entries below the diagonal"):
        SymmetricOperator(u.tocsr(), storage="upper", devices=[0], gpu_storage=gpu_storage)


def test_unsorted_rows_are_sorted_on_the_gpu():
    import cupy
    from cisolver.gpu_spmm import DeviceCsr
    a = sp.random(203, 171, density=0.1, random_state=9, format="csr")
    rng = np.random.default_rng(9)
    indices, data = a.indices.copy(), a.data.copy()
    for r in range(a.shape[0]):                  # every row's entries in a random order
        sl = slice(a.indptr[r], a.indptr[r + 1])
        order = rng.permutation(sl.stop - sl.start)
        indices[sl], data[sl] = indices[sl][order], data[sl][order]
    shuffled = sp.csr_matrix((data, indices, a.indptr.copy()), shape=a.shape)
    dev = DeviceCsr(shuffled, 0, np.float64)
    got = _device_rows(dev)
    np.testing.assert_array_equal(got.indices, a.indices)
    np.testing.assert_array_equal(got.data, a.data)
    x = rng.standard_normal((171, 3))
    with cupy.cuda.Device(0):
        y = dev.multiply_into(cupy.empty((203, 3)), cupy.asarray(x))
    np.testing.assert_allclose(cupy.asnumpy(y), a @ x, rtol=0, atol=1e-12 * np.abs(a @ x).max())


def test_storage_follows_the_free_memory(monkeypatch):
    """'auto': full rows where the first GPU holds U, its transpose and the rows; else U kept."""
    import cupy
    from hybridblas import memory

    from cisolver import gpu_spmm
    h = _symmetric(777, 0.03, seed=10)
    u = sp.triu(h, format="csr")
    assert SymmetricOperator(u, storage="upper", devices=[0]).gpu.storage == "full"
    peak = gpu_spmm.assembly_bytes(777, u.nnz, 8, 1)[0]
    monkeypatch.setattr(memory, "gpu_free", lambda i: int(peak / gpu_spmm.PEAK_FRACTION) - 1)
    op = SymmetricOperator(u, storage="upper", devices=[0])
    assert op.gpu.storage == "upper"
    x = np.random.default_rng(10).standard_normal((777, 4))
    with cupy.cuda.Device(0):
        _check(op.matmat(cupy.asarray(x)), h, x, np.float64)
