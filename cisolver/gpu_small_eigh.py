"""The eigenpairs of a small symmetric matrix (k <= 32, double) in one warp: LOBPCG's Rayleigh-Ritz eigensolve.

cuSOLVER's batched Jacobi solver (syevjBatched) takes about 117 us of GPU time on LOBPCG's own 24 x 24
matrices on an H200: 6-8 sweeps of 23 rounds, each round a chain of divisions and square roots. Three
Jacobi kernels of our own lost to it (cisolver.gpu_rayleigh_ritz lists them). This one does less sequential
work (Golub and Van Loan, ch. 8.3):

    Householder tridiagonalisation: the warp's lanes hold the rows, k - 2 reflections,
    the orthogonal factor Q accumulated from the reflections (lane c builds column c),
    implicit QL steps with Wilkinson's shift on the tridiagonal matrix: every lane works out the same
    chain of Givens rotations (no barrier, no shuffle inside a step) and applies it to its row of Q.

About 660 rotations on those matrices, each one reciprocal square root deep. The matrix is scaled to
max |a_ij| = 1 first, so that the squares in the rotations neither overflow nor underflow. The eigenpairs
come out in ascending order; an eigenvalue that has not converged after ``max_steps`` QL steps sets the
status to 1 (and so does a NaN, which never converges).
"""
import numpy as np

from . import cuda_modules

KMAX = 32              # one warp: a lane per row
MAX_STEPS = 30         # QL steps allowed per eigenvalue (about 1.5 are taken on average)

SOURCE = r"""
#define EIG_LD (EIG_KMAX + 1)        // shared rows padded: lane r's row r starts in another bank pair

// sum over the warp in a fixed order, the total given to every lane from lane 0: all lanes then hold the
// same bits, which the redundant QL chain below relies on
__device__ double warp_total(double v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return __shfl_sync(0xffffffffu, v, 0);
}

// One full warp. s: the k x k symmetric matrix (shared, row-major, leading dimension EIG_LD; destroyed);
// z: shared, EIG_KMAX x EIG_LD; wv: shared, EIG_KMAX. On return d (every lane's own copy) holds the
// eigenvalues of s / *scale, unsorted, and column i of z the eigenvector of d[i]. False when an eigenvalue
// took more than max_steps QL steps.
__device__ bool warp_eigh(double* s, double* z, double* wv, int k, int max_steps, double* d, double* scale)
{
    const int lane = threadIdx.x & 31;
    double e[EIG_KMAX], beta[EIG_KMAX];
    double amax = 0.0;                                         // scale to max |s_ij| = 1
    if (lane < k) for (int l = 0; l < k; ++l) amax = fmax(amax, fabs(s[lane * EIG_LD + l]));
    for (int off = 16; off > 0; off >>= 1) amax = fmax(amax, __shfl_down_sync(0xffffffffu, amax, off));
    amax = __shfl_sync(0xffffffffu, amax, 0);
    *scale = amax > 0.0 && amax <= DBL_BIG ? amax : 1.0;
    const double inv = 1.0 / *scale;
    if (lane < k) for (int l = 0; l < k; ++l) s[lane * EIG_LD + l] *= inv;
    __syncwarp();

    // Householder: H_j = I - beta_j v v^T on rows j+1..k-1 zeroes column j below the subdiagonal; v is kept
    // in row j right of the diagonal, which the later steps no longer read otherwise
    for (int j = 0; j + 2 < k; ++j) {
        const bool mine = lane > j && lane < k;
        const double x = mine ? s[j * EIG_LD + lane] : 0.0;
        const double x0 = __shfl_sync(0xffffffffu, x, j + 1);
        const double sigma = warp_total(lane > j + 1 ? x * x : 0.0);
        d[j] = s[j * EIG_LD + j];
        if (sigma == 0.0) {                                    // this column is already tridiagonal
            e[j] = x0;
            beta[j] = 0.0;
            continue;
        }
        const double norm = sqrt(x0 * x0 + sigma), alpha = x0 > 0.0 ? -norm : norm, v0 = x0 - alpha;
        const double b = 2.0 / (v0 * v0 + sigma);
        const double v = lane == j + 1 ? v0 : x;
        if (mine) s[j * EIG_LD + lane] = v;
        e[j] = alpha;
        beta[j] = b;
        __syncwarp();
        double p0 = 0.0, p1 = 0.0;                             // p = b B v, B the trailing block
        if (mine) {
            int l = j + 1;
            for (; l + 1 < k; l += 2) {
                p0 += s[lane * EIG_LD + l] * s[j * EIG_LD + l];
                p1 += s[lane * EIG_LD + l + 1] * s[j * EIG_LD + l + 1];
            }
            if (l < k) p0 += s[lane * EIG_LD + l] * s[j * EIG_LD + l];
        }
        const double p = b * (p0 + p1);
        const double w = p - 0.5 * b * warp_total(v * p) * v;  // B <- B - v w^T - w v^T
        wv[lane] = w;
        __syncwarp();
        if (mine) for (int l = j + 1; l < k; ++l) s[lane * EIG_LD + l] -= v * wv[l] + w * s[j * EIG_LD + l];
        __syncwarp();
    }
    if (k >= 2) {
        d[k - 2] = s[(k - 2) * EIG_LD + k - 2];
        e[k - 2] = s[(k - 1) * EIG_LD + k - 2];
    }
    d[k - 1] = s[(k - 1) * EIG_LD + k - 1];
    e[k - 1] = 0.0;

    // Q = H_0 H_1 ... H_{k-3}, from the last reflection back: lane c builds column c (those left of j + 1
    // are still the identity's)
    for (int r = 0; r < EIG_KMAX; ++r) z[r * EIG_LD + lane] = r == lane ? 1.0 : 0.0;
    for (int j = k - 3; j >= 0; --j) {
        if (beta[j] == 0.0 || lane <= j || lane >= k) continue;
        double t0 = 0.0, t1 = 0.0;
        int i = j + 1;
        for (; i + 1 < k; i += 2) {
            t0 += s[j * EIG_LD + i] * z[i * EIG_LD + lane];
            t1 += s[j * EIG_LD + i + 1] * z[(i + 1) * EIG_LD + lane];
        }
        if (i < k) t0 += s[j * EIG_LD + i] * z[i * EIG_LD + lane];
        const double t = beta[j] * (t0 + t1);
        for (i = j + 1; i < k; ++i) z[i * EIG_LD + lane] -= s[j * EIG_LD + i] * t;
    }
    __syncwarp();

    // implicit QL with Wilkinson's shift on (d, e), e[i] coupling i and i + 1. Every lane runs the same chain;
    // lane r rotates row r of z, carrying the new column i + 1 to the next rotation in a register
    double* zr = z + lane * EIG_LD;
    for (int l = 0; l < k; ++l) {
        int steps = 0;
        for (;;) {
            int m = l;
            for (; m + 1 < k; ++m)
                if (fabs(e[m]) <= EPS64 * (fabs(d[m]) + fabs(d[m + 1]))) break;
            if (m == l) break;
            if (++steps > max_steps) return false;
            double g = (d[l + 1] - d[l]) / (2.0 * e[l]);
            const double root = sqrt(g * g + 1.0);
            g = d[m] - d[l] + e[l] / (g + (g >= 0.0 ? root : -root));
            double sn = 1.0, cs = 1.0, p = 0.0;
            double carry = zr[m];
            int i = m - 1;
            bool deflated = false;
            for (; i >= l; --i) {
                const double f = sn * e[i], bb = cs * e[i];
                const double r2 = f * f + g * g;
                if (r2 == 0.0) {                               // e[i] vanished: the step ends here
                    e[i + 1] = 0.0;
                    d[i + 1] -= p;
                    e[m] = 0.0;
                    deflated = true;
                    break;
                }
                const double ri = rsqrt(r2);
                e[i + 1] = r2 * ri;
                sn = f * ri;
                cs = g * ri;
                g = d[i + 1] - p;
                const double t = (d[i] - g) * sn + 2.0 * cs * bb;
                p = sn * t;
                d[i + 1] = g + p;
                g = cs * t - bb;
                const double zi = zr[i];
                zr[i + 1] = sn * zi + cs * carry;
                carry = cs * zi - sn * carry;
            }
            zr[i + 1] = carry;
            if (deflated) continue;
            d[l] -= p;
            e[l] = g;
            e[m] = 0.0;
        }
    }
    return true;
}

// one warp: a (k x k, row-major, symmetric) <- its eigenvectors as rows (eigenvector i is a[i * k:(i + 1) * k],
// which is column-major as cuSOLVER leaves them), w <- the eigenvalues ascending, info <- 0, or 1 when the
// QL steps ran out (a NaN in a does that too)
extern "C" __global__ void eigh_warp(double* a, int k, int max_steps, double* w, int* info)
{
    __shared__ double s[EIG_KMAX * EIG_LD], z[EIG_KMAX * EIG_LD], wv[EIG_KMAX];
    const int lane = threadIdx.x;
    double d[EIG_KMAX], scale;
    for (int e = lane; e < k * k; e += 32) s[(e / k) * EIG_LD + e % k] = a[e];
    __syncwarp();
    const bool ok = warp_eigh(s, z, wv, k, max_steps, d, &scale);
    __syncwarp();
    if (lane < k) {                                            // ascending, ties in index order
        int rank = 0;
        for (int j = 0; j < k; ++j) rank += d[j] < d[lane] || (d[j] == d[lane] && j < lane);
        w[rank] = d[lane] * scale;
        for (int r = 0; r < k; ++r) a[rank * k + r] = z[r * EIG_LD + lane];
    }
    if (lane == 0) info[0] = ok ? 0 : 1;
}
"""


def defines():
    return {"EIG_KMAX": KMAX, "EPS64": repr(float(np.finfo(np.float64).eps)),
            "DBL_BIG": repr(float(np.finfo(np.float64).max))}


def eigh_in_place(cupy, a, w, info, max_steps=None):
    """Queue the eigendecomposition of the k x k symmetric float64 device array ``a`` (C-contiguous, k <= KMAX)
    on the current stream: a <- its eigenvectors as rows, w <- eigenvalues ascending, info[0] <- 0, or 1 when
    an eigenvalue did not converge in ``max_steps`` QL steps (MAX_STEPS by default)."""
    k = a.shape[0]
    if (a.shape != (k, k) or not 0 < k <= KMAX or a.dtype != np.float64 or not a.flags.c_contiguous
            or w.shape != (k,) or w.dtype != np.float64 or info.dtype != np.int32):
        raise ValueError(f"gpu_small_eigh: a {a.shape} {a.dtype}, w {w.shape} {w.dtype}, info {info.dtype} not "
                         f"covered (k x k float64 C-contiguous, k <= {KMAX})")
    steps = MAX_STEPS if max_steps is None else max_steps
    kernel = cuda_modules.module(cupy, np.float64, SOURCE, defines()).get_function("eigh_warp")
    kernel((1,), (32,), (a, np.int32(k), np.int32(steps), w, info))
