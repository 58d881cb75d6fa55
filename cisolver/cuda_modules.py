"""CUDA sources shared by cisolver's GPU kernels, and their compilation once per (device, dtype, source).

SMALL_FACTOR holds the device functions of the one-block kernels (cisolver.gpu_ortho, gpu_rayleigh_ritz)
that factor a small q x q matrix in shared memory: the in-place upper Cholesky factor, its test for a
numerically singular factor, and the triangular inverse. Every thread of the block must call them, with at
least q threads. cholesky_upper synchronises the block before it returns; flag_singular and inverse_upper do
not: the caller synchronises before another thread reads *bad or the inverse.
"""
import numpy as np

_CTYPES = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}

SMALL_FACTOR = r"""
// a (q x q, row-major, shared) <- its upper Cholesky factor R in place (row c holds R[c, c:]; the strictly
// lower part is left as it was). A non-positive or non-finite pivot sets ``bit`` in *bad (and takes 1).
__device__ void cholesky_upper(double* a, int q, int* bad, int bit)
{
    const int t = threadIdx.x, nt = blockDim.x;
    for (int c = 0; c < q; ++c) {
        if (t == 0) {
            const double p = a[c * q + c];
            const bool ok = p > 0.0 && isfinite(p);
            if (!ok) atomicOr(bad, bit);
            a[c * q + c] = ok ? sqrt(p) : 1.0;
        }
        __syncthreads();
        if (t > c && t < q) a[c * q + t] /= a[c * q + c];
        __syncthreads();
        for (int e = t; e < q * q; e += nt) {
            const int i = e / q, j = e % q;
            if (i > c && j >= i) a[e] -= a[c * q + i] * a[c * q + j];
        }
        __syncthreads();
    }
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

// ri (q x q, row-major) <- R^{-1} of the upper triangle of a: thread j < q back-substitutes column j
__device__ void inverse_upper(const double* a, double* ri, int q)
{
    const int j = threadIdx.x;
    if (j < q) {
        for (int i = 0; i < q; ++i) ri[i * q + j] = 0.0;
        ri[j * q + j] = 1.0 / a[j * q + j];
        for (int i = j - 1; i >= 0; --i) {
            double s = 0.0;
            for (int l = i + 1; l <= j; ++l) s += a[i * q + l] * ri[l * q + j];
            ri[i * q + j] = -s / a[i * q + i];
        }
    }
}
"""

_compiled = {}


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
