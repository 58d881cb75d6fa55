"""A group of H's rows filled on a GPU by cisolver's own CUDA kernels (no CuPy-generated kernel).

The fill of cisolver.shellmodel.rowblocks, kernel for kernel: the host works out where each piece starts in each
row of the group (numpy, from the plan's counts, as ``RowBlock.fill`` does) and sends those starts in one copy;
then one kernel per piece writes its entries at their places (``fill_jump_grid`` for the grid of both-move
elements, ``fill_own_column`` for its column n', ``fill_own_piece`` for the diagonal and neutron moves), with
the host's element formulas in the host's order (products and sums rounded one by one, no fused multiply-add),
so that the GPU's rows are the host build's bit for bit. Where a group drops exact zeros the entries go to
scratch with a keep flag each and are compacted into the CSR arrays in order (``keep_counts``, ``keep_starts``,
``keep_compact``: counts per tile, their scan, the copy). A cold machine compiles these kernels in the "main" unit
of cisolver.cuda_modules (one NVRTC call, beside the other units), where CuPy's array operations took 14 s of
compiles for 48Cr's fill.
"""
import numpy as np

THREADS = 256
MAX_BLOCKS = 8192
TILE = 4096                # entries a block of the compaction takes
TILE_THREADS = 1024

_SOURCE = r"""
#define FOR_EACH(i, n) \
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long) gridDim.x * blockDim.x)

// JumpGrid: entry (e, s) of the grid (neutron column e, proton source s): s_p s_n v, at
// width[e] rank[s] + start of the piece in row (ctarget[e], starget[s]) + place[e] (+ lead[s]); keep: v != 0
extern "C" __global__ void fill_jump_grid(long long ne, long long ns, long long e0, long long s0, long long q0,
        long long g0, long long ng, const long long* width, const long long* rank, const long long* ctarget,
        const long long* place, const long long* starget, const long long* lead, const double* tab2, long long ld,
        const long long* ia, const long long* ib2, const double* sign, const int* csource, const int* col_base,
        const long long* starts, T* val, int* col, unsigned char* keep)
{
    FOR_EACH(i, ne * ns) {
        const long long e = e0 + i / ns, s = s0 + i % ns;
        long long at = width[e] * rank[s] + starts[(ctarget[e] - q0) * ng + (starget[s] - g0)] + place[e];
        if (lead) at += lead[s];
        const double v = __dmul_rn(tab2[ia[s] * ld + ib2[e]], sign[s]);
        val[at] = (T) v;
        col[at] = csource[e] + col_base[s];
        if (keep) keep[at] = v != 0.0;
    }
}

// OwnColumn: column n' = q of the proton source s, H_p(p', p) + s_p y[q, column[s]], always kept
extern "C" __global__ void fill_own_column(long long nq, long long ns, long long q0, long long s0, long long g0,
        long long ng, const long long* b, const long long* jumps_before, const long long* starget,
        const long long* rank, const long long* own_place, const unsigned char* is_jump, const double* base,
        const double* sign, const double* y, long long ld_y, const long long* column, const int* col_base,
        const long long* starts, T* val, int* col, unsigned char* keep)
{
    FOR_EACH(i, nq * ns) {
        const long long ql = i / ns, s = s0 + i % ns, q = q0 + ql;
        const long long at = b[q] * jumps_before[s] + starts[ql * ng + (starget[s] - g0)] + rank[s]
                             + own_place[q] * (long long) is_jump[s];
        val[at] = (T) __dadd_rn(base[s], __dmul_rn(sign[s], y[q * ld_y + column[s]]));
        col[at] = (int) q + col_base[s];
        if (keep) keep[at] = 1;
    }
}

// OwnPiece: entry e (neutron row ctarget[e]) of proton row g: the diagonal where is_own[e], else
// H_n(n', n) + s_n y_n[column[e], g]; always kept
extern "C" __global__ void fill_own_piece(long long ne, long long ngg, long long e0, long long g0, long long q0,
        const long long* ctarget, const long long* place, const double* base, const double* sign,
        const long long* column, const double* y_n, long long ld_yn, const unsigned char* is_own,
        const double* diag, long long ld_diag, const int* csource, const int* col_base, const long long* starts,
        T* val, int* col, unsigned char* keep)
{
    FOR_EACH(i, ne * ngg) {
        const long long e = e0 + i / ngg, gl = i % ngg, g = g0 + gl, q = ctarget[e];
        const long long at = starts[(q - q0) * ngg + gl] + place[e];
        const double v = is_own[e] ? diag[q * ld_diag + g]
                                   : __dadd_rn(base[e], __dmul_rn(sign[e], y_n[column[e] * ld_yn + g]));
        val[at] = (T) v;
        col[at] = csource[e] + col_base[g];
        if (keep) keep[at] = 1;
    }
}

// the sum of v over the block's threads (blockDim.x a multiple of 32), in thread 0
__device__ long long block_sum(long long v, long long* warp_total)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) warp_total[threadIdx.x >> 5] = v;
    __syncthreads();
    long long t = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int) (blockDim.x >> 5); ++w) t += warp_total[w];
    __syncthreads();
    return t;
}

// counts[blk] = kept entries of tile blk (TILE entries a block)
extern "C" __global__ void keep_counts(long long n, const unsigned char* keep, long long* counts)
{
    __shared__ long long warp_total[32];
    const long long base = (long long) blockIdx.x * TILE;
    long long c = 0;
    for (int j = threadIdx.x; j < TILE; j += blockDim.x) {
        const long long i = base + j;
        if (i < n && keep[i]) ++c;
    }
    c = block_sum(c, warp_total);
    if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

// starts[0..nb) = exclusive scan of counts, starts[nb] = their total; one block
extern "C" __global__ void keep_starts(long long nb, const long long* counts, long long* starts)
{
    __shared__ long long warp_total[32];
    __shared__ long long carry;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (long long b0 = 0; b0 < nb; b0 += blockDim.x) {
        const long long i = b0 + threadIdx.x;
        const long long own = i < nb ? counts[i] : 0;
        long long x = own;
        for (int o = 1; o < 32; o <<= 1) {
            const long long y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) warp_total[warp] = x;
        __syncthreads();
        if (warp == 0) {
            long long w = lane < warps ? warp_total[lane] : 0;
            for (int o = 1; o < 32; o <<= 1) {
                const long long y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w += y;
            }
            if (lane < warps) warp_total[lane] = w;
        }
        __syncthreads();
        const long long inclusive = carry + (warp ? warp_total[warp - 1] : 0) + x;
        if (i < nb) starts[i] = inclusive - own;
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) carry = inclusive;
        __syncthreads();
    }
    if (threadIdx.x == 0) starts[nb] = carry;
}

// the kept entries of tile blk, in order, to data / indices from starts[blk] on
// (at most ``limit`` of them: a group that keeps more than it counted is reported by its total, not written past)
extern "C" __global__ void keep_compact(long long n, const unsigned char* keep, const T* val, const int* col,
        const long long* starts, long long limit, T* data, int* indices)
{
    __shared__ int warp_count[32];
    __shared__ long long carry;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (threadIdx.x == 0) carry = starts[blockIdx.x];
    __syncthreads();
    const long long base = (long long) blockIdx.x * TILE;
    for (int j0 = 0; j0 < TILE; j0 += blockDim.x) {
        const long long i = base + j0 + threadIdx.x;
        const bool k = i < n && keep[i];
        const unsigned mask = __ballot_sync(0xffffffffu, k);
        if (lane == 0) warp_count[warp] = __popc(mask);
        __syncthreads();
        int before = 0;
        for (int w = 0; w < warp; ++w) before += warp_count[w];
        const long long at = carry + before + __popc(mask & ((1u << lane) - 1u));
        if (k && at < limit) {
            data[at] = val[i];
            indices[at] = col[i];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int t = 0;
            for (int w = 0; w < warps; ++w) t += warp_count[w];
            carry += t;
        }
        __syncthreads();
    }
}
"""

KERNELS = ["fill_jump_grid", "fill_own_column", "fill_own_piece", "keep_counts", "keep_starts", "keep_compact"]


def cuda_section(dtype):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules)."""
    return _SOURCE, {"TILE": TILE}, list(KERNELS)


# the dtype each kernel argument taken from a piece must have (the plan makes them so; checked before a launch)
_I64, _F64, _I32, _BOOL = (np.dtype(t) for t in (np.int64, np.float64, np.int32, np.bool_))


def _arg(x, dtype, what):
    if x.dtype != dtype:
        raise TypeError(f"{what} must be {dtype} for the GPU fill, got {x.dtype}")
    return x


def _kernel(cupy, dtype, name, grid, threads, args):
    """One kernel of cisolver's module on the current device and stream."""
    from . import cuda_modules
    cuda_modules.function(cupy, dtype, name)((grid,), (threads,), tuple(args))


def _launch(cupy, dtype, name, n, args):
    """A grid-stride kernel over n items (none: no launch)."""
    if n > 0:
        _kernel(cupy, dtype, name, int(min(MAX_BLOCKS, -(-n // THREADS))), THREADS, args)


def starts_of(host, g0, g1, q0, q1):
    """(starts, entries): where each piece of the host RowBlock ``host`` starts in each row of the group, as an
    int64 (pieces, neutron rows, proton rows) array counted from the group's first entry, and the group's entries
    before any zero is dropped (RowBlock.fill's offsets, piece after piece)."""
    sizes = [p.sizes(g0, g1, q0, q1) for p in host.pieces]                 # (neutron row, proton row)
    nq, ng = q1 - q0, g1 - g0
    starts = np.empty((len(sizes), nq, ng), dtype=np.int64)
    if not sizes:
        return starts, 0
    total = np.sum(sizes, axis=0).T.ravel()                               # rows in CSR order
    at = (np.cumsum(total) - total).reshape(ng, nq).T
    for k, size in enumerate(sizes):
        starts[k] = at
        at = at + size
    return starts, int(total.sum())


def fill_group(cupy, host, block, g0, g1, q0, q1, data, indices, scratch):
    """RowBlock.fill on the current GPU: rows of protons g0..g1-1 and neutrons q0..q1-1 of the row block whose host
    plan is ``host`` and whose pieces on this GPU are ``block`` (RowBlock.to_device), into ``data`` / ``indices``
    (CuPy, exactly the group's stored entries). Returns None where the group drops nothing, else its kept entries
    as a device array of one int64 (nothing is waited for) for the caller to compare with len(data)."""
    from .shellmodel import rowblocks
    dtype = data.dtype
    starts, n_all = starts_of(host, g0, g1, q0, q1)
    starts_d = cupy.asarray(starts)
    if n_all == len(data):                  # no zero dropped: straight into the caller's arrays
        val, col, keep = data, indices, None
    else:
        val, col, keep = rowblocks.scratch_buffers(scratch, n_all, dtype, indices.dtype, cupy)
    null = np.uint64(0)
    keep_arg = keep if keep is not None else null
    ng = g1 - g0
    for k, (hp, dp) in enumerate(zip(host.pieces, block.pieces)):
        at = starts_d[k]
        if isinstance(hp, rowblocks.OwnPiece):
            e = hp.cols.span(q0, q1)
            _launch(cupy, dtype, "fill_own_piece", (e.stop - e.start) * ng, (
                np.int64(e.stop - e.start), np.int64(ng), np.int64(e.start), np.int64(g0), np.int64(q0),
                _arg(dp.cols.target, _I64, "target"), _arg(dp.cols.place, _I64, "place"),
                _arg(dp.base, _F64, "base"), _arg(dp.sign, _F64, "sign"), _arg(dp.column, _I64, "column"),
                _arg(dp.y_n, _F64, "y_n"), np.int64(dp.y_n.shape[1]), _arg(dp.is_own, _BOOL, "is_own"),
                _arg(dp.diag, _F64, "diag"), np.int64(dp.diag.shape[1]), _arg(dp.cols.source, _I32, "source"),
                _arg(dp.col_base, _I32, "col_base"), at, val, col, keep_arg))
            continue
        s, e = hp.src.span(g0, g1), hp.cols.span(q0, q1)
        ns, ne = s.stop - s.start, e.stop - e.start
        if ns and ne:
            lead = _arg(dp.lead, _I64, "lead") if hp.own is not None else null
            _launch(cupy, dtype, "fill_jump_grid", ne * ns, (
                np.int64(ne), np.int64(ns), np.int64(e.start), np.int64(s.start), np.int64(q0), np.int64(g0),
                np.int64(ng), _arg(dp.cols.width, _I64, "width"), _arg(dp.src.rank, _I64, "rank"),
                _arg(dp.cols.target, _I64, "target"), _arg(dp.cols.place, _I64, "place"),
                _arg(dp.src.target, _I64, "target"), lead, _arg(dp.tab2, _F64, "tab2"),
                np.int64(dp.tab2.shape[1]), _arg(dp.ia, _I64, "ia"), _arg(dp.ib2, _I64, "ib2"),
                _arg(dp.sign, _F64, "sign"), _arg(dp.cols.source, _I32, "source"),
                _arg(dp.src.col_base, _I32, "col_base"), at, val, col, keep_arg))
        if hp.own is None:
            continue
        own, dev_own = hp.own, dp.own
        s = own.src.span(g0, g1)
        nq, ns = q1 - q0, s.stop - s.start
        _launch(cupy, dtype, "fill_own_column", nq * ns, (
            np.int64(nq), np.int64(ns), np.int64(q0), np.int64(s.start), np.int64(g0), np.int64(ng),
            _arg(dp.cols.b, _I64, "b"), _arg(dev_own.jumps_before, _I64, "jumps_before"),
            _arg(dev_own.src.target, _I64, "target"), _arg(dev_own.src.rank, _I64, "rank"),
            _arg(dp.own_place, _I64, "own_place"), _arg(dev_own.is_jump, _BOOL, "is_jump"),
            _arg(dev_own.base, _F64, "base"), _arg(dev_own.sign, _F64, "sign"), _arg(dev_own.y, _F64, "y"),
            np.int64(dev_own.y.shape[1]), _arg(dev_own.column, _I64, "column"),
            _arg(dev_own.src.col_base, _I32, "col_base"), at, val, col, keep_arg))
    if keep is None:
        return None
    tiles = -(-n_all // TILE)
    counts = cupy.empty(tiles, dtype=np.int64)
    tile_starts = cupy.empty(tiles + 1, dtype=np.int64)
    _kernel(cupy, dtype, "keep_counts", tiles, TILE_THREADS, (np.int64(n_all), keep, counts))
    _kernel(cupy, dtype, "keep_starts", 1, TILE_THREADS, (np.int64(tiles), counts, tile_starts))
    _kernel(cupy, dtype, "keep_compact", tiles, TILE_THREADS, (
        np.int64(n_all), keep, val, col, tile_starts, np.int64(len(data)), data, indices))
    return tile_starts[tiles:]
