"""GPU kernels for LOBPCG's block updates: a tall row-major block times a small matrix.

float64 rows of whole 16-byte vectors take the staged kernel: a thread block copies tiles of
STAGE_ROWS rows into shared memory with cp.async, the next tile's copies in flight while two threads a row
multiply this one. Against the thread-per-row kernels below it took the end of iteration from 115 to 77 us
and S <- S m from 45 to 30 us at 47V's 242 k rows a GPU (H200, benchmarks.cisolver queued-steps). The rest of
this docstring is about the thread-per-row kernels, which take float32 blocks and rows the staged kernel does
not.

Each thread reads its row of the input (16-byte vector loads where the row allows), multiplies it by the
small matrix staged in shared memory (read by all threads of a warp at once: a broadcast) into QMAX
accumulators held in registers, and writes its row of the output. A thread has read all of its row before
it writes, and no other thread touches that row, so the output may be a column range of the input over the
same rows: an in-place update needs no scratch block and no copy back.

``update_with_residual`` is LOBPCG's end of iteration in one launch: the new X, P = S [C Z] and
H X, H P = H S [C Z], the residual R = H X - X diag(theta) of the new X and R's column sums of squares
(in double, one partial per thread block, added on the host in block order: reproducible). It replaces
two cuBLAS gemms and the residual kernel, and with them two launches' worth of host time and a pass over
H X and X.

Shapes the kernels do not cover (more than max(QMAX_CHOICES) output columns, a small matrix larger than
SHARED_LIMIT bytes, non-row-major blocks, an end of iteration on float64 blocks beyond DOUBLE_ROWS_LIMIT rows)
return False (None) and the caller takes its cuBLAS route.
"""
import numpy as np

from . import cuda_modules
from .arrays import Ready, aligned_rows, column_totals, row_major, row_stride, small_on_device

QMAX_CHOICES = (8, 16, 32)         # accumulators per thread: the smallest that holds the output row
SHARED_LIMIT = 32 << 10            # bytes of the staged small matrix (p x QMAX)
THREADS = 256
BLOCKS_PER_SM = 4
# thread blocks of THREADS the compiler keeps room for on an SM (__launch_bounds__): it caps the registers. At 2
# the kernels ran at 2 blocks per SM (104-128 registers), 22-31 % of the warps, 12-30 % of the DRAM bandwidth
# (Nsight Compute, 242 k rows, float64, H200: latency-bound; benchmarks.cisolver iteration-kernels)
MIN_BLOCKS = 2
# The staged kernels: a block copies tiles of STAGE_ROWS rows of its inputs into shared memory with cp.async
# (16-byte copies, coalesced, the next tile in flight while this one is multiplied) and two threads share a
# row, each with half of the output columns. The thread-per-row kernels above load their rows themselves
# and wait for every chunk: latency-bound at 22-31 % of the warps and a quarter of the H200's bandwidth
# (benchmarks.cisolver iteration-kernels). They cover rows whose every input is whole 16-byte vectors (p a
# multiple of VEC, aligned); ``staged=False`` asks a caller's kernel entry for the thread-per-row kernel
STAGE_ROWS = 48                    # H200, 242 k float64 rows: end of iteration 78.0 / 76.8 / 74.3 us at 16 / 32 / 48
STAGED_SHARED = 200 << 10          # bytes of shared memory a multiprocessor gives the staged blocks (H100/H200: 228 K)
# LOBPCG's end of iteration on float64 blocks longer than this takes cuBLAS where the thread-per-row kernel would
# take it; the staged kernel takes any length (47V's 484 k rows, H200: 133 against cuBLAS's 164 us,
# benchmarks.cisolver queued-steps). At 48Cr's size (1.96e6 rows, H200) cuBLAS's gemms did both updates in 481 us
# against the thread-per-row kernel's 843 (float32: 361 against 238; 24Mg's 28503 rows: row kernel ahead in both
# precisions, its one launch costing less host time). A product of one block (the orthonormalisation's
# in-place updates) takes the row kernel at any length: cuBLAS needs a scratch block and a copy back there
# (47V, 484 k rows: 48 against 76 us for H P, 94 against 98 for S)
DOUBLE_ROWS_LIMIT = 1 << 18

_SOURCE = r"""
union Vec { VT v; T e[VEC]; };

template <int QMAX>
__device__ __forceinline__ void stage(const T* m, int p, int q, T* ms)
{
    for (int e = threadIdx.x; e < p * QMAX; e += blockDim.x) {
        const int j = e / QMAX, c = e % QMAX;
        ms[e] = c < q ? m[j * q + c] : (T) 0;
    }
}

// acc <- row (p entries) times ms (p x QMAX). The row is read in chunks of CHUNK 16-byte vectors (when vec: the
// first p - p % VEC entries) or CHUNK * VEC elements, each chunk's loads issued together before its products:
// one load at a time per thread left the H200 at 1.2-1.9 TB/s on LOBPCG's blocks
#define CHUNK 4
template <int QMAX>
__device__ __forceinline__ void row_product(const T* row, int p, const T* ms, bool vec, T (&acc)[QMAX])
{
    #pragma unroll
    for (int c = 0; c < QMAX; ++c) acc[c] = (T) 0;
    int j = 0;
    if (vec) {
        const int pv = p - p % VEC;
        for (; j < pv; j += CHUNK * VEC) {
            Vec u[CHUNK];
            #pragma unroll
            for (int h = 0; h < CHUNK; ++h)
                if (j + h * VEC < pv) u[h].v = *reinterpret_cast<const VT*>(row + j + h * VEC);
            #pragma unroll
            for (int h = 0; h < CHUNK; ++h) {
                if (j + h * VEC < pv) {
                    #pragma unroll
                    for (int t = 0; t < VEC; ++t) {
                        #pragma unroll
                        for (int c = 0; c < QMAX; ++c) acc[c] += u[h].e[t] * ms[(j + h * VEC + t) * QMAX + c];
                    }
                }
            }
        }
        j = pv;
    }
    for (; j < p; j += CHUNK * VEC) {
        T u[CHUNK * VEC];
        #pragma unroll
        for (int h = 0; h < CHUNK * VEC; ++h)
            if (j + h < p) u[h] = row[j + h];
        #pragma unroll
        for (int h = 0; h < CHUNK * VEC; ++h) {
            if (j + h < p) {
                #pragma unroll
                for (int c = 0; c < QMAX; ++c) acc[c] += u[h] * ms[(j + h) * QMAX + c];
            }
        }
    }
}

template <int N>
__device__ __forceinline__ void row_store(T* out, int q, bool vec, const T (&acc)[N])
{
    #pragma unroll
    for (int c = 0; c < N; c += VEC) {
        if (vec && c + VEC <= q) {
            Vec u;
            #pragma unroll
            for (int t = 0; t < VEC; ++t) u.e[t] = c + t < N ? acc[c + t] : (T) 0;
            *reinterpret_cast<VT*>(out + c) = u.v;
        } else {
            #pragma unroll
            for (int t = 0; t < VEC; ++t) if (c + t < q && c + t < N) out[c + t] = acc[c + t];
        }
    }
}

// out <- a m for row-major a (n x p) and out (n x q); out may be a column range of a over the same rows
template <int QMAX>
__device__ __forceinline__ void rows_times_small(const T* a, long long lda, T* out, long long ldo,
        const T* m, int p, int q, long long n, int vec_a, int vec_out)
{
    extern __shared__ __align__(16) unsigned char staged[];
    T* ms = reinterpret_cast<T*>(staged);
    stage<QMAX>(m, p, q, ms);
    __syncthreads();
    const long long step = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        T acc[QMAX];
        row_product<QMAX>(a + i * lda, p, ms, vec_a, acc);
        row_store<QMAX>(out + i * ldo, q, vec_out, acc);
    }
}

// xn <- s m, hn <- hs m (q = 2b columns: new X and P, H X and H P), r <- hn[:, :b] - xn[:, :b] theta,
// and per thread block the column sums of r^2 in double (partials, gridDim.x x b)
template <int QMAX>
__device__ __forceinline__ void update_residual(
        const T* s, long long lds, const T* hs, long long ldh, T* xn, long long ldx, T* hn, long long ldhn,
        const T* m, int p, int q, const double* theta, int b, T* r, long long ldr, long long n, int vec,
        double* partials)
{
    constexpr int BMAX = QMAX / 2;
    extern __shared__ __align__(16) unsigned char staged[];
    T* ms = reinterpret_cast<T*>(staged);
    double* sums = reinterpret_cast<double*>(staged + ((p * QMAX * sizeof(T) + 15) / 16) * 16);
    stage<QMAX>(m, p, q, ms);
    __syncthreads();
    T th[BMAX];
    double sq[BMAX];
    #pragma unroll
    for (int c = 0; c < BMAX; ++c) {
        th[c] = c < b ? (T) theta[c] : (T) 0;
        sq[c] = 0.0;
    }
    const bool vs = vec & 1, vh = vec & 2, vx = vec & 4, vhn = vec & 8, vr = vec & 16;
    const long long step = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        T x[QMAX], hx[QMAX];
        row_product<QMAX>(s + i * lds, p, ms, vs, x);
        row_store<QMAX>(xn + i * ldx, q, vx, x);
        row_product<QMAX>(hs + i * ldh, p, ms, vh, hx);
        row_store<QMAX>(hn + i * ldhn, q, vhn, hx);
        T res[BMAX];
        #pragma unroll
        for (int c = 0; c < BMAX; ++c) {
            res[c] = c < b ? hx[c] - x[c] * th[c] : (T) 0;
            sq[c] += (double) res[c] * (double) res[c];
        }
        row_store<BMAX>(r + i * ldr, b, vr, res);
    }
    #pragma unroll
    for (int c = 0; c < BMAX; ++c) sums[c * blockDim.x + threadIdx.x] = sq[c];
    __syncthreads();
    if (threadIdx.x < b) {
        double total = 0.0;
        for (int t = 0; t < blockDim.x; ++t) total += sums[threadIdx.x * blockDim.x + t];
        partials[(long long) blockIdx.x * b + threadIdx.x] = total;
    }
}

// ---- staged kernels: tiles of STAGE_ROWS rows through shared memory, two threads per row ----

// rows [r0, r0 + rows) of src (p columns, a multiple of VEC, rows 16-byte aligned) into dst (row stride kp),
// as one group of asynchronous copies (hybridblas's copy_rows_async); the waits below are no-ops before Ampere
__device__ __forceinline__ void stage_tile(const T* src, long long ld, long long r0, int rows, int p, int kp, T* dst)
{
    copy_rows_async(src, ld, r0, rows, p, kp, dst);
    ASYNC_COMMIT();
}

// acc <- row (p entries in shared memory, 16-byte aligned, p a multiple of VEC) times columns [0, QH) of ms
// (p rows of QMAX, shared)
template <int QH, int QMAX>
__device__ __forceinline__ void shared_row_product(const T* row, int p, const T* ms, T (&acc)[QH])
{
    #pragma unroll
    for (int c = 0; c < QH; ++c) acc[c] = (T) 0;
    #pragma unroll 4
    for (int j = 0; j < p; j += VEC) {
        Vec u;
        u.v = *reinterpret_cast<const VT*>(row + j);
        #pragma unroll
        for (int t = 0; t < VEC; ++t) {
            #pragma unroll
            for (int c = 0; c < QH; ++c) acc[c] += u.e[t] * ms[(j + t) * QMAX + c];
        }
    }
}

// xn <- s m (q columns) and, with UPDATE, hn <- hs m, r <- hn[:, :b] - xn[:, :b] theta (and into w too, unless
// null) and per thread block the column sums of r^2 in double (partials, gridDim.x x b), as update_residual.
// Thread t takes row t / 2 of each tile and output columns [h QH, h QH + QH), h = t % 2 (so the residual's
// b <= QH columns are h = 0's).
template <int QMAX, bool UPDATE>
__device__ __forceinline__ void staged_rows(
        const T* s, long long lds, const T* hs, long long ldh, T* xn, long long ldx, T* hn, long long ldhn,
        const T* m, int p, int q, const double* theta, int b, T* r, long long ldr, T* w, long long ldw, long long n,
        int vec_out, double* partials)
{
    constexpr int QH = QMAX / 2, SOURCES = UPDATE ? 2 : 1;
    extern __shared__ __align__(16) unsigned char staged[];
    const int kp = ((p / VEC) | 1) * VEC;      // an odd number of vectors a row: 16-byte reads without conflicts
    T* ms = reinterpret_cast<T*>(staged);
    T* tiles = ms + ((p * QMAX * (int) sizeof(T) + 15) / 16) * 16 / (int) sizeof(T);
    const int tile_elems = SOURCES * STAGE_ROWS * kp;
    stage<QMAX>(m, p, q, ms);
    const int row = threadIdx.x / 2, h = threadIdx.x % 2, c0 = h * QH;
    T th[QH];
    double sq[QH];
    #pragma unroll
    for (int c = 0; c < QH; ++c) {
        th[c] = UPDATE && h == 0 && c < b ? (T) theta[c] : (T) 0;
        sq[c] = 0.0;
    }
    const long long step = (long long) gridDim.x * STAGE_ROWS;
    long long r0 = (long long) blockIdx.x * STAGE_ROWS;
    int buf = 0;
    if (r0 < n) {
        const int rows = n - r0 < STAGE_ROWS ? (int) (n - r0) : STAGE_ROWS;
        stage_tile(s, lds, r0, rows, p, kp, tiles);
        if (UPDATE) stage_tile(hs, ldh, r0, rows, p, kp, tiles + STAGE_ROWS * kp);
    }
    for (; r0 < n; r0 += step, buf ^= 1) {
        const int rows = n - r0 < STAGE_ROWS ? (int) (n - r0) : STAGE_ROWS;
        const long long next = r0 + step;
        if (next < n) {                                        // the next tile's copies, in flight meanwhile
            const int next_rows = n - next < STAGE_ROWS ? (int) (n - next) : STAGE_ROWS;
            T* dst = tiles + (buf ^ 1) * tile_elems;
            stage_tile(s, lds, next, next_rows, p, kp, dst);
            if (UPDATE) stage_tile(hs, ldh, next, next_rows, p, kp, dst + STAGE_ROWS * kp);
#if __CUDA_ARCH__ >= 800
            asm volatile("cp.async.wait_group %0;" :: "n"(UPDATE ? 2 : 1));     // this tile's have landed
#endif
        } else {
#if __CUDA_ARCH__ >= 800
            asm volatile("cp.async.wait_group 0;");
#endif
        }
        __syncthreads();
        if (row < rows && c0 < q) {
            const T* tile = tiles + buf * tile_elems;
            const long long i = r0 + row;
            T x[QH];
            shared_row_product<QH, QMAX>(tile + row * kp, p, ms + c0, x);
            row_store<QH>(xn + i * ldx + c0, q - c0, vec_out & 1, x);
            if (UPDATE) {
                T hx[QH];
                shared_row_product<QH, QMAX>(tile + (STAGE_ROWS + row) * kp, p, ms + c0, hx);
                row_store<QH>(hn + i * ldhn + c0, q - c0, vec_out & 2, hx);
                if (h == 0) {
                    T res[QH];
                    #pragma unroll
                    for (int c = 0; c < QH; ++c) {
                        res[c] = c < b ? hx[c] - x[c] * th[c] : (T) 0;
                        sq[c] += (double) res[c] * (double) res[c];
                    }
                    row_store<QH>(r + i * ldr, b, vec_out & 4, res);
                    if (w != nullptr) row_store<QH>(w + i * ldw, b, vec_out & 8, res);
                }
            }
        }
        __syncthreads();                                       // this buffer is free for the tile after next
    }
    if (UPDATE) {                                              // the sums of squares, in the tiles' room
        double* sums = reinterpret_cast<double*>(tiles);
        #pragma unroll
        for (int c = 0; c < QH; ++c) sums[c * blockDim.x + threadIdx.x] = sq[c];
        __syncthreads();
        if (threadIdx.x < b) {
            double total = 0.0;
            for (int t = 0; t < blockDim.x; t += 2) total += sums[threadIdx.x * blockDim.x + t];
            partials[(long long) blockIdx.x * b + threadIdx.x] = total;
        }
    }
}

// The kernels: one entry point per output width Q of QMAX_CHOICES, e.g. rows_times_small_16 = rows_times_small<16>
#define ROW_PRODUCT(Q) \
extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) rows_times_small_##Q(const T* a, long long lda, T* out, \
        long long ldo, const T* m, int p, int q, long long n, int vec_a, int vec_out) \
{ rows_times_small<Q>(a, lda, out, ldo, m, p, q, n, vec_a, vec_out); }
#define ROW_UPDATE(Q) \
extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) update_residual_##Q(const T* s, long long lds, \
        const T* hs, long long ldh, T* xn, long long ldx, T* hn, long long ldhn, const T* m, int p, int q, \
        const double* theta, int b, T* r, long long ldr, long long n, int vec, double* partials) \
{ update_residual<Q>(s, lds, hs, ldh, xn, ldx, hn, ldhn, m, p, q, theta, b, r, ldr, n, vec, partials); }

// staged_product_Q = staged_rows<Q, false>, staged_update_Q = staged_rows<Q, true>
#define STAGED_PRODUCT(Q) \
extern "C" __global__ void __launch_bounds__(2 * STAGE_ROWS) staged_product_##Q(const T* s, long long lds, \
        const T* hs, long long ldh, T* xn, long long ldx, T* hn, long long ldhn, const T* m, int p, int q, \
        const double* theta, int b, T* r, long long ldr, T* w, long long ldw, long long n, int vec_out, \
        double* partials) \
{ staged_rows<Q, false>(s, lds, hs, ldh, xn, ldx, hn, ldhn, m, p, q, theta, b, r, ldr, w, ldw, n, vec_out, partials); }
#define STAGED_UPDATE(Q) \
extern "C" __global__ void __launch_bounds__(2 * STAGE_ROWS) staged_update_##Q(const T* s, long long lds, \
        const T* hs, long long ldh, T* xn, long long ldx, T* hn, long long ldhn, const T* m, int p, int q, \
        const double* theta, int b, T* r, long long ldr, T* w, long long ldw, long long n, int vec_out, \
        double* partials) \
{ staged_rows<Q, true>(s, lds, hs, ldh, xn, ldx, hn, ldhn, m, p, q, theta, b, r, ldr, w, ldw, n, vec_out, partials); }
"""


# the entry points of each step, as (macro, kernel): the thread-per-row one, then the staged one (float64 only)
STEPS = {"product": (("ROW_PRODUCT", "rows_times_small"), ("STAGED_PRODUCT", "staged_product")),
         "update": (("ROW_UPDATE", "update_residual"), ("STAGED_UPDATE", "staged_update"))}


def cuda_section(dtype, widths=None, steps=tuple(STEPS)):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules): the entry points of ``steps``
    ("product": out <- a m, "update": LOBPCG's end of iteration) for the output widths ``widths`` (default: all
    of QMAX_CHOICES), thread-per-row, and for float64 staged too (_staged_fits takes no float32 block)."""
    kinds = 2 if np.dtype(dtype) == np.float64 else 1
    entries = [(macro, kernel, q) for q in (QMAX_CHOICES if widths is None else widths) for step in steps
               for macro, kernel in STEPS[step][:kinds]]
    code = _SOURCE + "".join(f"{macro}({q})\n" for macro, _, q in entries)
    return code, {"MIN_BLOCKS": MIN_BLOCKS, "STAGE_ROWS": STAGE_ROWS}, [f"{kernel}_{q}" for _, kernel, q in entries]


def _staged_fits(inputs, p, q):
    """The staged kernels take these inputs: float64, every row whole 16-byte vectors, 16-byte aligned, their
    buffers within CUDA's default 48 KB of dynamic shared memory. Float32 blocks keep the thread-per-row
    kernels: at 48Cr's size (1.96 M rows, H200) those ran S <- S m at 3.2 TB/s, the staged kernel 7 % slower
    (benchmarks.cisolver queued-steps)."""
    vec = 16 // inputs[0].itemsize
    qmax = _qmax(q)
    return (inputs[0].dtype == np.float64 and p % vec == 0 and qmax is not None
            and _staged_shared(p, qmax, inputs[0].itemsize, len(inputs)) <= 48 << 10
            and all(aligned_rows(x) for x in inputs))


def _staged_shared(p, qmax, itemsize, sources):
    vec = 16 // itemsize
    kp = ((p // vec) | 1) * vec
    staged = -(-p * qmax * itemsize // 16) * 16
    tiles = 2 * sources * STAGE_ROWS * kp * itemsize
    sums = 8 * (qmax // 2) * 2 * STAGE_ROWS if sources == 2 else 0
    return staged + max(tiles, sums)


def _copy_target(r_copy, r):
    """r_copy when the staged kernel can write it beside r (same shape and dtype, row-major, same device)."""
    if (r_copy is None or r_copy.shape != r.shape or r_copy.dtype != r.dtype or not row_major(r_copy)
            or r_copy.device.id != r.device.id):
        return None
    return r_copy


def _staged_grid(n, shared):
    """Blocks for n rows: as many a multiprocessor as STAGED_SHARED bytes of shared memory hold (16 at most)."""
    from hybridblas import gpu_multiprocessors
    per_sm = max(1, min(16, STAGED_SHARED // shared))
    return max(1, min(per_sm * gpu_multiprocessors(), -(-n // STAGE_ROWS)))


def _qmax(q):
    return next((c for c in QMAX_CHOICES if q <= c), None)


def _fits(blocks, p, q, long_double=False, staged=False):
    """The kernels cover these blocks; float64 blocks beyond DOUBLE_ROWS_LIMIT rows only with ``long_double``
    or for the staged kernels."""
    x0 = blocks[0]
    qmax = _qmax(q)
    return (type(x0).__module__.startswith("cupy") and x0.dtype in (np.float32, np.float64)
            and (x0.dtype == np.float32 or long_double or staged or x0.shape[0] <= DOUBLE_ROWS_LIMIT)
            and qmax is not None and p * qmax * x0.dtype.itemsize <= SHARED_LIMIT
            and all(x.dtype == x0.dtype and x.device.id == x0.device.id and row_major(x) for x in blocks))


def _grid(n):
    from hybridblas import gpu_multiprocessors
    return max(1, min(BLOCKS_PER_SM * gpu_multiprocessors(), -(-n // THREADS)))


def product(out, a, m, long_double=True, staged=True):
    """out <- a @ m on the caller's stream (``m`` a small host or device matrix); ``out`` may be a column
    range of ``a`` over the same rows. False (nothing done) when the kernel does not cover these blocks
    (with ``long_double`` False: nor float64 blocks beyond DOUBLE_ROWS_LIMIT rows that the staged kernel does
    not take). ``staged`` False: the thread-per-row kernel also where the staged one fits."""
    import cupy
    n, q = out.shape
    p = a.shape[1]
    use_staged = staged and type(a).__module__.startswith("cupy") and _staged_fits([a], p, q)
    if not _fits([out, a], p, q, long_double, staged=use_staged) or m.shape != (p, q) or a.shape[0] != n:
        return False
    if n == 0 or q == 0:
        return True
    qmax = _qmax(q)
    m_dev = small_on_device(m, out.dtype)
    if use_staged:
        kernel = cuda_modules.function(cupy, out.dtype, f"staged_product_{qmax}")
        none = np.uint64(0)
        shared = _staged_shared(p, qmax, out.dtype.itemsize, 1)
        kernel((_staged_grid(n, shared),), (2 * STAGE_ROWS,),
               (a, np.int64(row_stride(a)), none, np.int64(0), out, np.int64(row_stride(out)), none, np.int64(0),
                m_dev, np.int32(p), np.int32(q), none, np.int32(0), none, np.int64(0), none, np.int64(0), np.int64(n),
                np.int32(aligned_rows(out)), none),
               shared_mem=shared)
        return True
    kernel = cuda_modules.function(cupy, out.dtype, f"rows_times_small_{qmax}")
    kernel((_grid(n),), (THREADS,),
           (a, np.int64(row_stride(a)), out, np.int64(row_stride(out)), m_dev, np.int32(p), np.int32(q), np.int64(n),
            np.int32(aligned_rows(a)), np.int32(aligned_rows(out))),
           shared_mem=p * qmax * out.dtype.itemsize)
    return True


def update_with_residual(x_next, s, hx_next, hs, m, r, theta, later=False, r_copy=None, staged=True):
    """x_next <- s m, hx_next <- hs m (m is k x 2b), r <- hx_next[:, :b] - x_next[:, :b] diag(theta); returns
    the column sums of squares of r (float64 host array; with ``later`` an arrays.Later of it, the host not
    waiting for the GPU), or None when the kernel does not cover these blocks (nothing done). ``r_copy`` (like
    r, or None) receives r too: from the staged kernel beside r where it can, else by a copy after.
    ``staged`` False: the thread-per-row kernel also where the staged one fits."""
    import cupy
    n, q = x_next.shape
    p = s.shape[1]
    b = r.shape[1]
    blocks = [x_next, s, hx_next, hs, r]
    use_staged = staged and all(type(x).__module__.startswith("cupy") for x in (s, hs)) and _staged_fits([s, hs], p, q)
    if (not _fits(blocks, p, q, staged=use_staged) or q != 2 * b or m.shape != (p, q) or hs.shape != s.shape
            or hx_next.shape != x_next.shape or r.shape[0] != n or s.shape[0] != n):
        return None
    if n == 0 or b == 0:
        return Ready(np.zeros(b)) if later else np.zeros(b)
    qmax = _qmax(q)
    staged = -(-p * qmax * r.dtype.itemsize // 16) * 16
    shared = staged + 8 * (qmax // 2) * THREADS             # the small matrix, then the sums of squares
    if shared > 48 << 10:
        return None
    m_dev = small_on_device(m, r.dtype)
    theta_dev = cupy.asarray(theta, dtype=np.float64)      # a host vector, or already on the GPU
    if use_staged:
        shared = _staged_shared(p, qmax, r.dtype.itemsize, 2)
        grid = _staged_grid(n, shared)
        partials = cupy.empty((grid, b), dtype=np.float64)
        copy = _copy_target(r_copy, r)
        outs = (x_next, hx_next, r) + ((copy,) if copy is not None else ())
        vec = sum(bit << i for i, bit in enumerate(aligned_rows(x) for x in outs))
        kernel = cuda_modules.function(cupy, r.dtype, f"staged_update_{qmax}")
        kernel((grid,), (2 * STAGE_ROWS,),
               (s, np.int64(row_stride(s)), hs, np.int64(row_stride(hs)), x_next, np.int64(row_stride(x_next)),
                hx_next, np.int64(row_stride(hx_next)), m_dev, np.int32(p), np.int32(q), theta_dev, np.int32(b),
                r, np.int64(row_stride(r)), copy if copy is not None else np.uint64(0),
                np.int64(row_stride(copy) if copy is not None else 0), np.int64(n), np.int32(vec), partials),
               shared_mem=shared)
        if r_copy is not None and copy is None:
            r_copy[...] = r
        return column_totals(partials, later)
    grid = _grid(n)
    partials = cupy.empty((grid, b), dtype=np.float64)
    vec = sum(bit << i for i, bit in enumerate(aligned_rows(x) for x in (s, hs, x_next, hx_next, r)))
    kernel = cuda_modules.function(cupy, r.dtype, f"update_residual_{qmax}")
    kernel((grid,), (THREADS,),
           (s, np.int64(row_stride(s)), hs, np.int64(row_stride(hs)), x_next, np.int64(row_stride(x_next)),
            hx_next, np.int64(row_stride(hx_next)), m_dev, np.int32(p), np.int32(q), theta_dev, np.int32(b),
            r, np.int64(row_stride(r)), np.int64(n), np.int32(vec), partials),
           shared_mem=shared)
    if r_copy is not None:
        r_copy[...] = r
    return column_totals(partials, later)
