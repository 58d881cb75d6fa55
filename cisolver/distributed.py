"""Distributed LOBPCG pieces (mpi4py): vectors distributed by rows, a 1-D row-block SpMM with
Allgatherv, and Gram matrices as local hybridblas split-K products plus one Allreduce (MFDn's pattern).

Each rank builds only the Hamiltonian rows it owns (whole proton-2M blocks), so neither the matrix nor
the vectors need to fit on one node.
"""
import numpy as np

from hybridblas import distributed as _d

__all__ = ["world", "block_ranges", "DistributedOperator", "build_local", "allreduce", "colnorms"]

world = _d.world
allreduce = _d.allreduce


def block_ranges(sizes, n_ranks):
    """Contiguous ranges of row blocks, one per rank, with about equal rows each."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    total = bounds[-1]
    cuts = [0]
    for r in range(1, n_ranks):
        cuts.append(max(cuts[-1], int(np.searchsorted(bounds, r * total / n_ranks))))
    cuts.append(len(sizes))
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def build_local(problem, comm, dtype=np.float64, n_threads=None):
    """This rank's rows of H (full storage), and its row range [lo, hi)."""
    blocks = problem.basis.blocks
    mine = block_ranges([b.size for b in blocks], comm.Get_size() if comm else 1)[comm.Get_rank() if comm else 0]
    lo = blocks[mine.start].offset if len(mine) else 0
    hi = lo + sum(blocks[i].size for i in mine)
    if len(mine) == 0:
        import scipy.sparse as sp
        return sp.csr_matrix((0, problem.dimension), dtype=dtype), lo, lo
    h, _ = problem.build(storage="full", dtype=dtype, n_threads=n_threads, blocks=mine)
    return h, lo, hi


class DistributedOperator:
    """y_local = H[lo:hi, :] x for x distributed by rows: gather x (Allgatherv), multiply the local rows.

    device: a CUDA device id to hold this rank's rows and vectors there (cisolver.gpu_spmm); the gather then goes
    GPU to GPU through NCCL where CuPy has it (hybridblas.distributed.allgather_rows).
    """

    def __init__(self, h_local, lo, hi, n, comm, dtype=None, device=None):
        self.h = h_local.tocsr().astype(dtype or h_local.dtype, copy=False)
        self.local = (lo, hi)
        self.shape = (n, n)
        self.dtype = self.h.dtype
        self.comm = comm
        self.xp = np
        self.device = device
        self.gpu = None
        if device is not None:
            import cupy
            from .gpu_spmm import DeviceCsr
            self.gpu = DeviceCsr(self.h, device, self.dtype)     # row-major cuSPARSE products (gpu_spmm)
            self.h = None                                        # the rows live on the GPU now
            self.xp = cupy
        self.comm_seconds = 0.0

    def matmat(self, x_local):
        import time
        t0 = time.perf_counter()
        xp = self.xp
        x_full = _d.allgather_rows(xp.ascontiguousarray(x_local), self.comm)
        self.comm_seconds += time.perf_counter() - t0
        if self.gpu is None:
            return self.h @ x_full
        with xp.cuda.Device(self.device):
            y = xp.empty((self.gpu.shape[0], x_full.shape[1]), dtype=self.dtype)
            return self.gpu.multiply_into(y, x_full.astype(self.dtype, copy=False))

    __matmul__ = matmat


def colnorms(r, comm):
    """2-norms of the columns of a row-distributed block."""
    from .arrays import column_sumsq
    sq = column_sumsq(r)
    return np.sqrt(allreduce(np.ascontiguousarray(sq), comm))
