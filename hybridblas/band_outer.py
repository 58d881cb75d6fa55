"""The outer order of a band call (band_plan.BandLayout with ``order="outer"``): after the steps along k (none,
or a few), the final range of k is not cut; each block of C is computed over it as soon as the rows of the
factors it reads have landed, and written back while later factor rows are still being uploaded.

The k order (band_plan's final range, one piece per factor per unit) writes nothing before all of k has
landed, so its write-back and its last range's compute follow the uploads. Where the uploads take about as
long as the compute (zgemmt at n = 8192 on two H100s: 2.1 GB over two PCIe links, ~21 ms, against ~20 ms of
compute), that tail is a third of the call; the outer order overlaps the three.

- Blocks of band [g0, g1), in compute order, C's entries by whole columns where the triangle lets (C is
  column-major: long DMA segments in the write-back). Lower triangle: the band's triangle in column blocks
  from its right end ([a, b) reads rows [a, g1) of the left factors and [a, b) of the right ones), then the
  rectangle left of it (rows [g0, g1), columns [0, g0)) in column blocks from right to left, each reading the
  band's rows of the left factors and its own columns of the right ones. Upper triangle: the band's column
  strips from the left ([a, b) reads rows [g0, b) and columns [a, b)), then the rectangle above in row blocks
  no thinner than TALL_BYTES a column. The first blocks are thinner (RAMP) when there are no steps before.
- Two distinct factors (gemmt: C's entry (i, j) reads row i of the left factor and row j of the right one),
  ``corner=True``: the blocks grow from the band's corner away from the diagonal (lower: bottom left). The
  rows in of the left factor are always the band's last ones [top, g1), the right factor's the first [0, v);
  each block adds a strip of rows (a row strip of C) or of columns (a column strip), whichever makes the more
  entries computable per byte, strips CORNER_GROW of the extent so far (at least CORNER_FIRST rows). The
  entries computable then grow like the square of the uploaded bytes with no half lost to the diagonal until
  the rectangle meets it: modelled on 2 x H100 at n = k = 8192, 25.6 ms against 31.3 ms for the column
  blocks (where compute after the last upload is a quarter of the triangle's).
  A strip that crosses the diagonal ends where its diagonal block's herkx fills its waves of tiles on the GPUs'
  SMs (complex data, diag_width), and no strip leaves a thin rest at the band's end (CORNER_REST): 2 x H100,
  zgemmt n = k = 8192, best call 28.9-29.0 ms (median 29.3) against 29.1-29.9 (29.9-30.3) with the widths as
  grown; 16384 the same within the noise. Strips made at least 1408, 1728 or 2048 wide where they cross the
  diagonal ran the diagonal blocks at 49-52 TF/s against 40-43 and took GPU 0's kernels from 21.3 to 19.5 ms, but
  the call no faster (in turns, best 27.31, 27.16 and 28.31 ms against 27.44; in blocks of 10 calls 27.68-28.84
  against 27.67-27.96): the GPUs waited for uploads instead. A band that would end on a triangle at least twice
  TAIL_DIAG wide ends on one that wide, the columns left of it a block before (_thin_end): the last block's
  write-back is left after all of the band's compute.
  The ramp's starved GPU time (about 4.5 ms of a 26 ms zgemmt at n = k = 8192) is not filled by two passes over
  the blocks, the first over half of k (64 KiB segments of a k-minor factor) with nothing written back: modelled
  4-7 % faster at 52 GB/s up, measured on 2 x H100 in turns 1.067 x as long for zgemmt and 1.028 x for zherk at
  8192 (zgemmt's rectangles over half of k ran at 50-51 TF/s against 56, its second pass's diagonal products, beta
  = 1, at 6-19 TF/s against 42-48, though cuBLAS zherkx alone takes as long with beta = 1 as with 0), and as fast
  at 16384, where the gaps shrank but the kernels took 182 ms against 162-167.
- Pieces: each unique factor's outer index over the final range, cut where a block's reads start or end and
  into at most PIECE_BYTES, queued in the order of the expected start of the first block that reads them;
  each crosses PCIe once, uploaded by the GPU that has uploaded the fewest bytes so far (with peer access
  any GPU with a band, which need not read it; without, each GPU that reads it). A stretch that every one of
  several GPUs reads in its first block goes first, cut into a part per GPU, so each link carries one.
- ``simulate`` models a layout's time (either order) from rates: uploads in order on each GPU's link at the
  share of its rate that their DMA segments reach (SEGMENTS), peer copies in order, each step's and block's
  compute once its pieces are in, write-back in order.

Pure arithmetic on the problem's shape, tested without a GPU.
"""
import math

from . import plan
from .problem import Operand

RAMP = (0.25, 0.5)        # the first blocks' flops, as shares of an equal block's
PIECE_BYTES = 64 << 20    # a piece is cut into parts of at most this many bytes
SPLIT_FIRST = True        # a stretch every GPU reads in its first block goes up first, a part per GPU (_split). 2 x
                          # H100, zgemmt n = k = 8192: each GPU's first block had waited for its own first piece and
                          # the other's second (B's first columns), 2.9 and 3.2 ms modelled, now 2.2 (the call 29.2 ->
                          # 28.7 ms); measured in turns, median of 18 calls: 29.1 ms against 29.3 (within the noise)
PEER_RATE = 250e9         # bytes/s of a copy between GPUs (NVLink) the model takes
TALL_BYTES = 32 << 10     # an upper triangle's rectangle goes in row blocks of at least this many bytes a column
CORNER_FIRST = 512        # rows of the corner order's first strips: 2 x H100, zgemmt n = k = 8192, 31.4 ms a call
                          # (median of 20) against 33-36 with 256 (more and smaller products, queued late);
                          # 16384 and 24576 no slower. With the calling thread's uploads, in turns (median of the
                          # rounds' best over 512's): 256 1.029 x as long at 8192, 1.006 x at 16384; 384 1.010,
                          # 1.018 x (the first product starts 1 ms sooner; the thinner strips' products run slower)
CORNER_GROW = 0.25        # a later strip: this share of the corner rectangle's longer side so far. 2 x H100, zgemmt
                          # n = k = 8192 in turns, the rounds' best over 0.25's: 0.15 1.047 x, 0.1 1.145 x as long
                          # (16384: 0.15 1.016 x), though modelled 2.4 and 3.3 % faster: the model does not take the
                          # thinner strips' products slower
CORNER_REST = 512         # a strip that would leave fewer rows than this to its band's end takes them: a thin last
                          # strip's herkx costs about a wide one's (1 x H100, k = 8192: 192 wide 0.37 ms, 704 0.45)
TAIL_DIAG = 1408          # the corner order's last block, where it is a diagonal triangle at least twice this wide, is
                          # cut so that the band ends on one this wide (_thin_end): the band's last write-back follows
                          # all of its compute (2 x H100, zgemmt n = k = 16384: a 3136-wide last triangle went back in
                          # 1.9-2.5 ms after the last product). In turns, 6 rounds of 3 calls, against the whole
                          # triangle: 16384 best 179.0 ms against 178.9, median 185.7 against 187.7; 24576 611.9
                          # against 611.3, medians 615.0 and 615.1 (within the noise)
DIAG_TILE = 64            # cuBLAS zherkx covers a triangle of width w in t (t + 1) / 2 tiles, t = ceil(w / 64), one per
                          # SM a wave: 1 x H100 (132 SMs), k = 8192, its time steps where they pass a multiple of 132
                          # (960 wide 0.76 ms, 1024 1.29; 1408 1.32, 1472 1.87; 1728 1.93, 1792 2.47; 2048 2.53, 2112
                          # 3.16; benchmarks.blas herkx-widths)
DIAG_WASTE = 0.1          # a diagonal block whose tiles leave more than this share of their waves' slots idle ...
DIAG_SLACK = 0.25         # ... moves its strip's edge by at most this share of its width to the nearest width that
                          # leaves less (diag_width)
SEGMENTS = ((8 << 10, 0.55), (64 << 10, 0.7))  # a 2D copy whose segments are shorter than this many bytes runs
                          # at this share of the link. 2 x H100, page-locked, in a band call beside the peer
                          # copies: 1-13 KiB segments 27-34 GB/s, 32 KiB 37-40, 176 KiB and whole 46-54 GB/s
                          # (alone, one stream: 4 KiB 33, 8-16 KiB 49, 32 KiB and more 55 GB/s; both GPUs at once
                          # beside a write-back, benchmarks.blas links --segments: 4 KiB 32, 8-16 KiB 44, 32 KiB
                          # 46, 64 KiB and whole 47). The model with those shares (4 KiB 0.65, 16 KiB 0.87, 32 KiB
                          # 0.93, 64 KiB 0.98) ran zgemmt and zherk at 8192 and zgemmt at 16384 in turns within
                          # 1 % of these


def dma_share(segment):
    """The share of a link's rate a 2D copy with segments of ``segment`` bytes reaches (SEGMENTS)."""
    for below, share in SEGMENTS:
        if segment < below:
            return share
    return 1.0


def blocks(problem, g0, g1, count, align, ramp=RAMP, corner=False, sms=None):
    """[[Task over all of k]] of band [g0, g1), in compute order, C's entries of a block by whole columns as far
    as the triangle lets (column-major C: long DMA segments in the write-back; see the module's docstring);
    ``corner``: grown from the band's corner (two distinct factors), its diagonal blocks at widths that suit
    GPUs of ``sms`` SMs (complex data; None: as grown)."""
    if g1 <= g0:
        return []
    if corner:
        mk, k = plan.make_task, problem.k
        flip = (lambda r: r) if problem.lower else (lambda r: (r[2], r[3], r[0], r[1], r[4]))
        sms = sms if problem.complex else None
        return [[mk(problem, *flip(r)[:4], 0, k, diag=r[4]) for r in blk]
                for blk in corner_strips(g0, g1, align, sms=sms)]
    rect = (g1 - g0) * g0
    tri = (g1 - g0) * (g1 - g0 + 1) / 2
    n_rect = max(1, round(count * rect / (rect + tri))) if rect else 0
    n_tri = max(1, count - n_rect)
    width = g1 - g0
    k = problem.k
    mk = plan.make_task
    out = []
    if problem.lower:       # the triangle from its right end, column blocks; then the rectangle, right to left
        cuts = _cuts(g1, g0, n_tri, ramp, align, lambda share: g1 - width * math.sqrt(share))
        for b, a in zip(cuts, cuts[1:]):
            below = [mk(problem, b, g1, a, b, 0, k)] if b < g1 else []
            out.append([mk(problem, a, b, a, b, 0, k, diag=True)] + below)
        if rect:
            cuts = _cuts(g0, 0, n_rect, (), align, lambda share: g0 * (1 - share))
            out += [[mk(problem, g0, g1, a, b, 0, k)] for b, a in zip(cuts, cuts[1:])]
        return out
    # upper: the triangle's column strips from the left; then the rectangle above in row blocks of at least
    # TALL_BYTES per column segment
    cuts = _cuts(g0, g1, n_tri, ramp, align, lambda share: g0 + width * math.sqrt(share))
    for a, b in zip(cuts, cuts[1:]):
        above = [mk(problem, g0, a, a, b, 0, k)] if a > g0 else []
        out.append(above + [mk(problem, a, b, a, b, 0, k, diag=True)])
    if rect:
        n_rect = max(1, min(n_rect, g0 * problem.dtype.itemsize // TALL_BYTES))
        cuts = _cuts(0, g0, n_rect, (), align, lambda share: g0 * share)
        out += [[mk(problem, a, b, g0, g1, 0, k)] for a, b in zip(cuts, cuts[1:])]
    return out


def corner_strips(g0, g1, align, first=None, grow=None, sms=None):
    """The corner order of lower band [g0, g1) (an upper band: the same with rows and columns swapped): blocks
    as lists of (r0, r1, c0, c1, diag). State: the left factor's rows [top, g1) and the right factor's
    [0, v) are in, every entry (i, j) with i >= top, j < v, j <= i computed. A block is a row strip (top moves
    up) or a column strip (v moves right), the one with more entries per row; strip edges on multiples of
    align (or g0, g1). Given ``sms``, a strip that crosses the diagonal moves its edge so that its diagonal
    block's width is diag_width's; a strip that would leave fewer than CORNER_REST rows to the band's end takes
    them."""
    first = CORNER_FIRST if first is None else first
    grow = CORNER_GROW if grow is None else grow
    top, v, out = g1, 0, []
    while top > g0 or v < g1:
        w = max(first, int(grow * max(g1 - top, v)))
        best = None
        if top > g0:
            a = max(g0, (top - w) // align * align)
            if v > a:                       # its diagonal block is [a, min(v, top))
                a = max(g0, min(v, top) - diag_width(min(v, top) - a, sms, align))
            a = g0 if a - g0 < CORNER_REST else a
            rects = _row_strip(a, top, v)
            best = (_cells(rects) / (top - a), "row", a, rects)
        if v < g1:
            b = min(g1, -(-(v + w) // align) * align)
            if top < b:                     # its diagonal block is [max(v, top), b)
                b = min(g1, max(v, top) + diag_width(b - max(v, top), sms, align))
            b = g1 if g1 - b < CORNER_REST else b
            rects = _column_strip(v, b, top, g1)
            gain = _cells(rects) / (b - v)
            if best is None or gain > best[0] or (gain == best[0] and g1 - top >= v):
                best = (gain, "column", b, rects)
        _gain, which, edge, rects = best
        if which == "row":
            top = edge
        else:
            v = edge
        if rects:
            out.append(rects)
    return _thin_end(out, align, sms)


def _thin_end(strips, align, sms):
    """The strips with a last block that is one diagonal triangle at least twice TAIL_DIAG wide cut in two: its
    columns left of the last TAIL_DIAG (diag_width's) as one block, that triangle as the band's last block."""
    last = strips[-1] if strips else None
    if not last or len(last) != 1 or not last[0][4]:
        return strips
    a, b = last[0][0], last[0][1]
    tail = diag_width(TAIL_DIAG, sms, align)
    if b - a < 2 * tail:
        return strips
    m = b - tail
    return strips[:-1] + [[(a, m, a, m, True), (m, b, a, m, False)], [(m, b, m, b, True)]]


def diag_width(width, sms, align):
    """``width`` where its herkx wastes at most DIAG_WASTE of its waves (its t (t + 1) / 2 tiles, t = ceil(w /
    DIAG_TILE), in waves of ``sms``), else the nearest width within DIAG_SLACK (a multiple of ``align``) that
    does; ``width`` itself where none does or without ``sms``."""
    if not sms or width <= align or _waste(width, sms) <= DIAG_WASTE:
        return width
    lo = max(align, -(-int(width * (1 - DIAG_SLACK)) // align) * align)
    fits = [w for w in range(lo, int(width * (1 + DIAG_SLACK)) + 1, align) if _waste(w, sms) <= DIAG_WASTE]
    return min(fits, key=lambda w: (abs(w - width), w)) if fits else width


def diag_tiles(width):
    """The DIAG_TILE x DIAG_TILE tiles cuBLAS's herkx covers a triangle of ``width`` with."""
    t = -(-width // DIAG_TILE)
    return t * (t + 1) // 2


def _waste(width, sms):
    """The share of its waves' tile slots a triangle of ``width`` leaves idle on ``sms`` SMs."""
    tiles = diag_tiles(width)
    slots = -(-tiles // sms) * sms
    return (slots - tiles) / slots


def _row_strip(a, b, v):
    """Entries (i, j) of rows [a, b) with j < v and j <= i, as rectangles (r0, r1, c0, c1, diag)."""
    if v <= a:
        return [(a, b, 0, v, False)] if v > 0 else []
    out = [(a, b, 0, a, False)] if a > 0 else []
    if v >= b:
        return out + [(a, b, a, b, True)]
    return out + [(a, v, a, v, True), (v, b, a, v, False)]


def _column_strip(a, b, top, g1):
    """Entries (i, j) of columns [a, b) with top <= i < g1 and i >= j, as rectangles."""
    if top >= b:
        return [(top, g1, a, b, False)] if g1 > top else []
    lo = max(a, top)
    out = [(top, g1, a, top, False)] if top > a else []
    out.append((lo, b, lo, b, True))
    return out + ([(b, g1, lo, b, False)] if b < g1 else [])


def _cells(rects):
    return sum((r1 - r0) * (r1 - r0 + 1) // 2 if d else (r1 - r0) * (c1 - c0) for r0, r1, c0, c1, d in rects)


def _cuts(start, end, count, ramp, align, position):
    """Edges from ``start`` to ``end`` (either way): ``count`` parts of equal flops, the first ones ``ramp``
    shares of an equal one; ``position(share)`` maps a cumulative share of the flops to an edge; inner edges
    on multiples of align, at least align apart."""
    weights = list(ramp[:max(count - 1, 0)]) + [1.0] * count
    total = sum(weights)
    edges, acc = [start], 0.0
    for w in weights[:-1]:
        acc += w / total
        e = int(round(position(acc) / align)) * align
        if abs(e - edges[-1]) >= align and abs(end - e) >= align and min(start, end) < e < max(start, end):
            edges.append(e)
    return edges + [end]


def task_reads(problem, factor_of, tasks):
    """[(unique factor, lo, hi)]: the outer ranges of each unique factor (``factor_of``: BandLayout.factor_of) that
    ``tasks`` read."""
    tagged = [Operand(f, fac.op) for f, fac in enumerate(problem.factors)]
    out = set()
    for t in tasks:
        for _coef, x, y in problem.terms(tagged):
            out.add((factor_of[x.base], t.i0, t.i1))
            out.add((factor_of[y.base], t.j0, t.j1))
    return sorted(out)


def needs(problem, factor_of, n_unique, tasks):
    """Per unique factor, the merged outer ranges that ``tasks`` read."""
    ranges = [[] for _ in range(n_unique)]
    for u, lo, hi in task_reads(problem, factor_of, tasks):
        ranges[u].append((lo, hi))
    return [_merge(r) for r in ranges]


def _merge(ranges):
    out = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def pieces(layout, shared, speeds, piece_cls, k0, k1, uploaded, clock):
    """The pieces of k range [k0, k1) that the blocks (``layout.blocks``, over that range) read, in upload
    order (see the module's docstring), numbered on from len(layout.pieces); and per GPU per block the
    indices of the pieces it gathers (those no earlier block of that GPU read). ``uploaded`` (bytes each GPU
    uploads before) is updated; ``clock[g]``: when GPU g's first block is expected to start."""
    p = layout.problem
    item, span = layout.item, k1 - k0
    share = span / p.k
    starts = []                      # starts[g][b]: the block's expected start (s) if compute never waited
    for g, bl in enumerate(layout.blocks):
        t, st = clock[g], []
        for tasks in bl:
            st.append(t)
            t += share * sum(x.flops for x in tasks) / max(speeds[g], 1.0)
        starts.append(st)
    reads, spans = _reads(layout)
    segments = []                    # (need time, unique factor, o0, o1, {GPU: need time}, {GPU: its first block})
    for u, a, b, block_of in spans:
        first = {g: starts[g][bi] for g, bi in block_of.items()}
        segments.append((min(first.values()), u, a, b, first, block_of))
    segments.sort(key=lambda s: (s[0], not _split(s[5], shared), s[1], s[2]))
    rows_cap = max(1, PIECE_BYTES // max(span * item, 1))
    base = len(layout.pieces)
    busy = [g for g in range(layout.slots) if layout.band_tasks[g]]     # a GPU of an empty band holds nothing
    out = []
    per_block = [[[] for _ in r] for r in reads]     # a piece is gathered by the first block of a GPU that reads it
    for _t, u, a, b, first, block_of in segments:
        parts = -(-(b - a) // rows_cap)
        if _split(block_of, shared):
            parts = max(parts, len(block_of))
        step = -(-(b - a) // parts)
        for o0 in range(a, b, step):
            o1 = min(b, o0 + step)
            nbytes = (o1 - o0) * span * item
            for needers in ([tuple(first)] if shared else [(g,) for g in first]):
                choice = busy if shared else needers     # with peer access: any GPU that holds the factors
                owner = min(choice, key=lambda g: (uploaded[g], first.get(g, math.inf), g))
                uploaded[owner] += nbytes
                index = base + len(out)
                out.append(piece_cls(index, u, o0, o1, k0, k1, owner, tuple(g for g in needers if g != owner),
                                     nbytes))
                for g in needers:
                    per_block[g][block_of[g]].append(index)
    return out, per_block


def _split(block_of, shared):
    """Whether a stretch of a factor that the GPUs of ``block_of`` ({GPU: its first block that reads it}) read
    goes up first among those needed as early and in a part per GPU (SPLIT_FIRST): every one of several GPUs
    reads it in its first block, and they share pieces."""
    return SPLIT_FIRST and shared and len(block_of) > 1 and not any(block_of.values())


def _reads(layout):
    """(reads, spans) of ``layout.blocks``, kept on the layout for that list of blocks (the outer order's model
    lays out pieces for several final starts over the same blocks): reads[g][b] per unique factor the merged
    ranges block b of GPU g reads; spans: (unique factor, o0, o1, {GPU: the first of its blocks that reads it})
    for each stretch between the cuts of those ranges that some block reads, in factor then index order."""
    kept = getattr(layout, "_kept_reads", None)
    if kept is not None and kept[0] is layout.blocks:
        return kept[1], kept[2]
    p = layout.problem
    reads = [[needs(p, layout.factor_of, len(layout.uniques), tasks) for tasks in bl] for bl in layout.blocks]
    spans = []
    for u in range(len(layout.uniques)):
        cuts = sorted({x for r in reads for blk in r for lo, hi in blk[u] for x in (lo, hi)})
        at = {x: i for i, x in enumerate(cuts)}
        firsts = [{} for _ in cuts[1:]]      # per span between cuts: GPU -> the first of its blocks that reads it
        for g, r in enumerate(reads):
            for bi, blk in enumerate(r):
                for lo, hi in blk[u]:
                    for i in range(at[lo], at[hi]):
                        firsts[i].setdefault(g, bi)
        spans += [(u, a, b, block_of) for (a, b), block_of in zip(zip(cuts, cuts[1:]), firsts) if block_of]
    layout._kept_reads = (layout.blocks, reads, spans)
    return reads, spans


def simulate(layout, speeds, h2d, d2h, peer=PEER_RATE, trace=None):
    """Modelled seconds of ``layout``'s call: each GPU uploads the pieces it owns in order at ``h2d`` bytes/s
    (times dma_share of their segments), copies the others' in order at ``peer``, runs its steps and then its
    blocks in order at ``speeds`` flop/s, each once the pieces it reads are in, and writes its blocks back in
    order at ``d2h`` (times dma_share of their column segments). A list ``trace`` gets the modelled timeline:
    (GPU slot, what, index, start, end), what "upload" or "peer" (index: the piece), "compute" (index: its place
    in layout.schedule) or "write" (the same index)."""
    link = [0.0] * layout.slots
    landed = {}
    for x in layout.pieces:
        start = link[x.owner]
        link[x.owner] += layout.link_bytes(x) / h2d
        landed[x.index] = link[x.owner]
        if trace is not None:
            trace.append((x.owner, "upload", x.index, start, link[x.owner]))
    end = 0.0
    for g in range(layout.slots):
        comp = copy = out = 0.0
        byindex = layout.pieces
        for i, (gather, flops, written) in enumerate(layout.schedule(g)):
            ready = 0.0
            for j in gather:
                x = byindex[j]
                if x.owner == g:
                    ready = max(ready, landed[j])
                else:
                    start = max(copy, landed[j])
                    copy = start + x.nbytes / peer
                    ready = max(ready, copy)
                    if trace is not None:
                        trace.append((g, "peer", j, start, copy))
            start = max(comp, ready)
            comp = start + flops / max(speeds[g], 1.0)
            if trace is not None:
                trace.append((g, "compute", i, start, comp))
            if written:
                start = max(out, comp)
                out = start + written / d2h
                if trace is not None:
                    trace.append((g, "write", i, start, out))
        end = max(end, out, comp)
    return end
