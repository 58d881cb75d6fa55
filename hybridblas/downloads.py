"""A GPU matrix, or one triangle of it, copied into a host array at the DMA rate (hybridblas.lowlevel.to_host).

A plain ``cupy.ndarray.get()`` into pageable memory runs at the speed of the driver's bounce buffers (a
fraction of the link's); a host array of at least host_pinning.PIN_MIN_BYTES is page-locked here on first use
and stays so while it lives (hybridblas.host_pinning), so that every later copy into it is one DMA per column
panel. A triangle is copied panel by panel: the part of a panel below (above) its diagonal block by DMA straight
into place, the diagonal block through a small page-locked buffer whose triangle is then copied on the host, so
that nothing outside the triangle is written.
"""
import numpy as np

from . import host_pinning
from .cuda_transfer import copy_triangle_piece, par_copy
from .problem import is_column_major, leading_dim

PANEL = 1024          # columns per panel of a triangle copy (the diagonal blocks go through a PANEL^2 buffer)


def to_host(dst, src, lower=None):
    """dst <- src, or its lower (``lower`` True) or upper (False) triangle with the diagonal; checked arrays
    (lowlevel.to_host). Blocks until the copy has landed."""
    if not is_column_major(dst):             # both row-major: the transposes are column-major
        dst, src, lower = dst.T, src.T, (None if lower is None else not lower)
    if dst.size == 0:
        return
    import cupy
    pin = host_pinning.acquire(dst, after_uses=0)
    try:
        if pin is not None:
            pin.done.wait()
        stream = cupy.cuda.get_current_stream()
        if host_pinning.is_ready(pin):
            _by_dma(dst, src, lower, stream)
        else:
            _through_pageable(dst, src, lower, stream)
    finally:
        host_pinning.release(pin)


def _through_pageable(dst, src, lower, stream):
    """A copy of src in host memory (one transfer), then the wanted part of it into dst."""
    tmp = src.get(stream=stream)
    if lower is None:
        par_copy(dst, tmp)
    else:
        copy_triangle_piece(dst, tmp, 0, 0, lower)


def _by_dma(dst, src, lower, stream):
    """dst page-locked: the whole block, or the triangle's off-diagonal panels, straight into dst; diagonal
    blocks through two alternating page-locked buffers, each copied on the host while the next one lands."""
    import cupy
    rt = cupy.cuda.runtime
    item = dst.dtype.itemsize
    rows, cols = dst.shape
    lds, ldd = leading_dim(src) * item, leading_dim(dst) * item

    def dma(r0, r1, c0, c1, to_ptr, to_ld):
        if r1 > r0 and c1 > c0:
            rt.memcpy2DAsync(to_ptr, to_ld, src.data.ptr + c0 * lds + r0 * item, lds, (r1 - r0) * item, c1 - c0,
                             rt.memcpyDeviceToHost, stream.ptr)
    if lower is None:
        dma(0, rows, 0, cols, dst.ctypes.data, ldd)
        stream.synchronize()
        return
    width = min(PANEL, cols)
    buffers = [cupy.cuda.alloc_pinned_memory(width * width * item) for _ in range(2)]
    pending = None                           # (event, buffer view, j0) of the diagonal block in flight
    for p, j0 in enumerate(range(0, cols, width)):
        j1 = min(cols, j0 + width)
        if lower:                            # below the diagonal block, straight into place
            dma(j1, rows, j0, j1, dst.ctypes.data + j0 * ldd + j1 * item, ldd)
        else:
            dma(0, j0, j0, j1, dst.ctypes.data + j0 * ldd, ldd)
        view = np.ndarray((j1 - j0, j1 - j0), dtype=dst.dtype, buffer=buffers[p % 2], order="F")
        dma(j0, j1, j0, j1, view.ctypes.data, (j1 - j0) * item)
        event = cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        if pending is not None:
            _diagonal(dst, *pending, lower)
        pending = (event, view, j0)
    _diagonal(dst, *pending, lower)
    stream.synchronize()


def _diagonal(dst, event, view, j0, lower):
    event.synchronize()
    j1 = j0 + view.shape[0]
    copy_triangle_piece(dst[j0:j1, j0:j1], view, j0, j0, lower)
