"""Distributed LOBPCG pieces (mpi4py): vectors distributed by rows, a 1-D row-block SpMM with
Allgatherv, and Gram matrices as local hybridblas split-K products plus one Allreduce (MFDn's pattern).

Each rank builds only the Hamiltonian rows it owns (whole proton determinants), on the host or on its GPU, so
neither the matrix nor the vectors need to fit on one node.
"""
import numpy as np

from hybridblas import distributed as _d

from . import gpu_build

__all__ = ["world", "block_ranges", "DistributedOperator", "local_rows", "build_rows", "build_local", "allreduce",
           "device_sum", "colnorms"]

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


def row_ranges(sizes, weights, n_ranks, granules=None):
    """Contiguous row ranges [lo, hi), one per rank, with about equal weight each: block i has sizes[i] rows
    and weights[i] spread evenly over them (the sparse product's nonzeros), so a cut may fall inside a block,
    after a multiple of granules[i] rows of it (default 1)."""
    granules = np.ones(len(sizes), dtype=np.int64) if granules is None else np.asarray(granules, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    rows = np.concatenate([[0], np.cumsum(sizes)])
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    cuts = [0]
    for r in range(1, n_ranks):
        target = r * cum[-1] / n_ranks
        i = min(int(np.searchsorted(cum, target, side="right")) - 1, len(sizes) - 1)
        inside = (target - cum[i]) / weights[i] * sizes[i] if weights[i] > 0 else 0.0
        inside = granules[i] * round(inside / granules[i])
        cuts.append(int(min(max(cuts[-1], rows[i] + inside), rows[-1])))
    cuts.append(int(rows[-1]))
    return list(zip(cuts, cuts[1:]))


def local_rows(problem, comm):
    """This rank's row range [lo, hi) of H. The ranges give every rank about the same number of nonzeros
    (ShellModelProblem.row_block_weights) and may cut a block between two of its proton determinants."""
    blocks = problem.basis.blocks
    n_ranks, rank = (comm.Get_size(), comm.Get_rank()) if comm else (1, 0)
    return row_ranges([b.size for b in blocks], problem.row_block_weights(), n_ranks,
                      granules=[b.n_n for b in blocks])[rank]


def build_rows(problem, rows, dtype=np.float64, n_threads=None, device=None):
    """Rows (lo, hi) of H (full storage) and the build's stage times: a scipy CSR matrix built on the host, or,
    with ``device`` a CUDA id, (indptr, indices, data) CuPy arrays built on that GPU (cisolver.gpu_build)."""
    if device is None:
        h, info = problem.build(storage="full", dtype=dtype, n_threads=n_threads, rows=rows)
        return h, info.seconds
    [(_, _, _, h)], stages = gpu_build.build_rows_on_gpus(problem, [device], dtype, n_threads, rows=rows)
    return h, dict(problem.setup_seconds, **stages)


def build_local(problem, comm, dtype=np.float64, n_threads=None, device=None):
    """This rank's rows of H (full storage, ``build_rows``: on the host, or on GPU ``device``), and its row range
    [lo, hi) (``local_rows``); each rank builds only its own rows."""
    lo, hi = local_rows(problem, comm)
    return build_rows(problem, (lo, hi), dtype, n_threads, device)[0], lo, hi


class DistributedOperator:
    """y_local = H[lo:hi, :] x for x distributed by rows: gather x (Allgatherv), multiply the local rows.

    h_local: this rank's rows H[lo:hi, :], a scipy sparse matrix, or (indptr, indices, data) CuPy arrays on
    ``device`` that it built there (``build_rows``), used as they are.
    device: a CUDA device id to hold this rank's rows and vectors there (cisolver.gpu_spmm). Where CuPy has
    NCCL (``queued``), x is gathered GPU to GPU into a full block kept for the next call, by NCCL broadcasts
    queued on the stream (hybridblas.distributed.gather_rows_into), and the product is written into ``out``:
    the host does not wait, so a GPU rank can queue whole iterations (cisolver.iterations). Else the gather
    goes through host memory and MPI.
    """

    def __init__(self, h_local, lo, hi, n, comm, dtype=None, device=None):
        on_device = isinstance(h_local, tuple)       # rows built on the GPU (build_rows): they stay there
        if on_device:
            if device is None:
                raise ValueError("DistributedOperator: rows given as device arrays (indptr, indices, data) need "
                                 "their device, got device=None")
            held, asked = (len(h_local[0]) - 1, h_local[2].dtype), (hi - lo, np.dtype(dtype or h_local[2].dtype))
            if held != asked:
                raise ValueError(f"DistributedOperator: h_local holds {held[0]} rows of {held[1]}, rows {lo}:{hi} "
                                 f"of {asked[1]} asked")
            self.h, self.dtype = None, np.dtype(h_local[2].dtype)
        else:
            self.h = h_local.tocsr().astype(dtype or h_local.dtype, copy=False)
            self.dtype = self.h.dtype
        self.local = (lo, hi)
        self.shape = (n, n)
        self.comm = comm
        self.xp = np
        self.device = device
        self.devices = None              # set for a GPU rank: Iterations then passes ``out``
        self.gpu = None
        self.queued = False
        ranges = comm.allgather((lo, hi))
        self.counts = [b - a for a, b in ranges]
        if [a for a, _ in ranges] != [int(x) for x in np.concatenate([[0], np.cumsum(self.counts)[:-1]])]:
            raise ValueError(f"DistributedOperator: the ranks' row ranges {ranges} are not contiguous in rank order")
        self._gathered = None             # one flat buffer for the gathered block, as wide as the widest asked
        if device is not None:
            import cupy
            from .gpu_spmm import DeviceCsr
            # row-major cuSPARSE products (gpu_spmm); host rows are uploaded, then live on the GPU only
            self.gpu = DeviceCsr(h_local if on_device else self.h, device, self.dtype, shape=(hi - lo, n))
            self.h = None
            self.xp = cupy
            self.devices = [device]
            with cupy.cuda.Device(device):
                self.queued = _d.device_collectives(comm, cupy.empty(1, dtype=self.dtype))
        self.nnz = (self.h if self.gpu is None else self.gpu).nnz     # this rank's stored entries
        self.comm_seconds = 0.0           # host time of gathers through host memory (queued gathers: none)

    def matmat(self, x_local, out=None):
        import time
        xp = self.xp
        if self.queued:
            with xp.cuda.Device(self.device):
                n, width = self.shape[0], x_local.shape[1]
                if self._gathered is None or self._gathered.size < n * width:
                    self._gathered = xp.empty(n * width, dtype=self.dtype)
                full = self._gathered[:n * width].reshape(n, width)     # reused in stream order
                lo, hi = self.local
                full[lo:hi] = x_local
                _d.gather_rows_into(full, self.counts, self.comm)      # queued: its time is in the product's
                y = out if out is not None else xp.empty((self.gpu.shape[0], full.shape[1]), dtype=self.dtype)
                return self.gpu.multiply_into(y, full)
        t0 = time.perf_counter()
        x_full = _d.allgather_rows(xp.ascontiguousarray(x_local), self.comm)
        self.comm_seconds += time.perf_counter() - t0
        if self.gpu is None:
            y = self.h @ x_full
        else:
            with xp.cuda.Device(self.device):
                y = xp.empty((self.gpu.shape[0], x_full.shape[1]), dtype=self.dtype)
                y = self.gpu.multiply_into(y, x_full.astype(self.dtype, copy=False))
        if out is not None:
            out[...] = y
            return out
        return y

    __matmul__ = matmat


def device_sum(x, comm):
    """x (a cupy Gram or vector of this rank's rows) summed over the ranks, queued on the stream (NCCL);
    unchanged when ``comm`` is None. Returns a C-contiguous float64 array (the same layout on every rank)."""
    if comm is None:
        return x
    import cupy
    x = cupy.ascontiguousarray(x, dtype=np.float64)
    return allreduce(x, comm, wait=False)


def colnorms(r, comm):
    """2-norms of the columns of a row-distributed block."""
    from .arrays import column_sumsq
    sq = column_sumsq(r)
    return np.sqrt(allreduce(np.ascontiguousarray(sq), comm))
