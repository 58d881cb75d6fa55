"""The small symmetric eigenproblem of LOBPCG's Rayleigh-Ritz step (k x k, k <= 32) in one warp on a GPU.

cuSOLVER's syevjBatched took ~129 us of GPU time for LOBPCG's 24 x 24 matrices on an H200 (8 sweeps), the
largest single kernel of an iteration's dense steps at 47V's size on two GPUs (session 12). Two one-block
Jacobi kernels with the matrix in shared memory were slower still (1-1.3 us a round: barriers, and chains
of divisions and square roots behind them; cisolver.gpu_rayleigh_ritz's docstring).

Here one warp runs the parallel cyclic Jacobi method with everything in registers: lane i holds row i of A
and row i of the eigenvector matrix V; N = k rounded up to even (a zero row and column pad an odd k, and
are never rotated). Each round rotates the N/2 disjoint pairs of positions (0, 1), (2, 3), ... at once
(A <- J^T A J, V <- V J): the row rotations exchange rows between partner lanes (one shuffle per element),
the column rotations are register-local once each pair's (c, s) is broadcast. Then every position moves
one step round Brent and Luk's circle (position 0 fixed; rows between lanes by shuffles, columns between
registers by a fixed, compile-time permutation), so that N - 1 rounds pair every two positions once (a
sweep) and the register indices stay static. No barrier, no shared memory.

The rotation zeroing A[p, q] is Golub and Van Loan's sym.schur2 (the smaller angle), with A[p, p], A[q, q]
and A[p, q] set to their exact values. A sweep starts only while off(A) > tol ||A||_F (off: the Frobenius
norm of the off-diagonal part), as cuSOLVER's syevj stops. LOBPCG's own 24 x 24 matrices need 6-7 sweeps
(numpy emulation of this scheme: eigenvalues within 1.1e-14 of LAPACK's relative to the largest).
"""
import numpy as np

from . import cuda_modules

KMAX = 32
TOLERANCE = 4 * float(np.finfo(np.float64).eps)     # off(A) <= TOLERANCE ||A||_F ends the sweeps
MAX_SWEEPS = 20        # then info = 1 (the caller's residual check sends the step to its host path)

_SOURCE = r"""
// The position whose element moves to position j in a round (N even): t_m = 2m, b_m = 2m + 1; t_0 stays,
// t_m -> t_{m+1}, t_{M-1} -> b_{M-1}, b_m -> b_{m-1}, b_0 -> t_1 (M = N / 2). Lanes j >= N keep theirs.
__host__ __device__ constexpr int circle_source(int j, int n)
{
    return j >= n || j == 0 || n == 2 ? j
         : j == 2 ? 1
         : j % 2 == 0 ? j - 2
         : j == n - 1 ? n - 2
         : j + 2;
}

__device__ __forceinline__ double warp_sum(double x)
{
    #pragma unroll
    for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// a (k x k, column-major, its lower triangle read) <- its eigenvectors (eigenvector i is row i of a as a C
// array, i.e. column i of the column-major matrix), w <- the eigenvalues ascending, info <- 0 when converged
// (1: MAX_SWEEPS ran out or a non-finite entry). One warp of 32 threads; N = k or k + 1, even.
template <int N>
__global__ void __launch_bounds__(32) warp_jacobi(double* a, double* w, int* info, int k, double tol, int max_sweeps)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x;
    double r[N], v[N];
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        const int hi = lane > j ? lane : j, lo = lane > j ? j : lane;
        r[j] = lane < k && j < k ? a[lo * k + hi] : 0.0;
        v[j] = lane == j ? 1.0 : 0.0;
    }
    // this lane's diagonal and partner columns as bit masks that the optimiser cannot see through: given
    // ``j == lane`` tests over unrolled j it indexes r by lane instead, which moves r to local memory
    unsigned me, partner;
    asm("mov.b32 %0, %1;" : "=r"(me) : "r"(1u << lane));
    asm("mov.b32 %0, %1;" : "=r"(partner) : "r"(1u << (lane ^ 1)));
    int orig = lane;                                    // the row and column now at position ``lane``
    double norm2 = 0.0;
    #pragma unroll
    for (int j = 0; j < N; ++j) norm2 += r[j] * r[j];
    norm2 = warp_sum(norm2);
    bool converged = false;
    for (int sweep = 0; ; ++sweep) {
        double off2 = 0.0;
        #pragma unroll
        for (int j = 0; j < N; ++j) off2 += (me >> j) & 1u ? 0.0 : r[j] * r[j];
        off2 = warp_sum(off2);
        if (off2 <= tol * tol * norm2) { converged = true; break; }    // false for NaN: runs out, info 1
        if (sweep == max_sweeps) break;
        for (int round = 0; round < N - 1; ++round) {
            double own = 0.0, cross = 0.0;              // A[lane, lane], A[lane, lane ^ 1]
            #pragma unroll
            for (int j = 0; j < N; ++j) {
                own = (me >> j) & 1u ? r[j] : own;
                cross = (partner >> j) & 1u ? r[j] : cross;
            }
            // both lanes of a pair take the even lane's A[p, q] and the same diagonal: identical (c, s)
            const double apq = __shfl_sync(full, cross, lane & ~1);
            const double other = __shfl_xor_sync(full, own, 1);
            const double app = lane & 1 ? other : own, aqq = lane & 1 ? own : other;
            double c = 1.0, s = 0.0, t = 0.0;
            if (apq != 0.0) {
                const double tau = (aqq - app) / (2.0 * apq);
                t = (tau >= 0.0 ? 1.0 : -1.0) / (fabs(tau) + hypot(1.0, tau));
                c = 1.0 / sqrt(1.0 + t * t);
                s = t * c;
            }
            const double sg = lane & 1 ? s : -s;        // row p <- c row p - s row q, row q <- s row p + c row q
            #pragma unroll
            for (int j = 0; j < N; ++j) r[j] = c * r[j] + sg * __shfl_xor_sync(full, r[j], 1);
            #pragma unroll
            for (int m = 0; m < N / 2; ++m) {           // columns p, q of A and V: the same rotation
                const double cm = __shfl_sync(full, c, 2 * m), sm = __shfl_sync(full, s, 2 * m);
                const double x = r[2 * m], y = r[2 * m + 1], vx = v[2 * m], vy = v[2 * m + 1];
                r[2 * m] = cm * x - sm * y;
                r[2 * m + 1] = sm * x + cm * y;
                v[2 * m] = cm * vx - sm * vy;
                v[2 * m + 1] = sm * vx + cm * vy;
            }
            const double diag = lane & 1 ? aqq + t * apq : app - t * apq;
            #pragma unroll
            for (int j = 0; j < N; ++j) r[j] = (me >> j) & 1u ? diag : (partner >> j) & 1u ? 0.0 : r[j];
            const int from = circle_source(lane, N);    // one step round the circle
            double moved[N], vm[N];
            #pragma unroll
            for (int j = 0; j < N; ++j) moved[j] = __shfl_sync(full, r[circle_source(j, N)], from);
            #pragma unroll
            for (int j = 0; j < N; ++j) vm[j] = v[circle_source(j, N)];
            #pragma unroll
            for (int j = 0; j < N; ++j) { r[j] = moved[j]; v[j] = vm[j]; }
            orig = __shfl_sync(full, orig, from);
        }
    }
    double d = 0.0;
    #pragma unroll
    for (int j = 0; j < N; ++j) d = (me >> j) & 1u ? r[j] : d;
    const bool real = lane < N && orig < k;             // not a padding position
    const double key = real ? d : __longlong_as_double(0x7ff0000000000000LL);    // +inf: pads last
    int rank = 0;                                       // ascending; ties by position
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        const double kj = __shfl_sync(full, key, j);
        rank += kj < key || (kj == key && j < lane);
    }
    if (real) w[rank] = d;
    #pragma unroll
    for (int j = 0; j < N; ++j) {                       // position j's eigenvector is column j of V
        const int rj = __shfl_sync(full, rank, j);
        const bool ok = __shfl_sync(full, (int) real, j);
        if (ok && lane < k) a[rj * k + lane] = v[j];
    }
    if (lane == 0) info[0] = converged ? 0 : 1;
}
"""


def _width(k):
    return k + (k & 1)


def eigh_in_place(cupy, a, w, info):
    """a (k x k float64 device array, symmetric; its lower triangle in column-major order is read) <- its
    eigenvectors (eigenvector i is a's row i as a C array), w <- the eigenvalues ascending, info[0] <- 0 when
    converged; queued on the current stream. The same contract as cuSOLVER's syevjBatched on a batch of one."""
    k = a.shape[0]
    if not (a.shape == (k, k) and 0 < k <= KMAX and a.dtype == np.float64 and a.flags.c_contiguous
            and w.shape == (k,) and w.dtype == np.float64):
        raise ValueError(f"gpu_jacobi.eigh_in_place: a {a.shape} {a.dtype}, w {w.shape} {w.dtype} not covered "
                         f"(k <= {KMAX}, float64, contiguous)")
    n = _width(k)
    name = f"warp_jacobi<{n}>"
    kernel = cuda_modules.module(cupy, np.float64, _SOURCE, name_expressions=[name]).get_function(name)
    kernel((1,), (32,), (a, w, info, np.int32(k), np.float64(TOLERANCE), np.int32(MAX_SWEEPS)))
