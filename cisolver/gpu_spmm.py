"""Sparse-times-block products on GPUs through cuSPARSE's generic SpMM, on one or several GPUs at once,
without host waits, and the set-up that puts H's rows there without a transpose or a submatrix on the host.

``DeviceCsr`` is one CSR matrix on one GPU, multiplied into row-major blocks (column ranges of the solver's
S and H S, strided rows allowed). ``MultiDeviceCsr`` splits H by rows of equal nonzeros over GPUs: every
device but the first runs on its own non-blocking stream, the block goes out by a peer copy, the products
run at the same time, the rows come back by peer copies, and the caller's stream waits on events; the host
never waits.

Set-up. A row block of a host CSR matrix is a range of its indptr (rebased to 0) and the matching ranges of
its indices and values (views, no copy): ``row_block``. ``choose_storage`` decides by the GPUs' free memory
how they hold H when the host holds its upper triangle U (H = U + U^T - D):
- "full": the first GPU uploads U, transposes it with cuSPARSE (csr2csc), counts the rows of H, cuts them into
  parts of equal nonzeros and merges each part's rows (row i of H: column i of U above the diagonal, then row
  i of U) with one kernel; each part goes to its GPU. One product per GPU, nothing to add up after.
- "upper": each GPU uploads its rows of U and transposes them there; the product is U_p x + U_p^T x_p per
  part, the U_p^T x_p partial sums added on the first GPU, less D x (no transpose or slicing on the host).
A full host matrix goes to the GPUs as it is, in row blocks; rows that the GPUs built themselves
(cisolver.gpu_build) stay where they are (``MultiDeviceCsr.from_parts``). The products of "full" and "upper"
differ by the order of their sums only.
"""
import sys

import numpy as np

from .arrays import row_major, row_stride

ORDER_COL, ORDER_ROW = 1, 2     # cusparseOrder_t
SPMM_DEFAULT, SPMM_CSR_ALG1, SPMM_CSR_ALG2 = 0, 4, 6     # cusparseSpMMAlg_t
LAYOUT = "row"
OP_N = 0                        # cusparseOperation_t NON_TRANSPOSE
_CUDA_TYPE = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}    # cudaDataType CUDA_R_32F, CUDA_R_64F
MERGE_THREADS = 256
UNSORTED, LOWER = 1, 2      # row_flags' bits
PEAK_FRACTION = 0.9       # of a GPU's free memory the set-up may take at its peak
RESERVE_FRACTION = 0.25   # of a GPU's free memory left after the set-up for LOBPCG's blocks and cuSPARSE
INT32_MAX = np.iinfo(np.int32).max

_SOURCE = r"""
// Rows of the symmetric H = U + U^T - D from its upper triangle U: (indptr, indices, val) U's rows 0..n-1 in
// CSR, (colptr, rowind, cval) the same U in CSC. Row r of H is column r of U above the diagonal (rows < r, in
// the column's order) followed by row r of U (its diagonal, if stored, and the entries right of it).

// counts[i] = the entries of row r0 + i of H (i < rows)
extern "C" __global__ void full_row_counts(const int* indptr, const int* colptr, const int* rowind, long long r0,
        long long rows, int* counts)
{
    const long long step = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += step) {
        const long long r = r0 + i;
        int above = 0;
        for (int e = colptr[r]; e < colptr[r + 1]; ++e) above += rowind[e] < r;
        counts[i] = above + (indptr[r + 1] - indptr[r]);
    }
}

// rows r0 .. r0 + rows - 1 of H into (out_ptr, out_idx, out_val), out_ptr[i] the start of row r0 + i (from 0).
// A warp a row: its lanes take consecutive entries, those of the column above the diagonal placed by a ballot.
extern "C" __global__ void full_rows(const int* indptr, const int* indices, const T* val, const int* colptr,
        const int* rowind, const T* cval, long long r0, long long rows, const int* out_ptr, int* out_idx,
        T* out_val)
{
    const int lane = threadIdx.x & 31;
    const long long warps = (long long) gridDim.x * blockDim.x / 32;
    for (long long i = ((long long) blockIdx.x * blockDim.x + threadIdx.x) / 32; i < rows; i += warps) {
        const long long r = r0 + i;
        int o = out_ptr[i];
        const int c1 = colptr[r + 1];
        for (int base = colptr[r]; base < c1; base += 32) {
            const int e = base + lane;
            const bool keep = e < c1 && rowind[e] < r;
            const unsigned mask = __ballot_sync(0xffffffffu, keep);
            if (keep) {
                const int at = o + __popc(mask & ((1u << lane) - 1u));
                out_idx[at] = rowind[e];
                out_val[at] = cval[e];
            }
            o += __popc(mask);
        }
        const int u0 = indptr[r], u1 = indptr[r + 1];
        for (int e = lane; e < u1 - u0; e += 32) {
            out_idx[o + e] = indices[u0 + e];
            out_val[o + e] = val[u0 + e];
        }
    }
}

// Rows 0..rows-1 of a CSR matrix: *flags |= UNSORTED where a row's column indices are not ascending, and
// with diagonal >= 0, |= LOWER where row r holds a column left of diagonal + r
extern "C" __global__ void row_flags(const int* indptr, const int* indices, long long rows, long long diagonal,
        int* flags)
{
    const long long step = (long long) gridDim.x * blockDim.x;
    for (long long r = (long long) blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += step) {
        int bad = 0;
        for (int e = indptr[r]; e < indptr[r + 1]; ++e) {
            if (e > indptr[r] && indices[e] < indices[e - 1]) bad |= UNSORTED;
            if (diagonal >= 0 && indices[e] < diagonal + r) bad |= LOWER;
        }
        if (bad) atomicOr(flags, bad);
    }
}
"""


def cuda_section(dtype):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules)."""
    return _SOURCE, {"UNSORTED": UNSORTED, "LOWER": LOWER}, ["full_row_counts", "full_rows", "row_flags"]


# ---- host side: no CuPy needed ----

def row_block(h, r0, r1):
    """Rows r0:r1 of the scipy CSR matrix ``h`` as (indptr from 0, indices, data): the indptr range rebased
    (a new array of r1 - r0 + 1 entries), the indices and values as views of h's (no copy, no scan)."""
    n = h.shape[0]
    if not 0 <= r0 <= r1 <= n:
        raise ValueError(f"rows {r0}:{r1} of a matrix with {n} rows")
    a, b = int(h.indptr[r0]), int(h.indptr[r1])
    return h.indptr[r0:r1 + 1] - h.indptr[r0], h.indices[a:b], h.data[a:b]


def balanced_bounds(starts, parts):
    """Row bounds [0, ..., n] of ``parts`` ranges of equal nonzeros for rows starting at ``starts`` (an
    indptr: n + 1 nondecreasing entries from 0)."""
    starts = np.asarray(starts)
    cuts = np.searchsorted(starts, np.linspace(0, starts[-1], parts + 1)[1:-1])
    return [0, *map(int, cuts), len(starts) - 1]


def csr_bytes(rows, nnz, itemsize):
    """Bytes of a CSR matrix with int32 indices."""
    return 4 * (rows + 1) + nnz * (4 + itemsize)


def assembly_bytes(n, nnz, itemsize, parts):
    """Full rows of H (n x n) made on ``parts`` GPUs from its upper triangle U (``nnz`` entries): (bytes the
    first GPU holds at the peak: U, its transpose and one part of H's rows, or cuSPARSE's transpose workspace
    taken as large as U; bytes of one part; entries of one part), a part bounded by 2 nnz / parts + n entries."""
    part_nnz = -(-2 * nnz // parts) + n
    part = csr_bytes(n, part_nnz, itemsize)
    u = csr_bytes(n, nnz, itemsize)
    return 2 * u + max(u, part), part, part_nnz


def choose_storage(upper, n, nnz, itemsize, free):
    """How GPUs with ``free`` bytes each hold H (n x n): "full" rows or "upper" (U's rows and their
    transposes). A full host matrix (``upper`` False) is held as it is. Of the upper triangle U (``nnz``
    entries) the GPUs make full rows when they fit (assembly_bytes): the first GPU's peak at most PEAK_FRACTION
    of its free memory, each GPU's part at most 1 - RESERVE_FRACTION of its free memory after, and fewer than
    2^31 entries in U and in a part (int32 indices)."""
    if not upper:
        return "full"
    peak, part, part_nnz = assembly_bytes(n, nnz, itemsize, len(free))
    fits = (max(nnz, part_nnz) <= INT32_MAX and peak <= PEAK_FRACTION * free[0]
            and all(part <= (1 - RESERVE_FRACTION) * f for f in free))
    return "full" if fits else "upper"


# ---- GPU side ----

def _scratch(cache, device, key, shape, dtype, order="C"):
    """A block kept between calls in ``cache`` (made on ``device`` the first time)."""
    import cupy
    key = (key, shape, np.dtype(dtype), order)
    if key not in cache:
        with cupy.cuda.Device(device):
            cache[key] = cupy.empty(shape, dtype=dtype, order=order)
    return cache[key]


def _upload(block, dtype):
    """(indptr, indices, data) host arrays to the current device: int32 indices, values in ``dtype``."""
    import cupy
    indptr, indices, data = block
    if len(indices) > INT32_MAX:
        raise ValueError(f"{len(indices)} nonzeros in one GPU's rows: more than int32 indices hold; use more GPUs")
    return (cupy.asarray(indptr.astype(np.int32, copy=False)), cupy.asarray(indices.astype(np.int32, copy=False)),
            cupy.asarray(data.astype(dtype, copy=False)))


def _launch(name, dtype, n, args):
    """One of this module's kernels over n rows (a thread a row, or a warp a row for full_rows), on the
    current device and stream."""
    import cupy

    from . import cuda_modules
    per_block = MERGE_THREADS // 32 if name == "full_rows" else MERGE_THREADS
    cuda_modules.function(cupy, dtype, name)((max(1, -(-n // per_block)),), (MERGE_THREADS,), args)


def _transpose(csr, shape, dtype):
    """The CSC arrays (colptr, rowind, values) of the CSR arrays ``csr`` on the current device (cuSPARSE's
    csr2csc: rows ascending within each column)."""
    import cupy
    from cupy_backends.cuda.libs import cusparse as cs
    indptr, indices, data = csr
    rows, cols = shape
    nnz = int(data.size)
    colptr = cupy.zeros(cols + 1, dtype=np.int32)
    rowind = cupy.empty(nnz, dtype=np.int32)
    values = cupy.empty(nnz, dtype=dtype)
    if nnz:
        handle = cupy.cuda.device.get_cusparse_handle()
        cs.setStream(handle, cupy.cuda.get_current_stream().ptr)
        args = (handle, rows, cols, nnz, data.data.ptr, indptr.data.ptr, indices.data.ptr, values.data.ptr,
                colptr.data.ptr, rowind.data.ptr, _CUDA_TYPE[np.dtype(dtype)], cs.CUSPARSE_ACTION_NUMERIC,
                cs.CUSPARSE_INDEX_BASE_ZERO, cs.CUSPARSE_CSR2CSC_ALG1)
        work = cupy.empty(max(cs.csr2cscEx2_bufferSize(*args), 1), dtype=np.int8)
        cs.csr2cscEx2(*args, work.data.ptr)
    return colptr, rowind, values


def _row_flags(csr, rows, dtype, diagonal=-1):
    """row_flags of the CSR arrays' first ``rows`` rows (diagonal >= 0: entries left of diagonal + row too)."""
    import cupy
    flags = cupy.zeros(1, dtype=np.int32)
    if rows:
        _launch("row_flags", dtype, rows, (csr[0], csr[1], np.int64(rows), np.int64(diagonal), flags))
    return int(flags.get()[0])


def _check_upper(csr, rows, dtype, first_row):
    """ValueError where these rows of U (the first row ``first_row`` of H) hold an entry left of the diagonal."""
    if _row_flags(csr, rows, dtype, first_row) & LOWER:
        raise ValueError("storage='upper' needs the upper triangle of H: h has entries below the diagonal")


def _sorted(csr, shape, dtype):
    """The CSR arrays with every row's column indices ascending (sorted by cupyx where they were not)."""
    if not _row_flags(csr, shape[0], dtype) & UNSORTED:
        return csr
    import cupyx.scipy.sparse as csp
    indptr, indices, data = csr
    m = csp.csr_matrix((data, indices, indptr), shape=shape)
    m.sort_indices()
    return m.indptr, m.indices, m.data


class DeviceCsr:
    """One CSR matrix on one GPU; ``multiply_into(y, x, beta)``: y = A x + beta y on the current stream, x and
    y row-major (strided rows allowed). ``h``: a scipy CSR matrix (uploaded), or a tuple (indptr, indices,
    data) of CuPy arrays on ``device`` (int32 indices, values in ``dtype``) with ``shape``. Rows whose column
    indices are not ascending are sorted on the GPU.

    layout "row" (default): cuSPARSE reads and writes the row-major blocks in place with ``alg`` (default
    CSR_ALG1); "col": x goes through a column-major scratch block and the product comes back through
    another, cuSPARSE's default algorithm in between (what cupyx's ``csr @ block`` does). One H200, 8
    columns (benchmarks.cisolver spmm-gpu): 48Cr float32 29.9 ms row/ALG1 against 46.9 col and
    62.5 row/ALG2 or row/default; 47V float64 9.8 against 10.2 and 13.3.
    """

    def __init__(self, h, device, dtype, layout=None, alg=None, shape=None):
        import cupy
        from cupy_backends.cuda.libs import cusparse as cs
        self.device = device
        self.dtype = np.dtype(dtype)
        self.layout = layout or LAYOUT
        if self.layout not in ("col", "row"):
            raise ValueError(f"layout must be 'col' or 'row', got {self.layout!r}")
        self.alg = (SPMM_CSR_ALG1 if self.layout == "row" else SPMM_DEFAULT) if alg is None else alg
        self.desc = None
        with cupy.cuda.Device(device):
            if isinstance(h, tuple):
                self.shape = tuple(shape)
                csr = h
            else:
                self.shape = h.shape
                csr = _upload(row_block(h.tocsr(), 0, h.shape[0]), self.dtype)
            self.indptr, self.indices, self.data = _sorted(csr, self.shape, self.dtype)
            self.nnz = int(self.data.size)
            if self.nnz:
                i32 = cs.CUSPARSE_INDEX_32I
                self.desc = cs.createCsr(self.shape[0], self.shape[1], self.nnz, self.indptr.data.ptr,
                                         self.indices.data.ptr, self.data.data.ptr, i32, i32,
                                         cs.CUSPARSE_INDEX_BASE_ZERO, _CUDA_TYPE[self.dtype])
        self._workspace = {}
        self._scratch = {}

    def __del__(self):
        if getattr(self, "desc", None) is not None and not sys.is_finalizing():
            from cupy_backends.cuda.libs import cusparse as cs
            cs.destroySpMat(self.desc)
            self.desc = None

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
            args = (handle, OP_N, OP_N, alpha.ctypes.data, self.desc, dx, beta.ctypes.data, dy, ctype)
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
    """Rows r0:r1 of H on one device: ``rows`` (full rows, or U's rows with ``rows_t`` = U_p^T beside them)."""

    def __init__(self, device, r0, r1, rows, rows_t=None):
        import cupy
        self.device, self.r0, self.r1 = device, r0, r1
        self.rows, self.rows_t = rows, rows_t
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


def require_on_gpu(nbytes, device, what):
    """hybridblas.InsufficientMemory where ``nbytes`` would take more than PEAK_FRACTION of GPU ``device``'s free
    memory, with what to change."""
    from hybridblas import memory
    memory.require(nbytes, where=device, what=what, fraction=PEAK_FRACTION,
                   advice="use more GPUs, or float32 values (--dtype float32)")


def _row_parts(h, devices, dtype, make, need, what):
    """H's rows split by equal nonzeros over ``devices``: each block of rows r0:r1 (row_block) checked to fit
    (``need(rows, nonzeros, itemsize)`` bytes, ``what`` names it) and made into a _Part on its device by
    ``make(device, r0, r1, block)``."""
    import cupy
    itemsize = np.dtype(dtype).itemsize
    bounds = balanced_bounds(h.indptr, len(devices))
    parts = []
    for dev, r0, r1 in zip(devices, bounds[:-1], bounds[1:]):
        block = row_block(h, r0, r1)
        require_on_gpu(need(r1 - r0, len(block[1]), itemsize), dev, f"rows {r0}:{r1} of {what}")
        with cupy.cuda.Device(dev):
            parts.append(make(dev, r0, r1, block))
    return parts


def _full_parts(h, devices, dtype):
    """A full host matrix: its rows split by equal nonzeros, each part uploaded to its device."""
    n = h.shape[0]
    return _row_parts(h, devices, dtype, lambda dev, r0, r1, block: _Part(
        dev, r0, r1, DeviceCsr(_upload(block, dtype), dev, dtype, shape=(r1 - r0, n))), csr_bytes, "H")


def _upper_parts(h, devices, dtype):
    """The upper triangle U kept: each device uploads its rows of U (equal nonzeros) and transposes them."""
    n = h.shape[0]

    def make(dev, r0, r1, block):
        u = _upload(block, dtype)
        _check_upper(u, r1 - r0, dtype, r0)
        colptr, rowind, values = _transpose(u, (r1 - r0, n), dtype)
        # U_p^T: the rows r0.. of the transpose (those before are empty: no column of U_p is left of r0)
        rows_t = DeviceCsr((colptr[r0:], rowind, values), dev, dtype, shape=(n - r0, r1 - r0))
        return _Part(dev, r0, r1, DeviceCsr(u, dev, dtype, shape=(r1 - r0, n)), rows_t)
    return _row_parts(h, devices, dtype, make, lambda rows, nnz, item: 3 * csr_bytes(n, nnz, item),
                      "U and their transpose")


def _assembled_parts(h, devices, dtype):
    """Full rows of H = U + U^T - D made from the upper triangle U on the first device (U uploaded, transposed
    there), split by equal nonzeros of H and sent to their devices, the first device's own part last."""
    import cupy
    rt = cupy.cuda.runtime
    n, first, itemsize = h.shape[0], devices[0], np.dtype(dtype).itemsize
    require_on_gpu(assembly_bytes(n, int(h.nnz), itemsize, len(devices))[0], first,
             "H's upper triangle, its transpose and one GPU's part of H's rows")
    with cupy.cuda.Device(first):
        u = _upload(row_block(h, 0, n), dtype)
        _check_upper(u, n, dtype, 0)
        t = _transpose(u, (n, n), dtype)
        counts = cupy.empty(n, dtype=np.int32)
        if n:
            _launch("full_row_counts", dtype, n, (u[0], t[0], t[1], np.int64(0), np.int64(n), counts))
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts.get(), out=starts[1:])
        bounds = balanced_bounds(starts, len(devices))
        parts = {}
        for i in [*range(1, len(devices)), 0]:
            r0, r1, dev = bounds[i], bounds[i + 1], devices[i]
            ptr = starts[r0:r1 + 1] - starts[r0]
            nnz = int(ptr[-1])
            if nnz > INT32_MAX:
                raise ValueError(f"{nnz} nonzeros in one GPU's rows of H: more than int32 indices hold; "
                                 "use more GPUs")
            ptr_d = cupy.asarray(ptr.astype(np.int32))
            idx, val = cupy.empty(nnz, dtype=np.int32), cupy.empty(nnz, dtype=dtype)
            if r1 > r0:
                _launch("full_rows", dtype, r1 - r0, (u[0], u[1], u[2], t[0], t[1], t[2], np.int64(r0),
                                                      np.int64(r1 - r0), ptr_d, idx, val))
            if dev != first:                   # to its device; this device's copy is freed after
                cupy.cuda.get_current_stream().synchronize()
                with cupy.cuda.Device(dev):
                    there = [cupy.empty_like(a) for a in (ptr_d, idx, val)]
                    for a, b in zip(there, (ptr_d, idx, val)):
                        if b.nbytes:
                            rt.memcpyPeer(a.data.ptr, dev, b.data.ptr, first, b.nbytes)
                    rt.deviceSynchronize()
                ptr_d, idx, val = there
            parts[i] = _Part(dev, r0, r1, DeviceCsr((ptr_d, idx, val), dev, dtype, shape=(r1 - r0, n)))
    return [parts[i] for i in range(len(devices))]


class MultiDeviceCsr:
    """H (scipy CSR: full, or its upper triangle with ``upper``) split by rows of equal nonzeros over
    ``devices``; ``matmat(x, out=None)`` gives H x on the first device, for x there (n x k, row-major).
    ``storage``: how the GPUs hold an upper triangle, "full" or "upper" (default: choose_storage by their free
    memory); ``self.storage`` says which they do."""

    def __init__(self, h, devices, dtype, upper, storage=None):
        from hybridblas import memory
        self.devices = list(devices)
        self.dtype = np.dtype(dtype)
        self.n = h.shape[0]
        if storage not in (None, "full", "upper"):
            raise ValueError(f"storage must be 'full' or 'upper', got {storage!r}")
        if storage == "upper" and not upper:
            raise ValueError("storage='upper' on the GPUs needs the upper triangle of H on the host")
        if storage is None:
            free = [memory.gpu_free(d) for d in self.devices]
            storage = choose_storage(upper, self.n, int(h.nnz), self.dtype.itemsize, free)
        self.storage = storage
        self.upper = storage == "upper"
        if not upper:
            self.parts = _full_parts(h, self.devices, self.dtype)
        elif storage == "full":
            self.parts = _assembled_parts(h, self.devices, self.dtype)
        else:
            self.parts = _upper_parts(h, self.devices, self.dtype)
        self._connect(h.diagonal() if self.upper else None)

    @classmethod
    def from_parts(cls, parts, n, dtype):
        """H (n x n) from full rows already on their GPUs: ``parts`` [(device, r0, r1, (indptr, indices, data))]
        with CuPy arrays on that device (int32 indptr and indices, values in ``dtype``), the row ranges
        following each other from 0 to n (cisolver.gpu_build.build_rows_on_gpus); nothing is copied."""
        ranges = [(r0, r1) for _, r0, r1, _ in parts]
        bounds = [0] + [r for pair in ranges for r in pair] + [n]
        if not parts or bounds[0::2] != bounds[1::2] or any(r1 < r0 for r0, r1 in ranges):
            raise ValueError(f"parts must hold rows 0..{n} in order, got the row ranges {ranges}")
        import cupy
        self = cls.__new__(cls)
        self.devices = [dev for dev, _, _, _ in parts]
        self.dtype = np.dtype(dtype)
        self.n = n
        self.storage, self.upper = "full", False
        self.parts = []
        for dev, r0, r1, csr in parts:
            with cupy.cuda.Device(dev):
                self.parts.append(_Part(dev, r0, r1, DeviceCsr(csr, dev, self.dtype, shape=(r1 - r0, n))))
        self._connect(None)
        return self

    def _connect(self, diag):
        """Peer access between the devices, the first device's event for the block and, for upper storage,
        H's diagonal (a host array) there."""
        import cupy
        _enable_peer_access(self.devices)
        with cupy.cuda.Device(self.devices[0]):
            self.diag = None if diag is None else cupy.asarray(diag.astype(self.dtype, copy=False))
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
