"""Tall-skinny Gram matrices on one GPU: S^T H S and S^T S of a row-major n x k block S (k <= KMAX) and of H S
(same shape), in one pass over both, summed in double (also for float32 blocks); public as
``hybridblas.lowlevel.grams``.

LOBPCG's Rayleigh-Ritz wants both Grams of S = [X P W] and H S, its orthonormalisation S^T S's last columns.
As hybrid calls they are a gemmt and a syrk (S read twice) or a gemm: each about 55-70 us of GPU time and
130-275 us of host time at 47V's size (484 k rows, float64, H200, benchmarks.cisolver queued-steps), where
the whole dense budget is about 0.5 ms per iteration.

Here one kernel reads S and H S once. Each thread block stages tiles of TILE rows in shared memory
(coalesced, 16-byte loads where the rows allow; the next tile's loads in flight while this one is multiplied)
and each thread accumulates a 4 x 4 tile of a Gram over its share of the rows, in double (also for float32
blocks: the sum over millions of rows then loses nothing to float32 rounding). A second kernel adds the
blocks' partial sums in a fixed order (reproducible) into full, mirrored float64 matrices (one thread block
per element: a thread per element had taken ~0.1 ms for 528 dependent loads each).

The kernels are compiled per (GPU, dtype) on first use, through CuPy's RawModule (so CuPy's on-disk kernel
cache keeps them), or ahead by ``prepare`` (hybridblas.lowlevel.prepare_kernels). Launches run on the
caller's current device and stream, without waiting.
"""
import sys
import threading

import numpy as np

from . import cuda_compile
from .cuda_tiles import TILE_HELPERS
from ..devspec import gpu_multiprocessors

KMAX = 32
# Beyond this many rows cuBLAS (hybridblas' gemmt and syrk) takes less GPU time than this kernel (47V, 484 k
# rows, float64, H200: 126 against 150 us for both Grams; 48Cr float32: 408 against 485), and the GPU time
# sets the pace there; below it the host's time does (a hybrid call costs 130-275 us of it, this 45)
ROWS_LIMIT = 1 << 18
TILE = 32                # rows staged per step
FETCH = 4                # loads per thread and block per tile: TILE * KMAX / THREADS single elements at most
THREADS = 256
TOTAL_THREADS = 128      # per element of the Grams in the second kernel
BLOCKS_PER_SM = 2        # the prefetched tile's registers leave room for two blocks of THREADS per SM
# The staged kernel (rows whole 16-byte vectors): tiles copied by cp.async into STAGES buffers, STAGES - 1 of
# them in flight (``grams(..., staged=False)``: the register-prefetch kernel also where the staged one fits)
STAGES = 3
# float64 blocks the staged kernel takes up to this many rows: at 47V's 484 k rows (H200) both Grams in 116 us
# against 120 for cuBLAS and 128 for hybridblas' gemmt and syrk, and 46 us of host time against 262; at
# 48Cr's 1.96 M float32 rows cuBLAS stays ahead (407 against 428 us), so ROWS_LIMIT holds there
# (benchmarks.cisolver queued-steps)
STAGED_DOUBLE_ROWS_LIMIT = 1 << 20
# H200, benchmarks.cisolver queued-steps: both Grams 70.1 / 67.0 / 69.0 us at 2 / 3 / 4 (242 k f64 rows)
STAGED_BLOCKS_PER_SM = 3
# the constants the source is compiled with (macros; a changed value compiles the kernels again)
SOURCE_CONSTANTS = ("TILE", "THREADS", "TOTAL_THREADS", "FETCH", "BLOCKS_PER_SM", "STAGES")
KERNELS = ("gram_partials", "gram_total", "gram_partials_staged")
OPTIONS = ("--std=c++14",)

# T and VT (its 16-byte vector) per dtype; the kernels take VEC, shared_address, copy_rows_async and the async
# group macros from hybridblas's tile helpers (devices/cuda_tiles.py)
_CTYPES = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}
DTYPES = tuple(_CTYPES)
_HEAD = TILE_HELPERS

_SOURCE = r"""
// Tasks: a 4 x 4 tile of S^T H S (every tile, when has_hs) or of S^T S (tiles on or below the diagonal).
// Thread t takes task t % tasks and rows phase, phase + phases, ... of each staged tile (phase = t / tasks).
__device__ __forceinline__ void task_tile(int task, int nt4, int tasks0, int* gram, int* ti, int* tj)
{
    if (task < tasks0) { *gram = 0; *ti = task / nt4; *tj = task % nt4; return; }
    int u = task - tasks0, i = 0;
    while (u > i) { u -= i + 1; ++i; }
    *gram = 1; *ti = i; *tj = u;
}

// The block's work: nt4 = ceil(k / 4) tiles a side (kp = 4 nt4, the padded row), tasks0 tiles of S^T H S (when
// has_hs) then the tiles of S^T S on and below the diagonal; thread t takes task t % tasks in row phase t / tasks
// of phases (a thread with phase >= phases has no task)
__device__ __forceinline__ void split_tasks(int k, int has_hs, int& nt4, int& kp, int& tasks0, int& tasks, int& phases,
                                            int& task, int& phase)
{
    nt4 = (k + 3) / 4;
    kp = 4 * nt4;
    tasks0 = has_hs ? nt4 * nt4 : 0;
    tasks = tasks0 + nt4 * (nt4 + 1) / 2;
    const int t = threadIdx.x, nt = blockDim.x;
    phases = nt / tasks;
    task = t % tasks;
    phase = t / tasks;
}

// x <- the 4 elements at p (16-byte aligned in shared memory), in double
__device__ __forceinline__ void load4(const T* p, double (&x)[4])
{
    union { VT v[4 / VEC]; T e[4]; } u;
    #pragma unroll
    for (int c = 0; c < 4 / VEC; ++c) u.v[c] = reinterpret_cast<const VT*>(p)[c];
    #pragma unroll
    for (int c = 0; c < 4; ++c) x[c] = (double) u.e[c];
}

// acc += the 4 x 4 products of rows phase, phase + phases, ... (below rows) of the staged tiles at left and right
// (row stride kp), in double
__device__ __forceinline__ void accumulate_rows(const T* left, const T* right, int kp, int rows, int phase,
                                                int phases, double (&acc)[4][4])
{
    for (int r = phase; r < rows; r += phases) {
        double x[4], y[4];
        load4(left + r * kp, x);
        load4(right + r * kp, y);
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += x[i] * y[j];
    }
}

// A thread's share of a tile of rows, between its loads from global memory and its stores to shared memory:
// 16-byte vectors (vec: k == kp and every row 16-byte aligned) or single elements (then e[0] only)
union Chunk { VT v; T e[VEC]; };

// This thread's place in a tile of rows x kp: its first row r and column c, and the rows between its loads;
// false for a thread without one. fetch and put take their elements from it, so they take the same ones.
__device__ __forceinline__ bool slot(int kp, bool vec, int* r, int* c, int* rows_per_pass)
{
    const int t = threadIdx.x, per_row = vec ? kp / VEC : kp;
    *rows_per_pass = blockDim.x / per_row;
    *r = t / per_row;
    *c = vec ? (t % per_row) * VEC : t % per_row;
    return *r < *rows_per_pass;
}

// rows [r0, r0 + rows) of src (k columns at leading dimension ld): this thread's part into reg; put(fetch(tile))
// stages the tile into dst (rows x kp, zero past column k). The next tile's loads are issued before this
// tile's products and are in flight meanwhile (one load at a time per thread between two barriers left the
// H200 at 1.2 TB/s)
__device__ __forceinline__ void fetch(const T* src, long long ld, long long r0, int rows, int k, int kp, bool vec,
                                      Chunk (&reg)[FETCH])
{
    int r, c, rows_per_pass;
    if (!slot(kp, vec, &r, &c, &rows_per_pass)) return;
    #pragma unroll
    for (int l = 0; l < FETCH; ++l) {
        const int rr = r + l * rows_per_pass;
        if (rr < rows) {
            if (vec) reg[l].v = *reinterpret_cast<const VT*>(src + (r0 + rr) * ld + c);
            else reg[l].e[0] = c < k ? src[(r0 + rr) * ld + c] : (T) 0;
        }
    }
}

__device__ __forceinline__ void put(const Chunk (&reg)[FETCH], int rows, int kp, bool vec, T* dst)
{
    int r, c, rows_per_pass;
    if (!slot(kp, vec, &r, &c, &rows_per_pass)) return;
    #pragma unroll
    for (int l = 0; l < FETCH; ++l) {
        const int rr = r + l * rows_per_pass;
        if (rr < rows) {
            if (vec) *reinterpret_cast<VT*>(dst + rr * kp + c) = reg[l].v;
            else dst[rr * kp + c] = reg[l].e[0];
        }
    }
}

// The block's threads' 4 x 4 tiles (acc) summed over the phases in a fixed order into its partials (red: THREADS
// * 16 doubles of shared memory, free when called)
__device__ __forceinline__ void block_partials(const double (&acc)[4][4], double* red, int k, int nt4, int tasks0,
                                               int tasks, int phases, double* partials)
{
    const int t = threadIdx.x, nt = blockDim.x;
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) red[t * 16 + i * 4 + j] = acc[i][j];
    __syncthreads();
    for (int e = t; e < tasks * 16; e += nt) {
        const int tk = e / 16, x = e % 16;
        double sum = 0.0;
        for (int p = 0; p < phases; ++p) sum += red[(p * tasks + tk) * 16 + x];
        int g, a, b;
        task_tile(tk, nt4, tasks0, &g, &a, &b);
        const int i = 4 * a + x / 4, j = 4 * b + x % 4;
        if (i < k && j < k) partials[(long long) ((g * k + i) * k + j) * gridDim.x + blockIdx.x] = sum;
    }
}

// partials: 2 x k x k rows of gridDim.x doubles, one per block (Gram 0 = S^T H S, Gram 1 = S^T S; S^T S only
// on and below the diagonal); shared: 2 * TILE * kp elements of T and THREADS * 16 doubles (the larger of the two)
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM) gram_partials(const T* s, long long lds,
        const T* hs, long long ldh, long long n, int k, int vec, double* partials)
{
    extern __shared__ __align__(16) unsigned char shared[];
    const int t = threadIdx.x, nt = blockDim.x, has_hs = hs != nullptr;
    int nt4, kp, tasks0, tasks, phases, task, phase;
    split_tasks(k, has_hs, nt4, kp, tasks0, tasks, phases, task, phase);
    const bool active = phase < phases;
    T* ss = reinterpret_cast<T*>(shared);
    T* hh = ss + TILE * kp;
    int gram = 1, ti = 0, tj = 0;
    if (active) task_tile(task, nt4, tasks0, &gram, &ti, &tj);
    const T* left = ss + 4 * ti;
    const T* right = (gram == 0 ? hh : ss) + 4 * tj;
    double acc[4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    const long long stride = (long long) gridDim.x * TILE;
    Chunk sreg[FETCH], hreg[FETCH];
    long long r0 = (long long) blockIdx.x * TILE;
    if (r0 < n) {
        const int rows = n - r0 < TILE ? (int) (n - r0) : TILE;
        fetch(s, lds, r0, rows, k, kp, vec & 1, sreg);
        if (has_hs) fetch(hs, ldh, r0, rows, k, kp, vec & 2, hreg);
    }
    for (; r0 < n; r0 += stride) {
        const int rows = n - r0 < TILE ? (int) (n - r0) : TILE;
        __syncthreads();                                       // the last tile's readers are done
        put(sreg, rows, kp, vec & 1, ss);
        if (has_hs) put(hreg, rows, kp, vec & 2, hh);
        __syncthreads();
        if (r0 + stride < n) {                                 // the next tile's loads, in flight during the products
            const int next_rows = n - r0 - stride < TILE ? (int) (n - r0 - stride) : TILE;
            fetch(s, lds, r0 + stride, next_rows, k, kp, vec & 1, sreg);
            if (has_hs) fetch(hs, ldh, r0 + stride, next_rows, k, kp, vec & 2, hreg);
        }
        if (active) {
            accumulate_rows(left, right, kp, rows, phase, phases, acc);
        }
    }
    __syncthreads();
    block_partials(acc, reinterpret_cast<double*>(shared), k, nt4, tasks0, tasks, phases, partials);
}

// gram_partials with the tiles copied by cp.async (16-byte copies, STAGES buffers: STAGES - 1 tiles in flight
// while one is multiplied, no registers held for them). Rows of S and H S must be whole 16-byte vectors
// (k a multiple of VEC, rows aligned); columns k..kp-1 of every buffer are zeroed once and never copied into.
extern "C" __global__ void __launch_bounds__(THREADS) gram_partials_staged(const T* s, long long lds, const T* hs,
        long long ldh, long long n, int k, double* partials)
{
    extern __shared__ __align__(16) unsigned char shared[];
    const int t = threadIdx.x, nt = blockDim.x, has_hs = hs != nullptr;
    int nt4, kp, tasks0, tasks, phases, task, phase;
    split_tasks(k, has_hs, nt4, kp, tasks0, tasks, phases, task, phase);
    const bool active = phase < phases;
    const int stage_elems = (has_hs ? 2 : 1) * TILE * kp;
    T* buffers = reinterpret_cast<T*>(shared);
    if (kp > k)                                                // the padding columns, zero for good
        for (int e = t; e < STAGES * stage_elems; e += nt)
            if (e % kp >= k) buffers[e] = (T) 0;
    int gram = 1, ti = 0, tj = 0;
    if (active) task_tile(task, nt4, tasks0, &gram, &ti, &tj);
    double acc[4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    const long long stride = (long long) gridDim.x * TILE, first = (long long) blockIdx.x * TILE;
    // tile u of this block starts at row first + u * stride and lives in buffer u % STAGES
    #pragma unroll
    for (int u = 0; u < STAGES - 1; ++u) {                     // the first STAGES - 1 tiles
        const long long r0 = first + u * stride;
        if (r0 < n) {
            const int rows = n - r0 < TILE ? (int) (n - r0) : TILE;
            T* dst = buffers + u * stage_elems;
            copy_rows_async(s, lds, r0, rows, k, kp, dst);
            if (has_hs) copy_rows_async(hs, ldh, r0, rows, k, kp, dst + TILE * kp);
        }
        ASYNC_COMMIT();                // a group a tile, empty ones included
    }
    int u = 0;
    for (long long r0 = first; r0 < n; r0 += stride, ++u) {
        {                                                      // tile u + STAGES - 1 into the buffer freed last
            const long long ahead = r0 + (STAGES - 1) * stride;
            if (ahead < n) {
                const int rows = n - ahead < TILE ? (int) (n - ahead) : TILE;
                T* dst = buffers + ((u + STAGES - 1) % STAGES) * stage_elems;
                copy_rows_async(s, lds, ahead, rows, k, kp, dst);
                if (has_hs) copy_rows_async(hs, ldh, ahead, rows, k, kp, dst + TILE * kp);
            }
            ASYNC_COMMIT();
        }
        ASYNC_WAIT(STAGES - 1);                                // tile u has landed
        __syncthreads();
        const int rows = n - r0 < TILE ? (int) (n - r0) : TILE;
        if (active) {
            const T* ss = buffers + (u % STAGES) * stage_elems;
            const T* left = ss + 4 * ti;
            const T* right = (gram == 0 ? ss + TILE * kp : ss) + 4 * tj;
            accumulate_rows(left, right, kp, rows, phase, phases, acc);
        }
        __syncthreads();                                       // buffer u % STAGES is free for tile u + STAGES
    }
    ASYNC_WAIT(0);
    __syncthreads();
    block_partials(acc, reinterpret_cast<double*>(shared), k, nt4, tasks0, tasks, phases, partials);
}

// out (element (i, j) of Gram g at out[i * o0 + j * o1 + g * o2]) <- the sum of the blocks' partials: one
// thread block per element, its threads' sums added in a fixed order (reproducible); S^T S mirrored from
// its lower triangle. Gram 0 only when has_hs.
extern "C" __global__ void gram_total(const double* partials, int blocks, int k, int has_hs, double* out,
        long long o0, long long o1, long long o2)
{
    __shared__ double sums[TOTAL_THREADS];
    const int e = blockIdx.x, t = threadIdx.x;
    const int g = e / (k * k), i = (e / k) % k, j = e % k;
    if (g == 0 && !has_hs) return;
    const int src = g == 1 && i < j ? (g * k + j) * k + i : e;
    double sum = 0.0;
    for (int blk = t; blk < blocks; blk += TOTAL_THREADS) sum += partials[(long long) src * blocks + blk];
    sums[t] = sum;
    __syncthreads();
    for (int half = TOTAL_THREADS / 2; half > 0; half /= 2) {
        if (t < half) sums[t] += sums[t + half];
        __syncthreads();
    }
    if (t == 0) out[i * o0 + j * o1 + g * o2] = sums[0];
}
"""

_modules = {}            # (device, dtype, source constants) -> (gram_partials, gram_total, gram_partials_staged)
_modules_lock = threading.Lock()


def _constants():
    return tuple(globals()[name] for name in SOURCE_CONSTANTS)


def source(dtype):
    """The kernels' CUDA source for ``dtype`` (float32 or float64): T and VT typedef'd, the tile helpers,
    the constants as macros, then the kernels (extern "C": gram_partials, gram_partials_staged, gram_total)."""
    ctype, vtype = _CTYPES[np.dtype(dtype)]
    macros = "".join(f"#define {name} {value}\n" for name, value in zip(SOURCE_CONSTANTS, _constants()))
    return f"typedef {ctype} T;\ntypedef {vtype} VT;\n{_HEAD}{macros}{_SOURCE}"


def is_device(x):
    """x is a cupy array (CuPy is not imported for the question: a program with cupy arrays has imported it)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def row_stride(x):
    """Elements between the starts of consecutive rows of the 2-D block ``x`` when its rows lie at a leading
    dimension with unit stride along each (row-major, a column range of a row-major buffer too), else None.
    A block of one row (or none) has k."""
    n, k = x.shape
    s0, s1 = x.strides
    item = x.itemsize
    if k > 1 and s1 != item:
        return None
    if n <= 1:
        return k
    return None if s0 % item or s0 < k * item else s0 // item


def _aligned_rows(x):
    """Every row of the row-major GPU block x starts on a 16-byte boundary (aligned 16-byte loads and stores)."""
    ld = row_stride(x)
    return ld is not None and x.data.ptr % 16 == 0 and (ld * x.itemsize) % 16 == 0


def _current_device():
    import cupy
    return cupy.cuda.runtime.getDevice()


def fits(s, hs=None):
    """The kernels cover these blocks: row-major float32/float64 blocks of 1 to KMAX columns on the current GPU
    (and H S like S)."""
    return (is_device(s) and s.dtype in DTYPES and s.ndim == 2 and 0 < s.shape[1] <= KMAX
            and (s.shape[0] == 0 or row_stride(s) is not None) and s.device.id == _current_device()
            and (hs is None or (is_device(hs) and hs.shape == s.shape and hs.dtype == s.dtype
                                and (hs.shape[0] == 0 or row_stride(hs) is not None)
                                and hs.device.id == s.device.id)))


def _staged_shared(s, hs):
    """Bytes of shared memory the staged kernel takes: STAGES tiles of S (and H S), rows padded to a multiple
    of 4, or the block's partial sums, whichever is larger."""
    kp = 4 * -(-s.shape[1] // 4)
    return max(STAGES * (2 if hs is not None else 1) * TILE * kp * s.itemsize, THREADS * 16 * 8)


def _staged(s, hs):
    """The staged kernel takes these (covered) blocks: rows of whole 16-byte vectors that fit its buffers."""
    k = s.shape[1]
    return (k % (16 // s.itemsize) == 0 and _aligned_rows(s) and (hs is None or _aligned_rows(hs))
            and _staged_shared(s, hs) <= 48 << 10)      # CUDA's default limit of dynamic shared memory


def preferred(s, hs=None):
    """The kernels cover these blocks and are the faster way to their Grams: at most ROWS_LIMIT rows, or
    STAGED_DOUBLE_ROWS_LIMIT float64 rows for the staged kernel."""
    if not fits(s, hs):
        return False
    limit = STAGED_DOUBLE_ROWS_LIMIT if s.dtype == np.float64 and _staged(s, hs) else ROWS_LIMIT
    return s.shape[0] <= limit


def _kernels(cupy, dtype):
    """(gram_partials, gram_total, gram_partials_staged) for ``dtype`` on the current GPU, compiled (or loaded
    from CuPy's kernel cache) once per device, dtype and source constants, also under concurrent callers."""
    key = (cupy.cuda.Device().id, np.dtype(dtype), _constants())
    with _modules_lock:
        if key not in _modules:
            module = cupy.RawModule(code=source(dtype), options=OPTIONS)
            _modules[key] = tuple(module.get_function(name) for name in KERNELS)
        return _modules[key]


def prepare(cupy, dtype, devices):
    """Compile (or load from CuPy's kernel cache) the kernels of ``dtype`` on ``devices``, one device after the
    other, on a background thread; returns the thread, or None when ``dtype`` takes none (float32 and float64
    do) or every device has them. A failure is left to the first call."""
    dtype = np.dtype(dtype)
    if dtype not in _CTYPES:
        return None
    constants = _constants()
    with _modules_lock:
        todo = [d for d in dict.fromkeys(int(d) for d in devices) if (d, dtype, constants) not in _modules]
    return cuda_compile.in_background(cupy, todo, lambda: _kernels(cupy, dtype))


def _vector_rows(x, k):
    """Rows of x can be staged by 16-byte loads: k a multiple of 4 and every row 16-byte aligned."""
    return k % 4 == 0 and _aligned_rows(x)


def grams(s, hs=None, staged=True):
    """(k, k, 2) float64 GPU array in Fortran order (each Gram a column-major k x k matrix): [:, :, 0] = S^T H S
    (with ``hs``; zeros without) and [:, :, 1] = S^T S, both whole (not only their lower triangles). ``staged``
    False: the register-prefetch kernel also where the staged one fits. Queued on the current device and
    stream; returns without waiting. The blocks must be ones ``fits`` takes: hybridblas.lowlevel.grams checks
    them (and names what it refuses) before it calls this."""
    import cupy
    n, k = s.shape
    out = cupy.zeros((k, k, 2), dtype=np.float64, order="F")
    if n == 0:
        return out
    partial_kernel, total_kernel, staged_kernel = _kernels(cupy, s.dtype)
    hs_arg = hs if hs is not None else np.uint64(0)
    ldh = np.int64(row_stride(hs) if hs is not None else 0)
    if staged and _staged(s, hs):
        blocks = max(1, min(STAGED_BLOCKS_PER_SM * gpu_multiprocessors(), -(-n // TILE)))
        partials = cupy.empty((2, k, k, blocks), dtype=np.float64)
        staged_kernel((blocks,), (THREADS,), (s, np.int64(row_stride(s)), hs_arg, ldh, np.int64(n), np.int32(k),
                                              partials), shared_mem=_staged_shared(s, hs))
    else:
        blocks = max(1, min(BLOCKS_PER_SM * gpu_multiprocessors(), -(-n // TILE)))
        partials = cupy.empty((2, k, k, blocks), dtype=np.float64)
        shared = max(2 * TILE * 4 * -(-k // 4) * s.itemsize, THREADS * 16 * 8)
        vec = int(_vector_rows(s, k)) + 2 * int(hs is not None and _vector_rows(hs, k))
        partial_kernel((blocks,), (THREADS,),
                       (s, np.int64(row_stride(s)), hs_arg, ldh, np.int64(n), np.int32(k), np.int32(vec), partials),
                       shared_mem=shared)
    total_kernel((2 * k * k,), (TOTAL_THREADS,),
                 (partials, np.int32(blocks), np.int32(k), np.int32(hs is not None), out, np.int64(1), np.int64(k),
                  np.int64(k * k)))
    return out
