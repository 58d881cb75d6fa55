"""Host <-> GPU traffic for pageable numpy arrays: a pinned staging ring and parallel host copies.

cudaMemcpy from pageable memory is slow and synchronous. Each GPU feeder keeps a ring of page-locked
slots: the host copies piece p+1 into a free slot (several threads; numpy releases the GIL while copying)
while the copy engine moves piece p, and the GPU computes on earlier tiles. Downloads run the other way,
and a diagonal tile is copied out by its triangle only (the other triangle of the caller's C is never
written).
"""
import collections
import os
import threading

import numpy as np

from . import envvars, workers

PAR_MIN_BYTES = 8 << 20     # below this one thread copies
TRI_BLOCK = 256             # column block of triangle copies
MAX_COPY_THREADS = 16
ENV_THREADS = "HYBRIDBLAS_COPY_THREADS"

_threads = None
_group = None                # the copy threads (workers.Group) every GPU's calls share
_group_lock = threading.Lock()


def copy_threads():
    """Threads of the host copy pool: $HYBRIDBLAS_COPY_THREADS, else one per core, at most 16.

    Measured on a 4xH200 node (64 cores, python3 -m benchmarks.blas staging): one big pageable -> pinned copy
    scales to 70 GB/s on 64 threads, but the staging ring (64 MiB pieces, four GPUs pulling at once) ran at
    43 GB/s with 16 threads, 29 with 32 and 19 with 64: more threads only add contention there.
    """
    if _threads is not None:
        return _threads
    value = envvars.number(ENV_THREADS, int, minimum=1)
    if value is not None:
        return value
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 4)
    return max(2, min(MAX_COPY_THREADS, cores))


def set_copy_threads(n):
    """Fix the number of copy threads (None: back to the default); the group is remade on next use."""
    global _threads, _group
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"copy threads must be a positive integer or None, got {n!r}")
    with _group_lock:
        old, _group, _threads = _group, None, n
    if old is not None:
        old.close()


def copy_group():
    """The copy threads every GPU's calls share (copy_threads() of them)."""
    global _group
    with _group_lock:
        if _group is None:
            _group = workers.Group(copy_threads(), name="copy")
        return _group


def _run_all(jobs):
    """Run (fn, args) jobs on the copy threads (inline when there is one), re-raising the first error."""
    if len(jobs) == 1:
        fn, args = jobs[0]
        fn(*args)
        return
    copy_group().map(lambda job: job[0](*job[1]), jobs)


def par_copy(dst, src):
    """dst[...] = src for 2-D column-major arrays, split by columns across the copy pool."""
    cols = dst.shape[1]
    if dst.nbytes < PAR_MIN_BYTES or cols < 2:
        np.copyto(dst, src)
        return
    parts = min(cols, copy_threads())
    edges = [cols * p // parts for p in range(parts + 1)]
    _run_all([(np.copyto, (dst[:, a:b], src[:, a:b])) for a, b in zip(edges, edges[1:]) if b > a])


_masks = {}


def _tri_mask(size, lower):
    key = (size, lower)
    m = _masks.get(key)
    if m is None:
        m = _masks[key] = (np.tril if lower else np.triu)(np.ones((size, size), dtype=bool))
    return m


def _copy_cols_triangle(dst, src, r0, c0, a, b, lower):
    """Columns [a, b) of the piece at (r0, c0) of a diagonal tile: copy entries inside the triangle."""
    rows = dst.shape[0]
    g0, g1 = c0 + a, c0 + b                 # tile-column range of this block
    lo, hi = g0 - r0, g1 - r0               # rows of the piece that are on the diagonal block
    if lower:
        full = slice(max(hi, 0), rows)
        part = (max(lo, 0), min(hi, rows))
    else:
        full = slice(0, min(max(lo, 0), rows))
        part = (max(lo, 0), min(hi, rows))
    if full.stop > full.start:
        np.copyto(dst[full, a:b], src[full, a:b])
    p0, p1 = part
    if p1 > p0:
        size = b - a
        mask = _tri_mask(size, lower)[p0 - lo:p1 - lo, :]
        np.copyto(dst[p0:p1, a:b], src[p0:p1, a:b], where=mask)


def copy_triangle_piece(dst, src, r0, c0, lower):
    """dst <- src where the tile entry (r0 + i, c0 + j) lies in the triangle (diagonal included)."""
    cols = dst.shape[1]
    jobs = [(_copy_cols_triangle, (dst, src, r0, c0, a, min(a + TRI_BLOCK, cols), lower))
            for a in range(0, cols, TRI_BLOCK)]
    # group the small jobs so each pool task moves a few MB
    per = max(1, -(-len(jobs) // copy_threads()))
    groups = [jobs[i:i + per] for i in range(0, len(jobs), per)]
    _run_all([(_run_seq, (g,)) for g in groups])


def _run_seq(jobs):
    for fn, args in jobs:
        fn(*args)


class PinnedRing:
    """A few page-locked slots reused round-robin; a slot is free once its last copy has completed.

    A ring has one user at a time (one thread of one call on one GPU: the feeder uploads through its 'in'
    ring, the writer downloads through its 'out' ring); ``RingPool`` hands rings out and takes them back.
    """

    def __init__(self, slot_bytes, slots):
        import cupy
        self.slot_bytes = int(slot_bytes)
        self.mem = [cupy.cuda.alloc_pinned_memory(self.slot_bytes) for _ in range(slots)]
        self.busy = [None] * slots
        self.next = 0

    def acquire(self):
        i = self.next
        self.next = (i + 1) % len(self.mem)
        ev = self.busy[i]
        if ev is not None:
            ev.synchronize()
            self.busy[i] = None
        return i

    def view(self, i, shape, dtype):
        count = int(shape[0]) * int(shape[1])
        return np.frombuffer(self.mem[i], dtype=dtype, count=count).reshape(shape, order="F")

    def release(self, i, event):
        self.busy[i] = event


RING_PATIENCE = 2.0        # s a call waits for a GPU's staging ring before it gets one of its own (RingPool)


class RingPool:
    """The staging rings of one GPU, lent to one call at a time.

    Concurrent calls on one GPU each need their own ring: two users of one ring would copy into the same
    page-locked slot while the other's DMA still reads it. A call takes a ring when it starts on the GPU
    and gives it back when it ends; ``limit`` rings are kept (each holds ``slots`` x ``slot_bytes`` of
    page-locked host memory), and a call that finds them all lent waits for one, but no longer than
    ``patience`` seconds: then it gets a ring of its own, freed when given back. A tiled call holds one
    GPU's rings while its work queued on another GPU waits for that GPU's ring, so two such calls, each
    holding the ring the other waits for, would otherwise wait for ever.
    """

    def __init__(self, slot_bytes, slots, limit, patience=RING_PATIENCE):
        self.slot_bytes, self.slots, self.limit = int(slot_bytes), int(slots), int(limit)
        self.patience = patience
        self._idle = []
        self._made = 0
        self._cond = threading.Condition()

    def take(self, timeout=None):
        """A ring: an idle one, a new one while fewer than ``limit`` exist, else the next one given back;
        with ``timeout``, None once that many seconds have passed, without it a ring beyond ``limit`` once
        ``patience`` has."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._idle or self._made < self.limit,
                                       self.patience if timeout is None else timeout):
                if timeout is not None:
                    return None
            elif self._idle:
                return self._idle.pop()
            self._made += 1
        try:
            return PinnedRing(self.slot_bytes, self.slots)
        except BaseException:
            with self._cond:
                self._made -= 1
                self._cond.notify()
            raise

    def give(self, ring):
        """Return a ring once every copy through it has been waited for (its slots may be reused at once)."""
        if ring is None:
            return
        with self._cond:
            if self._made > self.limit:          # a ring made past the limit: freed
                self._made -= 1
                self._cond.notify()
                return
            self._idle.append(ring)
            self._cond.notify()

    def clear(self):
        """Drop the idle rings (their page-locked slots go back to CuPy's pinned pool); lent ones stay lent."""
        with self._cond:
            dropped, self._idle = self._idle, []
            self._made -= len(dropped)
            self._cond.notify_all()
        del dropped

    @property
    def made(self):
        return self._made


def _pieces(rows, cols, item, slot_bytes):
    rr = max(1, min(rows, slot_bytes // item))
    cc = max(1, slot_bytes // (rr * item))
    for c0 in range(0, cols, cc):
        for r0 in range(0, rows, rr):
            yield r0, min(rows, r0 + rr), c0, min(cols, c0 + cc)


def _dev_ld(arr):
    from .problem import leading_dim
    return leading_dim(arr)


def copy_2d(dst, src, stream):
    """dst <- src between column-major device views of the same shape, on any GPUs (peer to peer over
    NVLink where enabled), queued on ``stream``."""
    import cupy
    rt = cupy.cuda.runtime
    item = dst.dtype.itemsize
    rows, cols = dst.shape
    if rows == 0 or cols == 0:
        return
    rt.memcpy2DAsync(dst.data.ptr, _dev_ld(dst) * item, src.data.ptr, _dev_ld(src) * item,
                     rows * item, cols, rt.memcpyDefault, stream.ptr)


def upload(dst, src, ring, stream, direct=False):
    """Device column-major view dst <- host column-major view src, through the pinned ring on stream,
    or in one DMA when ``direct`` (src is page-locked: see host_pinning).

    Returns after the last piece is queued; the caller records an event on ``stream`` to know it landed.
    """
    import cupy
    rt = cupy.cuda.runtime
    rows, cols = src.shape
    if rows == 0 or cols == 0:
        return
    item = src.dtype.itemsize
    ld = _dev_ld(dst) * item
    if direct:
        rt.memcpy2DAsync(dst.data.ptr, ld, src.ctypes.data, _dev_ld(src) * item, rows * item, cols,
                         rt.memcpyHostToDevice, stream.ptr)
        return
    for r0, r1, c0, c1 in _pieces(rows, cols, item, ring.slot_bytes):
        i = ring.acquire()
        buf = ring.view(i, (r1 - r0, c1 - c0), src.dtype)
        par_copy(buf, src[r0:r1, c0:c1])
        ptr = dst.data.ptr + c0 * ld + r0 * item
        rt.memcpy2DAsync(ptr, ld, buf.ctypes.data, (r1 - r0) * item, (r1 - r0) * item, c1 - c0,
                         rt.memcpyHostToDevice, stream.ptr)
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(stream)
        ring.release(i, ev)


def download(dst, src, ring, stream, triangle=None, direct=False):
    """Host column-major view dst <- device view src through the ring, pieces pipelined on ``stream``;
    one DMA when ``direct`` (dst page-locked) and the whole block is wanted.

    ``triangle`` = 'lower' / 'upper' copies only that triangle of a square diagonal tile. Blocks until done.
    """
    import cupy
    rt = cupy.cuda.runtime
    rows, cols = src.shape
    if rows == 0 or cols == 0:
        return
    item = src.dtype.itemsize
    ld = _dev_ld(src) * item
    if direct and triangle is None:
        rt.memcpy2DAsync(dst.ctypes.data, _dev_ld(dst) * item, src.data.ptr, ld, rows * item, cols,
                         rt.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return
    slots = len(ring.mem)
    queued = collections.deque()
    for piece in _pieces(rows, cols, item, ring.slot_bytes):
        if len(queued) >= slots:
            _drain_one(queued, dst, ring, triangle)
        r0, r1, c0, c1 = piece
        if triangle is not None and _outside(r0, r1, c0, c1, triangle == "lower"):
            continue
        i = ring.acquire()
        buf = ring.view(i, (r1 - r0, c1 - c0), src.dtype)
        rt.memcpy2DAsync(buf.ctypes.data, (r1 - r0) * item, src.data.ptr + c0 * ld + r0 * item, ld,
                         (r1 - r0) * item, c1 - c0, rt.memcpyDeviceToHost, stream.ptr)
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(stream)
        queued.append((i, buf, piece, ev))
    while queued:
        _drain_one(queued, dst, ring, triangle)


def _outside(r0, r1, c0, c1, lower):
    return (r1 - 1 < c0) if lower else (r0 > c1 - 1)


def _drain_one(queued, dst, ring, triangle):
    i, buf, (r0, r1, c0, c1), ev = queued.popleft()
    ev.synchronize()
    if triangle is None:
        par_copy(dst[r0:r1, c0:c1], buf)
    else:
        copy_triangle_piece(dst[r0:r1, c0:c1], buf, r0, c0, triangle == "lower")
    ring.release(i, None)
