"""One CUDA GPU as a hybridblas device: CuPy arrays, cuBLAS through ctypes, three streams, a panel cache.

Per call and per GPU (``_CUDARun``, living in the GPU's worker thread):
- operands may be numpy (host) or cupy on any GPU; C is written where it lives (on the host also for cupy
  operands);
- a task (a band or a tile of C) is cut into tiles on a grid aligned to multiples of the block, so GPUs
  of one call name panels alike and can copy them from each other;
- ``s_in`` brings panels (``cuda_fetch.PanelSource``: host through the pinned ring, other GPUs peer to
  peer, kept in a panel cache), ``s_comp`` runs cuBLAS, ``s_out`` writes C blocks back (to a host C through
  ``cuda_writeback.HostWriter``'s thread); events order them, so uploads of tile t+1 and the write-back of
  tile t-1 overlap the kernels of tile t (a window of tiles in flight, this module);
- the block edge and k chunk follow the memory this GPU may use (``memory_limit`` or free memory); when
  cupy's pool still runs dry, the run drops its cache, shrinks its blocks and retries, and as a last
  resort computes a host-resident tile with the host BLAS: never a crash, never a wrong answer.
"""
import collections
import sys
import threading
import time

import numpy as np

from .. import cublas, cuda_transfer, host_pinning
from ..kernels import rect_block
from ..plan import subtiles, with_k
from ..problem import Operand, T
from .base import Device, DeviceRun, check_cancel, register
from . import cuda_ozaki
from .cuda_fetch import PanelSource, device_of
from .cuda_writeback import HostWriter

MAX_BLOCK = 4096
MIN_BLOCK = 32
GEMMT_LEAF = 512           # gemmt diagonal blocks up to this edge: one scratch gemm + masked copy
WINDOW = 5                 # tiles launched and not yet written back (the feeder's lead)
STAGING_SLOT = 64 << 20
STAGING_SLOTS = 4
STAGING_RINGS = 4          # rings per direction a GPU keeps (calls beyond wait for one, up to RING_PATIENCE)
RESERVE = 256 << 20        # left free for cuBLAS workspaces and CuPy temporaries
SINGLE_K = 1024            # k chunk for float32/complex64 kernels (accuracy, see _CUDARun)
STREAM_K = 4096            # panels moved from elsewhere are cut along k: the first kernel starts sooner


# Per GPU, what the last call did: bytes moved, host seconds spent staging, kernel seconds (for the notes).
last_stats = {}


class _Shrink(Exception):
    pass


def _cupy():
    import cupy
    return cupy


class CUDADevice(Device):
    """GPU ``index``. ``memory_limit`` caps the bytes a call may use on it; ``block`` fixes the tile edge."""
    kind = "cuda"
    max_in_flight = 2

    def __init__(self, index=0, *, memory_limit=None, block=None):
        if memory_limit is not None and (not isinstance(memory_limit, int) or memory_limit <= 0):
            raise ValueError(f"memory_limit must be a positive number of bytes, got {memory_limit!r}")
        if block is not None and (not isinstance(block, int) or block < 1):
            raise ValueError(f"block must be a positive integer, got {block!r}")
        self.index = int(index)
        self.memory_limit = memory_limit
        self.block = block
        self._rings = {which: cuda_transfer.RingPool(STAGING_SLOT, STAGING_SLOTS, STAGING_RINGS)
                       for which in ("in", "out")}

    @property
    def name(self):
        return f"cuda:{self.index}"

    def accepts(self, problem):
        return True

    def open(self, problem):
        return _CUDARun(self, problem)

    def preferred_block(self, problem):
        if self.block:
            return self.block
        cp = _cupy()
        with cp.cuda.Device(self.index):
            room = budget(self, problem)
        return _block_plan(problem, room, None)[0]

    def release(self):
        """The staging rings no call is using go, and with them CuPy's idle page-locked blocks."""
        for pool in self._rings.values():
            pool.clear()
        if "cupy" in sys.modules:
            sys.modules["cupy"].get_default_pinned_memory_pool().free_all_blocks()

    def ring_pool(self, which="in"):
        """This GPU's pinned staging rings ('in' for the feeder, 'out' for the writer): a call borrows one
        of each for its whole run on this GPU, so concurrent calls never share a ring."""
        return self._rings[which]


def budget(device, problem):
    """Bytes this call may hold on the current GPU."""
    cp = _cupy()
    limit = device.memory_limit or problem.run.memory_limit
    if limit:
        return int(limit)
    free, _total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    avail = free + pool.free_bytes()
    cap = pool.get_limit()
    if cap:
        avail = min(avail, cap - pool.used_bytes())
    return max(int(avail * 0.9) - RESERVE, 1 << 20)


def _emulated_k(problem):
    """The least k chunk at which emulated products apply (0 without emulation): panels streamed along k in
    shorter chunks would run natively."""
    if not cuda_ozaki.wanted(problem):
        return 0
    return min(problem.k, max(cuda_ozaki.MIN_K[problem.dtype.kind, t] for t in (False, True)))


def _block_plan(problem, budget, fixed):
    """(block edge nb, k chunk kc) whose working set (two panels per factor, tiles in flight) fits."""
    item = problem.dtype.itemsize
    nf = len(problem.factors)
    size = max(problem.m, problem.n, 1)
    k = max(problem.k, 1)
    if fixed:
        nb = fixed
    elif cuda_ozaki.wanted(problem):
        # emulated products: device operands (views, no panel copies) in one tile that cuda_ozaki cuts within
        # its own memory bound (each operand's residues made once); host operands in SUB tiles, so uploads
        # overlap the products
        if problem.fxp is not np and 3 * size * size * item <= budget:
            return size, k
        nb = min(size, cuda_ozaki.SUB)
    else:   # about six tiles per row for big C, never below 1024 unless C is smaller
        nb = min(MAX_BLOCK, max(1024, -(-size // 6 // 256) * 256), size)
    kc = k
    while (2 * nf * nb * kc * 2 + (WINDOW + 2) * nb * nb) * item > budget:
        if kc > max(2 * nb, 1024) or (nb <= MIN_BLOCK and kc > 16):
            kc = -(-kc // 2)      # long panels first: a big block keeps the kernels efficient
        elif nb > MIN_BLOCK:
            nb = max(MIN_BLOCK, -(-nb // 2))
        else:
            break
    return nb, kc


class _PanelFactor:
    """A factor as compute_block sees it (op, global indices) whose blocks resolve to cached panels."""

    def __init__(self, run, f, op):
        self.run, self.f, self.op = run, f, op

    @property
    def trans(self):
        return bool(self.op & T)

    def with_op(self, op):
        return _PanelFactor(self.run, self.f, op)

    def block(self, r0, r1, c0, c1):
        a, b = ((c0, c1), (r0, r1)) if self.trans else ((r0, r1), (c0, c1))
        return Operand(self.run.fetch.view(self.f, a, b), self.op)


class _Tile:
    __slots__ = ("task", "local", "done_event", "finish", "done", "written", "error", "touched", "failed")
    # finish "host": written back by the run's HostWriter, which sets ``written`` (and ``error``)

    def __init__(self, task):
        self.task = task
        self.local = None
        self.done_event = None
        self.finish = None
        self.done = False
        self.written = None      # set by the writer thread once a host tile is in the caller's C
        self.error = None
        self.touched = False     # a write into the caller's C has been queued or begun
        self.failed = False      # finishing it raised: its result is not to be trusted


class _CUDARun(DeviceRun):
    def __init__(self, device, problem):
        cp = _cupy()
        self.cp = cp
        self.device = device
        self.problem = problem
        self.dev = cp.cuda.Device(device.index)
        with self.dev:
            self.s_comp = cp.cuda.Stream(non_blocking=True)
            self.s_in = cp.cuda.Stream(non_blocking=True)
            self.s_out = cp.cuda.Stream(non_blocking=True)
            for ev in problem.run.caller_events:   # the caller's queued work comes first
                self.s_in.wait_event(ev)
                self.s_comp.wait_event(ev)
            self.handle = cublas.handle()
            if cuda_ozaki.wanted(problem):
                self.backend = cuda_ozaki.Backend(self.handle, self.s_comp, problem.run.emulation)
            else:
                self.backend = cublas.Backend(self.handle, self.s_comp)
            self.pool = cp.get_default_memory_pool()
            self.host = problem.xp is np                 # C on the host: written back through the writer
            self.host_operands = problem.fxp is np       # operands on the host: panels through the ring
            self.c_dev = device_of(problem.c)
            self.f_dev = [device_of(f.base) for f in problem.factors]
            self._enable_peers()
            self.budget = budget(device, problem)
            fixed = device.block
            self.nb, self.kc = _block_plan(problem, self.budget, fixed)
            if self.host or any(d != device.index for d in self.f_dev):
                self.kc = min(self.kc, max(self.nb, STREAM_K, _emulated_k(problem)))
            if isinstance(self.backend, cuda_ozaki.Backend):
                self.backend.limit = self.budget
            if problem.dtype in (np.float32, np.complex64):
                # cuBLAS's single-precision syrk sums a whole k range in one float32 accumulator: for
                # LOBPCG's tall Gram matrices (k ~ 3e4) that gave 10x the error of CPU BLAS and of a gemm;
                # short k chunks, summed in C, bring it back (measured in docs/performance.md)
                self.kc = min(self.kc, SINGLE_K)
            self.pending = collections.deque()
            self.partial = None
            self.scratch = None
            self.masks = None
            self.fallbacks = 0
            self.stats = collections.Counter()
            self.fetch, self.writer, self.pin_c = None, None, None
            try:
                self._acquire()
            except BaseException:
                self._release()
                raise
            self.kernel_events = []
            self.tasks = {}        # id(task) -> (its launched tile records, its tiles not yet launched)
            self.t_open = time.perf_counter()
            self.open_event = cp.cuda.Event()
            self.open_event.record(self.s_comp)

    # ------------------------------------------------------------------ setup
    def _acquire(self):
        """The run's parts: where its panels come from (the call's panel index, a staging ring lent by the
        GPU for this run), the host write-back (with a ring of its own), page-locked operands. ``_release``
        undoes it."""
        device, problem = self.device, self.problem
        self.fetch = PanelSource(self.cp, device.index, problem, self.s_in, self._cache_capacity(), self.stats,
                                 self.f_dev)
        if not self.host:
            return
        self.fetch.ring = device.ring_pool("in").take()
        self.writer = HostWriter(device, problem, self.s_out, self.stats)
        if problem.run.pin_host:
            self._pin_host_operands()

    def _release(self):
        if self.writer is not None:
            self.writer.stop()
            self.writer = None
        fetch, self.fetch = self.fetch, None
        if fetch is None:
            return
        self.device.ring_pool("in").give(fetch.ring)
        fetch.ring = None
        for pin in fetch.pins + [self.pin_c]:
            host_pinning.release(pin)
        self.pin_c = None
        fetch.close()

    def _pin_host_operands(self):
        """Start page-locking the caller's large host operands (kept while they live): once locked, an
        upload is one DMA. Until then (a first call) they go through the staging ring."""
        p = self.problem
        after = 1 if p.run.pin_host == "auto" else 0
        call = p.run.call          # one token shared by the call's GPUs
        self.fetch.pins = [None if fac.scratch or not self.host_operands
                           else host_pinning.acquire(fac.base, after_uses=after, call=call) for fac in p.factors]
        self.pin_c = host_pinning.acquire(p.c, after_uses=after, call=call) if p.writeback is None else None
        self.writer.pin = self.pin_c

    def _enable_peers(self):
        rt = self.cp.cuda.runtime
        others = {d for d in self.f_dev + [self.c_dev] if d is not None and d != self.device.index}
        if self.host:
            others |= set(range(rt.getDeviceCount())) - {self.device.index}
        for d in sorted(others):
            peer_access(self.cp, self.device.index, d)     # where it cannot, copies go through the host

    def _cache_capacity(self):
        item = self.problem.dtype.itemsize
        scratch = min(GEMMT_LEAF, self.nb) ** 2 * item if self.problem.kind == "gemmt" else 0
        return max(self.budget - (WINDOW + 2) * self.nb * self.nb * item - scratch, 0)

    # ------------------------------------------------------------------ DeviceRun
    def launch(self, task):
        with self.dev:
            return self._launch(task)

    def wait(self, handle):
        with self.dev:
            while any(not t.done for t in handle):
                self._finish(self.pending.popleft())

    def close(self):
        with self.dev:
            try:
                while self.pending:
                    self._finish(self.pending.popleft())
                self.s_comp.synchronize()
                self.s_in.synchronize()
                self.s_out.synchronize()
                self._record_stats()
                return self._partial_result()
            finally:
                self._release()
                self.scratch = None

    def _record_stats(self):
        elapsed = self.cp.cuda.get_elapsed_time
        kernel = sum(elapsed(a, b) for a, b in self.kernel_events) / 1e3
        st = dict(self.stats)
        wall = time.perf_counter() - self.t_open
        st.update(kernel_s=kernel, wall_s=wall, nb=self.nb, kc=self.kc, fallbacks=self.fallbacks,
                  budget=self.budget)
        if self.kernel_events:   # GPU idle before the first kernel, between kernels, after the last
            lead = elapsed(self.open_event, self.kernel_events[0][0]) / 1e3
            span = elapsed(self.kernel_events[0][0], self.kernel_events[-1][1]) / 1e3
            st.update(lead_s=lead, gaps_s=span - kernel, tail_s=wall - lead - span)
        last_stats[self.device.name] = st

    # ------------------------------------------------------------------ tiles
    def _launch(self, task):
        tiles = collections.deque(subtiles(self.problem, task, self.nb))
        launched = []
        self.tasks[id(task)] = (launched, tiles)
        while tiles:
            check_cancel(self.problem)
            t = tiles[0]
            try:
                rec = self._launch_tile_retry(t)
            except _Shrink:
                tiles.popleft()
                if self.nb > MIN_BLOCK or self.kc > 16:
                    self.nb = max(MIN_BLOCK, self.nb // 2)
                    self.kc = max(16, self.kc // 2)
                    tiles.extendleft(reversed(subtiles(self.problem, t, self.nb)))
                    continue
                tiles.appendleft(t)
                rec = self._host_fallback(t)
            launched.append(rec)
            tiles.popleft()
            while len(self.pending) > WINDOW:
                self._finish(self.pending.popleft())
        return launched

    def remainder(self, task):
        """What is left of a task after a failure: tiles not launched or not written (clean), and tiles
        whose write into C was queued or begun and not confirmed (torn)."""
        entry = self.tasks.get(id(task))
        if entry is None:
            return [task], []
        launched, unlaunched = entry
        clean = [r.task for r in launched if not r.done and not r.touched] + list(unlaunched)
        torn = [r.task for r in launched if not r.done and r.touched]
        return clean, torn

    def _launch_tile_retry(self, t):
        OOM = self.cp.cuda.memory.OutOfMemoryError
        for attempt in range(2):
            try:
                return self._launch_tile(t)
            except OOM:
                # drain what is in flight, drop cached panels and the pool's free blocks, try again once
                while self.pending:
                    self._finish(self.pending.popleft())
                self.s_comp.synchronize()
                self.fetch.cache.clear()
                self.s_in.synchronize()
                self.scratch = None
                self.pool.free_all_blocks()
        raise _Shrink()

    def _host_fallback(self, t):
        """Last resort for host operands when even the smallest tile does not fit on the GPU."""
        p = self.problem
        if not (self.host and self.host_operands):
            raise MemoryError(f"{self.device.name}: GPU memory exhausted even for {MIN_BLOCK}-wide tiles "
                              f"of device-resident operands")
        from .cpu import _HostBackend
        from ..kernels import compute_block
        self.fallbacks += 1
        rec = _Tile(t)
        if t.split:
            if self.partial is None:
                self.partial = np.zeros((p.m, p.n), dtype=p.dtype, order="F")
            out, beta = self.partial[t.i0:t.i1, t.j0:t.j1], 1.0
            if not isinstance(self.partial, np.ndarray):
                raise MemoryError(f"{self.device.name}: out of memory during a split-K reduction")
        else:
            out, beta = p.c[t.i0:t.i1, t.j0:t.j1], p.beta
        compute_block(_HostBackend, p, t, out, beta)
        rec.done = True
        return rec

    def _kchunks(self, t):
        edges = list(range(t.k0, t.k1, self.kc)) + [t.k1]
        return list(zip(edges, edges[1:])) or [(t.k0, t.k1)]

    def _launch_tile(self, t):
        cp, p = self.cp, self.problem
        rec = _Tile(t)
        chunks = self._kchunks(t)
        rows, cols = t.i1 - t.i0, t.j1 - t.j0
        here = self.c_dev == self.device.index
        local = t.split or not here or len(chunks) > 1
        beta = 0.0 if t.split else p.beta
        with self.s_in:
            buf = cp.empty((rows, cols), dtype=p.dtype, order="F") if local else None
        target = None if self.host else p.c[t.i0:t.i1, t.j0:t.j1]
        if local and not t.split and (beta != 0 or (t.diag and not self.host)):
            self._fetch_c(buf, t, target)
        out = buf if local else target
        for n_chunk, (k0, k1) in enumerate(chunks):
            keep, panels = set(), []
            for key in self.fetch.needs(t, k0, k1):
                panel = self.fetch.ensure(key, keep)
                keep.add(panel.key)
                panels.append(panel)
                if panel.ready is not None:
                    self.s_comp.wait_event(panel.ready)
            tk = with_k(t, p, k0, k1)
            start = cp.cuda.Event()
            start.record(self.s_comp)
            with self.s_comp:
                self._compute(tk, out, beta if n_chunk == 0 else 1.0)
            end = cp.cuda.Event()
            end.record(self.s_comp)
            self.kernel_events.append((start, end))
            used = self._record(self.s_comp)
            for panel in panels:
                panel.last_use = used
        done = cp.cuda.Event(disable_timing=True)
        done.record(self.s_comp)
        rec.local = buf
        if t.split:
            with self.s_comp:
                self._add_partial(t, buf)
            done = cp.cuda.Event(disable_timing=True)
            done.record(self.s_comp)
            rec.done_event = done
        elif local and not self.host:
            self.s_out.wait_event(done)
            rec.touched = True
            cuda_transfer.copy_2d(target, buf, self.s_out)
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(self.s_out)
            rec.done_event = ev
        elif local:
            rec.done_event = done
            rec.finish = "host"
            self.writer.submit(rec)
        else:
            rec.touched = True       # the kernels wrote into C in place
            rec.done_event = done
        self.pending.append(rec)
        return rec

    def _finish(self, rec):
        if rec.done:
            return
        if rec.failed:
            raise RuntimeError(f"{self.device.name}: tile {rec.task.i0}:{rec.task.i1} x {rec.task.j0}:{rec.task.j1} "
                               f"failed earlier")
        try:
            if rec.finish == "host":
                rec.written.wait()
                if rec.error is not None:
                    raise rec.error
            elif rec.done_event is not None:
                rec.done_event.synchronize()
        except BaseException:
            rec.failed = True
            raise
        rec.local = None
        rec.done = True

    # ------------------------------------------------------------------ C blocks
    def _fetch_c(self, buf, t, target):
        if self.host:
            cuda_transfer.upload(buf, self.problem.c[t.i0:t.i1, t.j0:t.j1], self.fetch.ring, self.s_in,
                                 direct=host_pinning.is_ready(self.pin_c))
        else:
            cuda_transfer.copy_2d(buf, target, self.s_in)
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.s_in)
        self.s_comp.wait_event(ev)

    def _add_partial(self, t, buf):
        p = self.problem
        if self.partial is None:
            self.partial = self.cp.zeros((p.m, p.n), dtype=p.dtype, order="F")
        view = self.partial[t.i0:t.i1, t.j0:t.j1]
        view += buf

    def _partial_result(self):
        if self.partial is None or isinstance(self.partial, np.ndarray):
            return self.partial
        self.s_comp.synchronize()
        if self.host:
            return self.partial.get()
        if self.c_dev == self.device.index:
            return self.partial
        with self.cp.cuda.Device(self.c_dev):
            out = self.cp.empty_like(self.partial, order="F")
        cuda_transfer.copy_2d(out, self.partial, self.s_comp)
        self.s_comp.synchronize()
        return out

    def _record(self, stream):
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    # ------------------------------------------------------------------ kernels
    def _compute(self, t, out, beta):
        from ..kernels import compute_block
        p = self.problem
        factors = [_PanelFactor(self, f, fac.op) for f, fac in enumerate(p.factors)]
        if t.diag and p.kind == "gemmt":
            self._gemmt_buffers(t.i1 - t.i0)    # allocate before the first write into C
            self._gemmt_diag(p.terms(factors), t.i0, t.i1, t.k0, t.k1, out, beta)
        else:
            compute_block(self.backend, p, t, out, beta, factors=factors)

    def _gemmt_buffers(self, size):
        cp, p = self.cp, self.problem
        edge = min(GEMMT_LEAF, max(size, 1))
        if self.scratch is None or self.scratch[0].shape[0] < edge:
            self.scratch = [cp.empty((edge, edge), dtype=p.dtype, order="F") for _ in range(2)]
            ones = cp.ones((edge, edge), dtype=bool)
            self.masks = cp.tril(ones) if p.lower else cp.triu(ones)

    def _gemmt_diag(self, terms, i0, i1, k0, k1, out, beta):
        """Triangle of a diagonal gemmt block: halve down to GEMMT_LEAF, then one gemm + masked copy."""
        cp, p = self.cp, self.problem
        size = i1 - i0
        if size <= GEMMT_LEAF:
            scratch = self.scratch[0][:size, :size]
            rect_block(self.backend, terms, i0, i1, i0, i1, k0, k1, scratch, 0.0)
            if beta != 0:
                old = self.scratch[1][:size, :size]
                cp.multiply(out, beta, out=old)
                scratch += old
            cp.copyto(out, scratch, where=self.masks[:size, :size])
            return
        h = max(GEMMT_LEAF // 2, (size // 2) // 64 * 64)
        self._gemmt_diag(terms, i0, i0 + h, k0, k1, out[:h, :h], beta)
        self._gemmt_diag(terms, i0 + h, i1, k0, k1, out[h:, h:], beta)
        if p.lower:
            rect_block(self.backend, terms, i0 + h, i1, i0, i0 + h, k0, k1, out[h:, :h], beta)
        else:
            rect_block(self.backend, terms, i0, i0 + h, i0 + h, i1, k0, k1, out[:h, h:], beta)


def _factory(spec):
    """'cuda' / 'gpu': every visible GPU; 'cuda:i': GPU i. Without CuPy, a driver or the GPU: a ValueError
    that says what to install or which ids exist."""
    from ..devspec import check_gpu_ids, device_words
    _cpu, every_gpu, _optional, ids = device_words(spec)
    count = check_gpu_ids(ids, spec)
    return [CUDADevice(i) for i in (range(count) if every_gpu else ids)]


register("cuda", _factory)


_peers = {}                # (a, b) -> GPU a reads GPU b's memory directly (peer access, enabled once per process)
_peers_lock = threading.Lock()


def peer_access(cp, a, b):
    """Whether GPU ``a`` reads GPU ``b``'s memory directly; the first call for the pair enables it (the tiled
    and the band runs ask on every call: one runtime query per pair and process)."""
    with _peers_lock:
        ok = _peers.get((a, b))
        if ok is None:
            rt = cp.cuda.runtime
            ok = bool(rt.deviceCanAccessPeer(a, b))
            if ok:
                with cp.cuda.Device(a):
                    try:
                        rt.deviceEnablePeerAccess(b)
                    except rt.CUDARuntimeError:
                        pass        # already enabled in this process (by CuPy's own peer copies)
            _peers[(a, b)] = ok
        return ok
