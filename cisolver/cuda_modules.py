"""CUDA sources shared by cisolver's GPU kernels, and their compilation once per (device, dtype, source).

SMALL_FACTOR holds the device functions of the one-block kernels (cisolver.gpu_ortho, gpu_rayleigh_ritz)
that factor a small q x q matrix (q <= 32) in shared memory: the in-place upper Cholesky factor, its test
for a numerically singular factor, and the triangular inverse. Every thread of the block must call them, the
block a multiple of 32 threads. cholesky_upper synchronises the block before it returns; flag_singular and
inverse_upper do not: the caller synchronises before another thread reads *bad or the inverse.
"""
import numpy as np

_CTYPES = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}

SMALL_FACTOR = r"""
// Thread t works on the elements (i, j) of a q x q matrix with j = t % 32 and i = t / 32, t / 32 + nt / 32, ...
// (q <= 32, nt a multiple of 32): no integer division, and one barrier a step in the eliminations below.

// a (q x q, row-major, shared) <- its upper Cholesky factor R in place (row c holds R[c, c:]; the strictly
// lower part is left as it was). Right-looking: step c takes the unscaled row c (final after step c - 1) and
// updates the rows below it, one barrier a step; the rows are scaled at the end. A non-positive or non-finite
// pivot sets ``bit`` in *bad (and takes 1). piv: shared scratch of q doubles.
__device__ void cholesky_upper(double* a, int q, int* bad, int bit, double* piv)
{
    const int t = threadIdx.x, nt = blockDim.x, j = t & 31;
    for (int c = 0; c < q; ++c) {
        const double p = a[c * q + c];
        const bool ok = p > 0.0 && isfinite(p);
        const double inv = ok ? 1.0 / p : 1.0;
        if (t == 0) {
            if (!ok) atomicOr(bad, bit);
            piv[c] = ok ? p : 1.0;
        }
        if (j > c && j < q) {
            const double acj = a[c * q + j] * inv;
            for (int i = (t >> 5); i <= j; i += nt >> 5)
                if (i > c) a[i * q + j] -= a[c * q + i] * acj;
        }
        __syncthreads();
    }
    for (int i = t >> 5; i < q; i += nt >> 5) {
        const double r = sqrt(piv[i]);
        if (j >= i && j < q) a[i * q + j] = j == i ? r : a[i * q + j] / r;
    }
    __syncthreads();
}

// sets ``bit`` in *bad when R's diagonal entries are more than 1 / ratio apart (as dense.cholesky_upper)
__device__ void flag_singular(const double* a, int q, double ratio, int* bad, int bit)
{
    if (threadIdx.x == 0) {
        double lo = fabs(a[0]), hi = fabs(a[0]);
        for (int c = 1; c < q; ++c) { lo = fmin(lo, fabs(a[c * q + c])); hi = fmax(hi, fabs(a[c * q + c])); }
        if (!(lo > ratio * hi)) atomicOr(bad, bit);
    }
}

// ri (q x q, row-major, shared) <- R^{-1} of the upper triangle of a (zero below the diagonal): R X = I solved
// from the last row up, step c taking row c of the right-hand side (final after step c + 1) off the rows above
// it, one barrier a step; the rows are scaled by 1 / R[c, c] at the end. rd: shared scratch of q doubles.
__device__ void inverse_upper(const double* a, double* ri, int q, double* rd)
{
    const int t = threadIdx.x, nt = blockDim.x, j = t & 31;
    if (t < q) rd[t] = 1.0 / a[t * q + t];
    for (int i = t >> 5; i < q; i += nt >> 5)
        if (j < q) ri[i * q + j] = i == j ? 1.0 : 0.0;
    __syncthreads();
    for (int c = q - 1; c > 0; --c) {
        if (j >= c && j < q) {
            const double xcj = ri[c * q + j] * rd[c];
            for (int i = t >> 5; i < c; i += nt >> 5) ri[i * q + j] -= a[i * q + c] * xcj;
        }
        __syncthreads();
    }
    for (int i = t >> 5; i < q; i += nt >> 5)
        if (j >= i && j < q) ri[i * q + j] *= rd[i];
}
"""

_compiled = {}


def small_factor_threads(threads):
    """``threads`` for a kernel that calls SMALL_FACTOR's functions: a positive multiple of 32 (their row loops
    step by threads / 32; fewer would loop for ever, a remainder would share elements)."""
    if threads < 32 or threads % 32:
        raise ValueError(f"one-block kernels need a positive multiple of 32 threads, got {threads}")
    return threads


def module(cupy, dtype, source, defines=None, name_expressions=None):
    """``source`` compiled for the current device with T (and VT, its 16-byte vector) typedef'd to ``dtype``
    and ``defines`` (name -> value) as macros; cached."""
    dtype = np.dtype(dtype)
    head = "typedef {} T;\ntypedef {} VT;\n".format(*_CTYPES[dtype])
    head += "".join(f"#define {name} {value}\n" for name, value in (defines or {}).items())
    key = (cupy.cuda.Device().id, head, source, tuple(name_expressions or ()))
    if key not in _compiled:
        options = ("--std=c++14",) if name_expressions else ()
        _compiled[key] = cupy.RawModule(code=head + source, options=options, name_expressions=name_expressions)
    return _compiled[key]
