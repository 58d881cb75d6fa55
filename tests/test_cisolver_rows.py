"""Row ranges of a distributed shell-model H (no MPI needed: a stand-in communicator per rank)."""
import numpy as np
import pytest
import scipy.sparse as sp

from cisolver.data import resolve_interaction
from cisolver.distributed import build_local, row_ranges
from cisolver.shellmodel import hamiltonian, snt


class _Rank:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size


@pytest.fixture(scope="module")
def mg24():
    problem = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction("usdb")), 4, 4)
    return problem, problem.build("full")[0]


def _block_nnz(problem, h):
    bounds = [b.offset for b in problem.basis.blocks] + [problem.dimension]
    return np.diff(h.indptr[bounds])


def test_row_block_weights_follow_the_nonzeros(mg24):
    problem, h = mg24
    ratio = problem.row_block_weights() / _block_nnz(problem, h)
    assert len(ratio) == len(problem.basis.blocks) > 3
    assert np.all((ratio >= 1.0) & (ratio < 1.1)), ratio       # an upper bound, within 10 %


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 5])
def test_build_local_cuts_inside_blocks_with_equal_nonzeros(mg24, n_ranks):
    problem, h = mg24
    parts = [build_local(problem, _Rank(r, n_ranks)) for r in range(n_ranks)]
    ranges = [(lo, hi) for _, lo, hi in parts]
    assert ranges[0][0] == 0 and ranges[-1][1] == problem.dimension
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    stacked = sp.vstack([p for p, _, _ in parts]).tocsr()
    assert stacked.shape == h.shape and abs(stacked - h).max() == 0
    nnz = np.array([p.nnz for p, _, _ in parts])
    assert nnz.max() <= 1.02 * nnz.mean(), nnz
    offsets = {b.offset for b in problem.basis.blocks}
    if n_ranks > 2:
        assert any(lo not in offsets for lo, _ in ranges[1:])  # equal nonzeros need cuts inside blocks


def test_row_ranges_edges():
    assert row_ranges([5], [7.0], 1) == [(0, 5)]
    assert row_ranges([3, 0, 4], [3.0, 0.0, 4.0], 4) == [(0, 2), (2, 3), (3, 5), (5, 7)]
    assert row_ranges([2], [1.0], 4) == [(0, 0), (0, 1), (1, 2), (2, 2)]      # more ranks than rows
