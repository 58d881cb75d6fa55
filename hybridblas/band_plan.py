"""The layout of one call on host operands over GPUs that each compute one band of C (devices.cuda_bands).

    layout = layout_for(problem, rates, writeback_rate, upload_rate, shared=True, speeds=None, mixes=None, sms=None)
    layout = BandLayout(problem, rates, writeback_rate, upload_rate, shared=True, speeds=None, order="k", mixes=None,
                        sms=None)

- Bands: GPU g computes rows [g0, g1) of a lower triangle with every column left of g1 (an upper triangle:
  columns [g0, g1) with every row above g1; gemm's C: columns [g0, g1), every row), the flops of the bands
  following the GPUs' speeds (the flop/s earlier calls measured on each GPU for the routine, else its rate),
  the edges on multiples of ALIGN. It holds the band's bounding box of C.
- Every GPU holds the whole factors. Along k they are cut into units, the first a quarter of the others so
  that compute starts early. A unit of a factor is a piece (a factor stored k-major: its whole unit, one
  contiguous copy; k-minor: cut along the outer index where the bands' needs start or end). A piece crosses
  PCIe once, uploaded by one of the GPUs that read it (the one that has uploaded the fewest bytes so far),
  and the others copy it from there (NVLink). Without peer access (``shared=False``) each GPU uploads every
  piece it reads.
- Compute goes by steps along k, each step the whole band in a few cuBLAS calls, the steps' lengths doubling
  from the first unit up to STEP_K. The last, ``final`` range of k is computed block column by block column,
  each block written back to the host while the next computes. Where it starts is chosen by a model of the
  call's time (``_final_start``): a longer range hides more of the write-back, but its blocks start only once
  every piece has landed. ``speeds`` (flop/s, default ``rates``) are what the model takes for the GPUs' compute.
- ``order="outer"`` (a triangle): the final range block by block, each block's pieces cut along the outer
  index and uploaded in the order the blocks read them, so that blocks are computed and written back while
  later pieces still come (band_outer); where the final range starts is chosen by band_outer.simulate.
- ``layout_for`` builds both orders and keeps the one modelled faster (the outer one only by OUTER_GAIN, on one
  GPU OUTER_GAIN_ONE_GPU, and for herk and syrk only up to k = OUTER_MAX_K), and caches layouts by the problem's
  signature and rates.

Everything here is arithmetic on the problem's shape: it runs, and is tested, without a GPU.
"""
import bisect
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import band_outer, plan, workers
from .band_outer import task_reads
from .problem import k_axis

ALIGN = 64                # k units, steps and block columns are cut at multiples of this
UNIT_BYTES = 64 << 20     # bytes of one unit of all the factors together (the first: a quarter of it)
STEP_K = 4096             # longest k step of the band-wide products
UNIT_K = 1024             # units are at least this long along k (the first a quarter): fewer, longer steps, whose
                          # products run nearer the GPUs' rate (a step along k of 64-512 reads and writes the band's C
                          # for little compute). 2 x H100 in turns, two processes each, best / median over Σ device
                          # cuBLAS, 1024 against UNIT_BYTES alone: zherk 16384 0.909-0.911 / 0.909-0.924 against
                          # 0.896-0.897 / 0.883-0.895, zher2k 16384 0.962-0.970 / 0.944-0.953 against 0.929-0.938 /
                          # 0.930-0.936, zher2k 8192 0.842-0.844 / 0.824-0.843 against 0.809-0.827 / 0.799-0.826,
                          # zherk 8192 0.754-0.756 / 0.756-0.764 against 0.757-0.778 / 0.760. Units of 256 MiB instead
                          # (zherk 8192: 2048 along k) took zherk 8192 to 0.668-0.673
BLOCKS = 8                # block columns of a band in the final range (the last one's copy is the tail)
OUTER_BLOCKS = 12         # blocks of a band in the outer order (band_outer). 2 x H100, n = k = 16384 in turns, 8 and
                          # 16 blocks: zherk 0.998 and 1.008 x as long, zgemmt 0.998 and 1.011 x (3 rounds: within the
                          # noise of calls that ranged 181-206 ms)
CORNER_DIAG = 0.7         # the corner order's diagonal blocks (small triangles) run at this share of its strips'
                          # rate: 2 x H100, zgemmt n = 8192, 35-37 TF/s against 48-52; 2 x H200 31-38 against 50-51
OUTER_STARTS = 8          # final range starts the outer order's model tries (16 chose the same at 4096-16384)
COPY_MARGIN = 1.25        # the final range is chosen as if the write-back took this many times its estimate
WHOLE_UNITS = True        # a unit of a factor stored k-major (k along its columns) goes whole: one copy
MIN_SEGMENT = 32 << 10    # bytes along k of a unit of a factor stored k-minor (its first unit: half of it):
                          # each column's segment of a piece moves at the DMA's rate (2 KiB segments left the
                          # GPU waiting 113 of 469 ms for zgemmt at n = k = 16384 on one H100)


@dataclass(frozen=True)
class Piece:
    """Rows [o0, o1) of the outer index of unique factor ``factor`` over k range [k0, k1): uploaded by GPU
    slot ``owner``, copied from there by the slots in ``readers``."""
    index: int
    factor: int
    o0: int
    o1: int
    k0: int
    k1: int
    owner: int
    readers: tuple
    nbytes: int


class BandLayout:
    """Bands, factor pieces, k steps and final blocks of ``problem`` over GPUs with flop rates ``rates``."""

    def __init__(self, problem, rates, writeback_rate, upload_rate=None, shared=True, unit_bytes=None,
                 blocks=None, speeds=None, order="k", final_start=None, mixes=None, sms=None):
        if order not in ("k", "outer") or (order == "outer" and not problem.triangular):
            raise ValueError(f"order must be 'k', or 'outer' for a triangle, got {order!r}")
        self.problem = problem
        self.order = order
        self.sms = sms            # the GPUs' fewest SMs: the corner order's diagonal widths (band_outer.diag_width)
        self.modelled = None      # seconds band_outer.simulate gave at the rates it was laid out for (if run)
        self.build_s = None       # seconds layout_for took to make it (both orders)
        self.calls = 0            # band calls that have run on it (cuda_bands: the first one's kernels are no reading)
        self._upload_share = None
        self._slot_link_bytes = None
        self.slots = len(rates)
        self.k = problem.k
        self.item = problem.dtype.itemsize
        tri = problem.triangular
        size = problem.n
        self._unique_factors()
        # two distinct factors, each entry reading one row of each (gemmt): the outer order grows from the corner
        self.corner = problem.kind == "gemmt" and len(set(self.factor_of)) == 2
        self._set_bands(aligned_edges(size, list(speeds or rates), tri))
        if order == "outer" and self.corner and self.slots > 1:
            self._set_bands(aligned_edges(size, self._corner_speeds(speeds or rates, mixes), tri))
        self.needs = [self._needs(tasks) for tasks in self.band_tasks]
        self.units = self._units(UNIT_BYTES if unit_bytes is None else unit_bytes, UNIT_K if unit_bytes is None else 0)
        if order == "outer":
            self._outer(shared, speeds or rates, writeback_rate, upload_rate or writeback_rate,
                        OUTER_BLOCKS if blocks is None else blocks, final_start)
        else:
            self.pieces = self._pieces(shared, self.units)
            self.final_start = self._final_start(speeds or rates, writeback_rate, upload_rate or writeback_rate)
            self.steps = self._steps()
            self.blocks = [self._blocks(g0, g1, BLOCKS if blocks is None else blocks) for g0, g1 in self.bands]
            self.block_pieces = [[[x.index for x in self.pieces_for(g, self.final_start, problem.k)]]
                                 + [[] for _ in self.blocks[g][1:]] for g in range(self.slots)]
        self.final = (self.final_start, problem.k)

    def schedule(self, g):
        """GPU g's compute in order: [(indices of the pieces it gathers first, flops, bytes of C it then writes
        back, each divided by the share of the link its DMA segments reach)], the steps along k, then the
        blocks."""
        k = self.k
        band = sum(t.flops for t in self.band_tasks[g])         # flops are linear in k
        starts, gather = [k0 for k0, _ in self.steps], [[] for _ in self.steps]
        for x in self.pieces:                   # each step's pieces_for(g, ...), in one pass over the pieces
            if x.owner == g or g in x.readers:
                i = bisect.bisect_right(starts, x.k0) - 1
                if i >= 0 and x.k1 <= self.steps[i][1]:
                    gather[i].append(x.index)
        out = [(gather[i], band * (k1 - k0) / k, 0) for i, (k0, k1) in enumerate(self.steps)]
        share = (k - self.final_start) / k
        for gather, tasks in zip(self.block_pieces[g], self.blocks[g]):
            out.append((gather, share * sum(t.flops for t in tasks), sum(self.write_bytes(t) for t in tasks)))
        return out

    def upload_share(self):
        """The share of a link's rate this layout's uploads reach by their DMA segments: their bytes over the sum
        of their link_bytes."""
        if self._upload_share is None:
            total = sum(x.nbytes for x in self.pieces)
            slow = sum(self.link_bytes(x) for x in self.pieces)
            self._upload_share = total / slow if slow else 1.0
        return self._upload_share

    def slot_link_bytes(self, g):
        """The link_bytes of every piece GPU slot ``g`` uploads (kept: a call's upload-rate reading takes it after
        its GPUs have finished)."""
        if self._slot_link_bytes is None:
            self._slot_link_bytes = [sum(self.link_bytes(x) for x in self.uploads(s)) for s in range(self.slots)]
        return self._slot_link_bytes[g]

    def link_bytes(self, piece):
        """Bytes a piece's upload costs at the link's full rate: its bytes over the share its segments reach."""
        return piece.nbytes / band_outer.dma_share(self.segment(piece))

    def segment(self, piece):
        """Bytes of one contiguous run of a piece's upload (its column segment on the host)."""
        if self.kaxis[piece.factor] == 0:
            return (piece.k1 - piece.k0) * self.item
        return (piece.o1 - piece.o0) * self.item

    def write_share(self, task):
        """The share of the link a block's task's write-back reaches, by its column segments (a diagonal
        block's triangle goes by panels whose columns are half its height on average)."""
        rows = task.i1 - task.i0
        return band_outer.dma_share(max(rows // 2 if task.diag else rows, 1) * self.item)

    def write_bytes(self, task):
        """Bytes of C a block's task writes back, divided by its write_share."""
        return _area(task) * self.item / self.write_share(task)

    # ---------------------------------------------------------------- bands
    def _set_bands(self, edges):
        self.edges = edges
        self.bands = list(zip(edges, edges[1:]))
        self.boxes = [self._box(g0, g1) for g0, g1 in self.bands]
        self.band_tasks = [plan.band(self.problem, g0, g1) for g0, g1 in self.bands]

    def _corner_speeds(self, speeds, mixes=None):
        """The GPUs' speeds less what the corner order's diagonal blocks cost on each band: those run at
        CORNER_DIAG of the rest's rate, and the band that is all triangle has the most of them. ``mixes``: per
        GPU (its diagonal blocks' rate over its other products', the diagonal blocks' share of its flops) in the
        corner-order call that measured its speed; that call's cost of them is taken out of the speed first (a
        measured speed already pays for its band's diagonal blocks), and the ratio replaces CORNER_DIAG."""
        out = []
        plains = plain_speeds(speeds, mixes)
        for g, (g0, g1) in enumerate(self.bands):
            ratio = mixes[g][0] if mixes else CORNER_DIAG
            tasks = [t for blk in band_outer.blocks(self.problem, g0, g1, 1, ALIGN, corner=True, sms=self.sms)
                     for t in blk]
            flops = sum(t.flops for t in tasks)
            diag = sum(t.flops for t in tasks if t.diag)
            out.append(plains[g] * flops / (flops - diag + diag / ratio) if flops else speeds[g])
        return out

    def _box(self, g0, g1):
        return box(self.problem, g0, g1)

    def band_area(self, g):
        """Entries of C that GPU g writes."""
        return sum(_area(t) for t in self.band_tasks[g])

    # ---------------------------------------------------------------- factors
    def _unique_factors(self):
        """Factors that are the same memory read along the same k axis are uploaded once: ``factor_of[f]`` is
        factor f's unique index, ``uniques[u]`` its first factor. (gemm(a, a) reads a along k by columns as the
        left factor and by rows as the right one: two factors, each cut into units along its own k.)"""
        p = self.problem
        keys, self.factor_of, self.uniques = {}, [], []
        for f, fac in enumerate(p.factors):
            key = _factor_key(p, f)
            if key not in keys:
                keys[key] = len(self.uniques)
                self.uniques.append(f)
            self.factor_of.append(keys[key])
        self.kaxis = [k_axis(p.kind, f, p.factors[f].op) for f in self.uniques]
        self.outer = [p.factors[f].base.shape[1 - ax] for f, ax in zip(self.uniques, self.kaxis)]

    def _needs(self, tasks):
        """[(lo, hi) or None] per unique factor: the outer range a band's tasks read (its hull)."""
        ranges = [[] for _ in self.uniques]
        for u, lo, hi in task_reads(self.problem, self.factor_of, tasks):
            ranges[u].append((lo, hi))
        return [(min(a for a, _ in r), max(b for _, b in r)) if r else None for r in ranges]

    # ---------------------------------------------------------------- k
    def _units(self, unit_bytes, least_k=0):
        """k ranges of the uploads: the first a quarter of the others (compute starts sooner); units at least
        ``least_k`` long (UNIT_K)."""
        k = self.problem.k
        per_k = sum(self.outer) * self.item
        unit = max(ALIGN, unit_bytes // max(per_k, 1) // ALIGN * ALIGN, least_k // ALIGN * ALIGN)
        first = max(ALIGN, unit // 4 // ALIGN * ALIGN)
        if 0 in self.kaxis:           # a piece of a k-minor factor is a segment of every column it covers
            least = -(-MIN_SEGMENT // self.item // ALIGN) * ALIGN
            unit, first = max(unit, least), max(first, least // 2)
        edges = [0] + list(range(min(first, k), k, unit)) + [k]
        edges = sorted(set(edges))
        return list(zip(edges, edges[1:]))

    def _outer(self, shared, speeds, writeback_rate, upload_rate, count, only=None):
        """The outer order: steps along k up to ``final_start``, then the final range block by block, each
        block's pieces cut along the outer index (band_outer). Of the unit starts (at most OUTER_STARTS of
        them, 0 among them; or ``only``), the one whose modelled time (band_outer.simulate) is least."""
        p = self.problem
        starts = [k0 for k0, _ in self.units]
        if only is not None and only not in starts:
            raise ValueError(f"final_start must be a unit's start {starts}, got {only!r}")
        pick = max(1, -(-len(starts) // OUTER_STARTS))
        best = None
        made = {}                   # the blocks depend on the start only through the ramp (start 0 or not)
        for start in [only] if only is not None else sorted(set(starts[::pick]) | {0}):
            self.final_start = start
            uploaded = [0] * self.slots
            self.pieces = self._pieces(shared, [u for u in self.units if u[1] <= start], uploaded)
            self.steps = self._steps()
            if (start == 0) not in made:
                made[start == 0] = [band_outer.blocks(p, g0, g1, count, ALIGN, corner=self.corner,
                                                      ramp=band_outer.RAMP if start == 0 else (), sms=self.sms)
                                    for g0, g1 in self.bands]
            self.blocks = made[start == 0]
            clock = [sum(t.flops for t in self.band_tasks[g]) * start / p.k / max(speeds[g], 1.0)
                     for g in range(self.slots)]                    # the steps' compute (flops linear in k)
            final, self.block_pieces = band_outer.pieces(self, shared, speeds, Piece, start, p.k, uploaded, clock)
            self.pieces = self.pieces + final
            t = band_outer.simulate(self, speeds, upload_rate, writeback_rate)
            if best is None or t < best[0] * 0.99:
                best = (t, start, self.pieces, self.steps, self.blocks, self.block_pieces)
        self.modelled, self.final_start, self.pieces, self.steps, self.blocks, self.block_pieces = best

    def _final_start(self, rates, writeback_rate, upload_rate):
        """First k of the final range, the unit start whose modelled time is least. The final range's blocks
        need every piece (they are written back once all of k is in), so the range's compute starts once
        the last upload has landed and the steps before it are done; its compute then hides the band's
        write-back, the rest of the write-back and one block's copy are left at the end:

            time = max(uploads, steps) + final + max(COPY_MARGIN * write-back - final, 0) + write-back / BLOCKS

        Of the starts within 2 % of the least time, the latest (the shortest final range) is taken.
        """
        p = self.problem
        landed = max(sum(x.nbytes for x in self.pieces if x.owner == g) for g in range(self.slots)) / upload_rate
        gpus = []
        for g in range(self.slots):
            area = self.band_area(g)
            if area:
                flops = sum(t.flops for t in self.band_tasks[g])
                gpus.append((flops / max(rates[g], 1.0), area * self.item / writeback_rate))
        times = []
        for start, _ in self.units:
            f = 1.0 - start / p.k
            times.append((max((max(landed, (1 - f) * comp) + f * comp + max(COPY_MARGIN * copy - f * comp, 0.0)
                               + copy / BLOCKS for comp, copy in gpus), default=0.0), start))
        least = min(t for t, _ in times)
        return max(start for t, start in times if t <= least * 1.02)   # of the near-best, the shortest range

    def _steps(self):
        """Band-wide k steps before the final range: unit edges, lengths doubling up to STEP_K."""
        edges = [k0 for k0, _ in self.units if k0 < self.final_start] + [self.final_start]
        if self.final_start == 0:
            return []
        out, start, length = [], 0, edges[1]
        for e in edges[1:]:
            if e - start >= length or e == self.final_start:
                out.append((start, e))
                length = min(STEP_K, 2 * (e - start))
                start = e
        return out

    # ---------------------------------------------------------------- pieces
    def _pieces(self, shared, units, uploaded=None):
        """Every piece of every unit of ``units``, in k order; owners chosen so that each GPU uploads about as
        many bytes (``uploaded``: the bytes each has uploaded so far, updated)."""
        uploaded = [0] * self.slots if uploaded is None else uploaded
        out = []
        todo = []                                   # the same cuts in every unit
        for u in range(len(self.uniques)):
            for o0, o1, needers in self._segments(u):
                if shared:
                    todo.append((u, o0, o1, needers))
                else:
                    todo += [(u, o0, o1, (g,)) for g in needers]
        todo.sort(key=lambda t: len(t[3]) > 1)        # pieces only one GPU needs go to it first
        for k0, k1 in units:
            for u, o0, o1, needers in todo:
                nbytes = (o1 - o0) * (k1 - k0) * self.item
                owner = min(needers, key=lambda g: (uploaded[g], g))
                uploaded[owner] += nbytes
                out.append(Piece(len(out), u, o0, o1, k0, k1, owner,
                                 tuple(g for g in needers if g != owner), nbytes))
        return out

    def _segments(self, u):
        """(o0, o1, needers) cutting unique factor u's outer index where a band's need starts or ends; one
        segment, the hull of the needs, for a k-major factor (WHOLE_UNITS: its unit is then contiguous)."""
        spans = [(g, n[u]) for g, n in enumerate(self.needs) if n[u] is not None and n[u][1] > n[u][0]]
        if WHOLE_UNITS and self.kaxis[u] == 1 and spans:
            return [(min(lo for _, (lo, _) in spans), max(hi for _, (_, hi) in spans), tuple(g for g, _ in spans))]
        cuts = sorted({x for _, (lo, hi) in spans for x in (lo, hi)})
        out = []
        for a, b in zip(cuts, cuts[1:]):
            needers = tuple(g for g, (lo, hi) in spans if lo <= a and b <= hi)
            if needers:
                out.append((a, b, needers))
        return out

    def pieces_for(self, g, k0, k1):
        """The pieces GPU g needs for k range [k0, k1)."""
        return [p for p in self.pieces if k0 <= p.k0 and p.k1 <= k1 and (p.owner == g or g in p.readers)]

    def uploads(self, g):
        return [p for p in self.pieces if p.owner == g]

    # ---------------------------------------------------------------- final blocks
    def _blocks(self, g0, g1, count):
        """Block columns of band [g0, g1) for the final range, of about equal area: [[Task over all of k]]."""
        p = self.problem
        if g1 <= g0:
            return []
        lo, hi = (0, g1) if (p.triangular and p.lower) else (g0, g1)
        cols = np.arange(lo, hi)
        if not p.triangular:
            height = np.full(cols.size, p.m)
        elif p.lower:
            height = np.where(cols < g0, g1 - g0, g1 - cols)
        else:
            height = cols + 1
        area = np.cumsum(height, dtype=np.float64)
        cuts = [lo]
        for share in range(1, count):
            c = lo + int(np.searchsorted(area, area[-1] * share / count)) + 1
            c = -(-c // ALIGN) * ALIGN                       # up to a multiple of ALIGN
            if c - cuts[-1] >= ALIGN and hi - c >= ALIGN:
                cuts.append(c)
        cuts.append(hi)
        return [self._block_tasks(g0, g1, a, b) for a, b in zip(cuts, cuts[1:])]

    def _block_tasks(self, g0, g1, a, b):
        p = self.problem
        k = p.k
        mk = plan.make_task
        if not p.triangular:
            return [mk(p, 0, p.m, a, b, 0, k)]
        if not p.lower:
            out = [mk(p, 0, a, a, b, 0, k)] if a > 0 else []
            return out + [mk(p, a, b, a, b, 0, k, diag=True)]
        out = []
        if a < g0:
            out.append(mk(p, g0, g1, a, min(b, g0), 0, k))
        s = max(a, g0)
        if s < b:
            out.append(mk(p, s, b, s, b, 0, k, diag=True))
            if b < g1:
                out.append(mk(p, b, g1, s, b, 0, k))
        return out


def _area(t):
    rows, cols = t.i1 - t.i0, t.j1 - t.j0
    return rows * (rows + 1) // 2 if t.diag else rows * cols


def layout_for(problem, rates, writeback_rate, upload_rate, shared=True, speeds=None, mixes=None, sms=None,
               ahead=None):
    """The BandLayout of the order (k, or outer for a triangle with beta = 0: C's old values are uploaded
    after the operands) whose modelled time is least, the outer order only where it is OUTER_GAIN faster
    (OUTER_GAIN_ONE_GPU on one GPU).
    The layouts of the last CACHED signatures (shapes, ops, which factors are one memory) are kept and serve
    calls whose rates are within RATE_SLACK of theirs and whose GPUs' shares of the speeds are within SHARE_SLACK, or
    within what a new layout would repay in PAYBACK_CALLS calls (_serves; the outer order's model costs milliseconds;
    measured rates move from call to call). ``ahead`` (a call's own layout, REBUILD_AHEAD): where the signature has
    a kept layout that no longer serves (_stale), whose GPUs' shares moved little (_moved_little) and
    ``ahead(layout)`` says it can serve this call, it does, and a worker thread makes the new one for the next calls
    (one at a time per signature, holding ``problem`` until it is made, and keeping the served one instead where the
    model takes that one about as fast: REBUILD_GAIN; a rebuild that raised leaves the next call to make its layout
    itself; wait_rebuilds waits for them);
    None: made in the call. A layout from here holds no reference to the call's arrays (``problem`` is None)."""
    speeds = list(speeds or rates)
    values = list(rates) + plain_speeds(speeds, mixes) + [writeback_rate, upload_rate] + [r for r, _ in mixes or ()]
    key = (_signature(problem), bool(shared), len(rates), sms, len(values))
    args = (problem, list(rates), writeback_rate, upload_rate, shared, speeds, mixes, sms)
    with _cache_lock:
        for known, lay in _cache.get(key, []):
            if _serves(known, values, len(rates), lay):
                _cache.move_to_end(key)
                return lay
        job = _rebuilds.get(key)
        failed = job is not None and job.done()     # a finished job still listed raised: made here instead
        if failed:
            del _rebuilds[key]
        stale = _stale(key) if ahead is not None and REBUILD_AHEAD and not failed else None
    if stale is not None and _moved_little(stale, values, len(rates)) and ahead(stale[1]):    # outside the lock
        with _cache_lock:
            if key not in _rebuilds:
                _rebuilds[key] = workers.start(_rebuild, key, values, args, stale[1], name="layout")
        return stale[1]
    return _keep(key, values, _build(*args))


def _stale(key):
    """(rate values, layout) newest kept for ``key``'s signature (its rates may have moved past it, and measured
    mixes may have joined them since), or None; with _cache_lock held."""
    kept = _cache.get(key)
    if kept:
        _cache.move_to_end(key)
        return kept[0]
    same = [k for k in _cache if k[:-1] == key[:-1]]        # all but the count of values: as many GPUs
    return _cache[same[-1]][0] if same else None


def _moved_little(stale, values, gpus):
    """Whether a kept layout (``stale``: its rate values and itself) may serve a call at rate values ``values``
    while the new one is made (layout_for's ``ahead``): where no GPU's share of the speeds moved by more than
    STALE_SHARE, or by more than the share whose cost (about shift x GPUs x the call's time, run on its slowest GPU)
    making a layout takes. A GPU measured far slower than its band was made for (a throttling GPU, or one another
    process shares) gets its new band in the call: 2 x H100 with GPU 1's kernels at 0.4-0.5 of GPU 0's, zher2k
    n = k = 24576 on the bands of equal speeds took 3.1-3.4 s against GPU 0's 2.4 alone."""
    known, lay = stale
    paid = (lay.build_s or 0.0) / (gpus * max(lay.modelled or 0.0, 1e-9))
    return _shift(known, values, gpus) <= max(STALE_SHARE, paid)


def _shift(known, values, gpus):
    """The most any GPU's share of the speeds moved from rate values ``known`` to ``values`` (layout_for's lists)."""
    was, now = known[gpus:2 * gpus], values[gpus:2 * gpus]
    return max(abs(a / sum(now) - b / sum(was)) for a, b in zip(now, was))


def plain_speeds(speeds, mixes):
    """Each GPU's speed less the cost of the diagonal blocks its measuring call ran, where ``mixes`` (per GPU: the
    diagonal blocks' rate over the other products', their share of the flops) are given: the rate of its other
    products (BandLayout._corner_speeds' first step, cuda_bands' tail balance), and the speeds a layout is made for,
    compared by _serves. Their share of the flops is the last layout's, not the GPU's: compared as it is, it made
    every other call a new layout."""
    if not mixes:
        return list(speeds)
    return [s * (1.0 - share + share / ratio) for s, (ratio, share) in zip(speeds, mixes)]


def _rebuild(key, values, args, kept=None):
    """A worker's job (layout_for's ``ahead``): make the layout for ``values`` and keep it, or keep ``kept`` (the
    layout the call took meanwhile) for them where the model takes ``kept`` at most REBUILD_GAIN slower at them."""
    lay = _build(*args)
    if kept is not None and lay.modelled:
        _problem, _rates, writeback_rate, upload_rate, _shared, speeds = args[:6]
        if band_outer.simulate(kept, speeds, upload_rate, writeback_rate) <= (1.0 + REBUILD_GAIN) * lay.modelled:
            lay = kept
    _keep(key, values, lay)
    with _cache_lock:
        _rebuilds.pop(key, None)


def rebuilding():
    """Whether a worker thread is making a layout now (layout_for's ``ahead``)."""
    with _cache_lock:
        return bool(_rebuilds)


def wait_rebuilds(timeout=None):
    """Wait for the layouts worker threads are making (layout_for's ``ahead``); False where ``timeout`` seconds
    passed first. A rebuild that raised is raised here."""
    with _cache_lock:
        jobs = list(_rebuilds.items())
    end = None if timeout is None else time.perf_counter() + timeout
    for key, job in jobs:
        if not job.wait(None if end is None else max(0.0, end - time.perf_counter())):
            return False
        with _cache_lock:
            if _rebuilds.get(key) is job:
                del _rebuilds[key]
        job.result()
    return True


def _keep(key, values, lay):
    """Keep ``lay``, made for rate values ``values``, as its signature's newest layout; returns it."""
    with _cache_lock:
        _cache[key] = ([(values, lay)] + _cache.get(key, []))[:2]
        _cache.move_to_end(key)
        while len(_cache) > CACHED:
            _cache.popitem(last=False)
    return lay


def _build(problem, rates, writeback_rate, upload_rate, shared, speeds, mixes, sms):
    """layout_for's layout, made (no cache)."""
    start = time.perf_counter()
    best = BandLayout(problem, rates, writeback_rate, upload_rate, shared=shared, speeds=speeds, mixes=mixes)
    best.modelled = band_outer.simulate(best, speeds, upload_rate, writeback_rate)
    one_factor = problem.kind in ("herk", "syrk")
    if problem.triangular and problem.beta == 0 and (not one_factor or problem.k <= OUTER_MAX_K):
        outer = BandLayout(problem, rates, writeback_rate, upload_rate, shared=shared, speeds=speeds,
                           order="outer", mixes=mixes, sms=sms)
        if outer.modelled < (OUTER_GAIN if len(rates) > 1 else OUTER_GAIN_ONE_GPU) * best.modelled:
            best = outer
    best.problem = None
    best.build_s = time.perf_counter() - start
    return best


def _serves(known, values, gpus, lay):
    """Whether ``lay``, made for rate values ``known`` (layout_for's list: rates, speeds (plain_speeds), link rates, the
    mixes' ratios), serves ``values``: each within RATE_SLACK of its own, and each GPU's share of the speeds within
    SHARE_SLACK, or within what a new layout would repay in PAYBACK_CALLS calls: a shift of the shares by s moves
    about s x GPUs x the call's time onto or off its slowest GPU, against the time making ``lay`` took."""
    if not all(abs(a - b) <= RATE_SLACK * b for a, b in zip(values, known)):
        return False
    repaid = (lay.build_s or 0.0) / (PAYBACK_CALLS * gpus * max(lay.modelled or 0.0, 1e-9))
    return _shift(known, values, gpus) <= max(SHARE_SLACK, repaid)


CACHED = 32               # signatures whose layouts are kept (two rate sets each)
RATE_SLACK = 0.3          # a kept layout serves rates within this share of the ones it was made for ...
SHARE_SLACK = 0.01        # ... and GPUs' shares of the speeds within this of theirs (the bands follow the shares: a
                          # band 1 % of the flops too wide is ~2 % of a two-GPU call's time) ...
PAYBACK_CALLS = 3         # ... or within what a new layout repays in this many calls (a layout costs 3-70 ms: zgemmt
                          # n = k = 8192 on two GPUs 6 ms, modelled at 28 ms a call: shares within 3.6 %; 16384 9 ms
                          # against 190: 1 %)
OUTER_GAIN = 1.0          # the outer order where its modelled time is below this share of the k order's. 2 x H100,
                          # steady state, outer order against k order: zherk 8192 25.4-25.9 ms against 26.5-27.1,
                          # 16384 179-182 against 181-189; zher2k 16384 363-366 against 373
OUTER_GAIN_ONE_GPU = 0.95 # the same on one GPU: one H100, zher2k 8192 took 99 ms in the outer order (modelled at
                          # 0.98 of the k order's time) against 90 in the k order
OUTER_MAX_K = 16384       # herk and syrk take the outer order only up to this k: 2 x H100, zherk n = k = 24576, its
                          # blocks waited 18-44 ms for pieces, 666-675 ms against the k order's 633-635 (zher2k in the
                          # outer order: 24576 0.98 of the sum of device cuBLAS, 32768 0.93)
REBUILD_AHEAD = True      # a call whose kept layout no longer serves takes it while a worker makes the new one
                          # (layout_for's ``ahead``): 2 x H100, the first calls after page-locking made new
                          # layouts as their rates were measured, zgemmt n = k = 8192 6 ms on the call's
                          # 28, 16384 42 ms
STALE_SHARE = 0.1         # ... where no GPU's share of the speeds moved by more than this (or by what the layout's
                          # making costs: _moved_little); else the call makes its layout itself
REBUILD_GAIN = 0.01       # ... and its new layout replaces the kept one only where the model takes the kept one this
                          # much slower at the new rates: a new layout's first call loads its shapes' kernels (2 x
                          # H100, zgemmt n = k = 8192: 36-57 ms against 28; its edges moved by 1 %)
_cache = OrderedDict()
_cache_lock = threading.Lock()
_rebuilds = {}            # signature key -> the worker's Job making its layout


def _signature(problem):
    """What a layout depends on besides the rates: the shapes, ops, triangle, beta = 0 or not, and which
    factors are one upload."""
    keys = [_factor_key(problem, f) for f in range(len(problem.factors))]
    return (problem.kind, problem.m, problem.n, problem.k, problem.dtype.str, problem.lower, problem.beta != 0,
            tuple((fac.base.shape, fac.op) for fac in problem.factors), tuple(keys.index(x) for x in keys))


def region(layout, f_unique, o0, o1, k0, k1):
    """(row slice, column slice) of the unique factor's base for outer [o0, o1) and k [k0, k1)."""
    if layout.kaxis[f_unique] == 0:
        return slice(k0, k1), slice(o0, o1)
    return slice(o0, o1), slice(k0, k1)


def box(problem, g0, g1):
    """(r0, r1, c0, c1): the part of C that band [g0, g1) lies in."""
    if not problem.triangular:
        return 0, problem.m, g0, g1
    return (g0, g1, 0, g1) if problem.lower else (0, g1, g0, g1)


def _factor_key(problem, f):
    """What makes two factors one upload: the same memory, read along the same k axis."""
    fac = problem.factors[f]
    b = fac.base
    return (b.__array_interface__["data"][0], b.shape, b.strides, b.dtype.str, k_axis(problem.kind, f, fac.op))


def upload_bytes(problem):
    """Bytes that cross PCIe for the factors (each upload once: the same memory read along the same k axis)."""
    sizes = {_factor_key(problem, f): fac.base.size for f, fac in enumerate(problem.factors)}
    return sum(sizes.values()) * problem.dtype.itemsize


def padded_rows(rows):
    """Rows a GPU allocates for ``rows``: a multiple of ALIGN from ALIGN + 1 on (cuda_bands' arrays), so that
    every column starts on ALIGN entries."""
    return -(-rows // ALIGN) * ALIGN if rows > ALIGN else rows


def device_bytes(problem, rates, edges=None):
    """Per GPU with flop rates ``rates`` (or bands ``edges``): bytes of the whole factors (each upload once, rows
    padded as the GPU allocates them) and of its band's box of C, 0 for a GPU whose band is empty (it holds
    nothing); and the factors' bytes alone. Without laying out the rest of the call."""
    item = problem.dtype.itemsize
    bases = {_factor_key(problem, f): padded_rows(fac.base.shape[0]) * fac.base.shape[1]
             for f, fac in enumerate(problem.factors)}
    factors = sum(bases.values()) * item
    edges = aligned_edges(problem.n, list(rates), problem.triangular) if edges is None else edges
    out = []
    for g0, g1 in zip(edges, edges[1:]):
        r0, r1, c0, c1 = box(problem, g0, g1)
        out.append(factors + padded_rows(r1 - r0) * (c1 - c0) * item if g1 > g0 else 0)
    return out, factors


def aligned_edges(n, rates, triangular):
    """plan.band_edges with the inner edges moved to the nearest multiple of ALIGN (operand views and C's box
    then start on 1 KiB for complex128: cuBLAS ran a band on an odd offset 15-25 % slower)."""
    edges = plan.band_edges(n, rates, triangular)
    inner = [min(n, max(0, int(round(e / ALIGN)) * ALIGN)) for e in edges[1:-1]]
    out = [0]
    for e in inner:
        out.append(max(out[-1], e))
    return out + [n]
