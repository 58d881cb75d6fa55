"""cisolver.estimate: the counts behind the refusal of runs that cannot fit. The determinant counts, one-body
jumps and two-particle moves from generating functions equal a brute-force enumeration; the M-scheme dimension
equals the basis'; the nonzeros bound the build's from above and come within 2 % of them; H's bytes match
the build's CSR arrays."""
import itertools
import time

import numpy as np
import pytest

from cisolver import estimate
from cisolver.shellmodel import basis, hamiltonian, snt
from ci_data import DATA, needs_data



def _brute_force(twoms, n):
    """Determinants by 2M, one-body jumps J[a, b] and two-particle moves T[a] by enumeration."""
    off = int(np.abs(twoms).sum())
    width = 2 * off + 1
    dets = [frozenset(c) for c in itertools.combinations(range(len(twoms)), n)]
    m_of = {d: sum(twoms[i] for i in d) + off for d in dets}
    counts, jumps, moves = np.zeros(width, int), np.zeros((width, width)), np.zeros(width)
    for d in dets:
        counts[m_of[d]] += 1
        empty = [i for i in range(len(twoms)) if i not in d]
        for g in d:
            for a in empty:
                jumps[m_of[d], m_of[d - {g} | {a}]] += 1
        for gd in itertools.combinations(sorted(d), 2):
            for ab in itertools.combinations(empty, 2):
                target = d - set(gd) | set(ab)
                if m_of[target] == m_of[d]:
                    moves[m_of[d]] += 1
    return counts, jumps, moves


@pytest.mark.parametrize("twojs,n", [((1, 3, 5), 3), ((1, 3, 5), 0), ((1, 3, 5), 1), ((7, 3), 4), ((7,), 2),
                                     ((1, 1, 3), 5), ((5, 1, 3), 12)])
def test_species_counts_equal_enumeration(twojs, n):
    twoms = np.array([tm for j in twojs for tm in range(-j, j + 1, 2)])
    got = estimate._Species(twoms, n)
    counts, jumps, moves = _brute_force(twoms, n)
    np.testing.assert_array_equal(got.by_m, counts)
    np.testing.assert_array_equal(got.jumps(), jumps)
    np.testing.assert_array_equal(got.pair_moves(), moves)


CASES = [("usdb.snt", 2, 2, None), ("usdb.snt", 2, 3, None), ("usdb.snt", 3, 4, 5), ("usdb.snt", 4, 4, 8),
         ("ckpot.snt", 4, 4, None), ("ckpot.snt", 3, 2, -3), ("gxpf1a.snt", 2, 2, None), ("kb3g.snt", 3, 2, 1)]


@needs_data
@pytest.mark.parametrize("name,z,n,m", CASES)
def test_dimension_exact_and_nonzeros_bound_the_build(name, z, n, m):
    inter = snt.read_snt(DATA / name)
    prob = hamiltonian.ShellModelProblem(inter, z, n, m)
    got = estimate.count(inter, z, n, prob.basis.twice_m)
    assert got.dimension == prob.dimension
    assert [(tm, a, b) for tm, a, b in got.blocks] == [(B.twom_p, B.n_p, B.n_n) for B in prob.basis.blocks]
    for storage in ("full", "upper"):
        h, info = prob.build(storage=storage)
        assert info.nnz_stored <= got.nnz(storage) <= 1.02 * info.nnz_stored, storage
        mem = estimate.memory(got, nev=5, block_size=8, dtype=np.float64, storage=storage)
        actual = h.data.nbytes + h.indices.nbytes + h.indptr.nbytes
        assert actual <= mem.h_bytes <= 1.02 * actual
    # the bound is at least as tight as the build's row weights (which count the element pairs it visits)
    assert got.nnz_full <= prob.row_block_weights().sum()


@needs_data
@pytest.mark.parametrize("name,z,n", [("usdb.snt", 2, 2), ("usdb.snt", 3, 4), ("ckpot.snt", 1, 2), ("gxpf1a.snt", 2, 1)])
def test_allowed_twice_m_is_the_edge_of_the_basis(name, z, n):
    inter = snt.read_snt(DATA / name)
    top = estimate.allowed_twice_m(inter, z, n)
    prob = hamiltonian.ShellModelProblem(inter, z, n)
    for m in (top, -top):
        assert basis.MSchemeBasis(prob.pdets, prob.ndets, m).dim == estimate.count(inter, z, n, m).dimension > 0
    for m in (top + 2, -top - 2):
        assert basis.MSchemeBasis(prob.pdets, prob.ndets, m).dim == estimate.count(inter, z, n, m).dimension == 0


@needs_data
def test_56ni_is_counted_in_a_second():
    """56Ni in gxpf1a: the dimension is the known 1 087 455 228, counted without enumerating a determinant."""
    inter = snt.read_snt(DATA / "gxpf1a.snt")
    t0 = time.perf_counter()
    got = estimate.count(inter, 8, 8, 0)
    assert time.perf_counter() - t0 < 2.0
    assert got.dimension == 1_087_455_228
    assert got.nnz_full > 1e3 * got.dimension


def test_memory_estimate_follows_the_choices():
    """Smaller for float32, upper storage, more ranks; a GPU run puts H on the GPUs."""
    c = estimate.Counts(10 ** 6, 0, 4e8, {"full": 5e7, "upper": 3e7}, [(0, 1000, 1000)])
    base = estimate.memory(c, nev=5, block_size=8, dtype=np.float64, storage="full")
    assert estimate.memory(c, nev=5, block_size=8, dtype=np.float32, storage="full").host < base.host
    assert estimate.memory(c, nev=5, block_size=8, dtype=np.float64, storage="upper").host < base.host
    assert estimate.memory(c, nev=5, block_size=8, dtype=np.float64, storage="full", ranks=4).host < base.host
    gpu = estimate.memory(c, nev=5, block_size=8, dtype=np.float64, storage="full", gpus=(0, 1))
    assert set(gpu.gpu) == {0, 1} and gpu.gpu[0] > gpu.h_bytes / 2 and not base.gpu
