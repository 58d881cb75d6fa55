"""Sparse-times-block products on GPUs through cuSPARSE's generic SpMM, on one or several GPUs at once,
without host waits.

``DeviceCsr`` is one CSR matrix on one GPU, multiplied into row-major blocks (column ranges of the solver's
S and H S, strided rows allowed). ``MultiDeviceCsr`` splits H by rows of equal nonzeros over GPUs: every
device but the first runs on its own non-blocking stream, the block goes out by a peer copy, the products
run at the same time, the rows come back by peer copies, and the caller's stream waits on events; the host
never waits. (cupyx's ``csr @ block``, which cisolver used before, drove the devices one after the other:
48Cr took 47.8 ms per product on two H200s, 47.6 on one; see docs/performance.md.)
"""
import numpy as np

from .arrays import row_major, row_stride

ORDER_COL, ORDER_ROW = 1, 2     # cusparseOrder_t
SPMM_DEFAULT, SPMM_CSR_ALG1, SPMM_CSR_ALG2 = 0, 4, 6     # cusparseSpMMAlg_t
LAYOUT = "row"
OP_N = 0                        # cusparseOperation_t NON_TRANSPOSE
_CUDA_TYPE = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}    # cudaDataType CUDA_R_32F, CUDA_R_64F


def _scratch(cache, device, key, shape, dtype, order="C"):
    """A block kept between calls in ``cache`` (made on ``device`` the first time)."""
    import cupy
    key = (key, shape, np.dtype(dtype), order)
    if key not in cache:
        with cupy.cuda.Device(device):
            cache[key] = cupy.empty(shape, dtype=dtype, order=order)
    return cache[key]


class DeviceCsr:
    """One CSR matrix (scipy CSR, uploaded) on one GPU; ``multiply_into(y, x, beta)``: y = A x + beta y
    on the current stream, x and y row-major (strided rows allowed).

    layout "row" (default): cuSPARSE reads and writes the row-major blocks in place with ``alg`` (default
    CSR_ALG1); "col": x goes through a column-major scratch block and the product comes back through
    another, cuSPARSE's default algorithm in between (what cupyx's ``csr @ block`` does). One H200, 8
    columns (benchmarks/bench_spmm_gpu.py, session 8): 48Cr float32 29.9 ms row/ALG1 against 46.9 col and
    62.5 row/ALG2 or row/default; 47V float64 9.8 against 10.2 and 13.3.
    """

    def __init__(self, h, device, dtype, layout=None, alg=None):
        import cupy
        import cupyx.scipy.sparse as csp
        from cupyx import cusparse
        self.device = device
        self.dtype = np.dtype(dtype)
        self.shape = h.shape
        self.nnz = int(h.nnz)
        self.layout = layout or LAYOUT
        if self.layout not in ("col", "row"):
            raise ValueError(f"layout must be 'col' or 'row', got {self.layout!r}")
        self.alg = (SPMM_CSR_ALG1 if self.layout == "row" else SPMM_DEFAULT) if alg is None else alg
        with cupy.cuda.Device(device):
            self.m = csp.csr_matrix((cupy.asarray(h.data.astype(self.dtype, copy=False)), cupy.asarray(h.indices),
                                     cupy.asarray(h.indptr)), shape=h.shape)
            self.m.sort_indices()
            self.desc = cusparse.SpMatDescriptor.create(self.m) if self.nnz else None
        self._workspace = {}
        self._scratch = {}

    def multiply_into(self, y, x, beta=0.0):
        import cupy
        rows, cols = self.shape
        if cupy.cuda.Device().id != self.device:
            raise ValueError(f"call on device {self.device} (the current device is {cupy.cuda.Device().id})")
        if x.shape[0] != cols or y.shape[0] != rows or x.shape[1] != y.shape[1]:
            raise ValueError(f"shapes: A {self.shape}, x {x.shape}, y {y.shape}")
        if x.dtype != self.dtype or y.dtype != self.dtype:
            raise TypeError(f"x and y must be {self.dtype}, got {x.dtype} and {y.dtype}")
        k = x.shape[1]
        if k == 0 or rows == 0:
            return y
        if self.desc is None:                 # no nonzeros: y = beta y
            if beta == 0:
                y.fill(0)
            else:
                y *= beta
            return y
        if self.layout == "col":
            xf = _scratch(self._scratch, self.device, "x", (cols, k), self.dtype, "F")
            xf[...] = x
            yf = _scratch(self._scratch, self.device, "y", (rows, k), self.dtype, "F")
            self._call(yf, rows, xf, cols, k, ORDER_COL)
            if beta == 0:
                y[...] = yf
            else:
                if beta != 1:
                    y *= beta
                y += yf
            return y
        # rows at a leading dimension, unit stride along a row: cuSPARSE takes them as they are (it asks
        # only that values be aligned to their type, cusparseCreateDnMat); other layouts go through copies
        if not row_major(x):
            x = cupy.ascontiguousarray(x)
        if not row_major(y):
            tmp = cupy.ascontiguousarray(y) if beta != 0 else cupy.empty(y.shape, dtype=y.dtype)
            self.multiply_into(tmp, x, beta)
            y[...] = tmp
            return y
        self._call(y, row_stride(y), x, row_stride(x), k, ORDER_ROW, beta)
        return y

    def _call(self, y, ld_y, x, ld_x, k, order, beta=0.0):
        import cupy
        from cupy_backends.cuda.libs import cusparse as cs
        rows, cols = self.shape
        ctype = _CUDA_TYPE[self.dtype]
        dx = cs.createDnMat(cols, k, ld_x, x.data.ptr, ctype, order)
        dy = cs.createDnMat(rows, k, ld_y, y.data.ptr, ctype, order)
        try:
            handle = cupy.cuda.device.get_cusparse_handle()
            cs.setStream(handle, cupy.cuda.get_current_stream().ptr)
            alpha, beta = np.array(1, self.dtype), np.array(beta, self.dtype)     # host scalars, read at the call
            args = (handle, OP_N, OP_N, alpha.ctypes.data, self.desc.desc, dx, beta.ctypes.data, dy, ctype)
            try:
                self._spmm(cs, args, self.alg)
            except cs.CuSparseError:
                if self.alg == SPMM_DEFAULT:
                    raise
                self.alg = SPMM_DEFAULT          # the algorithm turned these blocks down: cuSPARSE's own choice
                self._spmm(cs, args, self.alg)
        finally:
            cs.destroyDnMat(dx)
            cs.destroyDnMat(dy)

    def _spmm(self, cs, args, alg):
        import cupy
        size = cs.spMM_bufferSize(*args, alg)
        buf = self._workspace.get(size)
        if buf is None:
            with cupy.cuda.Device(self.device):
                buf = self._workspace[size] = cupy.empty(max(size, 1), dtype=cupy.int8)
        cs.spMM(*args, alg, buf.data.ptr)


class _Part:
    """Rows r0:r1 of H on one device, with U_p^T (rows r0.. of H) beside it for upper storage."""

    def __init__(self, h, r0, r1, device, dtype, upper):
        import cupy
        self.device, self.r0, self.r1 = device, r0, r1
        sub = h[r0:r1]
        self.rows = DeviceCsr(sub, device, dtype)
        # U's rows r0..r1 hold no column left of r0, so U_p^T x_p only reaches rows r0.. of the result
        self.rows_t = DeviceCsr(h[r0:r1, r0:].T.tocsr(), device, dtype) if upper else None
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.scratch = {}

    def buffer(self, name, shape, dtype):
        return _scratch(self.scratch, self.device, name, shape, dtype)


def _enable_peer_access(devices):
    import cupy
    rt = cupy.cuda.runtime
    for a in devices:
        for b in devices:
            if a != b and rt.deviceCanAccessPeer(a, b):
                with cupy.cuda.Device(a):
                    try:
                        rt.deviceEnablePeerAccess(b)
                    except rt.CUDARuntimeError:
                        pass      # already enabled


class MultiDeviceCsr:
    """H (scipy CSR: full, or its upper triangle with ``upper``) split by rows of equal nonzeros over
    ``devices``; ``matmat(x, out=None)`` gives H x on the first device, for x there (n x k, row-major)."""

    def __init__(self, h, devices, dtype, upper, diag):
        import cupy
        self.devices = list(devices)
        self.dtype = np.dtype(dtype)
        self.upper = upper
        self.n = h.shape[0]
        cuts = np.searchsorted(h.indptr, np.linspace(0, h.nnz, len(self.devices) + 1)[1:-1])
        bounds = [0, *map(int, cuts), self.n]
        self.parts = [_Part(h, r0, r1, dev, dtype, upper)
                      for dev, r0, r1 in zip(self.devices, bounds[:-1], bounds[1:])]
        _enable_peer_access(self.devices)
        with cupy.cuda.Device(self.devices[0]):
            self.diag = cupy.asarray(diag.astype(self.dtype, copy=False))
            self.x_ready = cupy.cuda.Event(disable_timing=True)
        self.home = {}

    def matmat(self, x, out=None):
        import cupy
        first, n = self.devices[0], self.n
        k = x.shape[1]
        with cupy.cuda.Device(first):
            caller = cupy.cuda.get_current_stream()
            y = out if out is not None else cupy.empty((n, k), dtype=self.dtype)
            remote = self.parts[1:]
            if remote:
                x = cupy.ascontiguousarray(x)
                whole = y if y.flags.c_contiguous else cupy.empty((n, k), dtype=self.dtype)
                self.x_ready.record(caller)
            else:
                whole = y
        done = [self._remote(i, part, x, whole, k) for i, part in enumerate(self.parts) if i]   # remote first
        local = self.parts[0]
        with cupy.cuda.Device(first):
            local.rows.multiply_into(whole[local.r0:local.r1], x)
            if self.upper and not remote:
                local.rows_t.multiply_into(whole[local.r0:], x[local.r0:local.r1], beta=1.0)
            elif self.upper:        # into a scratch: the remote rows of ``whole`` may not have arrived yet
                z0 = self._home("z", 0, (n - local.r0, k))
                local.rows_t.multiply_into(z0, x[local.r0:local.r1])
            for ev in done:
                caller.wait_event(ev)
            if self.upper:
                if remote:            # every part's U_p^T x_p, its own included (one device: added above)
                    for i, part in enumerate(self.parts):
                        whole[part.r0:] += self._home("z", i, (n - part.r0, k))
                whole -= self.diag[:, None] * x
            if whole is not y:
                y[...] = whole
        return y

    def _home(self, name, i, shape):
        """A scratch block on the first device for part i (kept between calls)."""
        return _scratch(self.home, self.devices[0], (name, i), shape, self.dtype)

    def _remote(self, i, part, x, whole, k):
        """Start part's rows on its own stream: x in by a peer copy, its rows (and, for upper storage, its
        U_p^T x_p) back to the first device by peer copies; returns the event that marks them done."""
        import cupy
        rt = cupy.cuda.runtime
        first, n = self.devices[0], self.n
        with cupy.cuda.Device(part.device):
            s = part.stream
            s.wait_event(self.x_ready)
            xd = part.buffer("x", (n, k), self.dtype)
            rt.memcpyPeerAsync(xd.data.ptr, part.device, x.data.ptr, first, x.nbytes, s.ptr)
            with s:
                yd = part.buffer("y", (part.r1 - part.r0, k), self.dtype)
                part.rows.multiply_into(yd, xd)
                rt.memcpyPeerAsync(whole[part.r0:part.r1].data.ptr, first, yd.data.ptr, part.device, yd.nbytes, s.ptr)
                if self.upper:
                    zd = part.buffer("z", (n - part.r0, k), self.dtype)
                    part.rows_t.multiply_into(zd, xd[part.r0:part.r1])
                    z_home = self._home("z", i, (n - part.r0, k))
                    rt.memcpyPeerAsync(z_home.data.ptr, first, zd.data.ptr, part.device, zd.nbytes, s.ptr)
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(s)
        return ev
