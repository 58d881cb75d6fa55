"""Host-side pieces of cisolver's GPU code, on the CPU: row blocks of a CSR matrix without a submatrix copy,
equal-nonzero cuts, the choice of full or upper storage on GPUs by memory, and the index arithmetic of the
GPU's <J²> against angmom's J₊."""

import numpy as np
import pytest
import scipy.sparse as sp

from cisolver import gpu_angmom, gpu_spmm
from cisolver.shellmodel import angmom, hamiltonian, snt
from cisolver.shellmodel.basis import MSchemeBasis
from ci_data import DATA, needs_data



def _csr(n, m, density, seed, empty_rows=()):
    a = sp.random(n, m, density=density, random_state=seed, format="csr", dtype=np.float64)
    a.data += 0.5                                # no stored zeros
    for r in empty_rows:
        a.data[a.indptr[r]:a.indptr[r + 1]] = 0.0
    a.eliminate_zeros()
    return a


@pytest.mark.parametrize("r0,r1", [(0, 0), (0, 97), (97, 97), (13, 14), (5, 60), (40, 97), (96, 97)])
def test_row_block_equals_scipy_rows_and_shares_memory(r0, r1):
    h = _csr(97, 83, 0.08, seed=r0 + r1, empty_rows=(0, 14, 50, 96))
    indptr, indices, data = gpu_spmm.row_block(h, r0, r1)
    ref = h[r0:r1]
    assert indptr[0] == 0 and len(indptr) == r1 - r0 + 1
    np.testing.assert_array_equal(indptr, ref.indptr)
    np.testing.assert_array_equal(indices, ref.indices)
    np.testing.assert_array_equal(data, ref.data)
    if len(data):                                 # views of h's arrays, not copies
        assert np.shares_memory(indices, h.indices) and np.shares_memory(data, h.data)
    np.testing.assert_array_equal(h.indptr[r0:r1 + 1] - h.indptr[r0], indptr)   # h itself untouched


@pytest.mark.parametrize("r0,r1", [(-1, 3), (5, 4), (0, 98)])
def test_row_block_rejects_ranges_outside_the_matrix(r0, r1):
    h = _csr(97, 83, 0.08, seed=1)
    with pytest.raises(ValueError, match=f"rows {r0}:{r1} of a matrix with 97 rows"):
        gpu_spmm.row_block(h, r0, r1)


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 200])
def test_balanced_bounds_cut_equal_nonzeros(parts):
    h = _csr(151, 151, 0.05, seed=parts, empty_rows=(0, 1, 2, 150))
    bounds = gpu_spmm.balanced_bounds(h.indptr, parts)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == 151
    assert all(a <= b for a, b in zip(bounds, bounds[1:]))
    longest = np.diff(h.indptr).max()
    for i, (r0, r1) in enumerate(zip(bounds, bounds[1:])):
        # each cut lies within one row of the ideal share
        assert abs(h.indptr[r1] - h.nnz * (i + 1) / parts) <= longest


def test_balanced_bounds_without_nonzeros():
    assert gpu_spmm.balanced_bounds(np.zeros(11, dtype=np.int64), 3) == [0, 0, 0, 10]


def test_gpu_storage_arguments_are_checked_before_any_gpu_work():
    from cisolver.operators import SymmetricOperator
    h = _csr(50, 50, 0.1, seed=11)
    h = (h + h.T).tocsr()
    with pytest.raises(ValueError, match="gpu_storage must be 'auto', 'full' or 'upper', got 'half'"):
        SymmetricOperator(h, devices=[0], gpu_storage="half")
    with pytest.raises(ValueError, match="gpu_storage='upper' needs storage='upper'"):
        SymmetricOperator(h, storage="full", devices=[0], gpu_storage="upper")


GIB = 1 << 30


@pytest.mark.parametrize("free,expected", [
    ([80 * GIB], "full"), ([80 * GIB, 80 * GIB], "full"),
    ([10 * GIB, 80 * GIB], "upper"),          # the first GPU cannot hold U, its transpose and a part
    ([80 * GIB, 2 * GIB], "upper"),           # the second GPU cannot hold its part
    ([20 * GIB], "upper"), ([40 * GIB], "full")])
def test_choose_storage_by_free_memory(free, expected):
    # 48Cr-like: n = 1.96 M, 626 M stored entries of U, float32
    assert gpu_spmm.choose_storage(True, 1_963_461, 626_101_525, 4, free) == expected


def test_choose_storage_keeps_a_full_matrix_and_respects_int32_indices():
    assert gpu_spmm.choose_storage(False, 10, 50, 8, [1]) == "full"       # a full host matrix stays full
    n, nnz = 1000, 1_500_000_000                                           # 3e9 entries of H on one GPU
    assert gpu_spmm.choose_storage(True, n, nnz, 4, [1 << 50]) == "upper"
    assert gpu_spmm.choose_storage(True, n, nnz, 4, [1 << 50, 1 << 50]) == "full"
    assert gpu_spmm.choose_storage(True, n, 2 ** 31, 4, [1 << 50] * 8) == "upper"     # U itself beyond int32


def test_choose_storage_at_its_limits():
    n, nnz, item = 1000, 20_000, 8
    peak, part, part_nnz = gpu_spmm.assembly_bytes(n, nnz, item, 1)
    assert part_nnz == 2 * nnz + n and part == gpu_spmm.csr_bytes(n, part_nnz, item)
    assert peak == 2 * gpu_spmm.csr_bytes(n, nnz, item) + part
    need = max(peak / gpu_spmm.PEAK_FRACTION, part / (1 - gpu_spmm.RESERVE_FRACTION))
    assert gpu_spmm.choose_storage(True, n, nnz, item, [int(np.ceil(need))]) == "full"
    assert gpu_spmm.choose_storage(True, n, nnz, item, [int(need) - 1]) == "upper"


# ---- <J²> on the GPU: the kernel's sums, evaluated here with numpy ----

def _raised_squares(problem, v):
    """What gpu_angmom's raised_squares kernel sums, in numpy: the column sums of (J₊ v)² from the species'
    raising elements and the block table."""
    target = MSchemeBasis(problem.pdets, problem.ndets, problem.basis.twice_m + 2)
    p_ptr, p_src, p_coef = gpu_angmom.raising_by_target(problem.pdets, problem.jumps_p)
    n_ptr, n_src, n_coef = gpu_angmom.raising_by_target(problem.ndets, problem.jumps_n)
    total = np.zeros(v.shape[1])
    for n_p, n_n, p_start, n_start, from_p, from_p_start, from_n, from_n_nn, from_n_start in \
            gpu_angmom.block_table(problem.basis, target):
        w = np.zeros((n_p, n_n, v.shape[1]))
        for d in range(n_p):
            for e in range(n_n):
                if from_p >= 0:
                    for x in range(p_ptr[p_start + d], p_ptr[p_start + d + 1]):
                        w[d, e] += p_coef[x] * v[from_p + (p_src[x] - from_p_start) * n_n + e]
                if from_n >= 0:
                    for x in range(n_ptr[n_start + e], n_ptr[n_start + e + 1]):
                        w[d, e] += n_coef[x] * v[from_n + d * from_n_nn + (n_src[x] - from_n_start)]
        total += (w ** 2).sum(axis=(0, 1))
    return total


@needs_data
@pytest.mark.parametrize("name,z,n,m", [("usdb.snt", 2, 2, 0), ("usdb.snt", 1, 2, 1), ("usdb.snt", 2, 2, 6),
                                        ("usdb.snt", 2, 2, 16), ("ckpot.snt", 4, 4, 2)])
def test_raised_squares_are_the_squares_of_j_plus(name, z, n, m):
    """20Ne at 2M = 0, 6 and 16 (the highest: no 2M + 2 states, J₊ψ = 0), 19F (odd), 12C at 2M = 2."""
    problem = hamiltonian.ShellModelProblem(snt.read_snt(DATA / name), z, n, m)
    v = np.random.default_rng(m).standard_normal((problem.dimension, 3))
    expected = ((angmom.j_plus(problem) @ v) ** 2).sum(axis=0)
    np.testing.assert_allclose(_raised_squares(problem, v), expected, rtol=1e-12, atol=1e-12)
    table = gpu_angmom.block_table(problem.basis, MSchemeBasis(problem.pdets, problem.ndets, m + 2))
    assert table.dtype == np.int64 and table.shape[1] == gpu_angmom.BLOCK_FIELDS
    assert (len(table) == 0) == (m == 16)


@needs_data
def test_raising_by_target_rows():
    problem = hamiltonian.ShellModelProblem(snt.read_snt(DATA / "usdb.snt"), 2, 2, 0)
    ptr, src, coef = gpu_angmom.raising_by_target(problem.pdets, problem.jumps_p)
    s, d, c = angmom._raise_entries(problem.jumps_p, problem.pdets)
    assert ptr[0] == 0 and ptr[-1] == len(s) and len(ptr) == len(problem.pdets) + 1
    assert src.dtype == np.int32 and coef.dtype == np.float64
    dense = np.zeros((len(problem.pdets),) * 2)
    dense[d, s] = c
    for row in range(len(problem.pdets)):
        cols = src[ptr[row]:ptr[row + 1]]
        assert (np.diff(cols) > 0).all()
        np.testing.assert_array_equal(coef[ptr[row]:ptr[row + 1]], dense[row, cols])
        assert np.count_nonzero(dense[row]) == len(cols)
