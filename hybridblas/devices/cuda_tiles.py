"""CUDA device functions for kernels that stage rows of tall blocks through shared memory (public as
``hybridblas.lowlevel.cuda_tile_helpers``): hybridblas's Gram kernels use them, and so may a consumer's own
kernels, so that one copy routine serves both.

The text needs ``T`` (the element type) and ``VT`` (its 16-byte vector type) typedef'd before it, and defines
``VEC`` (elements of T in 16 bytes), ``shared_address``, ``copy_rows_async`` and the group macros
``ASYNC_COMMIT()`` / ``ASYNC_WAIT(n)``.
"""

TILE_HELPERS = r"""
#define VEC ((int) (16 / sizeof(T)))      // elements of T in a 16-byte vector

// the shared-memory address of p, for cp.async
__device__ __forceinline__ unsigned shared_address(const void* p)
{
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// rows [r0, r0 + rows) of src (row stride ld; cols columns, a multiple of VEC; rows 16-byte aligned) into dst
// (row stride kp), as 16-byte asynchronous copies spread over the block's threads: consecutive threads,
// consecutive vectors. The caller commits the group (ASYNC_COMMIT) and waits for it (ASYNC_WAIT). Before
// Ampere (no cp.async) a plain copy, and the commits and waits are no-ops: correct, not overlapped.
__device__ __forceinline__ void copy_rows_async(const T* src, long long ld, long long r0, int rows, int cols, int kp,
                                                T* dst)
{
    const int per_row = cols / VEC;
    for (int e = threadIdx.x; e < rows * per_row; e += blockDim.x) {
        const int r = e / per_row, c = (e % per_row) * VEC;
#if __CUDA_ARCH__ >= 800
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(shared_address(dst + r * kp + c)),
                     "l"(src + (r0 + r) * ld + c));
#else
        *reinterpret_cast<VT*>(dst + r * kp + c) = *reinterpret_cast<const VT*>(src + (r0 + r) * ld + c);
#endif
    }
}

#if __CUDA_ARCH__ >= 800
#define ASYNC_COMMIT() asm volatile("cp.async.commit_group;")
#define ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;" :: "n"(n))
#else
#define ASYNC_COMMIT()
#define ASYNC_WAIT(n)
#endif
"""
