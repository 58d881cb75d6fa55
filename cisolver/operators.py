"""SpMM with the symmetric Hamiltonian: full CSR or the upper triangle only (H = U + U^T - D, like
MFDn's half storage), on the CPU (scipy.sparse) or on one or more GPUs (cupyx.scipy.sparse)."""
import numpy as np
import scipy.sparse as sp


def _check_square(h):
    if not sp.issparse(h) or h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise TypeError(f"h must be a square scipy.sparse matrix, got {type(h).__name__} "
                        f"{getattr(h, 'shape', None)}")


class SymmetricOperator:
    """y = H x for blocks of vectors (n x k, C order), H stored full or as its upper triangle.

    devices: "cpu", or a list of CUDA device ids (rows split evenly by nonzeros; the block of
    vectors is replicated and results are summed on the first device).
    """

    def __init__(self, h, storage="full", devices="cpu", dtype=None):
        _check_square(h)
        if storage not in ("full", "upper"):
            raise ValueError(f"storage must be 'full' or 'upper', got {storage!r}")
        self.storage = storage
        self.shape = h.shape
        self.dtype = np.dtype(dtype or h.dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        h = h.tocsr().astype(self.dtype, copy=False)
        self.diag = h.diagonal()
        self.nnz = int(h.nnz)
        if devices == "cpu" or devices is None:
            self.devices = None
            self.h = h
            self.ht = h.T if storage == "upper" else None      # CSC view, no copy
            self.xp = np
        else:
            self._to_devices(h, list(devices))

    def _to_devices(self, h, devices):
        import cupy
        import cupyx.scipy.sparse as csp
        self.xp = cupy
        self.devices = devices
        n = h.shape[0]
        # split rows so that each device holds about the same number of nonzeros
        cuts = np.searchsorted(h.indptr, np.linspace(0, h.nnz, len(devices) + 1)[1:-1])
        bounds = [0, *map(int, cuts), n]
        self.parts = []
        for dev, r0, r1 in zip(devices, bounds[:-1], bounds[1:]):
            with cupy.cuda.Device(dev):
                sub = h[r0:r1]
                m = csp.csr_matrix((cupy.asarray(sub.data), cupy.asarray(sub.indices),
                                    cupy.asarray(sub.indptr)), shape=sub.shape)
                m.sort_indices()
                mt = m.T.tocsr() if self.storage == "upper" else None
                self.parts.append((dev, r0, r1, m, mt))
        with cupy.cuda.Device(devices[0]):
            self.diag_dev = cupy.asarray(self.diag)

    def matmat(self, x):
        if self.devices is None:
            x = np.ascontiguousarray(x)
            y = self.h @ x
            if self.storage == "upper":
                y += self.ht @ x
                y -= self.diag[:, None] * x
            return y
        return self._matmat_devices(x)

    def _matmat_devices(self, x):
        import cupy
        first = self.devices[0]
        x = cupy.ascontiguousarray(x)        # CuPy copies only contiguous arrays between devices
        outs = []
        for dev, r0, r1, m, mt in self.parts:
            with cupy.cuda.Device(dev):
                xd = x if dev == first else cupy.asarray(x)          # peer copy
                y = m @ xd
                z = mt @ xd[r0:r1] if mt is not None else None
                outs.append((dev, r0, r1, y, z))
        with cupy.cuda.Device(first):
            y = cupy.empty((self.shape[0], x.shape[1]), dtype=x.dtype)
            for dev, r0, r1, yy, _ in outs:
                y[r0:r1] = yy if dev == first else cupy.asarray(yy)
            if self.storage == "upper":
                for dev, r0, r1, _, z in outs:
                    y += z if dev == first else cupy.asarray(z)
                y -= self.diag_dev[:, None] * x
        return y

    __matmul__ = matmat
