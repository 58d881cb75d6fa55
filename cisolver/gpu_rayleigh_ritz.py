"""LOBPCG's small Rayleigh-Ritz problem and next search directions on the GPU, with no host trip.

dense.rayleigh_ritz and dense.next_p_coefficients take the two Gram matrices to the host, factor them
there and send the update's coefficients back; the GPU waits for the host meanwhile (0.5-0.7 ms per
iteration at 47V's and 48Cr's sizes on an H200). Here the same steps run where the Grams are, in double:

    prepare (one thread block): the Grams mirrored, S^T S Jacobi-scaled and factored (Cholesky), R^{-1},
        A = R^{-T} (S^T H S, scaled) R^{-1}
    cuSOLVER's batched Jacobi eigensolver (syevjBatched on a batch of one, called directly: through
        cupy.linalg.eigh it cost 60-100 us of host time per call): A's eigenpairs, ascending
    finish (one thread block): C = D R^{-1} Y[:, :b], the next P's coefficients Z (dense.next_p_coefficients),
        [C Z] in the blocks' precision for the update kernel, theta, and a small summary for the host

The host reads the summary (theta, the largest |Ritz value|, which P columns are usable, and whether S^T S
was positive definite and the eigensolver converged) while the GPU runs the update. Where the host path
would raise NotPositiveDefinite the summary says so and the caller takes the host path from the same,
untouched S and H S.

The eigensolver is cuSOLVER's syevjBatched: one-warp Jacobi or Householder-plus-QL kernels were slower on
LOBPCG's own 24 x 24 matrices (docs/performance.md, `benchmarks.cisolver small-eigh`).
"""
import numpy as np

from . import cuda_modules
from .arrays import Later, is_device

KMAX = 32          # columns of S: cuSOLVER's batched Jacobi eigensolver takes matrices up to 32 x 32
# S^T S's scaled Cholesky factor with diagonal entries this far apart sends the step to the host path. Stricter
# than dense.cholesky_upper's: an exactly singular S^T S leaves pivots of rounding size whose sign is chance
# (the host's LAPACK failed where this kernel took a 1e-8 pivot, float32, two equal columns); the host path
# then decides as it always has
SINGULAR_RATIO = 1e-6
EIG_RESIDUAL = 1e-10   # |A y - w y| / max |w| of an eigenpair beyond which the eigensolve is taken as failed
THREADS = 256

_SOURCE = r"""
// both: the two Grams (at least their lower triangles, in double), element (i, j) of Gram p at
// both[i * s0 + j * s1 + p * s2] (p = 0: S^T H S, p = 1: S^T S). Writes a (k x k, for the eigensolver) and a
// copy a0, rinv, o (S^T S mirrored), d.
extern "C" __global__ void rr_prepare(const double* both, long long s0, long long s1, long long s2, int k,
        double singular_ratio, double* a, double* a0, double* rinv, double* o, double* d, int* flag)
{
    __shared__ double g[KMAX * KMAX], r[KMAX * KMAX], ri[KMAX * KMAX];
    __shared__ double dd[KMAX], piv[KMAX], rd[KMAX];
    __shared__ int bad;
    const int t = threadIdx.x, nt = blockDim.x;
    if (t == 0) bad = 0;
    for (int e = t; e < k * k; e += nt) {
        const int i = e / k, j = e % k, lo = i >= j ? i : j, hi = i >= j ? j : i;
        g[e] = (double) both[lo * s0 + hi * s1];
        r[e] = (double) both[lo * s0 + hi * s1 + s2];
        o[e] = r[e];
    }
    __syncthreads();
    if (t < k) {
        const double v = r[t * k + t];
        if (!(v > 0.0) || !isfinite(v)) atomicOr(&bad, 1);
        dd[t] = v > 0.0 && isfinite(v) ? 1.0 / sqrt(v) : 1.0;
        d[t] = dd[t];
    }
    __syncthreads();
    for (int e = t; e < k * k; e += nt) {
        const int i = e / k, j = e % k;
        const double sc = dd[i] * dd[j];
        r[e] *= sc;
        g[e] *= sc;
        if (!isfinite(r[e]) || !isfinite(g[e])) atomicOr(&bad, 1);
    }
    __syncthreads();
    cholesky_upper(r, k, &bad, 1, piv);
    flag_singular(r, k, singular_ratio, &bad, 1);
    inverse_upper(r, ri, k, rd);
    __syncthreads();
    for (int e = t; e < k * k; e += nt) {                     // r <- G_scaled R^{-1}
        const int i = e / k, j = e % k;
        double s = 0.0;
        for (int l = 0; l <= j; ++l) s += g[i * k + l] * ri[l * k + j];
        r[e] = s;
        rinv[e] = ri[e];
    }
    __syncthreads();
    for (int e = t; e < k * k; e += nt) {                     // A = R^{-T} (G_scaled R^{-1}), symmetrised
        const int i = e / k, j = e % k;
        double s1 = 0.0, s2 = 0.0;
        for (int l = 0; l <= i; ++l) s1 += ri[l * k + i] * r[l * k + j];
        for (int l = 0; l <= j; ++l) s2 += ri[l * k + j] * r[l * k + i];
        a[e] = 0.5 * (s1 + s2);
        a0[e] = a[e];                                          // kept: the eigensolver overwrites a
    }
    if (t == 0) flag[0] = bad;
}

// w: ascending eigenvalues; eigenvector i is column i of v (element (l, i) at v[l * v0 + i * v1]) of a0;
// eig_info: the eigensolver's status (0: converged). A residual |a0 y - w y| above EIG_RESIDUAL max |w|, or a
// nonzero status, sends the step to the host path (flag bit 2).
// m (k x 2b, row-major, T) = [C Z]; theta (b); info = [theta (b), max |w|, usable (b), flag].
// The small inputs are copied into shared memory first (one round of global loads instead of a chain of them in
// every inner loop); three buffers are reused once their first content is no longer read.
extern "C" __global__ void rr_finish(const double* w, const double* v, long long v0, long long v1,
        const double* a0, const double* rinv, const double* o, const double* d, const int* flag, const int* eig_info,
        int k, int b, T* m, double* theta, double* info)
{
    __shared__ double ab[KMAX * KMAX], y[KMAX * KMAX], ri[KMAX * KMAX], c[KMAX * KMAX], z[KMAX * KMAX];
    __shared__ double sw[KMAX], sd[KMAX], before[KMAX], after[KMAX];
    __shared__ int unsolved;
    double* const oz = ri;                                     // O Z, once R^{-1} is used
    double* const tt = y;                                      // C^T O Z, once Y is used
    const int t = threadIdx.x, nt = blockDim.x;
    if (t == 0) unsolved = eig_info[0] != 0;
    for (int e = t; e < k * k; e += nt) {
        const int l = e / k, i = e % k;
        ab[e] = a0[e];                                         // A, then S^T S
        y[e] = v[l * v0 + i * v1];                             // Y (row l, column i)
        ri[e] = rinv[e];
    }
    if (t < k) {
        sw[t] = w[t];
        sd[t] = d[t];
    }
    __syncthreads();
    double scale = TINY64;                                     // max |w|
    for (int i = 0; i < k; ++i) scale = fmax(scale, fabs(sw[i]));
    for (int e = t; e < k * k; e += nt) {                     // every eigenpair's residual: cuSOLVER's batched
        const int l = e / k, i = e % k;                        // syevj reports 0 also when its sweeps ran out
        double s = -sw[i] * y[l * k + i];
        for (int q = 0; q < k; ++q) s += ab[l * k + q] * y[q * k + i];
        if (!(fabs(s) <= EIG_RESIDUAL * scale)) unsolved = 1;
    }
    for (int e = t; e < k * b; e += nt) {                     // C = D R^{-1} Y[:, :b]
        const int l = e / b, j = e % b;
        double s = 0.0;
        for (int q = l; q < k; ++q) s += ri[l * k + q] * y[q * k + j];
        c[e] = sd[l] * s;
        z[e] = l < b ? 0.0 : c[e];
    }
    __syncthreads();
    for (int e = t; e < k * k; e += nt) ab[e] = o[e];
    __syncthreads();
    for (int pass = 0; pass < 2; ++pass) {
        for (int e = t; e < k * b; e += nt) {                 // O Z
            const int l = e / b, j = e % b;
            double s = 0.0;
            for (int q = 0; q < k; ++q) s += ab[l * k + q] * z[q * b + j];
            oz[e] = s;
        }
        __syncthreads();
        if (t < b) {                                           // |Z_j| in the S^T S inner product
            double s = 0.0;
            for (int l = 0; l < k; ++l) s += z[l * b + t] * oz[l * b + t];
            (pass == 0 ? before : after)[t] = sqrt(fmax(s, 0.0));
        }
        if (pass == 1) break;
        for (int e = t; e < b * b; e += nt) {                 // C^T O Z
            const int i = e / b, j = e % b;
            double s = 0.0;
            for (int l = 0; l < k; ++l) s += c[l * b + i] * oz[l * b + j];
            tt[e] = s;
        }
        __syncthreads();
        for (int e = t; e < k * b; e += nt) {                 // Z <- Z - C (C^T O Z)
            const int l = e / b, j = e % b;
            double s = 0.0;
            for (int i = 0; i < b; ++i) s += c[l * b + i] * tt[i * b + j];
            z[e] -= s;
        }
        __syncthreads();
    }
    __syncthreads();
    const int bad = flag[0] | (unsolved ? 2 : 0);               // 2: the eigensolver did not converge
    const bool ok = bad == 0;
    for (int e = t; e < k * b; e += nt) {
        const int l = e / b, j = e % b;
        const bool usable = after[j] > 1e3 * EPS64 * fmax(before[j], TINY64);
        m[l * 2 * b + j] = (T) (ok ? c[e] : 0.0);
        m[l * 2 * b + b + j] = (T) (ok && usable ? z[e] / after[j] : 0.0);
    }
    if (t < b) {
        theta[t] = sw[t];
        info[t] = sw[t];
        info[b + 1 + t] = after[t] > 1e3 * EPS64 * fmax(before[t], TINY64) ? 1.0 : 0.0;
    }
    if (t == 0) {
        double big = 0.0;
        for (int i = 0; i < k; ++i) big = fmax(big, fabs(sw[i]));
        info[b] = big;
        info[2 * b + 1] = (double) bad;
    }
}
"""


def fits(s, b):
    """The kernels cover these blocks: GPU, float32/float64, at most KMAX columns in S."""
    return is_device(s) and s.dtype in (np.float32, np.float64) and 0 < b and s.shape[1] <= KMAX


def cuda_section(dtype):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules; SMALL_FACTOR comes before it)."""
    return _SOURCE, {"KMAX": KMAX, "EPS64": repr(float(np.finfo(np.float64).eps)),
                     "TINY64": repr(float(np.finfo(np.float64).tiny)), "EIG_RESIDUAL": repr(EIG_RESIDUAL)}, \
        ["rr_prepare", "rr_finish"]


_syevj_params = {}       # device -> (cuSOLVER syevj parameters, {k: workspace elements})


def _eigh_in_place(cupy, a, w, info):
    """cuSOLVER syevjBatched on the k x k symmetric a (a batch of one) on the current stream: a <- its
    eigenvectors (column-major: eigenvector i is a's row i as a C array), w <- the eigenvalues ascending,
    info <- its status (0 also when the sweeps ran out, for k <= 32: rr_finish checks the residuals)."""
    from cupy_backends.cuda.libs import cusolver
    k = a.shape[0]
    handle = cupy.cuda.device.get_cusolver_handle()
    # CuPy's handle is shared per device and thread: its stream is set before every call, as CuPy does
    cusolver.setStream(handle, cupy.cuda.get_current_stream().ptr)
    dev = cupy.cuda.Device().id
    if dev not in _syevj_params:       # one per device; a thread that lost a race keeps the winner's
        _syevj_params.setdefault(dev, (cusolver.createSyevjInfo(), {}))
    params, sizes = _syevj_params[dev]
    vector, lower = 1, 0            # CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER
    if k not in sizes:
        sizes[k] = cusolver.dsyevjBatched_bufferSize(handle, vector, lower, k, a.data.ptr, k, w.data.ptr, params, 1)
    work = cupy.empty(max(sizes[k], 1), dtype=np.float64)
    cusolver.dsyevjBatched(handle, vector, lower, k, a.data.ptr, k, w.data.ptr, work.data.ptr, sizes[k],
                           info.data.ptr, params, 1)


class Queued:
    """A Rayleigh-Ritz step queued on the GPU: ``m`` ([C Z], k x 2b, device) and ``theta`` (device) feed the
    update kernel; ``summary()`` waits for the small results only and gives (theta, max |Ritz value|,
    usable P columns, and whether S^T S was positive definite and the eigensolver converged) on the host."""

    def __init__(self, m, theta, info, b):
        self.m, self.theta, self._info, self._b = m, theta, info, b

    def summary(self):
        info, b = self._info.result(), self._b
        return info[:b].copy(), float(info[b]), info[b + 1:2 * b + 1] > 0.5, info[2 * b + 1] == 0


def queue(both, b, dtype):
    """Queue Rayleigh-Ritz on the Gram buffer ``both`` ((k, k, 2), at least the lower triangles of S^T H S
    and S^T S: hybridblas.lowlevel.grams, or dense.gram_buffer) for the ``b`` lowest pairs, [C Z] in ``dtype``."""
    import cupy
    k = both.shape[0]
    if (both.shape != (k, k, 2) or not 0 < b <= k <= KMAX or np.dtype(dtype) not in (np.float32, np.float64)
            or both.dtype not in (np.float32, np.float64)):
        raise ValueError(f"gpu_rayleigh_ritz.queue: Grams {both.shape} {both.dtype} with b={b}, {np.dtype(dtype)} "
                         f"not covered")
    both = both.astype(np.float64, copy=False)
    a, a0, rinv, o = (cupy.empty((k, k), dtype=np.float64) for _ in range(4))
    d, w = cupy.empty(k, dtype=np.float64), cupy.empty(k, dtype=np.float64)
    flag, eig_info = cupy.empty(1, dtype=np.int32), cupy.empty(1, dtype=np.int32)
    item = both.itemsize
    cuda_modules.function(cupy, dtype, "rr_prepare")((1,), (cuda_modules.small_factor_threads(THREADS),), (
        both, np.int64(both.strides[0] // item), np.int64(both.strides[1] // item), np.int64(both.strides[2] // item),
        np.int32(k), np.float64(SINGULAR_RATIO), a, a0, rinv, o, d, flag))
    _eigh_in_place(cupy, a, w, eig_info)
    m = cupy.empty((k, 2 * b), dtype=dtype)
    theta = cupy.empty(b, dtype=np.float64)
    info = cupy.empty(2 * b + 2, dtype=np.float64)
    cuda_modules.function(cupy, dtype, "rr_finish")((1,), (THREADS,), (
        w, a, np.int64(1), np.int64(k), a0, rinv, o, d, flag, eig_info, np.int32(k), np.int32(b), m, theta, info))
    return Queued(m, theta, Later(info), b)
