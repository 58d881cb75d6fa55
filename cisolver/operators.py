"""SpMM with the symmetric Hamiltonian: full CSR or the upper triangle only (H = U + U^T - D, like
MFDn's half storage), on the CPU (scipy.sparse) or on one or more GPUs (cuSPARSE: cisolver.gpu_spmm).

On the CPU the rows are cut into pieces of equal nonzeros, one per thread (scipy's sparse products run
single-threaded but release the GIL). With upper storage each piece's transposed product U_p^T x_p adds
into the rows from the piece's first row on, so each thread writes a partial result of those rows and the
partials are summed by row ranges, again one range per thread. With Intel MKL installed (the ``mkl`` extra) the CPU product goes to MKL's
sparse block product instead (cisolver.mkl_sparse): it reads the upper triangle directly and costs far
less than k single-vector products.
"""

import numpy as np
import scipy.sparse as sp

from hybridblas import lowlevel, workers
from hybridblas.blas_threads import available_cores

from . import mkl_sparse

MIN_NNZ_PER_THREAD = 200_000      # below this a thread costs more than it gives
MAX_THREADS = 16


def _check_square(h):
    if not sp.issparse(h) or h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise TypeError(f"h must be a square scipy.sparse matrix, got {type(h).__name__} "
                        f"{getattr(h, 'shape', None)}")


def _float_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


class SymmetricOperator:
    """y = H x for blocks of vectors (n x k, C order), H stored full or as its upper triangle.

    devices: "cpu", or a list of CUDA device ids (rows split evenly by nonzeros, each device on its own
    stream; the block goes to every device and the results come back to the first: cisolver.gpu_spmm).
    gpu_storage: how GPUs hold an upper triangle: "full" rows (made on the GPUs), "upper" (U's rows and
    their transposes), or "auto" (full where they fit: gpu_spmm.choose_storage); ``self.gpu.storage`` says.
    backend (CPU): "mkl" (Intel MKL, error if not installed), "scipy" (row pieces on ``threads``
    threads), or "auto": MKL when installed and ``threads`` is not given (``threads`` sizes the scipy
    path only; MKL's threads follow MKL_NUM_THREADS / threadpoolctl).
    ``SymmetricOperator.on_gpus`` holds full rows that the GPUs built themselves, without a host matrix.
    """

    def __init__(self, h, storage="full", devices="cpu", dtype=None, threads=None, backend="auto",
                 gpu_storage="auto"):
        _check_square(h)
        if storage not in ("full", "upper"):
            raise ValueError(f"storage must be 'full' or 'upper', got {storage!r}")
        if gpu_storage not in ("auto", "full", "upper"):
            raise ValueError(f"gpu_storage must be 'auto', 'full' or 'upper', got {gpu_storage!r}")
        if gpu_storage == "upper" and storage != "upper":
            raise ValueError("gpu_storage='upper' needs storage='upper' (the upper triangle of H on the host)")
        if backend not in ("auto", "scipy", "mkl"):
            raise ValueError(f"backend must be 'auto', 'scipy' or 'mkl', got {backend!r}")
        self.storage = storage
        self.shape = h.shape
        self.dtype = _float_dtype(dtype or h.dtype)
        h = h.tocsr().astype(self.dtype, copy=False)
        self.nnz = int(h.nnz)
        self.mkl = None
        if devices == "cpu" or devices is None:
            self.devices = None
            self.xp = np
            if backend == "mkl" and threads is not None:
                raise ValueError("threads applies to backend='scipy'; MKL's threads follow "
                                 "MKL_NUM_THREADS / threadpoolctl")
            if backend == "mkl" and not mkl_sparse.available():
                raise RuntimeError("backend='mkl' needs Intel MKL (libmkl_rt), not found; "
                                   "install the 'mkl' extra: pip install mkl")
            self.diag = h.diagonal()
            if backend == "mkl" or (backend == "auto" and threads is None and mkl_sparse.available()):
                self.mkl = mkl_sparse.MklCsr(h, symmetric_upper=storage == "upper")
                threads = 1      # the scipy path then only serves other x dtypes: one piece, no copies
            self._cpu_pieces(h, threads)
        else:
            if backend == "mkl":
                raise ValueError("backend='mkl' is for devices='cpu'")
            self._to_devices(h, list(devices), None if gpu_storage == "auto" else gpu_storage)
        self.backend = "mkl" if self.mkl is not None else ("scipy" if self.devices is None else "cupy")

    @classmethod
    def on_gpus(cls, parts, n, dtype):
        """H (n x n) as the full rows that the GPUs built themselves (``parts``: one per device, the first
        device's rows first, from cisolver.gpu_build.build_rows_on_gpus); nothing is copied."""
        import cupy
        from . import cuda_modules
        from .gpu_spmm import MultiDeviceCsr
        self = cls.__new__(cls)
        self.storage, self.shape, self.dtype = "full", (n, n), _float_dtype(dtype)
        self.xp, self.mkl, self.backend = cupy, None, "cupy"
        cuda_modules.prepare(cupy, self.dtype, [dev for dev, _, _, _ in parts])
        lowlevel.prepare_kernels(self.dtype, [dev for dev, _, _, _ in parts])     # the Gram kernels, hybridblas's
        self.gpu = MultiDeviceCsr.from_parts(parts, n, self.dtype)
        self.devices = self.gpu.devices
        self.nnz = sum(part.rows.nnz for part in self.gpu.parts)
        return self

    def _cpu_pieces(self, h, threads):
        """Row pieces of equal nonzeros for ``threads`` threads (default: the cores, at most 16)."""
        if threads is None:
            threads = min(MAX_THREADS, available_cores(), max(1, self.nnz // MIN_NNZ_PER_THREAD))
        elif not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        n = h.shape[0]
        cuts = np.searchsorted(h.indptr, np.linspace(0, h.nnz, threads + 1)[1:-1])
        bounds = [0, *map(int, cuts), n]
        if threads == 1:
            self.pieces = [(0, n, h)]
        elif self.storage == "upper":       # rows r0..r1 of U hold no column left of r0: keep r0.. only
            self.pieces = [(r0, r1, h[r0:r1, r0:]) for r0, r1 in zip(bounds, bounds[1:])]
        else:
            self.pieces = [(r0, r1, h[r0:r1]) for r0, r1 in zip(bounds, bounds[1:])]
        self.threads = threads

    def _matmat_cpu(self, x):
        x = np.ascontiguousarray(x)
        if self.mkl is not None and x.dtype == self.dtype:
            return self.mkl.matmat(x)
        n, k = x.shape
        upper = self.storage == "upper"
        if self.threads == 1:
            (_, _, h), = self.pieces
            y = h @ x
            if upper:
                y += h.T @ x
                y -= self.diag[:, None] * x
            return y
        y = np.empty((n, k), dtype=np.result_type(self.dtype, x.dtype))

        def rows(piece):
            r0, r1, h = piece
            if not upper:
                y[r0:r1] = h @ x
                return None
            y[r0:r1] = h @ x[r0:]
            return h.T @ x[r0:r1]          # U_p^T x_p: rows r0.. only (CSC view, no copy)
        partials = workers.map(rows, self.pieces, self.threads)
        if upper:
            def add(q):
                q0, q1, _ = self.pieces[q]
                block = y[q0:q1]
                for (r0, _, _), z in zip(self.pieces[:q + 1], partials):    # pieces that start at or before q0
                    block += z[q0 - r0:q1 - r0]
                block -= self.diag[q0:q1, None] * x[q0:q1]
            workers.map(add, range(len(self.pieces)), self.threads)
        return y

    def _to_devices(self, h, devices, gpu_storage):
        import cupy
        from . import cuda_modules
        from .gpu_spmm import MultiDeviceCsr
        self.xp = cupy
        self.devices = devices
        cuda_modules.prepare(cupy, self.dtype, devices)       # compiles meanwhile (the set-up's kernels wait)
        lowlevel.prepare_kernels(self.dtype, devices)         # and hybridblas's (lowlevel.grams) likewise
        self.gpu = MultiDeviceCsr(h, devices, self.dtype, self.storage == "upper", storage=gpu_storage)

    def matmat(self, x, out=None):
        """H x; ``out``: where to write it (e.g. a column range of a row-major block), else a new array."""
        if self.devices is not None:
            if x.dtype == self.dtype and (out is None or out.dtype == self.dtype):
                return self.gpu.matmat(x, out=out)
            # another precision: the product in the matrix's, the result in the caller's (as on the CPU)
            y = self.gpu.matmat(x.astype(self.dtype)).astype(x.dtype if out is None else out.dtype)
        else:
            y = self._matmat_cpu(x)
        if out is None:
            return y
        out[...] = y
        return out

    __matmul__ = matmat
