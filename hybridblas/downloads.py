"""A GPU matrix, or one triangle of it, copied into a host array at the DMA rate (hybridblas.lowlevel.to_host).

A plain ``cupy.ndarray.get()`` into pageable memory runs at the speed of the driver's bounce buffers and may first
make a contiguous copy on the GPU. Here the host array's memory, when the buffer it lies in is at least
host_pinning.PIN_MIN_BYTES, is page-locked on first use and stays so while it lives (hybridblas.host_pinning); the
copy then goes by DMA straight into place. Otherwise (a small or foreign buffer, a lock that failed, or
$HYBRIDBLAS_PIN_HOST=off) it goes through a two-slot page-locked ring (cuda_transfer.download, the GPU write-back's
own pipeline): no GPU temporary, no host temporary of the matrix's size.

A triangle into a page-locked target is cut into column panels of PANEL columns: the part of a panel below (above)
its diagonal block goes by DMA straight into place; the diagonal blocks (PANEL x N in all) go by DMA into one
page-locked buffer, queued first, and the host copies their triangles into place while the panels' DMA runs, so
that nothing outside the triangle is written. ``start`` queues a copy and returns; its ``wait`` finishes it.
"""
from . import host_pinning
from .cuda_transfer import PinnedRing, _copy_cols_triangle, _run_all, copy_threads, download
from .problem import is_column_major, leading_dim

PANEL = 128             # columns per panel of a triangle copy by DMA (the diagonal blocks' buffer: PANEL x N)
STAGE_BYTES = 32 << 20  # bytes of each of the ring's two page-locked slots
BLOCKS_GRAIN = 16 << 20  # the diagonal blocks' buffer is a multiple of this: CuPy's pinned pool keeps a freed
                         # block for a later request of its exact size, so k-points of many sizes share a few


def to_host(dst, src, lower=None):
    """dst <- src, or its lower (``lower`` True) or upper (False) triangle with the diagonal; checked arrays
    (lowlevel.to_host). Blocks until the copy has landed, also when it is interrupted."""
    start(dst, src, lower).wait()


class Pending:
    """A copy into a host array, queued on a stream: ``wait()`` copies the diagonal blocks' triangles into
    place, waits for the stream and returns once everything has landed (nothing is in flight into ``dst`` or a
    page-locked buffer after it returns or raises). A copy that can go by DMA is queued when ``start``
    returns; any other is made whole inside ``wait``."""

    def __init__(self, run=None, stream=None, pin=None, finish=None):
        self._run, self._stream, self._pin, self._finish = run, stream, pin, finish
        self.done = False

    def __del__(self):                  # dropped unwaited: finished here, so no DMA outlives its buffers
        if not getattr(self, "done", True):
            try:
                self.wait()
            except Exception:           # noqa: BLE001 - nowhere to report it from a finalizer
                pass

    def wait(self):
        if self.done:
            return
        try:
            if self._run is not None:
                self._run()
            if self._finish is not None:
                self._finish()
        finally:
            self.done = True
            try:
                if self._stream is not None:
                    self._stream.synchronize()
            finally:
                host_pinning.release(self._pin)
                self._run = self._finish = self._pin = None


def start(dst, src, lower=None):
    """Queue dst <- src (or one triangle, as to_host) on the current stream; a Pending whose ``wait()``
    finishes it. Until then ``dst`` must not be read and ``src`` not written. Through the ring (a target that
    is not page-locked) the whole copy runs inside ``wait()``."""
    if not (is_column_major(dst) and is_column_major(src)):    # both row-major: the transposes are column-major
        dst, src, lower = dst.T, src.T, (None if lower is None else not lower)
    if dst.size == 0:
        return Pending()
    import cupy
    from .context import _pin_policy
    pin = host_pinning.acquire(dst, after_uses=0) if _pin_policy(None) is not False else None
    stream = cupy.cuda.get_current_stream()
    triangle = None if lower is None else ("lower" if lower else "upper")
    try:
        if pin is not None:
            pin.done.wait()
        if not host_pinning.is_ready(pin):
            return Pending(lambda: download(dst, src, PinnedRing(STAGE_BYTES, 2), stream, triangle=triangle),
                           stream, pin)
        if triangle is None:
            queue_full(dst, src, stream)
            return Pending(None, stream, pin)
        return Pending(None, stream, pin, queue_triangle(dst, src, lower, stream))
    except BaseException:
        try:
            stream.synchronize()
        finally:
            host_pinning.release(pin)
        raise


def queue_full(dst, src, stream):
    import cupy
    rt = cupy.cuda.runtime
    item = dst.dtype.itemsize
    rows, cols = src.shape
    rt.memcpy2DAsync(dst.ctypes.data, leading_dim(dst) * item, src.data.ptr, leading_dim(src) * item, rows * item,
                     cols, rt.memcpyDeviceToHost, stream.ptr)


def queue_triangle(dst, src, lower, stream):
    """dst page-locked: each panel's diagonal block into one page-locked buffer (an event after them), then the
    part below (above) each diagonal block straight into dst; returns the host step that copies the diagonal
    blocks' triangles into place once their event has passed."""
    import cupy
    import numpy as np
    rt = cupy.cuda.runtime
    item = dst.dtype.itemsize
    n = dst.shape[1]
    lds, ldd = leading_dim(src) * item, leading_dim(dst) * item
    width = min(PANEL, n)
    panels = [(c0, min(n, c0 + width)) for c0 in range(0, n, width)]
    mem = cupy.cuda.alloc_pinned_memory(-(-width * n * item // BLOCKS_GRAIN) * BLOCKS_GRAIN)
    blocks = np.frombuffer(mem, dtype=dst.dtype, count=width * n).reshape((width, n), order="F")
    for c0, c1 in panels:          # block c0:c1 at columns c0:c1 of the buffer, leading dimension `width`
        rt.memcpy2DAsync(blocks.ctypes.data + c0 * width * item, width * item, src.data.ptr + c0 * lds + c0 * item,
                         lds, (c1 - c0) * item, c1 - c0, rt.memcpyDeviceToHost, stream.ptr)
    landed = cupy.cuda.Event(disable_timing=True)
    landed.record(stream)
    queue_off_diagonal(dst, src, lower, stream, width)

    def finish(mem=mem):
        landed.synchronize()
        jobs = [(_copy_cols_triangle, (dst[c0:c1, c0:c1], blocks[:c1 - c0, c0:c1], 0, 0, 0, c1 - c0, lower))
                for c0, c1 in panels]
        per = max(1, -(-len(jobs) // copy_threads()))
        _run_all([(_run_jobs, (jobs[i:i + per],)) for i in range(0, len(jobs), per)])
    return finish


def queue_off_diagonal(dst, src, lower, stream, width):
    """Queue, for each panel of ``width`` columns of square ``src`` (cupy) and ``dst`` (page-locked host, the same
    shape and dtype, both column-major), the part below (``lower``) or above the panel's diagonal block into
    place: one 2D DMA per panel. The diagonal blocks are left to the caller."""
    import cupy
    rt = cupy.cuda.runtime
    item = dst.dtype.itemsize
    n = src.shape[1]
    lds, ldd = leading_dim(src) * item, leading_dim(dst) * item
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width)
        r0, r1 = (c1, n) if lower else (0, c0)
        if r1 > r0:
            rt.memcpy2DAsync(dst.ctypes.data + c0 * ldd + r0 * item, ldd, src.data.ptr + c0 * lds + r0 * item, lds,
                             (r1 - r0) * item, c1 - c0, rt.memcpyDeviceToHost, stream.ptr)


def _run_jobs(jobs):
    for fn, args in jobs:
        fn(*args)
