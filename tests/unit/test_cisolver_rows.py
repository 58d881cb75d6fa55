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
    for lo, _ in ranges:                                       # between proton determinants
        block = next(b for b in problem.basis.blocks if b.offset <= lo < b.offset + b.size) \
            if lo < problem.dimension else None
        assert block is None or (lo - block.offset) % block.n_n == 0


@pytest.mark.parametrize("storage", ["full", "upper"])
def test_build_of_a_row_range_equals_those_rows_of_the_whole(mg24, storage):
    problem, h_full = mg24
    h = h_full if storage == "full" else problem.build(storage)[0]
    blocks = problem.basis.blocks
    rng = np.random.default_rng(3)
    mid = max(blocks, key=lambda b: b.size)               # a block cut on both sides, and ranges over blocks
    ranges = [(mid.offset + mid.n_n, mid.offset + 3 * mid.n_n), (0, problem.dimension),
              (blocks[1].offset + blocks[1].n_n, mid.offset + 2 * mid.n_n), (mid.offset, mid.offset)]
    for _ in range(3):
        i, j = sorted(rng.choice(len(blocks), 2))
        a = blocks[i].offset + blocks[i].n_n * int(rng.integers(0, blocks[i].n_p))
        b = blocks[j].offset + blocks[j].n_n * int(rng.integers(1, blocks[j].n_p + 1))
        ranges.append((min(a, b), max(a, b)))
    for lo, hi in ranges:
        part, _ = problem.build(storage, rows=(lo, hi))
        assert part.shape == (hi - lo, problem.dimension)
        assert abs(part - h[lo:hi]).max() == 0 if hi > lo else part.nnz == 0, (lo, hi)


def test_build_refuses_a_range_that_cuts_a_proton_determinant(mg24):
    problem, _ = mg24
    mid = max(problem.basis.blocks, key=lambda b: b.size)
    with pytest.raises(ValueError, match=r"rows \(\d+, \d+\) cut block"):
        problem.build("full", rows=(mid.offset + 1, mid.offset + mid.n_n))
    with pytest.raises(ValueError, match="rows must be a range"):
        problem.build("full", rows=(5, problem.dimension + 1))


def test_row_ranges_edges():
    assert row_ranges([5], [7.0], 1) == [(0, 5)]
    assert row_ranges([3, 0, 4], [3.0, 0.0, 4.0], 4) == [(0, 2), (2, 3), (3, 5), (5, 7)]
    assert row_ranges([2], [1.0], 4) == [(0, 0), (0, 1), (1, 2), (2, 2)]      # more ranks than rows
    assert row_ranges([12, 12], [1.0, 1.0], 3, granules=[4, 6]) == [(0, 8), (8, 18), (18, 24)]
