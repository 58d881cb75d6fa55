"""<J²> of eigenvectors on the GPU where they lie, without building J₊ in the many-body basis.

cisolver.shellmodel.angmom builds the sparse J₊ from the 2M basis to the 2M + 2 basis on the host (at 47V's
484 k states 2.4 M entries, most of the half second J² took there) and takes <J²> = |J₊ψ|² / |ψ|² + M² + M.
J₊ = J₊(protons) ⊗ 1 + 1 ⊗ J₊(neutrons) on the product basis, so J₊ψ needs only the species' raising
operators: for a state of the 2M + 2 basis, (proton determinant d, neutron determinant e) in its block,

    (J₊ψ)[d, e] = Σ_s a_p(d, s) ψ[s, e]  +  Σ_s a_n(e, s) ψ[d, s]

with a_p, a_n the species' raising elements (angmom's, sqrt(j(j+1) - m(m+1)) times the sign), the first sum
over the proton determinants s of the block with 2M_p - 2 (same neutrons), the second over the neutron
determinants of the block with the same protons and 2M_n - 2. One kernel evaluates that sum for every state
of the 2M + 2 basis and column of ψ, in double, and adds up its square per column; another adds up |ψ|².
Both sum per thread block in a fixed order and the host adds the blocks' sums in a fixed order: the result
does not depend on the launch (it differs from the host's by the order of the sums, ~1e-15 relative).
The species' raising elements (CSR by target determinant, a few 10⁵ entries at 48Cr) are made on the host.
"""
import numpy as np

from . import cuda_modules
from .arrays import is_device, row_major, row_stride
from .shellmodel import angmom
from .shellmodel.basis import MSchemeBasis

THREADS = 256
MAX_BLOCKS = 1024          # thread blocks per launch (per target block for raised_squares)
BLOCK_FIELDS = 9           # int64 entries per target block in raised_squares' table (block_table)

_SOURCE = r"""
// v: the vectors (n x k, row-major, row stride ldv). Thread t of a thread block takes column t % k and rows
// t / k, t / k + rows_per_pass, ...; its squares are added in double, the block's threads of a column in a
// fixed order at the end, into partials[(blockIdx.y * gridDim.x + blockIdx.x) * k + column].
__device__ __forceinline__ void block_sums(double acc, int k, double* partials)
{
    extern __shared__ double sums[];
    const int rows_per_pass = blockDim.x / k;
    sums[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < k) {
        double s = 0.0;
        for (int q = 0; q < rows_per_pass; ++q) s += sums[q * k + threadIdx.x];
        partials[((long long) blockIdx.y * gridDim.x + blockIdx.x) * k + threadIdx.x] = s;
    }
}

// the column sums of v^2 (n rows), gridDim.y == 1
extern "C" __global__ void column_squares(const T* v, long long ldv, long long n, int k, double* partials)
{
    const int rows_per_pass = blockDim.x / k, c = threadIdx.x % k, q = threadIdx.x / k;
    double acc = 0.0;
    if (q < rows_per_pass) {
        const long long step = (long long) gridDim.x * rows_per_pass;
        for (long long i = (long long) blockIdx.x * rows_per_pass + q; i < n; i += step) {
            const double x = (double) v[i * ldv + c];
            acc += x * x;
        }
    }
    block_sums(acc, k, partials);
}

// The column sums of (J+ v)^2 over the target blocks, one per blockIdx.y. blocks[y * BLOCK_FIELDS + ...]: the
// target block's proton determinants, neutron determinants, first proton and first neutron determinant
// (species indices), then the source block that the protons' raising reaches it from (offset, first proton
// determinant; -1 when none: its neutrons are the target's) and the one the neutrons' raising reaches it
// from (offset, neutron determinants, first neutron determinant; -1 when none: its protons are the target's).
// p_ptr, p_src, p_coef: the protons' raising elements by target determinant (CSR), n_ptr, ... the neutrons'.
extern "C" __global__ void raised_squares(const T* v, long long ldv, int k, const long long* blocks,
        const long long* p_ptr, const int* p_src, const double* p_coef,
        const long long* n_ptr, const int* n_src, const double* n_coef, double* partials)
{
    const long long* b = blocks + (long long) blockIdx.y * BLOCK_FIELDS;
    const long long n_p = b[0], n_n = b[1], p_start = b[2], n_start = b[3];
    const long long from_p = b[4], from_p_start = b[5], from_n = b[6], from_n_nn = b[7], from_n_start = b[8];
    const int rows_per_pass = blockDim.x / k, c = threadIdx.x % k, q = threadIdx.x / k;
    double acc = 0.0;
    if (q < rows_per_pass) {
        const long long rows = n_p * n_n, step = (long long) gridDim.x * rows_per_pass;
        for (long long i = (long long) blockIdx.x * rows_per_pass + q; i < rows; i += step) {
            const long long d = i / n_n, e = i % n_n;
            double w = 0.0;
            if (from_p >= 0)
                for (long long x = p_ptr[p_start + d]; x < p_ptr[p_start + d + 1]; ++x)
                    w += p_coef[x] * (double) v[(from_p + (p_src[x] - from_p_start) * n_n + e) * ldv + c];
            if (from_n >= 0)
                for (long long x = n_ptr[n_start + e]; x < n_ptr[n_start + e + 1]; ++x)
                    w += n_coef[x] * (double) v[(from_n + d * from_n_nn + (n_src[x] - from_n_start)) * ldv + c];
            acc += w * w;
        }
    }
    block_sums(acc, k, partials);
}
"""


def cuda_section(dtype):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules)."""
    return _SOURCE, {"BLOCK_FIELDS": BLOCK_FIELDS}, ["column_squares", "raised_squares"]


def raising_by_target(dets, jumps):
    """The species' raising elements c†_{m+1} c_m (angmom's) as CSR by target determinant: (pointers (int64,
    len(dets) + 1), source determinants (int32), coefficients (float64)), sources ascending within a row."""
    src, dst, coef = angmom._raise_entries(jumps, dets)
    order = np.lexsort((src, dst))
    ptr = np.zeros(len(dets) + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=len(dets)), out=ptr[1:])
    return ptr, src[order].astype(np.int32), np.asarray(coef, dtype=np.float64)[order]


def block_table(basis, target):
    """(blocks of ``target`` that J₊ reaches from ``basis``, BLOCK_FIELDS) int64 table for raised_squares."""
    rows = []
    for t in target.blocks:
        bp = basis.block_of_twom.get(t.twom_p - 2)        # protons raised: the target's neutrons
        bn = basis.block_of_twom.get(t.twom_p)            # neutrons raised: the target's protons
        if bp is None and bn is None:
            continue
        p = basis.blocks[bp] if bp is not None else None
        q = basis.blocks[bn] if bn is not None else None
        rows.append([t.n_p, t.n_n, t.p_start, t.n_start, p.offset if p else -1, p.p_start if p else -1,
                     q.offset if q else -1, q.n_n if q else -1, q.n_start if q else -1])
    return np.array(rows, dtype=np.int64).reshape(-1, BLOCK_FIELDS)


def _grid(rows, k):
    """Thread blocks for ``rows`` rows of k columns (at most MAX_BLOCKS: the rest by a grid-stride loop)."""
    return max(1, min(MAX_BLOCKS, -(-rows // (THREADS // k))))


def expectation_j2(problem, vectors):
    """<J²> of each column of ``vectors`` (a CuPy n x k block on its device, row-major, float32 or float64;
    the columns need not be normalised), as a float64 host array."""
    import cupy
    if not is_device(vectors) or vectors.ndim != 2 or vectors.dtype not in (np.float32, np.float64):
        raise TypeError(f"vectors must be a 2-D float32 or float64 CuPy array, got {type(vectors).__name__} "
                        f"{getattr(vectors, 'dtype', None)}")
    basis = problem.basis
    n, k = vectors.shape
    if n != basis.dim:
        raise ValueError(f"vectors have {n} rows, the basis {basis.dim} states")
    if not 0 < k <= THREADS:
        raise ValueError(f"vectors must have 1 to {THREADS} columns, got {k}")
    m = basis.twice_m / 2.0
    with cupy.cuda.Device(vectors.device.id):
        v = vectors if row_major(vectors) else cupy.ascontiguousarray(vectors)
        ld = np.int64(row_stride(v))
        threads = THREADS // k * k
        grid = _grid(n, k)
        norms = cupy.empty((grid, k), dtype=np.float64)
        cuda_modules.function(cupy, v.dtype, "column_squares")((grid,), (threads,), (
            v, ld, np.int64(n), np.int32(k), norms), shared_mem=8 * threads)
        target = MSchemeBasis(problem.pdets, problem.ndets, basis.twice_m + 2)
        table = block_table(basis, target)
        if len(table):
            largest = int((table[:, 0] * table[:, 1]).max())
            gx = _grid(largest, k)
            raised = cupy.empty((len(table) * gx, k), dtype=np.float64)
            p = [cupy.asarray(a) for a in raising_by_target(problem.pdets, problem.jumps_p)]
            q = [cupy.asarray(a) for a in raising_by_target(problem.ndets, problem.jumps_n)]
            cuda_modules.function(cupy, v.dtype, "raised_squares")((gx, len(table)), (threads,), (
                v, ld, np.int32(k), cupy.asarray(table), *p, *q, raised), shared_mem=8 * threads)
            squares = raised.get().sum(axis=0)
        else:                              # no 2M + 2 states: J₊ψ = 0
            squares = np.zeros(k)
        norm2 = norms.get().sum(axis=0)
    return squares / norm2 + m * m + m
