"""The first pass of LOBPCG's orthonormalisation (dense.orthonormalise_tail) queued on a GPU with no host trip.

On the host path each pass takes S^T V to the host, factors it there and sends the coefficients back: the
GPU waits for the host at every pass (about 0.3-0.5 ms per iteration at 47V's and 48Cr's sizes on an
H200, where the whole dense budget is about 1.5 ms). Here one thread block factors S^T V where it lies
(in double: the Jacobi-scaled Cholesky of V^T V - (X^T V)^T X^T V, its triangular inverse, and the
predicted loss of orthogonality of dense.predicted_loss), writes the update's coefficients into device
memory, and the row kernels read them from there. The host queues the pass and goes on.

The pass is the host path's first pass, in the same arithmetic. Where the host path would do anything else
(project V off X first because it would cancel, fail the factorisation, or make a second pass), the kernel
writes coefficients that leave S and H S as they were and sets a flag; the caller reads the flag when it
next waits for the GPU anyway (cisolver.iterations: at the Rayleigh-Ritz Grams) and then runs the host path
on the untouched blocks. One exception: a NaN or Inf in V spreads over its row through the identity update
(0 times NaN), into P; the run then fails with NotPositiveDefinite, as it does on the host path.
"""
import numpy as np

import hybridblas as hb

from . import blocks, cuda_modules, dense
from .arrays import is_device
from .distributed import device_sum

QMAX = 32          # columns of V the kernel takes (P and W together)
BMAX = 64          # columns of X
THREADS = 256
OK, CANCELS, NOT_DEFINITE, SECOND_PASS = 0, 1, 2, 4      # flag bits

_SOURCE = r"""
// One thread block. y (k x q, k = b + q, element (i, j) at y[i * yi + j * yj]) holds [X^T V; V^T V] in double.
// Writes m (k x q, row-major): [-X^T V R^{-1}; triu(R^{-1})], and m_hp ((b + n_p) x n_p, row-major) its
// first b + n_p rows and n_p columns (H P's update), or the identity update [0; I] when flag != 0.
extern "C" __global__ void ortho_factor(const double* y, long long yi, long long yj, int b, int q, int n_p,
        double unit_roundoff, double cancellation, double single_pass_loss, double singular_ratio,
        T* m, T* m_hp, int* flag)
{
    __shared__ double xv[BMAX * QMAX];      // X^T V, b x q
    __shared__ double a[QMAX * QMAX];       // V^T V, then the outside part, then its scaled factor R_s
    __shared__ double ri[QMAX * QMAX];      // R^{-1}
    __shared__ double d[QMAX], col[QMAX], part[64], piv[QMAX], rd[QMAX];
    __shared__ int bad;
    const int t = threadIdx.x, nt = blockDim.x, k = b + q;
    if (t == 0) bad = 0;
    for (int e = t; e < b * q; e += nt) {
        const int i = e / q, j = e % q;
        xv[e] = (double) y[i * yi + j * yj];
    }
    for (int e = t; e < q * q; e += nt) {
        const int i = e / q, j = e % q;
        a[e] = 0.5 * ((double) y[(b + i) * yi + j * yj] + (double) y[(b + j) * yi + i * yj]);
    }
    __syncthreads();
    if (t < q) col[t] = a[t * q + t];                          // diag(V^T V)
    __syncthreads();
    for (int e = t; e < q * q; e += nt) {                     // V^T V - (X^T V)^T (X^T V)
        const int i = e / q, j = e % q;
        double s = 0.0;
        for (int l = 0; l < b; ++l) s += xv[l * q + i] * xv[l * q + j];
        a[e] -= s;
    }
    __syncthreads();
    if (t < q) {
        const double o = a[t * q + t];
        if (!(o >= cancellation * col[t])) atomicOr(&bad, CANCELS);     // would cancel: project first
        if (!(o > 0.0) || !isfinite(o)) atomicOr(&bad, NOT_DEFINITE);
        d[t] = o > 0.0 ? sqrt(o) : 1.0;
    }
    __syncthreads();
    for (int e = t; e < q * q; e += nt) a[e] /= d[e / q] * d[e % q];
    __syncthreads();
    cholesky_upper(a, q, &bad, NOT_DEFINITE, piv);             // row c is R_s[c, c:]
    flag_singular(a, q, singular_ratio, &bad, NOT_DEFINITE);   // numerically singular, as cholesky_upper
    __syncthreads();
    for (int e = t; e < q * q; e += nt) {                     // R = R_s diag(d), upper
        const int i = e / q, j = e % q;
        a[e] = j >= i ? a[e] * d[j] : 0.0;
    }
    __syncthreads();
    inverse_upper(a, ri, q, rd);
    if (t < q) {                                               // column lengths of R
        double c2 = 0.0;
        for (int i = 0; i <= t; ++i) c2 += a[i * q + t] * a[i * q + t];
        col[t] = sqrt(c2);
    }
    __syncthreads();
    double f1 = 0.0, f2 = 0.0;                                 // predicted loss: u kappa^2, kappa bounded by
    for (int e = t; e < q * q; e += nt) {                      // Frobenius norms of R_s and R_s^{-1}
        const int i = e / q, j = e % q;
        if (j >= i) {
            const double u = a[i * q + j] / col[j], v = ri[i * q + j] * col[i];
            f1 += u * u;
            f2 += v * v;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {                   // in a fixed order: every MPI rank gets the same bits
        f1 += __shfl_down_sync(0xffffffffu, f1, off);
        f2 += __shfl_down_sync(0xffffffffu, f2, off);
    }
    if ((t & 31) == 0) { part[t >> 5] = f1; part[32 + (t >> 5)] = f2; }
    __syncthreads();
    if (t == 0) {
        f1 = f2 = 0.0;
        for (int w = 0; w < (nt + 31) / 32; ++w) { f1 += part[w]; f2 += part[32 + w]; }
        const double loss = unit_roundoff * f1 * f2;
        if (!(loss <= single_pass_loss)) atomicOr(&bad, SECOND_PASS);
        flag[0] = bad;
    }
    __syncthreads();
    const bool keep = bad == 0;
    for (int e = t; e < k * q; e += nt) {
        const int i = e / q, j = e % q;
        double v;
        if (!keep) {
            v = i - b == j ? 1.0 : 0.0;
        } else if (i < b) {
            v = 0.0;
            for (int l = 0; l <= j; ++l) v -= xv[i * q + l] * ri[l * q + j];
        } else {
            v = ri[(i - b) * q + j];
        }
        m[e] = (T) v;
        if (i < b + n_p && j < n_p) m_hp[i * n_p + j] = (T) v;
    }
}
"""
def fits(s, b):
    """The kernel covers LOBPCG's blocks: a GPU buffer, float32/float64, X of at most BMAX columns (none: a
    Cholesky-QR pass of the whole block, LOBPCG's start) and [P W] of at most QMAX."""
    return (is_device(s) and s.dtype in (np.float32, np.float64) and 0 <= b <= BMAX
            and 0 < s.shape[1] - b <= QMAX)


def cuda_section(dtype):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules; SMALL_FACTOR comes before it)."""
    return _SOURCE, {"BMAX": BMAX, "QMAX": QMAX, "CANCELS": CANCELS, "NOT_DEFINITE": NOT_DEFINITE,
                     "SECOND_PASS": SECOND_PASS}, ["ortho_factor"]


def _kernel(cupy, dtype):
    return cuda_modules.function(cupy, dtype, "ortho_factor")


def _cross_products(s, b, context):
    """[X^T V; V^T V] = (S^T S)[:, b:] in double, on the GPU."""
    if hb.lowlevel.grams_preferred(s):
        return hb.lowlevel.grams(s)[:, b:, 1]
    return hb.gemm(1.0, s, s[:, b:], transa="T", context=context).astype(np.float64, copy=False)


def first_pass(s, hs, b, n_p, context=None, comm=None):
    """Queue one pass of dense.orthonormalise_tail (adaptive) on the GPU: V = s[:, b:] orthonormal and
    orthogonal to X = s[:, :b], and H P = hs[:, b:b + n_p] following P. Returns a device int32 flag: OK
    when the pass was made and one pass is enough, else the flag bits say why the host path is needed,
    and s and hs are left as they were. comm: MPI ranks holding rows each (the cross products summed over
    them on the GPU, cisolver.distributed.device_sum; every rank then factors the same sum)."""
    import cupy
    k = s.shape[1]
    q = k - b
    if not fits(s, b) or hs.shape[0] != s.shape[0] or hs.shape[1] < b + n_p or not 0 <= n_p <= q:
        raise ValueError(f"gpu_ortho.first_pass: s {s.shape}, hs {hs.shape}, b={b}, n_p={n_p} not covered")
    y = device_sum(_cross_products(s, b, context), comm)
    m = cupy.empty((k, q), dtype=s.dtype)
    m_hp = cupy.empty((b + n_p, n_p), dtype=s.dtype)
    flag = cupy.empty(1, dtype=np.int32)
    eps = float(np.finfo(s.dtype).eps)
    item = y.itemsize
    _kernel(cupy, s.dtype)((1,), (cuda_modules.small_factor_threads(THREADS),), (
        y, np.int64(y.strides[0] // item), np.int64(y.strides[1] // item), np.int32(b), np.int32(q),
        np.int32(n_p), np.float64(0.5 * eps), np.float64(dense.CANCELLATION), np.float64(dense.SINGLE_PASS_LOSS),
        np.float64(np.finfo(np.float64).eps ** 0.5 * 1e-2), m, m_hp, flag))
    blocks.replace_with_product(s[:, b:], s, m)
    if n_p:
        blocks.replace_with_product(hs[:, b:b + n_p], hs[:, :b + n_p], m_hp)
    return flag
