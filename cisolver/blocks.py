"""Tall blocks times small coefficient matrices, written into column ranges of LOBPCG's buffers.

LOBPCG keeps X, P, W (and H X, H P, H W) as column ranges of one row-major n x 3b buffer, so every update
is a tall block of that buffer times a small float64 host matrix:

    product_into(out, a, m)       out <- a m            (out must not overlap a)
    subtract_product(out, a, m)   out <- out - a m      (out and a disjoint column ranges)
    replace_with_product(v, a, m) v <- a m              (v may be a column range of a: same rows)
    tail_update(s, b, c, u)       s[:, b:] <- s[:, :b] c + s[:, b:] u   (u upper triangular)
    update_with_residual(...)     the new X, P, H X, H P and the residual of the new X with its norms
    times_upper(v, u)             v <- v u in place      (u upper triangular)
    residual_into(r, hx, x, theta)  r <- hx - x diag(theta), and the column sums of squares of r

On a GPU each product is one launch of a row kernel (cisolver.row_kernels: a thread per row, the small
matrix in shared memory, in place where the output is a column range of the input), and LOBPCG's end of
iteration (new X, P, H X, H P, the residual and its norms) is one launch. Where that kernel does not apply
(wide outputs, other layouts) a product is one cuBLAS gemm on the caller's CuPy stream on the strided
column ranges (through cupy's matmul the same updates cost a copy of each strided operand and a copy back:
1.55 ms per iteration for the X, P update at 48Cr's size on an H200, benchmarks.cisolver solve), in place
through a scratch block and one copy back (cuBLAS's in-place trmm took 0.62 ms for a 1.96e6 x 16 float32
block).
On the CPU the same updates are BLAS calls on the strided blocks, rows split over threads
(cisolver.host_blocks); an in-place update with an upper-triangular factor is a trmm there, which costs
no scratch and no copy.
"""
import numpy as np

from hybridblas import lowlevel

from . import cuda_modules, host_blocks, row_kernels
from .arrays import FLOATS, Ready, column_sumsq, column_totals, is_device, row_major, row_stride, small_on_device



def _check(out, a, m):
    if a.shape[0] != out.shape[0] or m.shape != (a.shape[1], out.shape[1]):
        raise ValueError(f"{a.shape} @ {m.shape} does not fit out {out.shape}")


def product_into(out, a, m):
    """out <- a @ m; ``m`` a small host matrix (cast to the blocks' precision)."""
    _check(out, a, m)
    # out of place: cuBLAS needs no scratch block here, and is faster on long float64 blocks
    if is_device(out) and row_kernels.product(out, a, m, long_double=False):
        return out
    if not _device_product([(out, a)], m, 0.0):
        _host_product([(out, a)], m, 0.0)
    return out


def product_into_both(out0, a0, out1, a1, m):
    """out0 <- a0 @ m and out1 <- a1 @ m (LOBPCG's X, P and H X, H P updates with the same coefficients).

    On a GPU two row-kernel launches: 238 against 361 us for two cuBLAS gemms at 48Cr's size in float32 on
    an H200 (benchmarks.cisolver kernels); float64 blocks beyond row_kernels.DOUBLE_ROWS_LIMIT take the gemms
    (47V: 164 against 247 us with the residual)."""
    _check(out0, a0, m)
    _check(out1, a1, m)
    if (is_device(out0) and row_kernels.product(out0, a0, m, long_double=False)
            and row_kernels.product(out1, a1, m, long_double=False)):
        return out0, out1
    if not _device_product([(out0, a0), (out1, a1)], m, 0.0):
        _host_product([(out0, a0), (out1, a1)], m, 0.0)
    return out0, out1


def subtract_product(out, a, m):
    """out <- out - a @ m; ``out`` and ``a`` must not share elements."""
    _check(out, a, m)
    if not _device_product([(out, a)], -np.asarray(m), 1.0):
        _host_product([(out, a)], -np.asarray(m), 1.0)
    return out


def replace_with_product(v, a, m):
    """v <- a @ m, where ``v`` may share elements with ``a`` as long as each row of v is a row of a's rows
    (a column range of the same buffer): on a GPU the row kernel works in place, else the product goes to
    a scratch block first."""
    _check(v, a, m)
    if is_device(v) and row_kernels.product(v, a, m):      # in place: one thread reads, then writes, a row
        return v
    if _on_cublas(v, a):
        import cupy
        scratch = cupy.empty(v.shape, dtype=v.dtype)
        _gemm(scratch, a, m, 0.0)
        v[...] = scratch
    else:
        _host_matmul(a, m, v)
    return v


def tail_update(s, b, c, u):
    """s[:, b:] <- s[:, :b] @ c + s[:, b:] @ u in place, ``u`` upper triangular (only its upper triangle is
    read). On a GPU one row-kernel launch over all of s (replace_with_product); on the host a trmm and a
    gemm."""
    v = s[:, b:]
    q = v.shape[1]
    if u.shape != (q, q) or c.shape != (b, q):
        raise ValueError(f"tail_update of {s.shape} after {b} columns: c {c.shape}, u {u.shape}")
    if not is_device(s) and host_blocks.blas_ready(s):
        host_blocks.upper_update(v, u, s[:, :b], c)
        return s
    return replace_with_product(v, s, np.vstack([c, np.triu(u)]))


def times_upper(v, u):
    """v <- v @ u in place, ``u`` a small upper-triangular host matrix."""
    if u.shape != (v.shape[1], v.shape[1]):
        raise ValueError(f"u must be {v.shape[1]} x {v.shape[1]}, got {u.shape}")
    return tail_update(v, 0, np.zeros((0, v.shape[1])), u)


def _device_product(pairs, m, beta):
    """out <- a m + beta out for each (out, a) by cuBLAS on a GPU; False when the blocks are numpy (or cupy
    in a layout cuBLAS cannot read in place: the caller then uses the array module)."""
    if all(_on_cublas(out, a) for out, a in pairs):
        for out, a in pairs:
            _gemm(out, a, m, beta)
        return True
    return False


def residual_into(r, hx, x, theta, later=False):
    """r <- hx - x diag(theta) (theta a host vector), and the column sums of squares of r as a float64 host
    array (with ``later`` an arrays.Later of it, or a Ready on the host). On a GPU one kernel does both
    (summing in double, partial sums per thread block added on the host in a fixed order: reproducible);
    it replaced a cupy multiply, subtract, widening and product, 0.50 ms per iteration at 48Cr's size on
    an H200."""
    if not is_device(theta):                  # (a GPU block's theta may be on the GPU already)
        theta = np.asarray(theta, dtype=np.float64)
    if hx.shape != x.shape or r.shape != x.shape or theta.shape != (x.shape[1],):
        raise ValueError(f"residual of hx {hx.shape}, x {x.shape}, theta {theta.shape} into r {r.shape}")
    if not is_device(r):
        if host_blocks.blas_ready(r, hx, x):
            sums = host_blocks.residual(r, hx, x, theta)
        else:
            np.multiply(x, theta.astype(x.dtype)[None, :], out=r)
            np.subtract(hx, r, out=r)
            sums = np.einsum("ij,ij->j", r, r, dtype=np.float64)
        return Ready(sums) if later else sums
    return _residual_gpu(r, hx, x, theta, later)


def update_with_residual(x_next, s, hx_next, hs, m, r, theta, later=False, r_copy=None):
    """LOBPCG's end of iteration: x_next <- s m, hx_next <- hs m (m is k x 2b: new X and P, H X and H P),
    then r <- hx_next[:, :b] - x_next[:, :b] diag(theta), and into ``r_copy`` too when given (the next
    basis's W columns: cisolver.iterations); returns r's column sums of squares (float64, host; with
    ``later`` an arrays.Later or Ready of them, the host not waiting for the GPU).
    On a GPU one kernel does all of it (cisolver.row_kernels), elsewhere product_into_both and residual_into."""
    b = r.shape[1]
    if is_device(r):
        _check(x_next, s, m)
        _check(hx_next, hs, m)
        sums = row_kernels.update_with_residual(x_next, s, hx_next, hs, m, r, theta, later=later, r_copy=r_copy)
        if sums is not None:
            return sums
    product_into_both(x_next, s, hx_next, hs, m)
    sums = residual_into(r, hx_next[:, :b], x_next[:, :b], theta, later)
    if r_copy is not None:
        r_copy[...] = r
    return sums


def _host_product(pairs, m, beta):
    """out <- a m + beta out for each (out, a) of host blocks: BLAS on the strided blocks, rows over
    threads (host_blocks); numpy where BLAS cannot read them in place."""
    if all(host_blocks.blas_ready(out, a) and not np.shares_memory(out, a) for out, a in pairs):
        host_blocks.products(pairs, m, beta)
        return
    for out, a in pairs:
        if beta == 0:
            _host_matmul(a, m, out)
        else:
            out *= beta
            out += a @ _like(out, m)


def _host_matmul(a, m, out):
    """out <- a @ m with the array module's matmul writing into out directly (numpy: no temporary and copy
    for a strided column range, 2.0 against 2.9 ms on 24Mg's blocks on the 2-core box; it copies by itself
    where out overlaps a). Cupy blocks that cuBLAS cannot read in place land here too."""
    if is_device(out):
        out[...] = a @ _like(out, m)
    else:
        np.matmul(a, _like(out, m), out=out)


def _like(x, m):
    if is_device(x):
        import cupy
        return cupy.asarray(m, dtype=x.dtype)
    return np.asarray(m, dtype=x.dtype)


def _on_cublas(*arrays):
    return (is_device(arrays[0]) and arrays[0].dtype in FLOATS and all(x.dtype == arrays[0].dtype for x in arrays)
            and all(row_major(x) for x in arrays))


def _gemm(out, a, m, beta):
    """Row-major out (n x q) = a (n x p) m (p x q) + beta out: one cuBLAS gemm on the caller's stream, on the
    blocks as they lie (the column-major out^T = m^T a^T)."""
    if out.size:
        lowlevel.device_gemm(out, a, small_on_device(m, out.dtype), beta)


_RESIDUAL_SOURCE = r"""
// r <- hx - x theta on an n x b block (rows at leading dimensions), and per-block column sums of r^2 in
// double. Thread t keeps column t % b for every row it visits (consecutive threads read consecutive
// elements of a row); the block's threads of one column are added in a fixed order at the end.
extern "C" __global__ void residual_sumsq(const T* hx, long long ldh, const T* x, long long ldx,
        const double* theta, int b, long long n, T* r, long long ldr, double* partials)
{
    extern __shared__ double sums[];
    const int rows_per_pass = blockDim.x / b;
    const int j = threadIdx.x % b, q = threadIdx.x / b;
    double acc = 0.0;
    if (q < rows_per_pass) {
        const T th = (T) theta[j];
        const long long step = (long long) gridDim.x * rows_per_pass;
        for (long long i = (long long) blockIdx.x * rows_per_pass + q; i < n; i += step) {
            const T v = hx[i * ldh + j] - x[i * ldx + j] * th;
            r[i * ldr + j] = v;
            acc += (double) v * (double) v;
        }
    }
    sums[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < b) {
        double s = 0.0;
        for (int qq = 0; qq < rows_per_pass; ++qq) s += sums[qq * b + threadIdx.x];
        partials[(long long) blockIdx.x * b + threadIdx.x] = s;
    }
}
"""


def cuda_section(dtype):
    """This module's part of cisolver's CUDA kernels (cisolver.cuda_modules)."""
    return _RESIDUAL_SOURCE, {}, ["residual_sumsq"]


def _residual_gpu(r, hx, x, theta, later=False):
    import cupy
    from hybridblas import gpu_multiprocessors
    n, b = r.shape
    if n == 0 or b == 0:
        return Ready(np.zeros(b)) if later else np.zeros(b)
    if not (all(row_major(a) for a in (r, hx, x)) and r.dtype == hx.dtype == x.dtype and r.dtype in FLOATS
            and b <= 256):
        cupy.subtract(hx, x * cupy.asarray(theta, dtype=x.dtype)[None, :], out=r)
        return Ready(column_sumsq(r)) if later else column_sumsq(r)
    kernel = cuda_modules.function(cupy, r.dtype, "residual_sumsq")
    threads = 256 // b * b
    blocks = max(1, min(8 * gpu_multiprocessors(), -(-n // (threads // b))))
    partials = cupy.empty((blocks, b), dtype=np.float64)
    kernel((blocks,), (threads,),
                           (hx, np.int64(row_stride(hx)), x, np.int64(row_stride(x)),
                            cupy.asarray(theta, dtype=np.float64), np.int32(b), np.int64(n), r,
                            np.int64(row_stride(r)), partials),
                           shared_mem=8 * threads)
    return column_totals(partials, later)
