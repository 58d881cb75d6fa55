"""LOBPCG's small Rayleigh-Ritz problem and next search directions on the GPU, with no host trip.

dense.rayleigh_ritz and dense.next_p_coefficients take the two Gram matrices to the host, factor them
there and send the update's coefficients back; the GPU waits for the host meanwhile (0.5-0.7 ms per
iteration at 47V's and 48Cr's sizes on an H200). Here the same steps run where the Grams are, in double:

    prepare: the Grams mirrored, S^T S Jacobi-scaled and factored (Cholesky), R^{-1},
        A = R^{-T} (S^T H S, scaled) R^{-1}
    A's eigenpairs
    finish: C = D R^{-1} Y[:, :b], the next P's coefficients Z (dense.next_p_coefficients), [C Z] in the
        blocks' precision for the update kernel, theta, and a small summary for the host

Two routes (``EIGENSOLVER``):
- "jacobi": all three in one thread block, A's eigenpairs by the parallel cyclic Jacobi method with
  one barrier per round (rr_solve). A one-block Jacobi kernel tried in session 10 took 228 us for a
  24 x 24 A on an H200: its rounds waited on one warp's chain of divisions and square roots and on three
  barriers; here every thread works out the two rotations it needs itself and A is double-buffered.
- "cusolver" (default): prepare and finish kernels around cuSOLVER's batched Jacobi eigensolver (syevjBatched on a
  batch of one, called directly: through cupy.linalg.eigh it cost 60-100 us of host time per call), which
  took 117 us on LOBPCG's own 24 x 24 matrices (benchmarks/bench_small_eigh.py).

The host reads the summary (theta, the largest |Ritz value|, which P columns are usable, and whether S^T S
was positive definite and the eigensolver converged) while the GPU runs the update. Where the host path
would raise NotPositiveDefinite the summary says so and the caller takes the host path from the same,
untouched S and H S.
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
EIG_RESIDUAL = 1e-10   # |A y - w y| / max |w| of an eigenpair beyond which cuSOLVER's eigensolve is taken as failed
THREADS = 256
SOLVE_THREADS = KMAX * KMAX // 2      # rr_solve: a thread per (row, pair of columns) of A
EIGENSOLVER = "cusolver"              # or "jacobi": slower (s12 run1: 215 against 178 us for the whole step)
MAX_SWEEPS = 30                       # rr_solve's Jacobi sweeps before it says it did not converge (6-7 on LOBPCG's)

_SOURCE = r"""
// ---- steps shared by the two routes (every thread of the block calls them)

// Loads the two Grams (at least their lower triangles, in double: element (i, j) of Gram p at
// both[i * s0 + j * s1 + p * s2], p = 0: S^T H S, p = 1: S^T S) and factors: o <- S^T S mirrored,
// dd <- D = diag(S^T S)^{-1/2}, g <- D (S^T H S) D, ri <- R^{-1} of the Cholesky factor R of D S^T S D (r holds
// R). Sets bit 1 of *bad where S^T S is not positive definite (or not finite). Synchronises before it returns.
__device__ void rr_factor(const double* both, long long s0, long long s1, long long s2, int k,
        double singular_ratio, double* g, double* r, double* ri, double* o, double* dd, int* bad)
{
    const int t = threadIdx.x, nt = blockDim.x;
    for (int e = t; e < k * k; e += nt) {
        const int i = e / k, j = e % k, lo = i >= j ? i : j, hi = i >= j ? j : i;
        g[e] = (double) both[lo * s0 + hi * s1];
        r[e] = (double) both[lo * s0 + hi * s1 + s2];
        o[e] = r[e];
    }
    __syncthreads();
    if (t < k) {
        const double v = r[t * k + t];
        if (!(v > 0.0) || !isfinite(v)) atomicOr(bad, 1);
        dd[t] = v > 0.0 && isfinite(v) ? 1.0 / sqrt(v) : 1.0;
    }
    __syncthreads();
    for (int e = t; e < k * k; e += nt) {
        const int i = e / k, j = e % k;
        const double sc = dd[i] * dd[j];
        r[e] *= sc;
        g[e] *= sc;
        if (!isfinite(r[e]) || !isfinite(g[e])) atomicOr(bad, 1);
    }
    __syncthreads();
    cholesky_upper(r, k, bad, 1);
    flag_singular(r, k, singular_ratio, bad, 1);
    inverse_upper(r, ri, k);
    __syncthreads();
}

// a (k x k, element (i, j) at a[i * lda + j]) <- R^{-T} g R^{-1}, symmetrised; gr (k x k) is scratch. Synchronises
// before it returns.
__device__ void rr_reduce(const double* g, const double* ri, double* gr, double* a, int lda, int k)
{
    const int t = threadIdx.x, nt = blockDim.x;
    for (int e = t; e < k * k; e += nt) {                     // gr <- g R^{-1}
        const int i = e / k, j = e % k;
        double s = 0.0;
        for (int l = 0; l <= j; ++l) s += g[i * k + l] * ri[l * k + j];
        gr[e] = s;
    }
    __syncthreads();
    for (int e = t; e < k * k; e += nt) {                     // A = R^{-T} (g R^{-1}), symmetrised
        const int i = e / k, j = e % k;
        double s1 = 0.0, s2 = 0.0;
        for (int l = 0; l <= i; ++l) s1 += ri[l * k + i] * gr[l * k + j];
        for (int l = 0; l <= j; ++l) s2 += ri[l * k + j] * gr[l * k + i];
        a[i * lda + j] = 0.5 * (s1 + s2);
    }
    __syncthreads();
}

// From A's eigenpairs (eigenvalue j: w[perm[j]], its eigenvector column perm[j] of v, element (l, i) at
// v[l * v0 + i * v1]; perm NULL: the identity, w ascending): C = D R^{-1} Y[:, :b], the next P's coefficients Z
// (dense.next_p_coefficients), m (k x 2b, row-major, T) = [C Z] (zero where bad != 0), theta (b) and
// info = [theta (b), max |w|, usable (b), bad]. c, z, oz, tt: k x b scratch each (oz and tt may alias v and rinv:
// they are written only after both are read); before, after: k each.
__device__ void rr_coefficients(const double* w, const double* v, long long v0, long long v1, const int* perm,
        const double* rinv, const double* o, const double* d, int k, int b, int bad,
        double* c, double* z, double* oz, double* tt, double* before, double* after, T* m, double* theta, double* info)
{
    const int t = threadIdx.x, nt = blockDim.x;
    for (int e = t; e < k * b; e += nt) {                     // C = D R^{-1} Y[:, :b]
        const int l = e / b, j = e % b, col = perm ? perm[j] : j;
        double s = 0.0;
        for (int q = l; q < k; ++q) s += rinv[l * k + q] * v[q * v0 + col * v1];
        c[e] = d[l] * s;
        z[e] = l < b ? 0.0 : c[e];
    }
    __syncthreads();
    for (int pass = 0; pass < 2; ++pass) {
        for (int e = t; e < k * b; e += nt) {                 // O Z
            const int l = e / b, j = e % b;
            double s = 0.0;
            for (int q = 0; q < k; ++q) s += o[l * k + q] * z[q * b + j];
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
    const bool ok = bad == 0;
    for (int e = t; e < k * b; e += nt) {
        const int l = e / b, j = e % b;
        const bool usable = after[j] > 1e3 * EPS64 * fmax(before[j], TINY64);
        m[l * 2 * b + j] = (T) (ok ? c[e] : 0.0);
        m[l * 2 * b + b + j] = (T) (ok && usable ? z[e] / after[j] : 0.0);
    }
    if (t < b) {
        const double wt = w[perm ? perm[t] : t];
        theta[t] = wt;
        info[t] = wt;
        info[b + 1 + t] = after[t] > 1e3 * EPS64 * fmax(before[t], TINY64) ? 1.0 : 0.0;
    }
    if (t == 0) {
        double big = 0.0;
        for (int i = 0; i < k; ++i) big = fmax(big, fabs(w[i]));
        info[b] = big;
        info[2 * b + 1] = (double) bad;
    }
}

// ---- the cuSOLVER route: rr_prepare, syevjBatched, rr_finish

// Writes a (k x k, for the eigensolver) and a copy a0, rinv, o (S^T S mirrored), d.
extern "C" __global__ void rr_prepare(const double* both, long long s0, long long s1, long long s2, int k,
        double singular_ratio, double* a, double* a0, double* rinv, double* o, double* d, int* flag)
{
    __shared__ double g[KMAX * KMAX], r[KMAX * KMAX], ri[KMAX * KMAX], so[KMAX * KMAX];
    __shared__ double dd[KMAX];
    __shared__ int bad;
    const int t = threadIdx.x, nt = blockDim.x;
    if (t == 0) bad = 0;
    __syncthreads();
    rr_factor(both, s0, s1, s2, k, singular_ratio, g, r, ri, so, dd, &bad);
    rr_reduce(g, ri, r, a, k, k);                             // r (R) is no longer needed: the scratch
    for (int e = t; e < k * k; e += nt) {
        a0[e] = a[e];                                          // kept: the eigensolver overwrites a
        rinv[e] = ri[e];
        o[e] = so[e];
    }
    if (t < k) d[t] = dd[t];
    if (t == 0) flag[0] = bad;
}

// w: ascending eigenvalues; eigenvector i is column i of v (element (l, i) at v[l * v0 + i * v1]) of a0;
// eig_info: the eigensolver's status (0: converged). A residual |a0 y - w y| above EIG_RESIDUAL max |w|, or a
// nonzero status, sends the step to the host path (flag bit 2).
extern "C" __global__ void rr_finish(const double* w, const double* v, long long v0, long long v1,
        const double* a0, const double* rinv, const double* o, const double* d, const int* flag, const int* eig_info,
        int k, int b, T* m, double* theta, double* info)
{
    __shared__ double c[KMAX * KMAX], z[KMAX * KMAX], oz[KMAX * KMAX], tt[KMAX * KMAX];
    __shared__ double before[KMAX], after[KMAX];
    __shared__ int unsolved;
    const int t = threadIdx.x, nt = blockDim.x;
    if (t == 0) unsolved = eig_info[0] != 0;
    __syncthreads();
    double scale = TINY64;                                     // max |w|
    for (int i = 0; i < k; ++i) scale = fmax(scale, fabs(w[i]));
    for (int e = t; e < k * k; e += nt) {                     // every eigenpair's residual: cuSOLVER's batched
        const int l = e / k, i = e % k;                        // syevj reports 0 also when its sweeps ran out
        double s = -w[i] * v[l * v0 + i * v1];
        for (int q = 0; q < k; ++q) s += a0[l * k + q] * v[q * v0 + i * v1];
        if (!(fabs(s) <= EIG_RESIDUAL * scale)) unsolved = 1;
    }
    __syncthreads();
    const int bad = flag[0] | (unsolved ? 2 : 0);               // 2: the eigensolver did not converge
    rr_coefficients(w, v, v0, v1, (const int*) 0, rinv, o, d, k, b, bad, c, z, oz, tt, before, after, m, theta, info);
    if (t == 0) info[2 * b + 2] = 0.0;                        // no rounds of its own
}

// ---- the Jacobi route: the whole step in one block

// The rotation of the pair (p, q), p < q, that zeroes a[p][q] of the symmetric a (row stride lda): [c s; -s c],
// t = s / c (Golub & Van Loan's sym.schur2, written without tau so that a tiny a[p][q] cannot overflow).
__device__ __forceinline__ void jacobi_rotation(const double* a, int lda, int p, int q, double* c, double* s, double* t)
{
    const double apq = a[p * lda + q];
    if (apq == 0.0) { *c = 1.0; *s = 0.0; *t = 0.0; return; }
    const double d = a[q * lda + q] - a[p * lda + p];
    const double h = sqrt(d * d + 4.0 * apq * apq);
    const double tv = (d >= 0.0 ? 2.0 : -2.0) * apq / (fabs(d) + h);
    const double cv = rsqrt(1.0 + tv * tv);
    *c = cv;
    *s = tv * cv;
    *t = tv;
}

// Round r (0 .. m - 2) of the round-robin ordering of m (even) indices: its pair i (0 .. m/2 - 1) as p < q.
// Over the m - 1 rounds every pair meets once, and the pairs of a round are disjoint.
__device__ __forceinline__ void jacobi_pair(int r, int i, int m, int* p, int* q)
{
    int x = r, y = m - 1;
    if (i > 0) { x = (r + i) % (m - 1); y = (r - i + m - 1) % (m - 1); }
    *p = x < y ? x : y;
    *q = x < y ? y : x;
}

// One thread block of at least m * m / 2 threads (m: k rounded up to even; k <= KMAX): rr_prepare's steps, the
// eigenpairs of A by the parallel cyclic Jacobi method (every round rotates m/2 disjoint pairs at once; each
// thread works out the rotations it needs itself, A is double-buffered, so a round costs one barrier), then
// rr_finish's. Stops after the first round whose result has every off-diagonal element at most
// 4 eps ||A||_F; after max_sweeps sweeps without that, flag bit 2 (the eigensolver did not converge).
// info[2b + 2] <- the rounds taken.
extern "C" __global__ void rr_solve(const double* both, long long s0, long long s1, long long s2, int k, int b,
        double singular_ratio, int max_sweeps, T* m_out, double* theta, double* info)
{
    __shared__ double buf[5][KMAX * KMAX];
    __shared__ double dd[KMAX], w[KMAX], before[KMAX], after[KMAX], part[32];
    __shared__ int perm[KMAX];
    __shared__ int bad, off_big[3];
    const int t = threadIdx.x, nt = blockDim.x, m = k + (k & 1), P = m / 2;
    if (t == 0) { bad = 0; off_big[0] = off_big[1] = off_big[2] = 0; }
    __syncthreads();
    double* v = buf[0];                     // g until A is formed, then the eigenvectors
    double* ri = buf[2];
    double* o = buf[3];
    rr_factor(both, s0, s1, s2, k, singular_ratio, buf[0], buf[1], ri, o, dd, &bad);
    double* a = buf[1];                     // R until here
    double* an = buf[4];
    rr_reduce(buf[0], ri, an, a, m, k);
    for (int e = t; e < m * m; e += nt) {   // V = I; A's padding row and column (odd k) are zero
        const int i = e / m, j = e % m;
        v[e] = i == j ? 1.0 : 0.0;
        if (i >= k || j >= k) a[e] = 0.0;
    }
    double fro = 0.0;                       // ||A||_F: a fixed order of sums (every rank of a run gets the same bits)
    for (int e = t; e < k * k; e += nt) fro += a[(e / k) * m + e % k] * a[(e / k) * m + e % k];
    for (int off = 16; off > 0; off >>= 1) fro += __shfl_down_sync(0xffffffffu, fro, off);
    if ((t & 31) == 0) part[t >> 5] = fro;
    __syncthreads();
    if (t == 0) {
        double s = 0.0;
        for (int i = 0; i < (nt + 31) / 32; ++i) s += part[i];
        part[0] = s;
    }
    __syncthreads();
    const double thr = 4.0 * EPS64 * sqrt(part[0]);
    int rounds = 0;
    bool done = bad != 0;                   // nothing to solve: the host path takes the step
    for (int sweep = 0; sweep < max_sweeps && !done; ++sweep) {
        for (int r = 0; r < m - 1; ++r) {
            const int slot = rounds % 3;
            if (t == 0) off_big[(rounds + 1) % 3] = 0;     // the next round's flag: last read two barriers ago
            if (t < m * P) {
                const int cp = t % P, row = t / P;
                int pc, qc;
                jacobi_pair(r, cp, m, &pc, &qc);
                double cc, sc, tc;
                jacobi_rotation(a, m, pc, qc, &cc, &sc, &tc);
                if (row < P && row <= cp) {                // A's 2 x 2 block of pairs (row, cp) and its mirror
                    int pr, qr;
                    jacobi_pair(r, row, m, &pr, &qr);
                    if (row == cp) {
                        const double apq = a[pr * m + qr];
                        an[pr * m + pr] = a[pr * m + pr] - tc * apq;
                        an[qr * m + qr] = a[qr * m + qr] + tc * apq;
                        an[pr * m + qr] = 0.0;
                        an[qr * m + pr] = 0.0;
                    } else {
                        double cr, sr, tr;
                        jacobi_rotation(a, m, pr, qr, &cr, &sr, &tr);
                        const double b00 = a[pr * m + pc], b01 = a[pr * m + qc], b10 = a[qr * m + pc], b11 = a[qr * m + qc];
                        const double x00 = cr * b00 - sr * b10, x01 = cr * b01 - sr * b11;
                        const double x10 = sr * b00 + cr * b10, x11 = sr * b01 + cr * b11;
                        const double y00 = cc * x00 - sc * x01, y01 = sc * x00 + cc * x01;
                        const double y10 = cc * x10 - sc * x11, y11 = sc * x10 + cc * x11;
                        an[pr * m + pc] = y00; an[pc * m + pr] = y00;
                        an[pr * m + qc] = y01; an[qc * m + pr] = y01;
                        an[qr * m + pc] = y10; an[pc * m + qr] = y10;
                        an[qr * m + qc] = y11; an[qc * m + qr] = y11;
                        if (fmax(fmax(fabs(y00), fabs(y01)), fmax(fabs(y10), fabs(y11))) > thr) off_big[slot] = 1;
                    }
                }
                if (row < k) {                             // V <- V J: this row's two columns of the pair
                    const double vp = v[row * m + pc], vq = v[row * m + qc];
                    v[row * m + pc] = cc * vp - sc * vq;
                    v[row * m + qc] = sc * vp + cc * vq;
                }
            }
            __syncthreads();
            double* swap = a; a = an; an = swap;
            ++rounds;
            if (!off_big[slot]) { done = true; break; }    // every thread reads the same flag: all stop here
        }
    }
    const bool converged = bad != 0 || !off_big[(rounds + 2) % 3];
    if (t < k) w[t] = a[t * m + t];
    __syncthreads();
    if (t < k) {                                           // ascending order, ties by index
        int rank = 0;
        for (int j = 0; j < k; ++j) rank += w[j] < w[t] || (w[j] == w[t] && j < t);
        perm[rank] = t;
    }
    __syncthreads();
    const int flag = bad | (converged ? 0 : 2);
    rr_coefficients(w, v, m, 1, perm, ri, o, dd, k, b, flag, a, an, v, ri, before, after, m_out, theta, info);
    if (t == 0) info[2 * b + 2] = (double) rounds;
}
"""


def fits(s, b):
    """The kernels cover these blocks: GPU, float32/float64, at most KMAX columns in S."""
    return is_device(s) and s.dtype in (np.float32, np.float64) and 0 < b and s.shape[1] <= KMAX


def _module(cupy, dtype):
    defines = {"KMAX": KMAX, "EPS64": repr(float(np.finfo(np.float64).eps)),
               "TINY64": repr(float(np.finfo(np.float64).tiny)), "EIG_RESIDUAL": repr(EIG_RESIDUAL)}
    return cuda_modules.module(cupy, dtype, cuda_modules.SMALL_FACTOR + _SOURCE, defines)


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
    if dev not in _syevj_params:
        _syevj_params[dev] = (cusolver.createSyevjInfo(), {})
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

    def rounds(self):
        """The Jacobi rounds rr_solve took (0 on the cuSOLVER route); waits for the step."""
        return int(self._info.result()[2 * self._b + 2])


def queue(both, b, dtype, eigensolver=None):
    """Queue Rayleigh-Ritz on the Gram buffer ``both`` ((k, k, 2), at least the lower triangles of S^T H S
    and S^T S: cisolver.gpu_grams.grams, or dense.gram_buffer) for the ``b`` lowest pairs, [C Z] in ``dtype``.
    eigensolver: "jacobi" or "cusolver" (default ``EIGENSOLVER``)."""
    import cupy
    k = both.shape[0]
    eigensolver = eigensolver or EIGENSOLVER
    if (both.shape != (k, k, 2) or not 0 < b <= k <= KMAX or np.dtype(dtype) not in (np.float32, np.float64)
            or both.dtype not in (np.float32, np.float64)):
        raise ValueError(f"gpu_rayleigh_ritz.queue: Grams {both.shape} {both.dtype} with b={b}, {np.dtype(dtype)} "
                         f"not covered")
    if eigensolver not in ("jacobi", "cusolver"):
        raise ValueError(f"eigensolver must be 'jacobi' or 'cusolver', got {eigensolver!r}")
    both = both.astype(np.float64, copy=False)
    mod = _module(cupy, dtype)
    item = both.itemsize
    strides = tuple(np.int64(st // item) for st in both.strides)
    m = cupy.empty((k, 2 * b), dtype=dtype)
    theta = cupy.empty(b, dtype=np.float64)
    info = cupy.empty(2 * b + 3, dtype=np.float64)
    if eigensolver == "jacobi":
        mod.get_function("rr_solve")((1,), (SOLVE_THREADS,), (
            both, *strides, np.int32(k), np.int32(b), np.float64(SINGULAR_RATIO), np.int32(MAX_SWEEPS), m, theta, info))
        return Queued(m, theta, Later(info), b)
    a, a0, rinv, o = (cupy.empty((k, k), dtype=np.float64) for _ in range(4))
    d, w = cupy.empty(k, dtype=np.float64), cupy.empty(k, dtype=np.float64)
    flag, eig_info = cupy.empty(1, dtype=np.int32), cupy.empty(1, dtype=np.int32)
    mod.get_function("rr_prepare")((1,), (THREADS,), (
        both, *strides, np.int32(k), np.float64(SINGULAR_RATIO), a, a0, rinv, o, d, flag))
    _eigh_in_place(cupy, a, w, eig_info)
    mod.get_function("rr_finish")((1,), (THREADS,), (
        w, a, np.int64(1), np.int64(k), a0, rinv, o, d, flag, eig_info, np.int32(k), np.int32(b), m, theta, info))
    return Queued(m, theta, Later(info), b)
