"""Host operands on GPUs, one band of C per GPU: each piece of an operand crosses PCIe once, compute starts on
the first thin unit and goes by whole-band cuBLAS calls along k, and C's write-back runs under the last
range's compute (the layout: hybridblas.band_plan).

The tiled run (devices.cuda) fetches panels tile by tile and writes every tile back on its own; at medium
sizes its GPUs waited for panels and for the write-back. On 2 x H100, complex128 n = k = 8192, host operands
page-locked, best of 4 in one process: tiles took 46.5 ms for zherk (0.40 of the sum of device cuBLAS), 86.1
for zher2k, 50.8 for zgemmt; bands 27.7 (0.67), 51.5 (0.80) and 49.0. At 16384: 206 / 187, 412 / 372,
237 / 209 ms.

Per GPU of the call up to three jobs run:
- the pieces this GPU owns go up in k order on ``s_in``, each with an event posted on the call's board: those
  from page-locked operands one DMA each, queued by the calling thread before the jobs start, the GPUs' pieces
  in turn; the rest (through the GPU's staging ring) and C's old values by the feeder, started only for them;
- the worker copies the pieces it needs from the GPUs that uploaded them (``s_peer``, after their events),
  then queues the band's products step by step on ``s_comp`` (a herkx's diagonal values on ``s_side`` while
  the herkx runs), and in the final range block by block, each after the pieces it reads (all of them before
  the first block in the k order; the outer order's blocks start while later pieces are still coming:
  band_outer), each handed to the writer;
- over the last blocks the worker keeps at most two blocks queued ahead of its GPU; a GPU that runs late hands the
  last share of k of one of its last two blocks to the GPU that will be free first, which computes it after its own
  blocks into a buffer of its own, then (its thread, on the giver's ``s_part``, beside the giver's next blocks) has
  it copied over and added to the block, and hands the block to the giver's writer (band_tail);
- the writer copies each finished block into the caller's C (``s_out``: DMA straight into a page-locked C, the
  diagonal blocks' triangles by 128-column panels, the panels' own diagonal blocks stored straight into it by a
  kernel that the worker queues on ``s_comp`` after the block's products where the GPU can reach C
  (cuda_tri_store), else through a page-locked buffer; C not page-locked: through the staging ring), and marks it
  written.

The streams of a GPU are a set that serves one call at a time and is kept for the next one: the pool's
arena of its compute stream keeps the call's arrays' blocks, so a call of the same shapes allocates no GPU
memory (cudaMalloc and cudaFree of the factors had cost 11-23 ms a call at n = 8192-16384); CuPy frees the
kept blocks when another allocation needs the memory. The set keeps the call's CUDA events too (_StreamSet). The
calling thread makes the GPUs' arrays before the jobs start. The layout
(band_plan.layout_for) is cached: where measured rates have moved past the kept one, it serves the call while a
worker thread makes the new one (a layout costs 6-42 ms of host time at n = 8192-16384); applies() hands the one
it checked to run() (RunOptions.bands).

C's old values (beta != 0) are uploaded after the operands and added to each block before its last product.
Only the triangle of C is written; the caller's other triangle is never touched.

A job that raises stops the call's other jobs. Out of GPU memory before anything was written: the call goes
to the tiled run, which shrinks its working set. Any other error: the GPU is left out of the Context (a
``DeviceFailureWarning``), the blocks not yet written are re-run by the tiled engine on the GPUs left, and
blocks whose copy into C had begun are torn (``DeviceFailure`` when C is read, beta != 0). A block part of whose k
another GPU computes (band_tail) is written by its own GPU once the part has been added: a fault on either leaves it
not yet written, and it is re-run.
"""
import math
import queue
import statistics
import threading
import time
import traceback
import warnings

import numpy as np

from .. import band_tail, cublas, cuda_transfer, downloads, host_pinning, plan, policy, workers
from ..band_outer import PEER_RATE, simulate
from ..band_plan import (ALIGN, CORNER_DIAG, device_bytes, layout_for, padded_rows, plain_speeds, rebuilding, region,
                         task_reads, upload_bytes)
from ..faults import DeviceFailure, DeviceFailureWarning
from ..kernels import compute_block
from ..problem import Operand, leading_dim
from . import cuda, cuda_direct, cuda_raw, cuda_tri_store

ENABLED = True            # module switch (benchmarks compare the tiled run on the same inputs)
STORE_ON_COMPUTE = True   # the diagonal blocks' store kernel on s_comp after their products (False: on s_out before
                          # their DMA, where it waited for SMs until the next product ended). 2 x H100, zgemmt
                          # n = k = 16384: blocks with a diagonal block went back at 7-11 GB/s, so at 30-45; the kernel
                          # takes 0.07-0.1 ms of s_comp a block; whole calls in turns: 0.99-1.015 x as long on s_out
RECT_COLUMNS = 768        # the corner order (gemmt, two factors): a block's rectangle as cuBLAS calls of about this
                          # many columns each (0: one call). One H100, zgemm A^H B, k = 16384: cuBLAS ran 1344 x 5312
                          # at 41 TF/s in one call, 53 in 768-column calls. 2 x H100, zgemmt in turns, one call over
                          # 768-column calls: 1.032 x as long at n = k = 16384, 1.045 x at 24576, 1.016 x at 8192 (640:
                          # like 768, 512 and 896: less gain); zher2k in 768-column calls took 1.039 x at 8192: other
                          # kinds make one call
RAW_CALLS = True          # the products' gemm and herk/syrk/her2k/syr2k calls from pointers and integers (cuda_raw;
                          # False: through kernels.compute_block's views and checks)
POLL = 0.05               # s: how often a wait looks whether the call is being stopped
UPLOAD_SHARE = 0.8        # bands only where the uploads take at most this share of compute plus write-back
ONE_GPU_MODEL = 1.25      # on one GPU, bands where their modelled time is within this many times the compute
SHARED_SHARE = 1.25       # the same on several GPUs that share pieces over peer access (the tiles' GPUs each
                          # upload what they read: 2 x H100, zgemmt 8192, bands 45 ms against tiles 59)
MIXES = True              # the corner order's bands from speeds less the diagonal blocks' cost their call measured
                          # (_mixes; benchmarks.blas band-settings compares CORNER_DIAG alone on the same inputs)
DIAG_WIDTHS = True        # the corner order's diagonal blocks at widths whose herkx fills whole waves of the GPUs' SMs
                          # (band_outer.diag_width; benchmarks.blas band-settings compares the widths as grown)
SIDE_DOTS = True          # a herkx's diagonal values (gemmt) on a second stream while the herkx runs (_Side): 2 x
                          # H100, zgemmt A^H B n = k = 8192, best of 10 calls 28.2 / 28.0 ms against 28.4 / 28.7 on
                          # the compute stream (GPU 0's diagonal blocks 37.5-37.9 TF/s against 32.2)
CALLER_UPLOADS = True     # the calling thread queues the pieces that go as one DMA each (_Call._queue_uploads;
                          # False: the feeders queue all of them). 2 x H100, n = k = 8192, turns of 3 calls, median of
                          # 18: zgemmt 29.3 ms against 30.7, zherk 28.1 against 29.2, zher2k 51.8 against 53.3 (all of
                          # them before the jobs start); with HEAD_PIECES and SPLIT_FIRST against neither: zgemmt 28.3 /
                          # 28.8, zherk 26.7 / 27.7, zher2k 51.7 / 53.8; 16384 zgemmt 186.4 / 187.4, zherk 189.8 / 190.7
HEAD_PIECES = 2           # ... of each GPU before the jobs start, the rest once they run (all before: the workers
                          # started 2.4-2.7 ms into zgemmt at 8192; medians 28.1, 26.5, 51.4 ms: within the noise)
SWITCH_INTERVAL = 2e-4    # s: Python's thread switch interval while a call runs (workers.short_switches; None: as it
                          # is, 5 ms by default): its threads each queue GPU work between short waits, and a thread of
                          # the caller's that runs Python without pause held the interpreter that long at every hand-
                          # over. 2 x H100, n = k = 8192 (benchmarks.blas busy-thread): such a thread slowed zgemmt and
                          # zherk 21.6-29.4 x with 5 ms, 2.3 x with 0.2 ms; quiet calls in turns, two processes each:
                          # zgemmt best 0.673 / 0.691 of Σ device with 0.2 ms against 0.687 / 0.681, zherk 0.758 /
                          # 0.736 against 0.737 / 0.721, at 16384 0.89-0.93 either way (within the noise)
TAIL_BALANCE = True       # a GPU that runs late hands the last part of k of one of its last blocks to the GPU that
                          # will be free first (band_tail; C's old values not read, GPUs with peer access)
TAIL_POLL = 1e-4          # s: how often a worker looks whether its block two back has ended (band_tail's pace)
TRACE = False             # each call's timeline in cuda.last_stats (_timeline): timing events around every upload
                          # and peer copy (benchmarks.blas band-trace)
_DOUBLE = (np.dtype(np.float64), np.dtype(np.complex128))


class _Stop(Exception):
    """Another job of the call failed: this one stops."""


def applies(problem, devices, rates, ctx):
    """Host operands and host C in double precision on GPUs only, no fixed block, memory cap, emulation, sync
    mode or dynamic strategy asked for, not a tall-skinny Gram product, uploads that compute can hide, and
    every GPU able to hold the factors and its band."""
    if not ENABLED or ctx.sync or ctx.block_size or problem.run.emulation or getattr(ctx, "memory_limit", None):
        return False
    if ctx.strategy == "dynamic":       # a block queue asked for
        return False
    if not devices or any(not isinstance(d, cuda.CUDADevice) or d.block or d.memory_limit for d in devices):
        return False
    if problem.fxp is not np or problem.xp is not np or problem.dtype not in _DOUBLE:
        return False
    if min(problem.m, problem.n, problem.k) == 0 or policy.wants_split_k(problem, len(devices)):
        return False
    if problem.kind == "gemmt" and cuda_direct.rank_kx(problem, beta=1.0) is None:
        return False
    lay, shared, speeds, mixes = _layout(problem, devices, rates, ctx, checked=True)
    if lay is None:
        return False
    problem.run.bands = (_names(devices), list(rates), lay, shared, speeds, mixes)
    return True


def _layout(problem, devices, rates, ctx, checked=False):
    """The call's layout (band_plan.layout_for, cached), whether its GPUs share pieces, their flop rates (_speeds)
    and corner mixes (_mixes).
    ``checked``: the layout only where its uploads hide and it fits (else None); a layout kept for rates that have
    moved serves where it passes that check while a worker makes the new one (it decides nothing otherwise: the
    call makes one for its own rates)."""
    shared = _peer_access([d.index for d in devices])
    speeds = _speeds(problem, devices, rates, ctx)

    def usable(lay):
        return _hides_uploads(problem, devices, ctx, lay, shared, speeds) and _fits(problem, devices, lay)
    mixes = _mixes(problem, devices, ctx)
    lay = layout_for(problem, list(rates), _rate(ctx, devices, "d2h_pinned"), _rate(ctx, devices, "h2d_pinned"),
                     shared=shared, speeds=speeds, mixes=mixes,
                     sms=_sms(devices) if DIAG_WIDTHS else None, ahead=usable if checked else None)
    return (lay if not checked or usable(lay) else None), shared, speeds, mixes


def _hides_uploads(problem, devices, ctx, layout, shared, speeds):
    """The k order finishes a block only once all of k has landed, so its write-back cannot run under the
    uploads as the tiles' can: bands win where the uploads take at most UPLOAD_SHARE of the compute and
    write-back (SHARED_SHARE on GPUs that share pieces). Measured on 2 x H100, complex128, n = k, steady state:
    zgemmt (two factors) on one GPU at n = 8192 took 82 ms by bands, 58 by tiles; at 16384 391 against 404;
    zherk at 8192 48 against 50, two GPUs 28 against 47. The uploads go at the links' rate times the share
    their DMA segments reach in ``layout``."""
    link, d2h = _rate(ctx, devices, "h2d_pinned"), _rate(ctx, devices, "d2h_pinned")
    if len(devices) == 1 and not model_within(problem, layout, speeds, link, d2h):
        return False
    return uploads_hide(problem, len(devices), shared or len(devices) == 1, speeds, link * layout.upload_share(),
                        d2h)


def model_within(problem, layout, speeds, h2d, d2h):
    """On one GPU the tiles overlap their uploads with compute as well as bands do when the uploads take about
    as long: bands only where their modelled time (band_outer.simulate; the layout's own where layout_for made
    it, at rates within its RATE_SLACK) is within ONE_GPU_MODEL of the compute.
    zgemmt on one H100: at n = 8192 (uploads 39 ms, compute 40) the corner order is modelled at 1.17 x the compute
    and measured 52-57 ms against the tiles' 58-59 (the column blocks: 1.34 x, the k order 82 ms); at 16384 1.04 x,
    365-370 ms against 398-401; at 4096 1.96 x: the tiles."""
    modelled = layout.modelled if layout.modelled is not None else simulate(layout, speeds, h2d, d2h)
    return modelled <= ONE_GPU_MODEL * problem.flops() / sum(speeds)


def uploads_hide(problem, n_gpu, shared, speeds, h2d, d2h):
    """The rule of _hides_uploads on numbers: ``n_gpu`` GPUs at flop/s ``speeds``, copies at ``h2d`` and ``d2h``
    bytes/s per GPU, the uploads spread over the GPUs' links when they share pieces (``shared``: peer access),
    each GPU uploading everything otherwise; C's old values (beta != 0) are uploaded too. Several GPUs that
    share pieces take SHARED_SHARE instead of UPLOAD_SHARE."""
    item = problem.dtype.itemsize
    c_bytes = (problem.n * (problem.n + 1) // 2 if problem.triangular else problem.m * problem.n) * item
    up_bytes = upload_bytes(problem) + (c_bytes if problem.beta != 0 else 0)
    upload = up_bytes / (n_gpu if shared else 1) / h2d
    compute = problem.flops() / sum(speeds)
    writeback = c_bytes / n_gpu / d2h
    return upload <= (SHARED_SHARE if n_gpu > 1 and shared else UPLOAD_SHARE) * (compute + writeback)


def _sms(devices):
    """The fewest streaming multiprocessors among the GPUs ``devices`` (None where CUDA does not say)."""
    import cupy
    counts = []
    for d in devices:
        with _sms_lock:
            if d.index not in _sm_counts:
                try:
                    _sm_counts[d.index] = cupy.cuda.runtime.deviceGetAttribute(MULTIPROCESSOR_COUNT, d.index)
                except Exception:       # noqa: BLE001 - a runtime without the attribute: the widths as grown
                    _sm_counts[d.index] = None
            counts.append(_sm_counts[d.index])
    return None if not counts or None in counts else min(counts)


def _speeds(problem, devices, rates, ctx):
    """flop/s the model takes for each GPU (and the bands follow): the Context's explicit rate, else what earlier
    calls measured where every GPU without an explicit rate has a measurement (a measured GPU beside one at the
    default rate took 56 % of zgemmt's flops on two H200s, its kernels 27 ms against 19), else the rate the
    scheduler was given."""
    size = (problem.n, problem.k, len(devices))
    measured = [None if d.name in ctx.rates else calibrated(d, problem.kind, size) for d in devices]
    if any(m is None for d, m in zip(devices, measured) if d.name not in ctx.rates):
        return list(rates)
    return [r if m is None else m for r, m in zip(rates, measured)]


def _mixes(problem, devices, ctx):
    """Per GPU (its diagonal blocks' rate over its other products', their share of its flops) as the last
    corner-order call measured them where every GPU's speed is a measured one (_speeds), else None."""
    if not MIXES or any(d.name in ctx.rates for d in devices):
        return None
    size = (problem.n, problem.k, len(devices))
    mixes = [calibrated(d, ("mix", problem.kind), size) for d in devices]
    if any(m is None or calibrated(d, problem.kind, size) is None for d, m in zip(devices, mixes)):
        return None
    return mixes


def _fits(problem, devices, layout):
    """Every GPU with a band has room for the factors and its band's box (twice with C's old values): free blocks
    its memory pool already holds (an earlier call's arrays, kept for the next: the call then holds no more of the
    GPU than that one did), else within its budget (cuda.budget, which keeps cuda.RESERVE free for cuBLAS; its
    device memory query took 0.05-0.1 ms a GPU on the calling thread, before the call's first upload)."""
    import cupy
    totals, factors = device_bytes(problem, None, edges=layout.edges)
    for d, total in zip(devices, totals):
        if not total:                   # an empty band holds nothing
            continue
        need = total + (total - factors if problem.beta != 0 else 0)
        with cupy.cuda.Device(d.index):
            pool = cupy.get_default_memory_pool()
            capped = d.memory_limit or problem.run.memory_limit or pool.get_limit()
            if not capped and need <= pool.free_bytes():
                continue
            if need > cuda.budget(d, problem):
                return False
    return True


def run(problem, devices, rates, ctx, reserves=()):
    """Compute the call; returns False when it must go to the tiled run instead (out of GPU memory before
    anything was written), True when done."""
    try:
        call = _Call(problem, devices, rates, ctx)
    except Exception as exc:            # noqa: BLE001 - out of memory or a CUDA error making streams: the tiles
        if _is_memory(exc) or type(exc).__name__ == "CUDARuntimeError":
            return False
        raise
    if not call.prepared and not _fits(problem, devices, call.layout):     # a layout applies() did not check
        call.abandon()
        return False
    return call.execute(reserves)


class _Board:
    """Which pieces have been queued for upload: a piece's event (on its owner's ``s_in``) once posted. Each piece
    has a gate, a lock held until the piece is posted, which every waiter takes and hands on (a threading.Event a
    piece, 43 of them for zgemmt at n = 8192 on two GPUs, took the calling thread ~0.09 ms to make before its first
    upload; a lock a piece, 6 us)."""

    def __init__(self, count, stop):
        self.events = [None] * count
        self.gates = [threading.Lock() for _ in range(count)]
        for gate in self.gates:
            gate.acquire()
        self.stop = stop

    def post(self, index, event):
        self.events[index] = event
        self.gates[index].release()

    def wait(self, index):
        gate = self.gates[index]
        while not gate.acquire(timeout=POLL):
            if self.stop.is_set():
                raise _Stop()
        gate.release()                  # open for the piece's other waiters
        return self.events[index]


class _Gpu:
    """One GPU's part of the call: streams, the factors' copies, its band's box of C, its blocks' states."""

    def __init__(self, cp, slot, device, layout):
        self.slot, self.device = slot, device
        self.dev = cp.cuda.Device(device.index)
        self.set = _take_streams(cp, device.index)
        self.settled = False                     # every stream of the set finished (_Call._settle)
        self.s_in, self.s_peer, self.s_comp, self.s_out = self.set
        self.factors, self.box, self.old = None, None, None
        self.blocks = layout.blocks[slot]
        self.state = ["pending"] * len(self.blocks)     # -> "touched" (copy into C begun) -> "written"
        self.stats = {"bytes_from_host": 0, "bytes_from_peer": 0, "bytes_to_host": 0}
        self.kernel_events = []                  # (start, end, class, flops, task over its k range) of each product
        self.upload_events = None                # (start, end) around this GPU's uploads of pieces
        self.first_upload = None                 # the start event of those
        self.fed = 0                             # how many of its pieces the calling thread queued
        self.copy_events = []                    # (start, end, block) around each block's copy into C (DMA)
        self.times, self.copy_times = [], []     # seconds of the products and copies ended so far (_harvest)
        self.piece_events = []                   # ("upload" | "peer", piece index, start, end, host seconds after the
                                                 # call began when queued) of each piece it moved
        self.queued = []                         # host seconds after the call began when each product was queued
                                                 # (TRACE)
        self.host_marks = []                     # (what, host seconds after the call began, thread) of the host
                                                 # threads' steps for this GPU (TRACE)
        self.open_event = None
        self.marks = {}                          # host seconds after the call began: first upload, first product
        self.writes = queue.SimpleQueue()
        self.ring_in = self.ring_out = None
        self.old_ready = []                      # per block: event after C's old values landed (beta != 0)
        self.ends = []                           # per block queued: event after its products on s_comp
        self.have = set()                        # indices of the pieces gathered onto this GPU
        self.lane = None                         # band_tail.Lane over its last blocks (TAIL_BALANCE)
        self.old_posted = threading.Semaphore(0)
        self.summary = None                      # _Call._summary, made by the writer once all is done

    def streams(self):
        return self.set.all()


class _Call:
    def __init__(self, problem, devices, rates, ctx):
        import cupy
        self.cp = cupy
        self.problem, self.devices, self.ctx = problem, list(devices), ctx
        self.rates = list(rates)
        known, problem.run.bands = problem.run.bands, None      # a layout may refer to the problem: no cycle kept
        self.prepared = known is not None and known[:2] == (_names(devices), self.rates)
        self.layout, self.shared, self.speeds, self.mixes = (known[2:] if self.prepared
                                                             else _layout(problem, self.devices, self.rates, ctx))
        self.columns = rect_columns(self.layout)        # the rectangles' cuBLAS calls' width (queue_product)
        self.stop = threading.Event()
        self.board = _Board(len(self.layout.pieces), self.stop)
        self.errors = []
        self.lock = threading.Lock()
        self.gpus = []
        try:
            for g, d in enumerate(devices):
                self.gpus.append(_Gpu(cupy, g, d, self.layout))
        except BaseException:
            self.abandon()
            raise
        self.pins = [None] * len(self.layout.uniques)
        self.pin_c = None
        self.direct = [False] * len(self.layout.uniques)    # per unique factor: page-locked (DMA) this call
        self.direct_c = False
        self.first_dma = False          # the first call to copy one of its arrays by DMA: not calibrated
        self.pin_pending = False        # an operand or C being page-locked: the call stages it, later ones will not
        self.first_use = False          # the layout's first call to run: its shapes' kernels load, no rates
        self.beside_build = rebuilding()    # a layout being made beside the call: its products were queued late
        self.parts = []                     # band_tail parts handed between GPUs (buffers kept until _release)
        self.balance = None                 # _execute makes it once the first uploads are queued (_balance)

    def _balance(self):
        """The call's band_tail.Balance, each GPU's band_tail.Lane (its blocks' modelled seconds) set, or None: one
        GPU, no peer access, or C's old values read (each block's are added before its last product)."""
        p, lay = self.problem, self.layout
        if len(self.gpus) < 2 or not self.shared or p.beta != 0:
            return None
        self.d2h = _rate(self.ctx, self.devices, "d2h_pinned")     # write-back bytes/s (band_plan.write_bytes')
        corner = lay.corner and lay.order == "outer"
        self.rates_by_class = []                 # per GPU: (flop/s of its diagonal blocks, of its other products)
        for g, plain in enumerate(plain_speeds(self.speeds, self.mixes)):
            ratio = self.mixes[g][0] if self.mixes else (CORNER_DIAG if corner else 1.0)
            self.rates_by_class.append((plain * ratio, plain))
        for g, gpu in enumerate(self.gpus):
            gpu.lane = band_tail.Lane(g, [self._seconds(block, g) for block in gpu.blocks])
        return band_tail.Balance(len(self.gpus))

    def _seconds(self, tasks, g):
        """Modelled seconds of ``tasks`` over the final range of k on GPU slot ``g``."""
        k0, k1 = self.layout.final
        diag, plain = self.rates_by_class[g]
        return sum(t.flops * (k1 - k0) / self.problem.k / max(diag if t.diag else plain, 1.0) for t in tasks)

    # ------------------------------------------------------------------ the call
    def abandon(self):
        """Hand back the stream sets of a call that queued nothing."""
        for gpu in self.gpus:
            if gpu.set is not None:
                _give_streams(gpu.device.index, gpu.set)
                gpu.set = None

    def execute(self, reserves):
        with workers.short_switches(SWITCH_INTERVAL):
            return self._execute(reserves)

    def _execute(self, reserves):
        t0 = self.t0 = time.perf_counter()
        self.first_use = self.layout.calls == 0         # counted here: an abandoned call ran nothing
        self.layout.calls += 1
        jobs = []
        try:
            self._pin()
            self._take_rings()
            for gpu in self.gpus:       # in this thread: the uploads start before any job runs
                self._mark(gpu, "rings")
                if self.layout.band_tasks[gpu.slot] and not self.stop.is_set():
                    self._guard(gpu, self._allocate, Exception)
                self._mark(gpu, "allocated")
            mine = self._caller_feeds()
            self._queue_uploads(mine, HEAD_PIECES)
            if TAIL_BALANCE and not self.stop.is_set():     # under the first uploads: the jobs read it
                self.balance = self._balance()
            for gpu in self.gpus:
                self._mark(gpu, "jobs")
            if not self.stop.is_set():
                jobs += [workers.start(self._guard, gpu, self._feed, name="feeder") for gpu in self.gpus
                         if gpu.slot not in mine]
                for role, name in ((self._work, "device"), (self._write, "writer")):
                    jobs += [workers.start(self._guard, gpu, role, name=name) for gpu in self.gpus]
            for gpu in self.gpus:
                self._mark(gpu, "started")
            self._queue_uploads(mine)
            for job in jobs:
                job.wait()
        except BaseException:
            self.stop.set()
            try:
                _join(jobs)
            finally:
                try:
                    self._settle()
                finally:
                    self._release()
            raise
        self._settle()
        try:
            if not self.errors:
                self._record_stats(t0)
        finally:
            self._release()
        if not self.errors:
            return True
        return self._recover(reserves)

    def _guard(self, gpu, fn, catch=BaseException):
        """Run a job's ``fn(gpu)`` on its GPU; an error is the call's (it stops the other jobs). In the calling
        thread ``catch`` is Exception: an interrupt there is no GPU's error, execute stops the call and raises it."""
        try:
            with gpu.dev:
                fn(gpu)
        except _Stop:
            pass
        except catch as exc:                # noqa: BLE001 - handed to the caller's thread
            traceback.clear_frames(exc.__traceback__)      # kept by the Context: not the GPU arrays its frames held
            with self.lock:
                self.errors.append((gpu, exc))
            self.stop.set()

    def _check(self, gpu):
        if self.stop.is_set():
            raise _Stop()
        self.ctx.fault_check(gpu.device)

    # ------------------------------------------------------------------ host memory
    def _pin(self):
        """Page-lock the operands and C as the Context's policy says (hybridblas.host_pinning)."""
        p = self.problem
        if not p.run.pin_host:
            return
        after = 1 if p.run.pin_host == "auto" else 0
        for u, f in enumerate(self.layout.uniques):
            fac = p.factors[f]
            if not fac.scratch:
                self.pins[u] = host_pinning.acquire(fac.base, after_uses=after, call=p.run.call)
        if p.writeback is None:
            self.pin_c = host_pinning.acquire(p.c, after_uses=after, call=p.run.call)
        self.direct = [host_pinning.is_ready(pin) for pin in self.pins]
        self.direct_c = host_pinning.is_ready(self.pin_c)
        self.first_dma = any([host_pinning.first_direct_use(pin) for pin in self.pins + [self.pin_c]])
        self.pin_pending = any(pin is not None and not host_pinning.is_ready(pin) for pin in self.pins + [self.pin_c])

    def _take_rings(self):
        """The staging rings this call needs, all of them or none: a call never holds one GPU's ring while it
        waits for another's (its GPUs depend on each other's uploads; a tiled call holds a GPU's rings while
        its other GPUs wait for theirs), so calls waiting for rings cannot wait for each other."""
        old = self.problem.beta != 0
        wanted = []
        for gpu in self.gpus:
            if not self.layout.band_tasks[gpu.slot]:
                continue
            owned = {piece.factor for piece in self.layout.uploads(gpu.slot)}
            if any(not self.direct[u] for u in owned) or (old and not self.direct_c):
                wanted.append((gpu, "in"))
            if not self.direct_c:
                wanted.append((gpu, "out"))
        while wanted:
            taken = []
            for gpu, which in wanted:
                ring = gpu.device.ring_pool(which).take(timeout=0 if taken else POLL)
                if ring is None:
                    break
                taken.append((gpu, which, ring))
            else:
                for gpu, which, ring in taken:
                    setattr(gpu, f"ring_{which}", ring)
                return
            for gpu, which, ring in taken:
                gpu.device.ring_pool(which).give(ring)

    def _release(self):
        """Rings back to their GPUs, the arrays' memory back to the device (after _settle), pins released."""
        for gpu in self.gpus:
            for which, ring in (("in", gpu.ring_in), ("out", gpu.ring_out)):
                gpu.device.ring_pool(which).give(ring)
            gpu.ring_in = gpu.ring_out = None
            gpu.factors = gpu.box = gpu.old = None
            if gpu.set is None:
                continue
            if not gpu.settled:     # work may still be queued on it (an interrupt during _settle, a stream
                _unsettled.append(gpu.set)      # that failed): never reused, nor its arena's blocks
            elif not any(g is gpu for g, _ in self.errors):
                _give_streams(gpu.device.index, gpu.set)    # its arena keeps the blocks for the next call
            else:
                try:                # streams of a GPU that failed are dropped, and their arena's blocks freed
                    with gpu.dev:
                        self.cp.get_default_memory_pool().free_all_blocks(stream=gpu.s_comp)
                except Exception:   # noqa: BLE001 - a GPU in an error state: the blocks stay in the pool
                    pass
                gpu.set.close()
            gpu.set = None
        self.parts = []
        for pin in self.pins + [self.pin_c]:
            host_pinning.release(pin)
        self.pins, self.pin_c = [None] * len(self.pins), None

    def _settle(self):
        """Wait for every stream of the call (after an error too: nothing may still copy into C). A GPU whose
        streams all finished is ``settled`` (its stream set may serve another call)."""
        for gpu in self.gpus:
            failed = None
            for s in gpu.streams():
                try:
                    s.synchronize()
                except Exception as exc:     # noqa: BLE001 - reported with the GPU's errors
                    failed = failed or exc
            gpu.settled = failed is None
            if failed is not None and not any(g is gpu for g, _ in self.errors):
                self.errors.append((gpu, failed))

    # ------------------------------------------------------------------ jobs
    def _allocate(self, gpu):
        """The GPU's arrays, from the pool's arena of the compute stream of this call's stream set: memory no
        other caller's pending work may use (a set serves one call at a time, and a call hands its set back
        only after every stream of it has finished; blocks from a shared arena, the default stream's, could
        still be read by another caller's queued kernels while this call's copy streams write them). The
        blocks stay in that arena for the next call that takes the set: no cudaMalloc per call."""
        cp, p, lay = self.cp, self.problem, self.layout
        with gpu.s_comp:
            gpu.factors = [_padded(cp, p.factors[f].base.shape, p.dtype) for f in lay.uniques]
            r0, r1, c0, c1 = lay.boxes[gpu.slot]
            gpu.box = _padded(cp, (r1 - r0, c1 - c0), p.dtype)
            if p.beta != 0:
                gpu.old = _padded(cp, (r1 - r0, c1 - c0), p.dtype)

    def _caller_feeds(self):
        """The slots of the GPUs whose uploads the calling thread queues (CALLER_UPLOADS): each piece one DMA from
        page-locked operands, no C's old values to upload. The others' feeders queue theirs (the calling thread
        still queues their first HEAD_PIECES that go by DMA)."""
        if not CALLER_UPLOADS:
            return set()
        return {gpu.slot for gpu in self.gpus if gpu.factors is not None and gpu.old is None
                and all(self.direct[x.factor] for x in self.layout.uploads(gpu.slot))}

    def _queue_uploads(self, mine, count=None):
        """In the calling thread: the pieces of the GPUs of ``mine`` (all of them, or their next ``count``), and
        before the jobs start (``count`` given) every other GPU's first ``count`` that go by DMA, in upload order,
        the GPUs in turn piece by piece, so that every link starts at once. Each GPU's feeder had queued its first
        upload 0.5-1.3 ms after the call began, while six jobs started; with the calling thread queueing all
        pieces before the jobs started, the workers started 2.4-2.7 ms after it (2 x H100, zgemmt n = k = 8192:
        43 pieces)."""
        if not CALLER_UPLOADS:
            return
        owned = {gpu.slot: self.layout.uploads(gpu.slot) for gpu in self.gpus
                 if gpu.slot in mine or (count is not None and gpu.factors is not None)}
        until = {slot: len(pieces) if count is None else min(len(pieces), self.gpus[slot].fed + count)
                 for slot, pieces in owned.items()}
        while owned and not self.stop.is_set():
            for slot, pieces in list(owned.items()):
                gpu = self.gpus[slot]
                piece = pieces[gpu.fed] if gpu.fed < until[slot] else None
                if piece is None or not self.direct[piece.factor]:     # staged: the feeder queues it and the rest
                    del owned[slot]
                    continue
                self._guard(gpu, lambda g, x=piece: self._upload_piece(g, x), Exception)
                gpu.fed += 1
        if count is None:
            for gpu in self.gpus:
                if gpu.slot in mine and gpu.first_upload is not None and not self.stop.is_set():
                    self._guard(gpu, self._uploads_queued, Exception)

    def _uploads_queued(self, gpu):
        """Every piece the GPU owns is queued: the event after them closes upload_events."""
        gpu.upload_events = (gpu.first_upload, gpu.set.event(gpu.s_in, timing=True))

    def _upload_piece(self, gpu, piece):
        """Queue one piece's upload on the GPU's s_in and post its event on the board."""
        p, lay = self.problem, self.layout
        if gpu.first_upload is None:
            gpu.first_upload = gpu.set.event(gpu.s_in, timing=True)
        rows, cols = region(lay, piece.factor, piece.o0, piece.o1, piece.k0, piece.k1)
        src = p.factors[lay.uniques[piece.factor]].base[rows, cols]
        start = gpu.set.event(gpu.s_in, timing=True) if TRACE else None
        self._mark(gpu, "upload", piece.index)
        self._upload(gpu, gpu.factors[piece.factor][rows, cols], src, self.direct[piece.factor])
        self._mark(gpu, "uploaded", piece.index)
        gpu.marks.setdefault("host_first_upload_s", time.perf_counter() - self.t0)
        gpu.stats["bytes_from_host"] += piece.nbytes
        end = gpu.set.event(gpu.s_in, timing=TRACE)
        if TRACE:
            gpu.piece_events.append(("upload", piece.index, start, end, time.perf_counter() - self.t0))
        self.board.post(piece.index, end)

    def _feed(self, gpu):
        """Upload the pieces this GPU owns (k order) that the calling thread left, then C's old values of its
        blocks (beta != 0)."""
        p = self.problem
        owned = self.layout.uploads(gpu.slot)
        for piece in owned[gpu.fed:]:
            if self.stop.is_set():
                raise _Stop()
            self._upload_piece(gpu, piece)
        if owned and gpu.upload_events is None:
            self._uploads_queued(gpu)
        if gpu.old is None:
            return
        for tasks in gpu.blocks:
            for t in tasks:
                self._upload(gpu, self._view(gpu, gpu.old, t), p.c[t.i0:t.i1, t.j0:t.j1], self.direct_c)
            gpu.old_ready.append(gpu.set.event(gpu.s_in))
            gpu.old_posted.release()

    def _upload(self, gpu, dst, src, direct):
        if direct and src.flags.f_contiguous and dst.flags.f_contiguous:     # one linear DMA
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, gpu.s_in.ptr)
            return
        cuda_transfer.upload(dst, src, gpu.ring_in, gpu.s_in, direct=direct)

    def _work(self, gpu):
        """Gather each step's pieces, queue the band's products along k, then the final blocks; over the last blocks
        hand part of one to another GPU or take such parts (TAIL_BALANCE), and finish the blocks handed out."""
        p, lay = self.problem, self.layout
        tasks = lay.band_tasks[gpu.slot]
        if not tasks:                   # an empty band (a tiny C): nothing to hold, upload or write
            if self.balance is not None:
                self.balance.close(gpu.slot)
            gpu.writes.put(None)
            return
        gpu.marks["host_worker_s"] = time.perf_counter() - self.t0
        self._mark(gpu, "worker")
        try:
            self._check(gpu)
            gpu.open_event = gpu.set.event(gpu.s_comp, timing=True)
            gpu.marks["host_open_s"] = time.perf_counter() - self.t0
            backend = cublas.Backend(gpu.set.comp_handle(), gpu.s_comp)
            self._mark(gpu, "backend")
            operands = [Operand(gpu.factors[lay.factor_of[f]], fac.op) for f, fac in enumerate(p.factors)]
            kx = cuda_direct.rank_kx(p, operands, beta=1.0) if p.kind == "gemmt" else None
            side = _Side.make(gpu.set) if SIDE_DOTS and kx is not None and kx[0] == "herkx" else None
            raw = cuda_raw.Calls.make(backend.handle, p, operands) if RAW_CALLS else None
            kit = (backend, operands, kx, side, raw)
            self._mark(gpu, "side")
            for n_step, (k0, k1) in enumerate(lay.steps):
                self._check(gpu)
                self._gather(gpu, lay.pieces_for(gpu.slot, k0, k1))
                for t in tasks:
                    self._product(gpu, kit, t, k0, k1, 0.0 if n_step == 0 else 1.0, "step")
            given = self._blocks(gpu, kit)
        finally:
            if self.balance is not None:
                self.balance.close(gpu.slot)
        self._serve(gpu, kit)
        for part in given:              # each handed to the writer by its taker before the writer's end
            while not part.handed.wait(POLL):
                if self.stop.is_set():
                    raise _Stop()
            gpu.stats["bytes_from_peer"] += part.landed.nbytes
        gpu.writes.put(None)

    def _blocks(self, gpu, kit):
        """Queue the final range's blocks (each handed to the writer), a part of one of the last blocks' k to another
        GPU where band_tail says so; the parts handed out."""
        lay = self.layout
        k0, k1 = lay.final
        stepped = bool(lay.steps)
        given = []
        for b, block in enumerate(gpu.blocks):
            self._check(gpu)
            self._gather(gpu, [lay.pieces[i] for i in lay.block_pieces[gpu.slot][b]])
            beta = 1.0 if stepped else 0.0
            if gpu.old is not None:
                self._add_old(gpu, b, block, stepped)
                beta = 1.0
            part = self._pace(gpu, b) if gpu.lane is not None and b >= gpu.lane.first else None
            cut = k1 if part is None else part.k0
            for t in block:
                self._product(gpu, kit, t, k0, cut, beta, "final")
            if part is not None:            # its taker finishes it (_finish_part) once this GPU's share is done
                part.own = gpu.set.event(gpu.s_comp)
                gpu.ends.append(part.own)
                given.append(part)
                self.balance.inbox[part.taker].put(part)
                continue
            stored = self._store_diagonals(gpu, b, block)
            end = gpu.set.event(gpu.s_comp)
            gpu.ends.append(end)
            gpu.writes.put((b, end, stored))
        return given

    # ------------------------------------------------------------------ the end in balance (band_tail)
    def _pace(self, gpu, b):
        """Before block b of the last ones (band_tail.Lane): wait until block b - 2 has ended, report when this GPU's
        work will end, and where b may give, the part of its k to hand to the GPU free first, or None."""
        if b >= 2:
            self._wait_event(gpu.ends[b - 2])
        lay = self.layout
        k0, k1 = lay.final
        block = gpu.blocks[b]
        after = 0.0
        if b >= gpu.lane.give_from:                                 # what a split adds at the end
            r0, r1, c0, c1 = _Part.bounds(block)
            after = (r1 - r0) * (c1 - c0) * lay.item / PEER_RATE    # the part's copy back
            if b < len(gpu.blocks) - 1:                             # its write-back, after the last block's compute
                after += sum(lay.write_bytes(t) for t in block) / self.d2h
        decision = gpu.lane.step(self.balance, b, time.perf_counter(), lambda t: self._taker_s(block, t), k0, k1,
                                 ALIGN, after)
        if decision is None:
            return None
        taker, cut = decision
        part = _Part(gpu.slot, taker, b, block, cut, k1)
        gpu.stats.setdefault("given", []).append((b, cut, k1, self.gpus[taker].device.name))
        with self.lock:
            self.parts.append(part)
        return part

    def _taker_s(self, tasks, t):
        """Modelled seconds of ``tasks`` over the final range on GPU slot ``t`` at its pace so far."""
        return self._seconds(tasks, t) * self.gpus[t].lane.pace.factor()

    def _wait_event(self, event):
        while not event.done:
            if self.stop.is_set():
                raise _Stop()
            time.sleep(TAIL_POLL)

    def _serve(self, gpu, kit):
        """Compute the parts other GPUs hand this one, until none can come any more."""
        bal = self.balance
        if bal is None or bal.giver[gpu.slot]:
            return
        inbox = bal.inbox[gpu.slot]
        while True:
            try:
                part = inbox.get(timeout=POLL)
            except queue.Empty:
                if self.stop.is_set():
                    raise _Stop() from None
                continue
            if part is None:            # every GPU has closed (Balance.close): no part comes after
                return
            self._take_part(gpu, kit, part)

    def _take_part(self, gpu, kit, part):
        """A part of another GPU's block: the factor rows it reads that this GPU lacks (from the GPUs that uploaded
        them), its products into a buffer of this GPU's, then the block finished on its own GPU (_finish_part)."""
        self._check(gpu)
        p, lay = self.problem, self.layout
        reads = task_reads(p, lay.factor_of, part.tasks)
        self._gather(gpu, [x for x in band_tail.pieces_over(lay.pieces, reads, part.k0, part.k1)
                           if x.index not in gpu.have])
        r0, r1, c0, c1 = part.box
        with gpu.s_comp:
            part.buffer = _padded(self.cp, (r1 - r0, c1 - c0), p.dtype)
        for t in part.tasks:
            out = part.buffer[t.i0 - r0:t.i1 - r0, t.j0 - c0:t.j1 - c0]
            self._product(gpu, kit, t, part.k0, part.k1, 0.0, "part", out=out)
        part.event = gpu.set.event(gpu.s_comp)
        gpu.stats.setdefault("taken", []).append((self.gpus[part.slot].device.name, part.b, part.k0, part.k1))
        self._finish_part(part)

    def _finish_part(self, part):
        """In the taker's thread, on the giver's part stream (s_part: beside the giver's next blocks on s_comp, so
        the block's write-back overlaps them): once the giver's share and the part are done, copy the part over,
        add it to the block in the giver's box, store its diagonal panels (cuda_tri_store), and hand the block to the
        giver's writer. An error here is the giver's."""
        giver = self.gpus[part.slot]
        r0, r1, c0, c1 = part.box
        try:
            with giver.dev:
                stream = giver.set.s_part
                with stream:
                    part.landed = _padded(self.cp, (r1 - r0, c1 - c0), self.problem.dtype)
                stream.wait_event(part.own)
                stream.wait_event(part.event)
                cuda_transfer.copy_2d(part.landed, part.buffer, stream)
                with stream:
                    for t in part.tasks:
                        out = self._view(giver, giver.box, t)
                        out += part.landed[t.i0 - r0:t.i1 - r0, t.j0 - c0:t.j1 - c0]
                stored = self._store_diagonals(giver, part.b, part.tasks, stream)
                done = self.cp.cuda.Event(disable_timing=True)      # not the set's: the giver's threads record those
                done.record(stream)
        except Exception as exc:        # noqa: BLE001 - the giver's device failed: its error, not the taker's
            traceback.clear_frames(exc.__traceback__)
            with self.lock:
                self.errors.append((giver, exc))
            self.stop.set()
            raise _Stop() from None
        giver.writes.put((part.b, done, stored))
        part.handed.set()

    def _store_diagonals(self, gpu, b, block, stream=None):
        """The diagonal tasks of a finished block whose panels' diagonal blocks a kernel stores straight into a
        page-locked C the GPU reaches (cuda_tri_store.queue_diagonals), queued on s_comp right after the block's
        products, so that it takes its turn between products instead of waiting for SMs on s_out; the writer
        sends the rest of those triangles by DMA. The tasks so queued (their block is 'touched' from here on)."""
        if not (self.direct_c and STORE_ON_COMPUTE):
            return ()
        p = self.problem
        out = []
        for t in block:
            if not t.diag:
                continue
            dst = p.c[t.i0:t.i1, t.j0:t.j1]
            where = cuda_tri_store.address(self.cp, dst)
            if where is not None:
                gpu.state[b] = "touched"
                cuda_tri_store.queue_diagonals(self.cp, dst, where, self._view(gpu, gpu.box, t), p.lower,
                                               gpu.s_comp if stream is None else stream)
                out.append(t)
        return tuple(out)

    def _gather(self, gpu, pieces):
        """Make s_comp wait until ``pieces`` (that this GPU reads) are on it."""
        lay = self.layout
        for piece in pieces:
            self._mark(gpu, "wait", piece.index)
            ev = self.board.wait(piece.index)
            self._mark(gpu, "posted", piece.index)
            gpu.have.add(piece.index)
            if piece.owner == gpu.slot:
                gpu.s_comp.wait_event(ev)
                continue
            rows, cols = region(lay, piece.factor, piece.o0, piece.o1, piece.k0, piece.k1)
            owner = self.gpus[piece.owner]
            gpu.s_peer.wait_event(ev)
            start = gpu.set.event(gpu.s_peer, timing=True) if TRACE else None
            dst, src = gpu.factors[piece.factor][rows, cols], owner.factors[piece.factor][rows, cols]
            if dst.flags.f_contiguous and src.flags.f_contiguous:          # one linear copy (copy engines)
                rt = self.cp.cuda.runtime
                rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDefault, gpu.s_peer.ptr)
            else:
                cuda_transfer.copy_2d(dst, src, gpu.s_peer)
            gpu.stats["bytes_from_peer"] += piece.nbytes
            end = gpu.set.event(gpu.s_peer, timing=TRACE)
            if TRACE:
                gpu.piece_events.append(("peer", piece.index, start, end, time.perf_counter() - self.t0))
            gpu.s_comp.wait_event(end)

    def _product(self, gpu, kit, task, k0, k1, beta, phase, out=None):
        """Queue ``task``'s product over k range [k0, k1) on s_comp into ``out`` (default: its place in the GPU's box);
        ``kit``: (backend, the GPU's operands, rank_kx, _Side or None, cuda_raw.Calls or None)."""
        backend, operands, kx, side, raw = kit
        p = self.problem
        part = plan.with_k(task, p, k0, k1)
        out = self._view(gpu, gpu.box, task) if out is None else out
        start = gpu.set.event(gpu.s_comp, timing=True)
        self._mark(gpu, "product")
        with gpu.s_comp:
            queue_product(backend, p, operands, kx, part, out, beta, side, self.columns, raw)
        gpu.marks.setdefault("host_first_product_s", time.perf_counter() - self.t0)
        label = f"{phase}-{'diag' if task.diag else 'rect'}"
        gpu.kernel_events.append((start, gpu.set.event(gpu.s_comp, timing=True), label, part.flops, part))
        if TRACE:
            gpu.queued.append(time.perf_counter() - self.t0)

    def _add_old(self, gpu, b, block, stepped):
        """box[block] (+)= beta * C's old values, on s_comp once they have landed."""
        while not gpu.old_posted.acquire(timeout=POLL):
            if self.stop.is_set():
                raise _Stop()
        gpu.s_comp.wait_event(gpu.old_ready[b])
        beta = self.problem.beta
        with gpu.s_comp:
            for t in block:
                old = self._view(gpu, gpu.old, t)
                out = self._view(gpu, gpu.box, t)
                old *= beta
                if stepped:
                    out += old
                else:
                    out[...] = old

    def _write(self, gpu):
        """Copy each finished block into the caller's C, in order; a block is 'written' once it has landed."""
        p = self.problem
        tri = "lower" if p.lower else "upper"
        self._mark(gpu, "writer")
        while True:
            try:
                item = gpu.writes.get(timeout=POLL)
            except queue.Empty:
                if self.stop.is_set():
                    raise _Stop() from None
                continue
            if item is None:
                gpu.s_comp.synchronize()                # parts taken from other GPUs end after its last block
                gpu.summary = self._summary(gpu)        # beside the other GPUs' work, not after it
                return
            b, done, stored = item
            direct = self.direct_c
            if direct:
                gpu.s_out.wait_event(done)
                copy_start = gpu.set.event(gpu.s_out, timing=True)
            else:
                done.synchronize()
            gpu.state[b] = "touched"
            finish = []
            try:
                for t in gpu.blocks[b]:
                    dst, src = p.c[t.i0:t.i1, t.j0:t.j1], self._view(gpu, gpu.box, t)
                    if not direct:
                        cuda_transfer.download(dst, src, gpu.ring_out, gpu.s_out, tri if t.diag else None)
                    elif t in stored:
                        cuda_tri_store.queue_off_diagonal(dst, src, p.lower, gpu.s_out)
                    elif t.diag:
                        where = cuda_tri_store.address(self.cp, dst)
                        if where is None:
                            finish.append(downloads.queue_triangle(dst, src, p.lower, gpu.s_out))
                        else:
                            cuda_tri_store.queue(self.cp, dst, where, src, p.lower, gpu.s_out)
                    else:
                        downloads.queue_full(dst, src, gpu.s_out)
                    rows = t.i1 - t.i0
                    gpu.stats["bytes_to_host"] += (rows * (rows + 1) // 2 if t.diag else src.size) * src.itemsize
                if direct:
                    gpu.copy_events.append((copy_start, gpu.set.event(gpu.s_out, timing=True), b))
                for fn in finish:
                    fn()
            finally:
                gpu.s_out.synchronize()     # also after an error: nothing still copies into a buffer let go
            gpu.state[b] = "written"
            self._harvest(gpu)

    # ------------------------------------------------------------------ helpers
    def _mark(self, gpu, what, index=None):
        """Note when a host thread reached ``what`` (of piece ``index``) for ``gpu`` (TRACE)."""
        if TRACE:
            what = what if index is None else f"{what} {index}"
            gpu.host_marks.append((what, round(time.perf_counter() - self.t0, 7), threading.current_thread().name))

    def _view(self, gpu, box, task):
        r0, _r1, c0, _c1 = self.layout.boxes[gpu.slot]
        return box[task.i0 - r0:task.i1 - r0, task.j0 - c0:task.j1 - c0]

    def _measure(self, gpu):
        """(seconds of each product, from the GPU's first event to its first product, from its first product's start
        to its last one's end, of its copies into C); every product and copy of the GPU has finished."""
        elapsed = self.cp.cuda.get_elapsed_time
        self._harvest(gpu, everything=True)
        ev = gpu.kernel_events
        lead = elapsed(gpu.open_event, ev[0][0]) / 1e3 if ev else 0.0
        span = elapsed(ev[0][0], ev[-1][1]) / 1e3 if ev else 0.0
        return list(gpu.times), lead, span, sum(gpu.copy_times)

    def _harvest(self, gpu, everything=False):
        """Seconds of the GPU's products and copies into C that have ended, kept in gpu.times and gpu.copy_times:
        its writer takes them as its blocks land, so that only the last block's are left once the GPU is done
        (reading a product's two events took ~3 us, 0.07 ms a GPU of zgemmt at n = 8192 when all were read at
        the end, after its last copy). ``everything``: every product and copy has ended."""
        elapsed = self.cp.cuda.get_elapsed_time
        ev, times = gpu.kernel_events, gpu.times
        while len(times) < len(ev) and (everything or ev[len(times)][1].done):
            a, b, *_ = ev[len(times)]
            times.append(elapsed(a, b) / 1e3)
        copies, done = gpu.copy_events, gpu.copy_times
        while len(done) < len(copies) and (everything or copies[len(done)][1].done):
            a, b, _ = copies[len(done)]
            done.append(elapsed(a, b) / 1e3)

    def _summary(self, gpu):
        """(GPU ``gpu``'s cuda.last_stats but for the call's wall time and the uploads' rate, seconds from its first
        event to its last product's end (None without products), its kernels' flop/s, its corner mix (_mix) and its
        write-back link rate (None where the call gives none)), once its products and copies have all finished:
        its writer makes it beside the other GPUs' work (it had held the calling thread 0.3-0.5 ms a call after
        the GPUs finished, 2 x H100, n = 8192-16384)."""
        lay = self.layout
        st = dict(gpu.stats, path="bands", order=lay.order, steps=len(lay.steps), final_k=lay.final[1] - lay.final[0],
                  blocks=len(gpu.blocks))
        ev = gpu.kernel_events
        times, lead, span, copies = self._measure(gpu)
        busy = flops = mix = writeback = None
        if ev:
            kernel = sum(times)
            classes = {}
            for (_, _, label, f, _), t in zip(ev, times):
                c = classes.setdefault(label, [0.0, 0.0])
                c[0] += t
                c[1] += f
            st.update(kernel_s=kernel, lead_s=lead, gaps_s=span - kernel,
                      kernels={k: {"s": t, "tflops": f / max(t, 1e-12) / 1e12} for k, (t, f) in classes.items()},
                      products=[(x.i0, x.i1, x.j0, x.j1, x.k0, x.k1, bool(x.diag), t)
                                for (*_, x), t in zip(ev, times)])
            busy, flops = lead + span, sum(f for _, f in classes.values()) / max(kernel, 1e-12)
            mix = _mix(classes) if lay.corner and lay.order == "outer" else None
        if gpu.copy_events:         # the link's rate: the copies' bytes over the share their segments reach
            t = max(copies, 1e-12)
            st["writeback_gbps"] = gpu.stats["bytes_to_host"] / t / 1e9
            writeback = sum(lay.write_bytes(task) for block in gpu.blocks for task in block) / t
        return st, busy, flops, mix, writeback

    def _record_stats(self, t0):
        """cuda.last_stats per GPU (bytes moved, kernel time by class and of each product with its block of C and k
        range, GPU idle before, between and after the kernels, host seconds from the call's start to its worker,
        first upload and first product queued) and the calibration of this GPU's rates (``calibrated``)."""
        wall = time.perf_counter() - t0
        elapsed = self.cp.cuda.get_elapsed_time
        # no rates from a call whose kernels or copies ran slow for other reasons: its first copies by DMA, its
        # layout's first call (the kernels of its shapes load: 2 x H100, zgemmt n = k = 8192, 27 ms of kernels
        # against 20), or a call beside a layout build in a worker thread (its products queued late: 33 TF/s
        # against 51); such readings had moved the bands back and forth for five calls after page-locking
        reading = not (self.first_dma or self.first_use or self.beside_build or rebuilding())
        staged = not (all(self.direct) and self.direct_c)
        speed_reading = reading and not (staged and self.pin_pending)  # staged while locks are made: no speed
        size = (self.problem.n, self.problem.k, len(self.gpus))
        warm = []
        for gpu in self.gpus:
            summary, busy, flops, mix, writeback = gpu.summary
            st = dict(summary, **gpu.marks, wall_s=wall, new_layout=self.first_use, beside_build=self.beside_build)
            if busy is not None:
                st["tail_s"] = wall - busy
                warm.append(_warm(gpu.device, self.problem.kind))
                if warm[-1] and speed_reading:                                 # see ``reading``
                    _calibrate(gpu.device, "flops", self.problem.kind, flops, size, staged=staged)
                    if mix is not None:
                        _calibrate(gpu.device, "mix", self.problem.kind, mix, size, staged=staged)
            if TRACE:                                                   # s_in's events: read once it has settled
                st["timeline"] = _timeline(self.cp, gpu)
                st["host_marks"] = gpu.host_marks
            if gpu.upload_events is not None and all(self.direct):
                t = max(elapsed(*gpu.upload_events) / 1e3, 1e-12)
                st["upload_gbps"] = gpu.stats["bytes_from_host"] / t / 1e9
                if reading:
                    _calibrate(gpu.device, "h2d_pinned", None, self.layout.slot_link_bytes(gpu.slot) / t)
            if writeback is not None and reading:
                _calibrate(gpu.device, "d2h_pinned", None, writeback)
            cuda.last_stats[gpu.device.name] = st
        if self._rebalances(speed_reading, staged, warm):
            self._rebalance(size)

    def _rebalances(self, speed_reading, staged, warm):
        """Whether the call's kernel rates may move the GPUs' speeds though it gave no speed reading (_rebalance):
        a call by DMA, not its layout's first, on several GPUs that had each run the routine before (``warm``)."""
        return not (speed_reading or staged or self.first_use) and len(warm) == len(self.gpus) > 1 and all(warm)

    def _rebalance(self, size):
        """A call by DMA that gives no speed reading (``reading`` in _record_stats: its first copies by DMA, a
        layout being made beside it) slows its GPUs alike; one whose GPUs ran unlike the speeds the next call
        takes for them (a GPU throttling, or shared with another process) moves the bands still: where a GPU's
        kernel rate over its speed is below BALANCE of the highest such ratio, each GPU's speed starts anew at its
        speed times its ratio over the ratio nearest 1 (the GPU that ran nearest its speed keeps it: the others
        slowed down, or one that had been slow is back). Staged calls and a layout's first call do not: the staged
        call's products are queued late unevenly (27-37 TF/s on 2 x H100, zgemmt 8192), and a new layout's shapes
        load their kernels on each GPU for its own blocks (2 x H100, zgemmt 8192, a new layout after GPU 1's share
        grew back: GPU 0's kernels at 0.66 of its speed, then 0.84 the call after)."""
        p = self.problem
        speeds = _speeds(p, self.devices, self.rates, self.ctx)
        ratios = [gpu.summary[2] / s if gpu.summary[2] and s else None for gpu, s in zip(self.gpus, speeds)]
        if None in ratios or min(ratios) >= BALANCE * max(ratios):
            return
        anchor = min(ratios, key=lambda r: abs(math.log(r)))
        for gpu, s, r in zip(self.gpus, speeds, ratios):
            if gpu.device.name not in self.ctx.rates:       # an explicit rate is the speed the model takes
                _calibrate(gpu.device, "flops", p.kind, s * r / anchor, size, reset=True)

    # ------------------------------------------------------------------ faults
    def _recover(self, reserves):
        """After a job raised: the call to the tiles (out of memory before anything was written: False), or the
        blocks not yet written re-run by the tiles. A GPU out of memory stays in the Context; any other error
        leaves its GPU out (a DeviceFailureWarning). A block whose copy into C had begun is torn: DeviceFailure
        when C is read (beta != 0), else it is computed again."""
        p = self.problem
        touched = any(s != "pending" for gpu in self.gpus for s in gpu.state)
        memory = all(_is_memory(exc) for _, exc in self.errors)
        if not touched and memory:
            return False
        failed = {}
        for gpu, exc in self.errors:
            failed.setdefault(gpu.slot, exc)
            if not memory:
                self.ctx.mark_failed(gpu.device, exc)
        errors = [(self.gpus[g].device.name, exc) for g, exc in failed.items()]
        torn, redo = [], []
        for gpu in self.gpus:
            for b, s in enumerate(gpu.state):
                if s == "touched":
                    torn += gpu.blocks[b]
                elif s == "pending":
                    redo += gpu.blocks[b]
        if torn and p.beta != 0:
            raise DeviceFailure(errors, torn=torn, message_tail=(
                f"{len(torn)} tile(s) of C were being written when a GPU failed and C is read (beta != 0), "
                f"so they cannot be recomputed"))
        redo += torn
        live = [d for g, d in enumerate(self.devices) if memory or g not in failed]
        if not live:                    # every GPU of the call failed: a device the policy had left out
            live = [d for d in reserves if not self.ctx.is_failed(d)][:1]
        if not live and redo:
            raise DeviceFailure(errors)
        if not memory:
            names = ", ".join(d.name for d in live) or "no device (every block was written)"
            for name, exc in errors:
                warnings.warn(f"hybridblas: {name} failed ({type(exc).__name__}: {exc}); the call's {len(redo)} "
                              f"unfinished block(s) run on {names}; it stays out of this Context until "
                              f"Context.reset_failed()", DeviceFailureWarning, stacklevel=3)
        if redo:
            from ..engine import Engine
            rates = [self.ctx.rate(d, p) for d in live]
            Engine(p, self.ctx, live, rates, pending=plan.dynamic_order(p, redo, self.ctx.tail_fraction)).run()
        return True


class _Part:
    """The share [k0, k1) of the final range of block ``b`` (``tasks``) of GPU slot ``slot`` that GPU slot ``taker``
    computes (band_tail): ``own`` the event after the giver's share, ``buffer`` the taker's (C's entries of the
    block's bounding ``box``), ``event`` after it there, ``landed`` the giver's copy of it; ``handed`` once the block
    is with the giver's writer."""

    def __init__(self, slot, taker, b, tasks, k0, k1):
        self.slot, self.taker, self.b, self.tasks, self.k0, self.k1 = slot, taker, b, tasks, k0, k1
        self.box = self.bounds(tasks)
        self.own = self.buffer = self.event = self.landed = None
        self.handed = threading.Event()

    @staticmethod
    def bounds(tasks):
        """(r0, r1, c0, c1): the box of C that ``tasks`` lie in."""
        return (min(t.i0 for t in tasks), max(t.i1 for t in tasks), min(t.j0 for t in tasks), max(t.j1 for t in tasks))


_idle_sets = {}            # GPU index -> [_StreamSet] not held by a call
_idle_lock = threading.Lock()
_unsettled = []            # sets whose work may not have finished: kept (a destroyed stream's handle could come
                           # back for a new stream, with the arena of blocks that work may still use)


def rect_columns(layout):
    """The width of the cuBLAS calls a layout's rectangles go in (queue_product's ``columns``): RECT_COLUMNS in
    the corner order (gemmt of two factors, outer order), else 0 (one call each)."""
    return RECT_COLUMNS if layout.corner and layout.order == "outer" else 0


def queue_product(backend, problem, factors, kx, task, out, beta, side=None, columns=0, raw=None):
    """out (+)= ``task``'s product on ``backend``'s stream, as a band call queues it: a diagonal block of a gemmt
    as one cuBLAS herkx/syrkx (``kx`` from cuda_direct.rank_kx over ``factors``; None for other kinds), anything
    else by ``raw`` (cuda_raw.Calls on backend's handle and stream over ``factors``) where it is given, else by
    kernels.compute_block. ``side``: a _Side whose stream computes a herkx's diagonal values while the herkx runs
    (their reads of the factors are memory-bound; the herkx leaves SMs idle in its last wave). ``columns``: a
    rectangle at least twice as wide goes as calls of about that many columns (multiples of 64)."""
    if task.diag and kx is not None:
        kind, coef, x, y = kx
        xb, yb = x.block(task.i0, task.i1, task.k0, task.k1), y.block(task.k0, task.k1, task.i0, task.i1)
        dots = side.dots(backend, coef, xb, yb, out) if side is not None and kind == "herkx" else None
        cuda_direct.gemmt_kx(backend, kind, coef, xb, yb, out, problem.lower, beta, dots=dots)
        return
    cuts = _column_cuts(task, columns)
    if raw is not None and (out.shape[0] <= 1 or out.strides[0] == out.itemsize):
        if task.diag and raw.rank is not None:
            raw.diagonal(task.i0, task.i1, task.k0, task.k1, out, beta)
            return
        if not task.diag:
            ldc, c = leading_dim(out), out.data.ptr
            for a, b in zip(cuts, cuts[1:]):
                raw.rect(task.i0, task.i1, a, b, task.k0, task.k1, c + (a - task.j0) * ldc * out.itemsize, ldc,
                         beta)
            return
    if len(cuts) > 2:
        for a, b in zip(cuts, cuts[1:]):
            sub = plan.make_task(problem, task.i0, task.i1, a, b, task.k0, task.k1)
            compute_block(backend, problem, sub, out[:, a - task.j0:b - task.j0], beta, factors=factors)
    else:
        compute_block(backend, problem, task, out, beta, factors=factors)


def _column_cuts(task, columns):
    """The column edges of a task's cuBLAS calls: a rectangle at least twice ``columns`` wide in calls of about
    that many columns (on multiples of 64), anything else in one."""
    width = task.j1 - task.j0
    if not columns or task.diag or width < 2 * columns:
        return [task.j0, task.j1]
    count = round(width / columns)
    return sorted({task.j0 + width * i // count // 64 * 64 for i in range(count)} | {task.j1})


class _Side:
    """A GPU's second compute stream for a call's herkx diagonals (SIDE_DOTS): its own cuBLAS handle (a handle's
    workspace serves one stream at a time), events from the call's stream set."""

    def __init__(self, streams):
        self.streams = streams
        self.backend = cublas.Backend(streams.side_handle(), streams.s_side)

    @classmethod
    def make(cls, streams):
        """The set's side, or None where cuBLAS cannot make its handle (the diagonals then go on s_comp)."""
        try:
            return cls(streams)
        except Exception as exc:        # noqa: BLE001 - CuPy's CUBLASError, by name: its module may move
            if type(exc).__name__ == "CUBLASError" or isinstance(exc, cublas.CublasError):
                return None
            raise

    def dots(self, backend, coef, x, y, out):
        """(values, event): op(x)[i, :] op(y)[:, i] for the diagonal of ``out``, queued on the side stream once
        ``backend``'s stream has reached this point. The values are allocated on ``backend``'s stream: its later
        work that reuses their memory comes after its wait for the event (cuda_direct.gemmt_kx queues that wait
        before it lets them go); where the herkx raises before that wait, the call stops and _settle waits for
        the side stream before any of the arena's memory serves again."""
        cp = self.streams.cp
        with backend.stream:
            values = cp.empty((out.shape[0], 1, 1), dtype=out.dtype)
        self.streams.s_side.wait_event(self.streams.event(backend.stream))
        cuda_direct.diagonal_dots(self.backend, coef, x, y, values)
        return values, self.streams.event(self.streams.s_side)


def _mix(classes):
    """(the diagonal blocks' flop/s over the other products', the diagonal blocks' share of the flops) of a call's
    kernel classes ({label: [seconds, flops]}), or None where either kind of product is missing."""
    diag = [sum(v[i] for k, v in classes.items() if k.endswith("-diag")) for i in (0, 1)]
    rest = [sum(v[i] for k, v in classes.items() if not k.endswith("-diag")) for i in (0, 1)]
    if min(diag + rest) <= 0:
        return None
    return (diag[1] / diag[0]) / (rest[1] / rest[0]), diag[1] / (diag[1] + rest[1])


def _timeline(cp, gpu):
    """GPU ``gpu``'s work in the call: [(what, index, start, end, queued)], start and end in seconds from its first
    event on s_comp (recorded marks["host_open_s"] after the call began), ``queued`` host seconds after the call
    began when it was queued. ``what``: "upload" or "peer" (index: the piece), "product-<phase>-<class>"
    (index: its place among the GPU's products) or "write" (index: the block; queued: None)."""
    if gpu.open_event is None:
        return []

    def rel(ev):
        return round(cp.cuda.get_elapsed_time(gpu.open_event, ev) / 1e3, 7)

    out = [(what, i, rel(a), rel(b), round(q, 7)) for what, i, a, b, q in gpu.piece_events]
    out += [(f"product-{label}", i, rel(a), rel(b), round(q, 7))
            for i, ((a, b, label, *_), q) in enumerate(zip(gpu.kernel_events, gpu.queued))]
    out += [("write", blk, rel(a), rel(b), None) for a, b, blk in gpu.copy_events]
    return sorted(out, key=lambda r: r[2])


class _StreamSet:
    """GPU ``index``'s streams for one call at a time: four (s_in, s_peer, s_comp, s_out), a side and a part stream
    (s_side, s_part); cuBLAS handles of its own for s_comp and s_side (comp_handle, side_handle: a call's jobs take
    whichever pooled threads are idle, and a worker on a thread without CuPy's per-thread handle for its GPU made one
    before its first product: 2 x H100, zgemmt n = k = 8192, 2.5 and 4.0 ms, while the calling thread queued no
    upload for 1.5 ms), and the CUDA events calls record on them, kept for the next call: a call records 100-450
    (zgemmt at n = 8192 on two GPUs), whose destruction had held the caller ~0.2 ms after the GPUs finished. Each
    stream is recorded on by one thread of a call at a time (s_in: the calling thread, then the feeder once started;
    s_peer, s_comp and s_side: the worker; s_out: the writer; s_part: the worker of the GPU that takes a part of this
    one's block, whose events are its own, not the set's). An event recorded again by a later call is one whose
    waits have all been queued: a stream waits for the record that preceded its wait."""

    def __init__(self, cp, index):
        self.cp = cp
        self.index = index
        with cp.cuda.Device(index):
            self.streams = tuple(cp.cuda.Stream(non_blocking=True) for _ in range(4))
            self.s_side = cp.cuda.Stream(non_blocking=True)
            self.s_part = cp.cuda.Stream(non_blocking=True)
        self._handles = {}          # stream pointer -> this set's cuBLAS handle bound to it
        self._events = {}           # (stream pointer, timing) -> events created for that stream
        self._used = {}             # (stream pointer, timing) -> how many of them this call has recorded

    def __iter__(self):
        return iter(self.streams)

    def all(self):
        """Every stream of the set, the side and part streams included."""
        return self.streams + (self.s_side, self.s_part)

    def close(self):
        """Destroy the set's cuBLAS handles (a set dropped after its GPU failed)."""
        handles, self._handles = list(self._handles.values()), {}
        if not handles:
            return
        try:
            from cupy.cuda import cublas as cupy_cublas
            with self.cp.cuda.Device(self.index):
                for h in handles:       # each tried: one that fails does not keep the others
                    try:
                        cupy_cublas.destroy(h)
                    except Exception:   # noqa: BLE001 - a GPU in an error state keeps the handle
                        pass
        except Exception:               # noqa: BLE001 - nor does one that cannot be made current
            pass

    def comp_handle(self):
        """A cuBLAS handle of this set's own, bound to s_comp (made on first use; kept with the set)."""
        return self._handle(self.streams[2])

    def side_handle(self):
        """A cuBLAS handle of this set's own, bound to s_side (made on first use; kept with the set)."""
        return self._handle(self.s_side)

    def _handle(self, stream):
        h = self._handles.get(stream.ptr)
        if h is None:
            with self.cp.cuda.Device(self.index):
                h = self._handles[stream.ptr] = cublas.new_handle(stream.ptr)
        return h

    def rewind(self):
        """A new call: its events are recorded from the first again."""
        self._used = {}

    def event(self, stream, timing=False):
        """An event of this set recorded on ``stream`` (one of its streams; the current device is its GPU)."""
        key = (stream.ptr, bool(timing))
        kept = self._events.setdefault(key, [])
        i = self._used.get(key, 0)
        if i == len(kept):
            kept.append(self.cp.cuda.Event(disable_timing=not timing))
        self._used[key] = i + 1
        kept[i].record(stream)
        return kept[i]


def _take_streams(cp, index):
    """A stream set of GPU ``index`` for one call: an idle one, else a new one."""
    with _idle_lock:
        free = _idle_sets.setdefault(index, [])
        if free:
            streams = free.pop()
            streams.rewind()
            return streams
    return _StreamSet(cp, index)


def _give_streams(index, streams):
    """Back to the idle sets, once every stream of it has finished (_Call._settle)."""
    with _idle_lock:
        _idle_sets.setdefault(index, []).append(streams)


def _padded(cp, shape, dtype):
    """A column-major (rows, cols) view whose columns start on multiples of band_plan.ALIGN entries."""
    rows, cols = shape
    return cp.empty((padded_rows(rows), cols), dtype=dtype, order="F")[:rows]


def _join(jobs):
    """Wait for every job, through further interrupts (they must end before the call's memory goes)."""
    for job in jobs:
        while True:
            try:
                job.wait()
                break
            except KeyboardInterrupt:
                continue


def _is_memory(exc):
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


def _names(devices):
    return tuple(d.name for d in devices)


def _peer_access(ids):
    """Peer access between every pair of the call's GPUs (cuda.peer_access); False when some pair cannot."""
    import cupy
    return all(cuda.peer_access(cupy, a, b) for a in ids for b in ids if a != b)


def _rate(ctx, devices, key):
    """bytes/s of the GPUs' copies between them and page-locked host memory (``key``: 'h2d_pinned' or
    'd2h_pinned'): the slowest of the profile's, else of what earlier calls measured, else PINNED_RATE."""
    prof = ctx.profile
    rates = []
    for d in devices:
        measured = prof.transfer(d.name) if prof is not None else None
        rates.append((measured or {}).get(key) or calibrated(d, key) or PINNED_RATE)
    return min(rates)


PINNED_RATE = 50e9         # bytes/s a page-locked copy each way is taken to reach before a call measured it (PCIe
                           # 5.0 x16, H100 and H200: 54-55 up, 43-56 down). At policy.TRANSFER_RATE (25e9, which
                           # counts staging) the first measured calls moved it past RATE_SLACK: each rebuilt the
                           # layout (9-21 ms on 2 x H100 at n = 8192)
MULTIPROCESSOR_COUNT = 16  # cudaDevAttrMultiProcessorCount
_sm_counts = {}            # GPU index -> its SMs
_sms_lock = threading.Lock()
_calibration = {}          # device name -> {"h2d_pinned" | "d2h_pinned": [bytes/s readings], ("flops", kind, size
                           # class): [flop/s readings], ("mix", kind, size class): (ratio, share), ("staged", "flops"
                           # or "mix", kind, size class): whether those came from staged calls only (_calibrate),
                           # "warm": the kinds that ran here before}
_calibration_lock = threading.Lock()


def calibrated(device, what, size=None):
    """What earlier band calls measured on ``device``: a transfer rate ('h2d_pinned', 'd2h_pinned'), given a
    routine kind its kernels' flop/s, each the upper median of the last READINGS readings; given ("mix", kind) the
    corner order's (diagonal blocks' rate over the other products', their share of the flops) (_mix), the last
    call's. Speeds and mixes are kept per size class (_size_class of (n, k, GPUs)); ``size`` picks the class
    nearest to it that has readings, of its GPU count where there is one (None: the class measured last). None
    before the first such call."""
    with _calibration_lock:
        rates = _calibration.get(device.name, {})
        if what in ("h2d_pinned", "d2h_pinned"):
            return statistics.median_high(rates[what]) if what in rates else None
        key = what if isinstance(what, tuple) else ("flops", what)
        classes = [x[-1] for x in rates if isinstance(x, tuple) and x[:-1] == key]
        if not classes:
            return None
        want = _size_class(size) if size is not None else classes[-1]
        near = min(classes, key=lambda c: (c[2] != want[2], abs(c[0] - want[0]) + abs(c[1] - want[1]), c))
        value = rates[key + (near,)]
        return statistics.median_high(value) if key[0] == "flops" else value


def _size_class(size):
    """(log2 n, log2 k, GPUs) of ``size`` (n, k[, GPUs of the call, default 1]), the logarithms rounded: the calls
    whose speeds are measured together. A GPU's band and kernels at n = 8192 are not its band at 16384 (on
    2 x H100, zgemmt at 16384 on the bands that 8192's speeds drew kept its first GPU busy 191 ms against 167),
    nor its whole triangle in a call on it alone."""
    n, k, gpus = tuple(size) + (1,) * (3 - len(size))
    return (round(math.log2(max(n, 1))), round(math.log2(max(k, 1))), gpus)


def _warm(device, kind):
    """Whether an earlier band call of this routine ran on ``device`` (then this one's kernels measure its rate;
    a first call's include loading them: zherk at n = 8192 on an H100, 137 ms of kernels against 22 after)."""
    with _calibration_lock:
        seen = _calibration.setdefault(device.name, {}).setdefault("warm", set())
        known = kind in seen
        seen.add(kind)
        return known


def _calibrate(device, what, kind, value, size=None, staged=False, reset=False):
    """Fold one call's measurement into the device's rates. A transfer rate ('h2d_pinned', 'd2h_pinned') or a
    speed ("flops", of a call of ``size`` (n, k, GPUs)) is one of its last READINGS readings, the upper median of which
    counts: a call that shared the links or the GPU with another is one reading, which neither turns the bands
    off for good nor holds the model to a first fast reading (the fall from PINNED_RATE to a measured write-back
    rate of ~29 GB/s had taken some twenty calls). A mix ("mix": _mix, of a call of ``size``) is the last
    call's. A speed or mix from a call that staged operands or C through host buffers (``staged``) counts only
    until one from a call that read and wrote them by DMA comes, which then replaces them: the staging threads
    hold the interpreter, so such a call's products are queued late and its kernels' times run long (2 x H100,
    zgemmt n = k = 8192: 27-37 TF/s against 52-54 once page-locked). A speed below DROP of the upper median it
    joins or above its inverse, or one given with ``reset`` (_Call._rebalance), starts the readings anew: a GPU
    that throttles, or that another process shares, gets its smaller band at the next call, not once its slow
    readings outnumber the fast ones, and its band back as soon as it runs at its speed again."""
    with _calibration_lock:
        rates = _calibration.setdefault(device.name, {})
        key = what if what in ("h2d_pinned", "d2h_pinned") else (what, kind, _size_class(size))
        tag = ("staged",) + key if what in ("flops", "mix") else None
        if tag is not None and key in rates:
            if staged and not rates.get(tag, False):
                return                          # readings by DMA are kept: a staged one would pull them down
            if not staged and rates.get(tag, False):
                del rates[key]                  # the staged readings make way for the first by DMA
        if tag is not None:
            rates[tag] = staged
        old = rates.pop(key, None)              # re-entered: the class measured last is last (calibrated(size=None))
        if what == "flops" and old and (reset or not DROP <= value / statistics.median_high(old) <= 1 / DROP):
            old = None
        rates[key] = value if what == "mix" else ((old or []) + [value])[-READINGS:]


READINGS = 5               # a GPU's speed for a routine and size class, and its links' rates: the upper median of
                           # the last this many band calls' readings
DROP = 0.8                 # a speed reading below this share of the upper median (or above its inverse) starts the
                           # readings anew; call-to-call kernel rates move by 4-8 % (2 x H100, n = 8192-16384). 2 x
                           # H200, zher2k n = k = 16384, GPU 1 shared with another process: its band shrank from
                           # the third call on (1.47 and 1.22 x the time on GPU 0 alone, then 0.73-0.76 x); once
                           # the other process stopped, the upper median of its last five readings kept the narrow
                           # band for three more calls; with a reading above 1 / DROP starting them anew too, the
                           # call after gave the bands back (2 x H100, zgemmt 8192 and 16384)
BALANCE = 0.75             # a call that gives no speed reading still moves the bands where a GPU's kernel rate over
                           # the speed the next call takes for it is below this share of the highest such ratio
                           # (_Call._rebalance); below DROP, as the GPU whose band holds more of the corner order's
                           # slower diagonal blocks reads up to ~10 % lower than the other
