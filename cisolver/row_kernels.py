"""GPU kernels for LOBPCG's block updates: a tall row-major block times a small matrix, one thread per row.

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
# (Nsight Compute, 242 k rows, float64, H200: latency-bound; benchmarks/profile_iteration_kernels.py)
MIN_BLOCKS = 2
ENABLED = True                     # False: every caller takes its cuBLAS route (benchmarks compare the two)
# LOBPCG's end of iteration on float64 blocks longer than this takes cuBLAS: at 48Cr's size (1.96e6 rows,
# H200) its gemms did both updates in 481 us against the row kernel's 843 (float32: 361 against 238; 24Mg's
# 28503 rows: row kernel ahead in both precisions, its one launch costing less host time). A product of one
# block (the orthonormalisation's in-place updates) takes the row kernel at any length: cuBLAS needs a
# scratch block and a copy back there (47V, 484 k rows: 48 against 76 us for H P, 94 against 98 for S)
DOUBLE_ROWS_LIMIT = 1 << 18

_SOURCE = r"""
// T (float or double) and VT (float4 or double2) are typedef'd first; VEC elements per 16-byte vector.
#define VEC ((int) (16 / sizeof(T)))
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
// one load at a time per thread left the H200 at 1.2-1.9 TB/s on LOBPCG's blocks (session 12)
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
__global__ void __launch_bounds__(256, MIN_BLOCKS) rows_times_small(const T* a, long long lda, T* out, long long ldo,
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
__global__ void __launch_bounds__(256, MIN_BLOCKS) update_residual(
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
"""
def _module(cupy, dtype):
    names = [f"{kernel}<{q}>" for kernel in ("rows_times_small", "update_residual") for q in QMAX_CHOICES]
    return cuda_modules.module(cupy, dtype, _SOURCE, {"MIN_BLOCKS": MIN_BLOCKS}, name_expressions=names)


def _qmax(q):
    return next((c for c in QMAX_CHOICES if q <= c), None)


def _fits(blocks, p, q, long_double=False):
    """The kernels cover these blocks; float64 blocks beyond DOUBLE_ROWS_LIMIT rows only with ``long_double``."""
    x0 = blocks[0]
    qmax = _qmax(q)
    return (ENABLED and type(x0).__module__.startswith("cupy") and x0.dtype in (np.float32, np.float64)
            and (x0.dtype == np.float32 or long_double or x0.shape[0] <= DOUBLE_ROWS_LIMIT)
            and qmax is not None and p * qmax * x0.dtype.itemsize <= SHARED_LIMIT
            and all(x.dtype == x0.dtype and x.device.id == x0.device.id and row_major(x) for x in blocks))


def _grid(cupy, n):
    from hybridblas.devices.cuda_skinny import multiprocessors
    return max(1, min(BLOCKS_PER_SM * multiprocessors(cupy), -(-n // THREADS)))


def product(out, a, m, long_double=True):
    """out <- a @ m on the caller's stream (``m`` a small host or device matrix); ``out`` may be a column
    range of ``a`` over the same rows. False (nothing done) when the kernel does not cover these blocks
    (with ``long_double`` False: nor float64 blocks beyond DOUBLE_ROWS_LIMIT rows)."""
    import cupy
    n, q = out.shape
    p = a.shape[1]
    if not _fits([out, a], p, q, long_double) or m.shape != (p, q) or a.shape[0] != n:
        return False
    if n == 0 or q == 0:
        return True
    qmax = _qmax(q)
    m_dev = small_on_device(m, out.dtype)
    kernel = _module(cupy, out.dtype).get_function(f"rows_times_small<{qmax}>")
    kernel((_grid(cupy, n),), (THREADS,),
           (a, np.int64(row_stride(a)), out, np.int64(row_stride(out)), m_dev, np.int32(p), np.int32(q), np.int64(n),
            np.int32(aligned_rows(a)), np.int32(aligned_rows(out))),
           shared_mem=p * qmax * out.dtype.itemsize)
    return True


def update_with_residual(x_next, s, hx_next, hs, m, r, theta, later=False):
    """x_next <- s m, hx_next <- hs m (m is k x 2b), r <- hx_next[:, :b] - x_next[:, :b] diag(theta); returns
    the column sums of squares of r (float64 host array; with ``later`` an arrays.Later of it, the host not
    waiting for the GPU), or None when the kernel does not cover these blocks (nothing done)."""
    import cupy
    n, q = x_next.shape
    p = s.shape[1]
    b = r.shape[1]
    blocks = [x_next, s, hx_next, hs, r]
    if (not _fits(blocks, p, q) or q != 2 * b or m.shape != (p, q) or hs.shape != s.shape
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
    grid = _grid(cupy, n)
    partials = cupy.empty((grid, b), dtype=np.float64)
    vec = sum(bit << i for i, bit in enumerate(aligned_rows(x) for x in (s, hs, x_next, hx_next, r)))
    kernel = _module(cupy, r.dtype).get_function(f"update_residual<{qmax}>")
    kernel((grid,), (THREADS,),
           (s, np.int64(row_stride(s)), hs, np.int64(row_stride(hs)), x_next, np.int64(row_stride(x_next)),
            hx_next, np.int64(row_stride(hx_next)), m_dev, np.int32(p), np.int32(q), theta_dev, np.int32(b),
            r, np.int64(row_stride(r)), np.int64(n), np.int32(vec), partials),
           shared_mem=shared)
    return column_totals(partials, later)
