"""MFDn's triangular distribution of a symmetric H over P = n_d (n_d + 1) / 2 ranks, and its SpMM.

H is cut into n_d x n_d blocks along row blocks of the basis; of each pair H_ij, H_ji only one is stored
(the diagonal blocks always), on its own rank, chosen cyclically so that every row and every column of
the grid holds about (n_d + 1) / 2 blocks. Sub-vector W_j is split into segments over the ranks of grid
column j; each rank's vector rows are one contiguous segment. One product U = H W (paper: "Distributed
SpMV" in ../shared/papers/ci-distributed-spmv-nccl.md, steps 1-4):

1. Allgatherv of W_j in column communicator j;
2. the diagonal rank (i, i) broadcasts W_i over row communicator i, overlapped with U_i += H_ij W_j;
3. Reduce of the U_i parts onto (i, i) over row i, overlapped with the transposed product H_ij^T W_i;
4. Reduce_scatter over column j of the transposed parts (plus the reduced U_j on (j, j)).

Each rank holds one block (1/P of the stored half of H) and 1/P of each vector, against 1/P of the full
H and the whole vector for the 1-D row layout (DistributedOperator).
"""
import math
import time

import numpy as np
import scipy.sparse as sp

from .distributed import block_ranges


def grid_size(n_ranks):
    """n_d with n_d (n_d + 1) / 2 = n_ranks; ValueError naming the rank count when there is none."""
    n_d = (math.isqrt(8 * n_ranks + 1) - 1) // 2
    if n_d * (n_d + 1) // 2 != n_ranks:
        near = [d * (d + 1) // 2 for d in range(1, n_d + 3)]
        raise ValueError(f"the triangular layout needs n_d (n_d + 1) / 2 ranks ({', '.join(map(str, near))}, "
                         f"...), got {n_ranks}")
    return n_d


def stored_blocks(n_d):
    """Grid positions (i, j) stored, in rank order (column-major, as MFDn maps them): every diagonal
    block, and of each off-diagonal pair the one at cyclic offset 1..(n_d - 1) // 2 right of the diagonal
    (for even n_d, offset n_d / 2 keeps i < j)."""
    def stored(i, j):
        off = (j - i) % n_d
        if i == j:
            return True
        if 2 * off == n_d:
            return i < j
        return off <= (n_d - 1) // 2
    return [(i, j) for j in range(n_d) for i in range(n_d) if stored(i, j)]


class TriangularLayout:
    """Who holds what: grid block of each rank, row ranges of the sub-vectors and of each rank's segment."""

    def __init__(self, block_sizes, n_ranks):
        self.n_d = grid_size(n_ranks)
        self.blocks = stored_blocks(self.n_d)
        groups = block_ranges(block_sizes, self.n_d)           # basis blocks of each sub-vector
        edges = np.concatenate([[0], np.cumsum(block_sizes)]).astype(int)
        self.basis_blocks = groups
        self.sub = [(int(edges[g.start]), int(edges[g.stop])) if len(g) else (int(edges[g.start]),) * 2
                    for g in groups]
        self.column = {j: [r for r, (_, jj) in enumerate(self.blocks) if jj == j] for j in range(self.n_d)}
        self.row = {i: [r for r, (ii, _) in enumerate(self.blocks) if ii == i] for i in range(self.n_d)}
        self.segment = {}
        for j, members in self.column.items():
            a, b = self.sub[j]
            cuts = [a + (b - a) * s // len(members) for s in range(len(members) + 1)]
            for s, r in enumerate(members):
                self.segment[r] = (cuts[s], cuts[s + 1])

    def diagonal_rank(self, i):
        return self.blocks.index((i, i))


def build_block(problem, layout, rank, dtype=np.float64, n_threads=None):
    """H_ij of this rank's grid block (i, j), CSR: built from the upper-storage rows of min(i, j)."""
    i, j = layout.blocks[rank]
    lo, hi = min(i, j), max(i, j)
    rows = layout.basis_blocks[lo]
    (r0, r1), (c0, c1) = layout.sub[lo], layout.sub[hi]
    if r1 == r0 or c1 == c0:
        return sp.csr_matrix((layout.sub[i][1] - layout.sub[i][0], layout.sub[j][1] - layout.sub[j][0]),
                             dtype=dtype)
    upper, _ = problem.build(storage="upper", dtype=dtype, n_threads=n_threads, blocks=rows)
    block = upper.tocsc()[:, c0:c1].tocsr()
    if i == j:        # the diagonal block in full: its upper triangle, mirrored
        block = (block + sp.triu(block, k=1).T).tocsr()
    elif i > j:       # stored below the diagonal: H_ij = H_ji^T
        block = block.T.tocsr()
    return block


class TriangularOperator:
    """y_local = (H x) on this rank's segment, with H in the triangular layout (see the module text)."""

    def __init__(self, h_block, layout, n, comm, dtype=None):
        self.h = h_block.tocsr().astype(dtype or h_block.dtype, copy=False)
        self.ht = self.h.T                      # CSC view: the transposed product without a second copy
        self.layout = layout
        rank = comm.Get_rank()
        self.i, self.j = layout.blocks[rank]
        self.local = layout.segment[rank]
        self.shape = (n, n)
        self.dtype = self.h.dtype
        self.comm = comm
        self.xp = np
        self.comm_seconds = 0.0
        # column j communicator (ordered by segment) and row i communicator (the diagonal rank first)
        col_members = layout.column[self.j]
        row_members = layout.row[self.i]
        diag = layout.diagonal_rank(self.i)
        self.col = comm.Split(color=self.j, key=col_members.index(rank))
        self.row = comm.Split(color=self.i, key=0 if rank == diag else 1 + row_members.index(rank))
        self.col_counts = [layout.segment[r][1] - layout.segment[r][0] for r in col_members]
        self.sub_i = layout.sub[self.i][1] - layout.sub[self.i][0]
        self.sub_j = layout.sub[self.j][1] - layout.sub[self.j][0]

    def matmat(self, x_local):
        from mpi4py import MPI
        x_local = np.ascontiguousarray(x_local, dtype=self.dtype)
        k = x_local.shape[1]
        t_comm = 0.0
        # 1. W_j on every rank of column j
        t0 = time.perf_counter()
        w_j = np.empty((self.sub_j, k), dtype=self.dtype)
        sizes = [c * k for c in self.col_counts]
        self.col.Allgatherv(x_local, [w_j, (sizes, _offsets(sizes))])
        t_comm += time.perf_counter() - t0
        diagonal = self.i == self.j
        # 2. W_i from the diagonal rank of row i, while U_i += H_ij W_j
        w_i = w_j if diagonal else np.empty((self.sub_i, k), dtype=self.dtype)
        bcast = self.row.Ibcast(w_i, root=0)
        u_i = self.h @ w_j
        t0 = time.perf_counter()
        bcast.Wait()
        t_comm += time.perf_counter() - t0
        # 3. the U_i parts summed on the diagonal rank, while the transposed product runs
        u_i = np.ascontiguousarray(u_i)
        summed = np.empty_like(u_i) if diagonal else None
        reduce = self.row.Ireduce(u_i, summed, op=MPI.SUM, root=0)
        contribution = None if diagonal else np.ascontiguousarray(self.ht @ w_i)
        t0 = time.perf_counter()
        reduce.Wait()
        t_comm += time.perf_counter() - t0
        if diagonal:
            contribution = summed
        # 4. U_j's segments: sum over column j, scattered back to the segments
        t0 = time.perf_counter()
        out = np.empty_like(x_local)
        self.col.Reduce_scatter(contribution, out, recvcounts=sizes, op=MPI.SUM)
        t_comm += time.perf_counter() - t0
        self.comm_seconds += t_comm
        return out

    __matmul__ = matmat


def _offsets(sizes):
    return [int(o) for o in np.concatenate([[0], np.cumsum(sizes)[:-1]])]
