"""A GPU matrix, or one triangle of it, copied into a host array at the DMA rate (hybridblas.lowlevel.to_host).

A plain ``cupy.ndarray.get()`` into pageable memory runs at the speed of the driver's bounce buffers and may first
make a contiguous copy on the GPU. Here the host array's memory, when the buffer it lies in is at least
host_pinning.PIN_MIN_BYTES, is page-locked on first use and stays so while it lives (hybridblas.host_pinning); the
copy then goes by DMA straight into place. Otherwise (a small or foreign buffer, a lock that failed, or
$HYBRIDBLAS_PIN_HOST=off) it goes through a two-slot page-locked ring (cuda_transfer.download, the GPU write-back's
own pipeline): no GPU temporary, no host temporary of the matrix's size. A triangle is copied panel by panel: the
part of a panel below (above) its diagonal block by DMA straight into place, the diagonal block through the ring,
which copies its triangle only, so that nothing outside the triangle is written.
"""
from . import host_pinning
from .cuda_transfer import PinnedRing, download
from .problem import is_column_major, leading_dim

PANEL = 1024            # columns per panel of a triangle copy by DMA (its diagonal blocks go through the ring)
STAGE_BYTES = 32 << 20  # bytes of each of the ring's two page-locked slots


def to_host(dst, src, lower=None):
    """dst <- src, or its lower (``lower`` True) or upper (False) triangle with the diagonal; checked arrays
    (lowlevel.to_host). Blocks until the copy has landed, also when it is interrupted."""
    if not (is_column_major(dst) and is_column_major(src)):    # both row-major: the transposes are column-major
        dst, src, lower = dst.T, src.T, (None if lower is None else not lower)
    if dst.size == 0:
        return
    import cupy
    from .context import _pin_policy
    pin = host_pinning.acquire(dst, after_uses=0) if _pin_policy(None) is not False else None
    stream = cupy.cuda.get_current_stream()
    triangle = None if lower is None else ("lower" if lower else "upper")
    try:
        if pin is not None:
            pin.done.wait()
        if not host_pinning.is_ready(pin):
            download(dst, src, PinnedRing(STAGE_BYTES, 2), stream, triangle=triangle)
        elif triangle is None:
            download(dst, src, None, stream, direct=True)
        else:
            _triangle_by_dma(dst, src, lower, stream)
    finally:
        stream.synchronize()       # nothing in flight into dst or a slot once this returns or raises
        host_pinning.release(pin)


def _triangle_by_dma(dst, src, lower, stream):
    """dst page-locked: each column panel's part below (above) its diagonal block straight into dst, queued
    first; then the diagonal blocks through the ring, their triangles only."""
    import cupy
    rt = cupy.cuda.runtime
    item = dst.dtype.itemsize
    n = dst.shape[1]
    lds, ldd = leading_dim(src) * item, leading_dim(dst) * item
    width = min(PANEL, n)
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width)
        r0, r1 = (c1, n) if lower else (0, c0)
        if r1 > r0:
            rt.memcpy2DAsync(dst.ctypes.data + c0 * ldd + r0 * item, ldd, src.data.ptr + c0 * lds + r0 * item, lds,
                             (r1 - r0) * item, c1 - c0, rt.memcpyDeviceToHost, stream.ptr)
    ring = PinnedRing(min(STAGE_BYTES, width * width * item), 2)
    triangle = "lower" if lower else "upper"
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width)
        download(dst[c0:c1, c0:c1], src[c0:c1, c0:c1], ring, stream, triangle=triangle)
