"""A GPU matrix, or one triangle of it, copied into a host array at the DMA rate (hybridblas.lowlevel.to_host).

A plain ``cupy.ndarray.get()`` into pageable memory runs at the speed of the driver's bounce buffers and may first
make a contiguous copy on the GPU. Here the host array's memory, when the buffer it lies in is at least
host_pinning.PIN_MIN_BYTES, is page-locked on first use and stays so while it lives (hybridblas.host_pinning); the
copy then goes by DMA straight into place, column panel by column panel. Otherwise (a small or foreign buffer, or a
lock that failed) the panels land in two alternating page-locked buffers, each copied into place on the host while
the next one lands: no GPU temporary, no host temporary of the matrix's size. A triangle is copied panel by panel:
the part of a panel below (above) its diagonal block by DMA, the diagonal block through a page-locked buffer whose
triangle is copied on the host, so that nothing outside the triangle is written.
"""
import numpy as np

from . import host_pinning
from .cuda_transfer import copy_triangle_piece
from .problem import is_column_major, leading_dim

PANEL = 1024            # columns per panel of a triangle copy by DMA (its diagonal blocks go through PANEL^2 buffers)
STAGE_BYTES = 32 << 20  # bytes of each of the two page-locked buffers of a copy that cannot go straight into place


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
    try:
        if pin is not None:
            pin.done.wait()
        if host_pinning.is_ready(pin):
            _by_dma(dst, src, lower, stream)
        else:
            _staged(dst, src, lower, stream)
    finally:
        stream.synchronize()       # nothing in flight into dst or a buffer once this returns or raises
        host_pinning.release(pin)


def _dma(src, stream, r0, r1, c0, c1, to_ptr, to_ld):
    """Rows r0:r1 of columns c0:c1 of the column-major GPU matrix src into host memory at to_ptr (leading
    dimension to_ld bytes), queued on ``stream``."""
    import cupy
    rt = cupy.cuda.runtime
    item, lds = src.dtype.itemsize, leading_dim(src) * src.dtype.itemsize
    if r1 > r0 and c1 > c0:
        rt.memcpy2DAsync(to_ptr, to_ld, src.data.ptr + c0 * lds + r0 * item, lds, (r1 - r0) * item, c1 - c0,
                         rt.memcpyDeviceToHost, stream.ptr)


def _through_buffers(dst, src, lower, stream, pieces):
    """Each (r0, r1, c0, c1) of ``pieces`` into a page-locked buffer (two, alternating), then into dst on the host
    (its triangle only, with ``lower``): each host copy runs while the next piece lands."""
    if not pieces:
        return
    import cupy
    item = dst.dtype.itemsize
    size = max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in pieces) * item
    buffers = [cupy.cuda.alloc_pinned_memory(size) for _ in range(2)]
    pending = None
    for p, (r0, r1, c0, c1) in enumerate(pieces):
        view = np.ndarray((r1 - r0, c1 - c0), dtype=dst.dtype, buffer=buffers[p % 2], order="F")
        _dma(src, stream, r0, r1, c0, c1, view.ctypes.data, (r1 - r0) * item)
        event = cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        if pending is not None:
            _land(dst, *pending, lower)
        pending = (event, view, r0, c0)
    if pending is not None:
        _land(dst, *pending, lower)


def _land(dst, event, view, r0, c0, lower):
    event.synchronize()
    part = dst[r0:r0 + view.shape[0], c0:c0 + view.shape[1]]
    if lower is None:
        np.copyto(part, view)
    else:
        copy_triangle_piece(part, view, r0, c0, lower)


def _panels(rows, cols, width, lower):
    """(r0, r1, c0, c1) of each column panel, the rows of the wanted triangle only."""
    for c0 in range(0, cols, width):
        c1 = min(cols, c0 + width)
        r0, r1 = (c0, rows) if lower else (0, c1) if lower is False else (0, rows)
        yield r0, r1, c0, c1


def _staged(dst, src, lower, stream):
    """dst not page-locked: column panels of at most STAGE_BYTES through page-locked buffers."""
    rows, cols = dst.shape
    width = max(1, min(cols, STAGE_BYTES // max(1, rows * dst.dtype.itemsize)))
    _through_buffers(dst, src, lower, stream, list(_panels(rows, cols, width, lower)))


def _by_dma(dst, src, lower, stream):
    """dst page-locked: the whole block, or the triangle's off-diagonal panels, straight into dst; the diagonal
    blocks through page-locked buffers."""
    item = dst.dtype.itemsize
    rows, cols = dst.shape
    ldd = leading_dim(dst) * item
    if lower is None:
        _dma(src, stream, 0, rows, 0, cols, dst.ctypes.data, ldd)
        return
    width = min(PANEL, cols)
    diagonal = []
    for r0, r1, c0, c1 in _panels(rows, cols, width, lower):
        if lower:                            # below the diagonal block, straight into place
            _dma(src, stream, c1, r1, c0, c1, dst.ctypes.data + c0 * ldd + c1 * item, ldd)
        else:                                # above it
            _dma(src, stream, r0, c0, c0, c1, dst.ctypes.data + c0 * ldd + r0 * item, ldd)
        diagonal.append((c0, min(c1, rows), c0, c1))
    _through_buffers(dst, src, lower, stream, [d for d in diagonal if d[1] > d[0]])
