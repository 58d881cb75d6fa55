"""Tall-skinny float32 products on one GPU: C (at most 64 x 64) from k up to millions, summed in double.

LOBPCG's Gram matrices are S^T S and S^T (H S) with S a row-major n x 24 block and n up to 2e6 (48Cr).
In single precision cuBLAS sums a whole k range in one float32 accumulator (relative error 1.3e-6 on
these Gram matrices), and the inline path's fix, 512-term float32 chunks added in double, issues its
batched calls from Python and is bound by the host (0.61 ms per call at 48Cr's size on an H200).
Here one kernel streams the rows once: a block stages 64 rows of both factors at a time in shared memory
(coalesced loads), each thread owns a 4 x 4 tile of C and sums its share of the staged rows in double,
and one warp per entry of C adds the block partials in a fixed order (reproducible bit for bit). Error
2.9e-8 (the float32 rounding of the result), 0.47 ms per call (bench_dense_kernels.py). It is still well
short of the memory bandwidth (reading S takes ~60 us): the first version, each thread reading its own
rows straight from memory, took 0.69 ms, so latency, not arithmetic, is what to attack next.

It applies when, in the normalised problem, every left factor is m x k with its rows on the unit stride
and every right factor k x n with its columns on the unit stride, k running along the leading dimension:
what row-major (C-order) n x p blocks give for ``a^T b``, strided column slices included.
"""
import numpy as np

from ..problem import leading_dim

MAX_EDGE = 64          # C at most this wide and tall (a thread's 4 x 4 tiles: at most 256 per block)
THREADS = 256
MIN_ROWS = 512         # rows per thread block at least (fewer blocks for short k)
BLOCKS_PER_SM = 4
SHARED_BYTES = 40 << 10    # staged rows of X and Y (double), under the 48 KiB a block gets by default

_SOURCE = r"""
// Partial sums of op(X) op(Y) for the block's k range: rows of X (m wide) and Y (n wide) are staged
// through shared memory, `tile_rows` at a time, with coalesced loads (many in flight per thread: the
// kernel is bound by memory, not arithmetic); then each thread adds a 4 x 4 tile of C over its share
// of the staged rows, in double. Block totals go to partials[block] (column-major m x n).
extern "C" __global__ void skinny_gram_partials(
        const T* __restrict__ x, long long ldx, const T* __restrict__ y, long long ldy,
        int m, int n, long long k, long long rows_per_block, int tile_rows, double* __restrict__ partials)
{
    extern __shared__ double shared[];
    double* xs = shared;                       // tile_rows x m
    double* ys = shared + tile_rows * m;       // tile_rows x n
    const int tiles_i = (m + 3) / 4, tiles = tiles_i * ((n + 3) / 4);
    const int groups = blockDim.x / tiles;
    const int g = threadIdx.x / tiles, t = threadIdx.x % tiles;
    const int i0 = (t % tiles_i) * 4, j0 = (t / tiles_i) * 4;
    double acc[4][4];
    #pragma unroll
    for (int a = 0; a < 4; ++a)
        #pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0;
    const long long r0 = (long long) blockIdx.x * rows_per_block;
    const long long r1 = min(k, r0 + rows_per_block);
    for (long long base = r0; base < r1; base += tile_rows) {
        const int rows = (int) min((long long) tile_rows, r1 - base);
        __syncthreads();                       // the previous tile has been used
        #pragma unroll 4
        for (int e = threadIdx.x; e < tile_rows * m; e += blockDim.x) {
            const int rr = e / m;
            xs[e] = rr < rows ? (double) x[(base + rr) * ldx + (e - rr * m)] : 0.0;
        }
        #pragma unroll 4
        for (int e = threadIdx.x; e < tile_rows * n; e += blockDim.x) {
            const int rr = e / n;
            ys[e] = rr < rows ? (double) y[(base + rr) * ldy + (e - rr * n)] : 0.0;
        }
        __syncthreads();
        if (g < groups) {
            for (int rr = g; rr < rows; rr += groups) {
                double xv[4], yv[4];
                #pragma unroll
                for (int a = 0; a < 4; ++a) xv[a] = (i0 + a < m) ? xs[rr * m + i0 + a] : 0.0;
                #pragma unroll
                for (int b = 0; b < 4; ++b) yv[b] = (j0 + b < n) ? ys[rr * n + j0 + b] : 0.0;
                #pragma unroll
                for (int a = 0; a < 4; ++a)
                    #pragma unroll
                    for (int b = 0; b < 4; ++b) acc[a][b] = fma(xv[a], yv[b], acc[a][b]);
            }
        }
    }
    __syncthreads();                           // shared memory now holds the groups' sums
    if (g < groups) {
        #pragma unroll
        for (int a = 0; a < 4; ++a)
            #pragma unroll
            for (int b = 0; b < 4; ++b) shared[(g * tiles + t) * 16 + a * 4 + b] = acc[a][b];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < tiles * 16; e += blockDim.x) {
        double s = 0.0;
        for (int gg = 0; gg < groups; ++gg) s += shared[gg * tiles * 16 + e];
        const int tt = e / 16, a = (e % 16) / 4, b = e % 4;
        const int i = (tt % tiles_i) * 4 + a, j = (tt / tiles_i) * 4 + b;
        if (i < m && j < n) partials[(long long) blockIdx.x * m * n + i + (long long) j * m] = s;
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
_sm_counts = {}


def applies(problem):
    """float32 data, C at most MAX_EDGE each way, and every factor laid out as a row-major tall block.

    Only float32: in float64, cuBLAS's gemm (the inline path) takes 0.16 ms for S^T S at 48Cr's size and
    this kernel 0.48 ms; in float32 the inline path sums 512-term chunks from Python and is bound by the
    host at 0.61 ms per call, this kernel 0.47 ms (bench_dense_kernels.py, H200, session 5)."""
    if problem.dtype != np.float32 or max(problem.m, problem.n) > MAX_EDGE:
        return False
    return all(_rows_unit(x, left=True) and _rows_unit(y, left=False) for _, x, y in problem.terms())


def _rows_unit(f, left):
    """op(f) is m x k (left) or k x n (right) with k along the base's axis 1 (its leading dimension)."""
    return f.trans != left


def _kernels(cupy, dtype):
    key = (cupy.cuda.Device().id, dtype)
    if key not in _modules:
        ctype = "float" if dtype == np.float32 else "double"
        module = cupy.RawModule(code=_SOURCE.replace("T*", f"{ctype}*").replace("(T)", f"({ctype})"),
                                options=("--std=c++14",))
        _modules[key] = (module.get_function("skinny_gram_partials"), module.get_function("skinny_gram_finish"))
    return _modules[key]


def _sm_count(cupy):
    """Multiprocessors of the current GPU, asked once (Device.attributes queries every attribute)."""
    dev = cupy.cuda.Device().id
    if dev not in _sm_counts:
        _sm_counts[dev] = cupy.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"]
    return _sm_counts[dev]


def run(problem):
    """C <- the problem's sum of terms plus beta C, on the caller's current stream, without waiting."""
    import cupy
    m, n, k = problem.m, problem.n, problem.k
    if m == 0 or n == 0:
        return
    partials_kernel, finish_kernel = _kernels(cupy, problem.dtype)
    terms = problem.terms()
    sms = _sm_count(cupy)
    blocks = max(1, min(-(-k // MIN_ROWS), BLOCKS_PER_SM * sms)) if k else 0
    rows_per_block = -(-k // blocks) if blocks else 0
    tiles = -(-m // 4) * -(-n // 4)
    tile_rows = min(64, SHARED_BYTES // (8 * (m + n)))
    shared = 8 * max(tile_rows * (m + n), (THREADS // tiles) * tiles * 16)
    partials = cupy.empty((len(terms), max(blocks, 1), m * n), dtype=np.float64)
    for t, (_, x, y) in enumerate(terms):
        if blocks:
            partials_kernel((blocks,), (THREADS,),
                            (x.base, np.int64(leading_dim(x.base)), y.base, np.int64(leading_dim(y.base)),
                             np.int32(m), np.int32(n), np.int64(k), np.int64(rows_per_block),
                             np.int32(tile_rows), partials[t]),
                            shared_mem=shared)
    coefs = [float(coef) for coef, _, _ in terms] + [0.0]
    triangle = 0 if problem.kind == "gemm" else (1 if problem.lower else 2)
    c = problem.c
    finish_kernel((m * n,), (32,),
                  (partials, np.int32(blocks), np.int32(len(terms)), np.float64(coefs[0]), np.float64(coefs[1]),
                   np.int32(m), np.int32(n), np.float64(problem.beta), c, np.int64(leading_dim(c)),
                   np.int32(triangle)))
