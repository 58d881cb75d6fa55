"""Tall-skinny float32 products on one GPU: C (at most 64 x 64) from k up to millions, summed in double.

LOBPCG's Gram matrices are S^T S and S^T (H S) with S a row-major n x 24 block and n up to 2e6 (48Cr).
In single precision cuBLAS sums a whole k range in one float32 accumulator (relative error 1.3e-6 on
these Gram matrices, and 0.90 ms for S^T S at 48Cr's size on an H200), and the inline path's fix,
512-term float32 chunks added in double, is bound by the host at 0.61 ms per call.
Here one kernel streams the rows once. Each thread keeps LOADS rows' worth of loads in flight in
registers while the block computes on the tile before (coalesced: consecutive threads read consecutive
elements of a row); the tile is converted once to double in shared memory, each thread owns a 4 x 4 tile
of C (only the tiles that touch the wanted triangle, for syrk and gemmt) and sums its rows in double, and
one warp per entry of C adds the block partials in a fixed order (reproducible bit for bit).
Error 2.9e-8 (the float32 rounding of the result). At 48Cr's size on an H200: S^T S 0.19 ms, S^T HS and
S^T [P W] 0.23 ms (benchmarks.blas kernels; staging 64 rows with 4 loads in flight per
thread took 0.47, 0.55 and 0.39 ms). ncu: 125 registers, 2 blocks per multiprocessor, ~47 % of the SM's
issue throughput: the double-precision sums, not memory, set the pace.

It applies when, in the normalised problem, every left factor is m x k with its rows on the unit stride
and every right factor k x n with its columns on the unit stride, k running along the leading dimension:
what row-major (C-order) n x p blocks give for ``a^T b``, strided column slices included.
"""
import threading

import numpy as np

from . import cuda_compile
from ..devspec import gpu_multiprocessors
from ..problem import leading_dim

MAX_EDGE = 64          # C at most this wide and tall (a thread's 4 x 4 tiles: at most 256 per block)
THREADS = 256
MIN_ROWS = 512         # rows per thread block at least (fewer blocks for short k)
BLOCKS_PER_SM = 2      # what the registers allow (__launch_bounds__(256, 2)); 4 and 6 were 5-10 % slower
SHARED_BYTES = 40 << 10    # staged rows (double), under the 48 KiB a block gets by default
LOADS = 8              # loads per operand per thread per tile (the kernel's LOADS)

_SOURCE = r"""
// Partial sums of op(X) op(Y) for the block's k range (block totals to partials[block], column-major
// m x n): the block's threads load a tile of rows into registers (LOADS independent
// loads per operand per thread, all in flight at once), convert them once to double in shared memory
// (rows padded to a multiple of 4, so a thread reads its 4 + 4 values as double2 pairs with no bounds
// test), and load the next tile while they compute on this one. Thread (q, c) loads column c of rows q,
// q + rows_per_pass, ...: consecutive threads read consecutive elements of a row (coalesced). `same`
// (S^T S: one operand) stages the rows once; `triangle` (1 lower, 2 upper) computes only the 4 x 4 tiles
// that touch that triangle of C, so more thread groups share the rows.
#define LOADS 8
extern "C" __global__ void __launch_bounds__(256, 2) skinny_gram_partials(
        const T* __restrict__ x, long long ldx, const T* __restrict__ y, long long ldy,
        int m, int n, long long k, long long rows_per_block, int tile_rows, int same, int triangle,
        double* __restrict__ partials)
{
    // tile_rows: at most min(rpx, rpy) * LOADS (the host caps it to the shared memory)
    extern __shared__ double shared[];
    const int rpx = blockDim.x / m, rpy = blockDim.x / n;      // rows one pass of the threads covers
    const int mp = (m + 3) & ~3, np_ = (n + 3) & ~3;            // padded row lengths in shared memory
    double* xs = shared;                                         // tile_rows x mp
    double* ys = same ? xs : xs + tile_rows * mp;                // tile_rows x np_
    const int cx = threadIdx.x % m, qx = threadIdx.x / m;
    const int cy = threadIdx.x % n, qy = threadIdx.x / n;
    // this thread's 4 x 4 tile of C: the t-th of those that touch the wanted triangle
    const int tiles_i = mp / 4, tiles_j = np_ / 4;
    int tiles = 0;
    for (int tj = 0; tj < tiles_j; ++tj)
        for (int ti = 0; ti < tiles_i; ++ti)
            tiles += (triangle == 1 && 4 * ti + 3 < 4 * tj) || (triangle == 2 && 4 * tj + 3 < 4 * ti) ? 0 : 1;
    const int groups = blockDim.x / tiles;
    const int g = threadIdx.x / tiles;
    int i0 = 0, j0 = 0;
    {
        int left = threadIdx.x % tiles;
        for (int tj = 0; tj < tiles_j; ++tj)
            for (int ti = 0; ti < tiles_i; ++ti) {
                if ((triangle == 1 && 4 * ti + 3 < 4 * tj) || (triangle == 2 && 4 * tj + 3 < 4 * ti)) continue;
                if (left-- == 0) { i0 = 4 * ti; j0 = 4 * tj; }
            }
    }
    // zero the padding columns once (loads never write them)
    for (int e = threadIdx.x; e < tile_rows * (mp - m); e += blockDim.x)
        xs[(e / (mp - m)) * mp + m + e % (mp - m)] = 0.0;
    if (!same)
        for (int e = threadIdx.x; e < tile_rows * (np_ - n); e += blockDim.x)
            ys[(e / (np_ - n)) * np_ + n + e % (np_ - n)] = 0.0;
    double acc[4][4];
    #pragma unroll
    for (int a = 0; a < 4; ++a)
        #pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0;
    const long long r0 = (long long) blockIdx.x * rows_per_block;
    const long long r1 = min(k, r0 + rows_per_block);
    T rx[LOADS], ry[LOADS];
    #define LOAD_TILE(start)                                                                        \
        _Pragma("unroll")                                                                           \
        for (int q = 0; q < LOADS; ++q) {                                                           \
            const long long row = (start) + qx + q * rpx;                                           \
            rx[q] = (qx < rpx && qx + q * rpx < tile_rows && row < r1) ? x[row * ldx + cx] : (T) 0; \
            if (!same) {                                                                            \
                const long long rowy = (start) + qy + q * rpy;                                      \
                ry[q] = (qy < rpy && qy + q * rpy < tile_rows && rowy < r1) ? y[rowy * ldy + cy] : (T) 0; \
            }                                                                                       \
        }
    if (r0 < r1) { LOAD_TILE(r0) }
    for (long long base = r0; base < r1; base += tile_rows) {
        __syncthreads();                       // the previous tile has been used
        #pragma unroll
        for (int q = 0; q < LOADS; ++q) {
            if (qx < rpx && qx + q * rpx < tile_rows) xs[(qx + q * rpx) * mp + cx] = (double) rx[q];
            if (!same && qy < rpy && qy + q * rpy < tile_rows) ys[(qy + q * rpy) * np_ + cy] = (double) ry[q];
        }
        __syncthreads();
        if (base + tile_rows < r1) { LOAD_TILE(base + tile_rows) }
        const int rows = (int) min((long long) tile_rows, r1 - base);
        if (g < groups) {
            for (int rr = g; rr < rows; rr += groups) {
                const double2 xa = *(const double2*) &xs[rr * mp + i0], xb = *(const double2*) &xs[rr * mp + i0 + 2];
                const double2 ya = *(const double2*) &ys[rr * np_ + j0], yb = *(const double2*) &ys[rr * np_ + j0 + 2];
                const double xv[4] = {xa.x, xa.y, xb.x, xb.y}, yv[4] = {ya.x, ya.y, yb.x, yb.y};
                #pragma unroll
                for (int a = 0; a < 4; ++a)
                    #pragma unroll
                    for (int b = 0; b < 4; ++b) acc[a][b] = fma(xv[a], yv[b], acc[a][b]);
            }
        }
    }
    #undef LOAD_TILE
    __syncthreads();                           // shared memory now holds the groups' sums
    if (g < groups) {
        const int t = threadIdx.x % tiles;
        #pragma unroll
        for (int a = 0; a < 4; ++a)
            #pragma unroll
            for (int b = 0; b < 4; ++b) shared[(g * tiles + t) * 16 + a * 4 + b] = acc[a][b];
    }
    __syncthreads();
    if (g == 0) {                              // group 0's threads add the groups' sums of their own tiles
        const int t = threadIdx.x;
        for (int e = 0; e < 16; ++e) {
            double s = 0.0;
            for (int gg = 0; gg < groups; ++gg) s += shared[(gg * tiles + t) * 16 + e];
            const int i = i0 + e / 4, j = j0 + e % 4;
            if (i < m && j < n) partials[(long long) blockIdx.x * m * n + i + (long long) j * m] = s;
        }
    }
}

// C[i, j] <- sum over terms and blocks of coef * partial + beta C[i, j], on the chosen triangle only;
// C is column-major with leading dimension ldc. beta = 0 never reads C. One warp per entry: each lane
// sums every 32nd block partial (many loads in flight), then a fixed shuffle tree adds the lanes, so the
// result does not depend on timing.
extern "C" __global__ void skinny_gram_finish(
        const double* __restrict__ partials, int blocks, int terms, double coef0, double coef1,
        int m, int n, double beta, T* c, long long ldc, int triangle)
{
    const int e = blockIdx.x;
    const int lane = threadIdx.x;
    const int i = e % m, j = e / m;
    if ((triangle == 1 && i < j) || (triangle == 2 && i > j)) return;
    double total = 0.0;
    for (int t = 0; t < terms; ++t) {
        const double* p = partials + (long long) t * blocks * m * n + e;
        double s = 0.0;
        for (int b = lane; b < blocks; b += 32) s += p[(long long) b * m * n];
        #pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
        total += (t == 0 ? coef0 : coef1) * s;
    }
    if (lane != 0) return;
    if (beta != 0.0) total += beta * (double) c[i + (long long) j * ldc];
    c[i + (long long) j * ldc] = (T) total;
}
"""
_modules = {}
_modules_lock = threading.Lock()


def applies(problem):
    """float32 data, C at most MAX_EDGE each way, and every factor laid out as a row-major tall block.

    Only float32: in float64 cuBLAS sums accurately enough by itself and its gemm (the inline path) takes
    0.14-0.16 ms for S^T S at 48Cr's size on an H200 (benchmarks.cisolver kernels), faster than
    this kernel's double-precision sums."""
    if problem.dtype != np.float32 or max(problem.m, problem.n) > MAX_EDGE:
        return False
    return all(_rows_unit(x, left=True) and _rows_unit(y, left=False) for _, x, y in problem.terms())


def _rows_unit(f, left):
    """op(f) is m x k (left) or k x n (right) with k along the base's axis 1 (its leading dimension)."""
    return f.trans != left


def _kernels(cupy, dtype):
    key = (cupy.cuda.Device().id, dtype)
    with _modules_lock:      # one compile per device and dtype, also under concurrent callers
        if key not in _modules:
            ctype = "float" if dtype == np.float32 else "double"
            module = cupy.RawModule(code=f"typedef {ctype} T;\n" + _SOURCE, options=("--std=c++14",))
            _modules[key] = (module.get_function("skinny_gram_partials"), module.get_function("skinny_gram_finish"))
        return _modules[key]


def prepare(cupy, dtype, devices):
    """Compile (or load from CuPy's kernel cache) the kernels that ``dtype``'s calls use on ``devices``, one
    device after the other, on a background thread; returns the thread, or None when ``dtype`` takes no kernel
    of this module (only float32 does) or every device has them. A failure is left to the first call."""
    dtype = np.dtype(dtype)
    if dtype != np.float32:
        return None
    with _modules_lock:
        todo = [d for d in dict.fromkeys(int(d) for d in devices) if (d, dtype) not in _modules]
    return cuda_compile.in_background(cupy, todo, lambda: _kernels(cupy, dtype))


def run(problem):
    """C <- the problem's sum of terms plus beta C, on the caller's current stream, without waiting."""
    import cupy
    m, n, k = problem.m, problem.n, problem.k
    if m == 0 or n == 0:
        return
    partials_kernel, finish_kernel = _kernels(cupy, problem.dtype)
    terms = problem.terms()
    blocks = max(1, min(-(-k // MIN_ROWS), BLOCKS_PER_SM * gpu_multiprocessors())) if k else 0
    rows_per_block = -(-k // blocks) if blocks else 0
    triangle = 0 if problem.kind == "gemm" else (1 if problem.lower else 2)
    partials = cupy.empty((len(terms), max(blocks, 1), m * n), dtype=np.float64)
    for t, (_, x, y) in enumerate(terms):
        if not blocks:
            continue
        ldx, ldy = leading_dim(x.base), leading_dim(y.base)
        same = int(x.base.data.ptr == y.base.data.ptr and ldx == ldy and m == n)    # S^T S: stage once
        row_bytes = 8 * (-(-m // 4) * 4 + (0 if same else -(-n // 4) * 4))          # padded, in double
        tile_rows = min(min(THREADS // m, THREADS // n) * LOADS, SHARED_BYTES // row_bytes)
        partials_kernel((blocks,), (THREADS,),
                        (x.base, np.int64(ldx), y.base, np.int64(ldy), np.int32(m), np.int32(n), np.int64(k),
                         np.int64(rows_per_block), np.int32(tile_rows), np.int32(same), np.int32(triangle),
                         partials[t]),
                        shared_mem=max(row_bytes * tile_rows, 8 * THREADS * 16))    # staging, then the sums
    coefs = [float(coef) for coef, _, _ in terms] + [0.0]
    c = problem.c
    finish_kernel((m * n,), (32,),
                  (partials, np.int32(blocks), np.int32(len(terms)), np.float64(coefs[0]), np.float64(coefs[1]),
                   np.int32(m), np.int32(n), np.float64(problem.beta), c, np.int64(leading_dim(c)),
                   np.int32(triangle)))
