"""The outer order of a band call (hybridblas.band_outer, BandLayout(order="outer"), band_plan.layout_for) on
host problems, without a GPU:

- each band's blocks cover it exactly once, over all of k, the triangle's strips and the rectangle's column
  blocks on multiples of ALIGN;
- with peer access every cell of every factor over the final range crosses PCIe once (the pieces of a unique
  factor are disjoint) and the two GPUs upload about as much; without it nobody copies from another GPU;
- every step's and every block's products read only cells of pieces gathered by then (the same array as
  both factors included), and no block gathers a piece twice;
- layout_for picks the order of least modelled time (the outer one where the uploads are as long as the
  compute: zgemmt at n = 8192 on two GPUs), the k order for gemm and beta != 0, caches by signature and
  keeps no reference to the call's arrays; the model is monotone in the rates.
"""
import copy

import numpy as np
import pytest

from hybridblas import band_outer as O
from hybridblas import band_plan as B
from hybridblas import problem as P
from test_band_plan import CASES, IDS, OPS, Z, build, covers, disjoint, grid, inside, mat, tally

needs = O.needs

RATES = [(1e13,), (1e13, 1e13), (1e13, 3e13), (2e13, 1e13, 5e12)]
FAST, SLOW = (1e15, 1e15), (3e9, 6e9)          # (write-back, upload) bytes/s: the final start varies


def outer(case_args, rates, shared=True, rates_io=SLOW, blocks=None):
    prob = build(*case_args)
    return prob, B.BandLayout(prob, list(rates), rates_io[0], rates_io[1], shared=shared, blocks=blocks,
                              order="outer")


TRI = [i for i, c in enumerate(CASES) if c[0] != "gemm"]


@pytest.mark.parametrize("case", TRI, ids=[IDS[i] for i in TRI])
def test_blocks_cover_each_band_once(case):
    for rates in RATES:
        for io in (FAST, SLOW):
            prob, lay = outer(CASES[case], rates, rates_io=io)
            for g, (g0, g1) in enumerate(lay.bands):
                tasks = [t for blk in lay.blocks[g] for t in blk]
                assert bool(lay.blocks[g]) == (g1 > g0)
                rows, cols = grid(prob, lay.band_tasks[g], tasks)
                assert all(np.array_equal(a, b) for a, b in zip(tally(prob, tasks, rows, cols),
                                                                 tally(prob, lay.band_tasks[g], rows, cols)))
                assert all(inside(t, lay.boxes[g]) and (t.k0, t.k1) == (0, prob.k) for t in tasks)
                edges = {x for t in tasks for x in (t.i0, t.i1, t.j0, t.j1)} - {0, g0, g1, prob.n}
                assert all(x % B.ALIGN == 0 for x in edges)


@pytest.mark.parametrize("case", TRI, ids=[IDS[i] for i in TRI])
def test_final_pieces_cross_pcie_once_and_cover_the_blocks(case):
    for rates in RATES:
        for shared in (True, False):
            prob, lay = outer(CASES[case], rates, shared)
            k0, k1 = lay.final
            final = [p for p in lay.pieces if (p.k0, p.k1) == (k0, k1)]
            steps = [p for p in lay.pieces if p.k1 <= k0]
            assert len(final) + len(steps) == len(lay.pieces) and [p.index for p in lay.pieces] == list(
                range(len(lay.pieces)))
            for p in final:
                assert p.nbytes == (p.o1 - p.o0) * (k1 - k0) * lay.item and p.owner not in p.readers
                assert shared or p.readers == ()
            if shared:
                for u in range(len(lay.uniques)):
                    assert disjoint([(p.o0, p.o1) for p in final if p.factor == u])
            for g in range(lay.slots):
                seen = [i for lst in lay.block_pieces[g] for i in lst]
                assert len(seen) == len(set(seen))
                assert all(lay.pieces[i].owner == g or g in lay.pieces[i].readers for i in seen)
                listed = set()
                for b, tasks in enumerate(lay.blocks[g]):
                    got = [lay.pieces[i] for lst in lay.block_pieces[g][:b + 1] for i in lst]
                    reads = O.needs(prob, lay.factor_of, len(lay.uniques), tasks)
                    for u, ranges in enumerate(reads):
                        mine = [(p.o0, p.o1) for p in got if p.factor == u]
                        assert all(covers(mine, lo, hi) for lo, hi in ranges), (g, b, u, ranges, mine)
                    first = [p.index for p in final if (p.owner == g or g in p.readers) and p.index not in listed
                             and any(lo <= p.o0 and p.o1 <= hi for lo, hi in reads[p.factor])]
                    assert lay.block_pieces[g][b] == first        # each piece at the first block that reads it
                    listed.update(first)


def test_two_gpus_upload_about_as_much():
    for args in (("gemmt", "CN", 8192, 8192, Z, True, "F"), ("herk", "N", 8192, 8192, Z, False, "F"),
                 ("her2k", "C", 4096, 2048, Z, True, "C")):
        _, lay = outer(args, (5e13, 5e13), rates_io=(45e9, 50e9))
        sent = [sum(p.nbytes for p in lay.uploads(g)) for g in range(2)]
        assert abs(sent[0] - sent[1]) <= O.PIECE_BYTES + max(p.nbytes for p in lay.pieces), sent


def _cells(lay, prob, g, pieces):
    have = [np.zeros(prob.factors[f].base.shape, bool) for f in lay.uniques]
    for p in pieces:
        have[p.factor][B.region(lay, p.factor, p.o0, p.o1, p.k0, p.k1)] = True
    return have


SAME_ARRAY = [("her2k", "N", "F"), ("her2k", "C", "C"), ("syr2k", "T", "F"), ("herk", "N", "F"), ("herk", "C", "C")]


@pytest.mark.parametrize("kind,trans,how", SAME_ARRAY + [("gemmt", "CN", "F"), ("gemmt", "NT", "C")])
@pytest.mark.parametrize("gpus", [1, 2, 3])
@pytest.mark.parametrize("lower", [True, False])
def test_every_product_reads_only_what_has_landed(kind, trans, how, gpus, lower, monkeypatch):
    monkeypatch.setattr(B, "MIN_SEGMENT", 64 * 16)
    n = 448
    a = mat((n, n), Z, how)
    if kind == "gemmt":
        b = mat((n, n), Z, how)
        arrays, ops = [a, b], [OPS[t] for t in trans]
    else:
        arrays, ops = [a, a if kind.endswith("2k") else None][:1 + kind.endswith("2k")], [OPS[trans]] * (
            1 + kind.endswith("2k"))
    prob = P.build_problem(kind, 1.0, arrays, 0.0, None, ops, lower, None)
    tagged = [P.Operand(f, fac.op) for f, fac in enumerate(prob.factors)]
    for start in (0, 64, 192, 384):                 # unit starts: units of 64 along k
        lay = B.BandLayout(prob, [1e13] * gpus, 1e9, 1e9, unit_bytes=64 * n * 16, blocks=6, order="outer",
                           final_start=start)
        assert len(lay.steps) >= (start > 0) and lay.final == (start, n)
        for g in range(gpus):
            phases = [(k0, k1, lay.band_tasks[g], lay.pieces_for(g, 0, k1)) for k0, k1 in lay.steps]
            before = lay.pieces_for(g, 0, lay.final[0])
            for b, block in enumerate(lay.blocks[g]):
                got = before + [lay.pieces[i] for lst in lay.block_pieces[g][:b + 1] for i in lst]
                phases.append((*lay.final, block, got))
            for k0, k1, tasks, got in phases:
                have = _cells(lay, prob, g, got)
                for t in tasks:
                    for _coef, x, y in prob.terms(tagged):
                        for f, (o0, o1) in ((x.base, (t.i0, t.i1)), (y.base, (t.j0, t.j1))):
                            fac = prob.factors[f]
                            rows = (slice(k0, k1), slice(o0, o1)) if P.k_axis(kind, f, fac.op) == 0 else (
                                slice(o0, o1), slice(k0, k1))
                            assert have[lay.factor_of[f]][rows].all(), (g, k0, k1, t, f)


@pytest.mark.parametrize("sms", [None, 132, 7])
@pytest.mark.parametrize("g0,g1", [(0, 1), (0, 65), (0, 5824), (64, 130), (5824, 8192), (3000, 3001), (448, 7011)])
def test_corner_strips_cover_the_band_once_growing_from_its_corner(g0, g1, sms):
    strips = O.corner_strips(g0, g1, B.ALIGN, sms=sms)
    seen = np.zeros((g1, g1), int)
    top, v = g1, 0
    for blk in strips:
        assert blk
        rows = {(r0, r1) for r0, r1, *_ in blk}
        cols = {(c0, c1) for _, _, c0, c1, _ in blk}
        for r0, r1, c0, c1, diag in blk:
            assert g0 <= r0 < r1 <= g1 and 0 <= c0 < c1 <= g1
            if diag:
                assert (r0, r1) == (c0, c1)
                seen[r0:r1, c0:c1] += np.tril(np.ones((r1 - r0, r1 - r0), int))
            else:
                assert c1 <= r0                              # below the diagonal
                seen[r0:r1, c0:c1] += 1
        lo, hi = min(r for r, _ in rows), max(r for _, r in rows)
        a, b = min(c for c, _ in cols), max(c for _, c in cols)
        assert hi == g1 or hi <= top                 # the left factor's rows read so far: [top, g1)
        assert a == 0 or a >= v                      # the right factor's: [0, v)
        assert lo < top or b > v                     # each block reads rows or columns not read before
        top, v = min(top, lo), max(v, b)
        inner = {x for r0, r1, c0, c1, _ in blk for x in (r0, r1, c0, c1)} - {0, g0, g1}
        assert all(x % B.ALIGN == 0 for x in inner)
    assert np.array_equal(seen[g0:g1], np.tril(np.ones((g1, g1), int))[g0:g1])
    first = strips[0]
    assert max(r1 - r0 for r0, r1, *_ in first) <= O.CORNER_FIRST + B.ALIGN
    if g1 - g0 > O.CORNER_FIRST:            # no strip leaves a thin rest: every diagonal block is wide
        assert min(r1 - r0 for blk in strips for r0, r1, _, _, d in blk if d) >= min(
            O.CORNER_REST, B.ALIGN * 2)


def test_a_band_ends_on_a_thin_triangle_where_its_last_one_is_wide():
    """_thin_end: a band whose corner order would end on a triangle at least twice TAIL_DIAG wide ends on one of
    diag_width(TAIL_DIAG)'s, the columns left of it one block before; a narrower last triangle stays whole."""
    tail = O.diag_width(O.TAIL_DIAG, 132, B.ALIGN)
    strips = O.corner_strips(11520, 16384, B.ALIGN, sms=132)
    m = 16384 - tail
    assert strips[-1] == [(m, 16384, m, 16384, True)]
    (a, b, c, d, diag), below = strips[-2]
    assert diag and (b, c, d) == (m, a, m) and below == (m, 16384, a, m, False) and m - a >= tail
    whole = O._thin_end([[(0, 2 * tail - B.ALIGN, 0, 2 * tail - B.ALIGN, True)]], B.ALIGN, 132)
    assert whole == [[(0, 2 * tail - B.ALIGN, 0, 2 * tail - B.ALIGN, True)]]
    assert O._thin_end([[(0, 4096, 0, 512, False)]], B.ALIGN, 132) == [[(0, 4096, 0, 512, False)]]
    assert O._thin_end([], B.ALIGN, 132) == []


def waste(w, sms):
    """The share of its waves' slots that a triangle of width w in 64 x 64 tiles leaves idle on sms SMs."""
    t = -(-w // O.DIAG_TILE)
    tiles = t * (t + 1) // 2
    return 1 - tiles / (-(-tiles // sms) * sms)


def test_diagonal_widths_fill_their_waves():
    """herkx's time steps where its 64 x 64 tiles pass a multiple of the SMs (1 x H100: 960 wide 0.76 ms, 1152
    1.32 ms): a width that leaves more than DIAG_WASTE of its waves idle moves to the nearest that does not,
    within DIAG_SLACK; one that fills them, or has no such width near, stays."""
    assert [O.diag_width(w, 132, 64) for w in (1024, 1088, 1792, 1472, 2112, 2304)] == [960, 960, 1728, 1408, 2048,
                                                                                        2240]
    assert [O.diag_width(w, 132, 64) for w in (960, 2496, 2688, 3072, 448)] == [960, 2496, 2688, 3072, 448]
    for sms in (132, 114, 78):
        for w in range(128, 4096, 64):
            got = O.diag_width(w, sms, 64)
            assert got % 64 == 0 and abs(got - w) <= O.DIAG_SLACK * w
            if waste(w, sms) <= O.DIAG_WASTE:
                assert got == w
            else:
                assert got == w or waste(got, sms) <= O.DIAG_WASTE
    assert O.diag_width(1024, None, 64) == 1024 and O.diag_width(64, 132, 64) == 64


def test_corner_layout_picks_wave_filling_diagonal_blocks_given_the_sms():
    """zgemmt n = 8192 on two GPUs of 132 SMs: the diagonal blocks of strips that cross the diagonal waste less of
    their waves than the widths as grown, and the model takes them at about the same time; real data (whose
    herkx tiles were not measured) keeps the widths as grown."""
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")
    speeds, wb, up = [4.6e13, 5.4e13], 3.5e10, 5.1e10
    grown = B.BandLayout(gemmt, speeds, wb, up, order="outer")
    snapped = B.BandLayout(gemmt, speeds, wb, up, order="outer", sms=132)

    def idle(lay):
        return sum(waste(t.i1 - t.i0, 132) * (t.i1 - t.i0) for blocks in lay.blocks for blk in blocks for t in blk
                   if t.diag)
    assert idle(snapped) < 0.7 * idle(grown)
    assert snapped.modelled < 1.02 * grown.modelled
    real = build("syrk", "T", 7011, 3136, np.float64, True, "F")
    assert O.blocks(real, 0, 7011, 12, B.ALIGN, corner=True, sms=132) == O.blocks(real, 0, 7011, 12, B.ALIGN,
                                                                                   corner=True)


def test_corner_order_for_two_distinct_factors_and_faster_in_the_model(monkeypatch):
    speeds, wb, up = [5.2e13, 5.2e13], 45e9, 54e9
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")
    corner = B.BandLayout(gemmt, speeds, wb, up, order="outer")
    assert corner.corner and len(corner.blocks[0]) > B.OUTER_BLOCKS
    assert corner.edges[1] < B.aligned_edges(8192, speeds, True)[1]     # the all-triangle band: more diagonal
    a = mat((8192, 8192), Z)
    assert not B.BandLayout(P.build_problem("gemmt", 1.0, [a, a], 0.0, None, [P.C, P.N], True, None),
                            speeds, wb, up, order="outer").corner       # one array: square first as herk
    for kind, trans in (("herk", "N"), ("her2k", "N")):
        assert not B.BandLayout(build(kind, trans, 1024, 1024, Z, True, "F"), speeds, wb, up, order="outer").corner
    orig = O.blocks                                  # the same call in column blocks
    monkeypatch.setattr(O, "blocks", lambda *args, **kw: orig(*args, **dict(kw, corner=False)))
    columns = B.BandLayout(gemmt, speeds, wb, up, order="outer")
    assert corner.modelled < 0.85 * columns.modelled


def test_a_stretch_every_gpus_first_block_reads_goes_up_first_a_part_on_each_link(monkeypatch):
    """SPLIT_FIRST: zgemmt's first blocks on two GPUs both read B's first columns; that stretch goes up before the
    rest that is needed as early, in a part per GPU, so each GPU's first block has its reads after two uploads on
    either link (without: after its owner's second upload, then a peer copy), and the model takes the call faster."""
    speeds, wb, up = [5.2e13, 5.1e13], 33e9, 46e9
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")

    def made(split):
        monkeypatch.setattr(O, "SPLIT_FIRST", split)
        return B.BandLayout(gemmt, speeds, wb, up, order="outer", sms=132)
    lay, before = made(True), made(False)
    assert lay.edges == before.edges and lay.blocks == before.blocks
    a, b = lay.pieces[:2]
    assert (a.factor, a.o1, a.k0, a.k1) == (b.factor, b.o0, 0, 8192) and {a.owner, b.owner} == {0, 1}
    assert all(x.index in lay.block_pieces[g][0] for x in (a, b) for g in (0, 1))
    for g in (0, 1):
        for i in lay.block_pieces[g][0]:
            x = lay.pieces[i]
            assert lay.uploads(x.owner).index(x) < 2
    assert sum(x.nbytes for x in lay.pieces) == sum(x.nbytes for x in before.pieces)
    assert lay.modelled < 0.99 * before.modelled


def test_corner_bands_count_the_diagonal_blocks_once():
    """Speeds measured by a corner-order call already pay for its band's diagonal blocks: given that call's
    mixes, the bands come out where the GPUs' plain speeds put them (not moved again toward the other GPU), and
    a measured ratio replaces CORNER_DIAG."""
    wb, up, plain = 45e9, 54e9, [5.2e13, 5.2e13]
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")
    ref = B.BandLayout(gemmt, plain, wb, up, order="outer")
    mixes, measured = [], []
    for g, (g0, g1) in enumerate(ref.bands):
        tasks = [t for blk in O.blocks(gemmt, g0, g1, 1, B.ALIGN, corner=True) for t in blk]
        share = sum(t.flops for t in tasks if t.diag) / sum(t.flops for t in tasks)
        mixes.append((B.CORNER_DIAG, share))
        measured.append(plain[g] / (1 - share + share / B.CORNER_DIAG))    # what such a GPU measures
    assert measured[0] < measured[1]
    again = B.BandLayout(gemmt, measured, wb, up, order="outer", mixes=mixes)
    assert again.edges == ref.edges
    twice = B.BandLayout(gemmt, measured, wb, up, order="outer")           # the diagonal blocks counted twice
    assert twice.edges[1] < ref.edges[1]
    slow = B.BandLayout(gemmt, plain, wb, up, order="outer", mixes=[(0.5, 0.0), (0.5, 0.0)])
    assert slow.edges[1] < ref.edges[1]                                    # slower diagonal blocks: less for GPU 0
    lay = B.layout_for(gemmt, measured, wb, up, mixes=mixes)
    assert B.layout_for(gemmt, measured, wb, up) is not lay                 # kept apart in the cache


def test_layout_for_picks_the_order_of_least_modelled_time(monkeypatch):
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    speeds, wb, up = [5.2e13, 5.2e13], 45e9, 50e9
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")
    lay = B.layout_for(gemmt, speeds, wb, up)
    assert lay.order == "outer" and lay.problem is None and lay.build_s > 0
    lay.build_s = 0.0                                   # shares served by SHARE_SLACK alone (PAYBACK_CALLS: below)
    k_order = B.BandLayout(gemmt, speeds, wb, up)
    assert O.simulate(lay, speeds, up, wb) < 0.8 * O.simulate(k_order, speeds, up, wb)
    assert B.layout_for(gemmt, [6.5e13, 6.4e13], 45.1e9, 53e9) is lay           # rates within RATE_SLACK,
    assert B.layout_for(gemmt, [5.8e13, 4.7e13], 45e9, 50e9) is not lay         # shares within SHARE_SLACK
    assert B.layout_for(gemmt, [7e13, 7e13], 45e9, 50e9) is not lay
    assert B.layout_for(gemmt, speeds, wb, up, shared=False) is not lay
    gemm = build("gemm", "NN", 2048, 2048, Z, True, "F", 2048)
    assert B.layout_for(gemm, speeds, wb, up).order == "k"
    a, c = mat((4096, 4096), Z), mat((4096, 4096), Z)
    old = P.build_problem("herk", 1.0, [a], 0.5, c, [P.N], True, None)
    assert B.layout_for(old, speeds, wb, up).order == "k"                       # C's old values: the k order


def test_a_kept_layout_serves_share_shifts_a_new_one_would_not_repay(monkeypatch):
    """Beyond SHARE_SLACK a kept layout still serves a shift of the GPUs' shares s while s x GPUs x its modelled
    time, over PAYBACK_CALLS calls, stays below the time making it took."""
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    speeds, wb, up = [5.2e13, 5.2e13], 45e9, 50e9
    gemmt = build("gemmt", "CN", 4096, 4096, Z, True, "F")
    lay = B.layout_for(gemmt, speeds, wb, up)
    lay.build_s = 0.05 * B.PAYBACK_CALLS * 2 * lay.modelled          # repays a shift of 5 %
    assert B.layout_for(gemmt, [5.6e13, 4.8e13], wb, up) is lay        # shares 0.538 against 0.5
    assert B.layout_for(gemmt, [6.0e13, 4.4e13], wb, up) is not lay    # 0.577


def _any(layout):
    """layout_for's ``ahead`` check that lets any kept layout serve."""
    return True


def test_a_call_takes_the_kept_layout_while_a_worker_makes_the_new_one(monkeypatch):
    """``ahead``: the first layout of a signature is made in the call; rates that moved past it get the kept one at
    once and the new one from a worker (one job per signature), which serves the calls after it; without
    ``ahead``, where its check refuses the kept layout, or with REBUILD_AHEAD off the call makes it itself."""
    import threading
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    monkeypatch.setattr(B, "_rebuilds", {})
    monkeypatch.setattr(B, "REBUILD_GAIN", -1.0)    # a rebuild keeps its new layout (REBUILD_GAIN: its own test)
    speeds, moved, wb, up = [5.2e13, 5.2e13], [6.0e13, 4.4e13], 45e9, 50e9
    gemmt = build("gemmt", "CN", 4096, 4096, Z, True, "F")
    first = B.layout_for(gemmt, speeds, wb, up, ahead=_any)            # nothing kept: made here
    assert first.problem is None and not B._rebuilds
    first.build_s = 0.0                 # shares served by SHARE_SLACK alone (_serves' payback: its own test)
    gate, made = threading.Event(), []
    real = B._build

    def slow_build(*args):
        gate.wait(30)
        made.append(real(*args))
        return made[-1]
    monkeypatch.setattr(B, "_build", slow_build)
    assert B.layout_for(gemmt, moved, wb, up, ahead=_any) is first      # the kept one, at once
    assert B.layout_for(gemmt, moved, wb, up, ahead=_any) is first      # the same job still making it
    assert len(B._rebuilds) == 1
    gate.set()
    assert B.wait_rebuilds(timeout=30) and not B._rebuilds
    assert len(made) == 1
    new = B.layout_for(gemmt, moved, wb, up, ahead=_any)
    assert new is made[0] and new.edges != first.edges and new.problem is None
    new.build_s = 0.0
    assert B.layout_for(gemmt, speeds, wb, up, ahead=_any) is first     # both rate sets kept
    monkeypatch.setattr(B, "_build", real)
    mixes = [(0.8, 0.16), (0.85, 0.1)]                                 # measured mixes join the rates
    assert B.layout_for(gemmt, speeds, wb, up, mixes=mixes, ahead=_any) in (first, new)
    assert B.wait_rebuilds(timeout=30)
    one = B.layout_for(gemmt, [5.2e13], wb, up, ahead=_any)             # another GPU count: never another's
    assert len(one.bands) == 1 and len(first.bands) == 2
    other = [7.0e13, 3.5e13]
    other_lay = B.layout_for(gemmt, other, wb, up)
    assert other_lay is not first                                       # no ``ahead``: made in the call
    other_lay.build_s = 0.0
    refused = []
    made_here = B.layout_for(gemmt, [6.4e13, 3.9e13], wb, up, ahead=lambda lay: refused.append(lay) and False)
    assert refused and refused[0] is not made_here and not B._rebuilds     # the caller's check refused the kept one
    assert made_here.edges[1] < other_lay.edges[1]
    monkeypatch.setattr(B, "REBUILD_AHEAD", False)
    made_here = B.layout_for(gemmt, [3.5e13, 7.0e13], wb, up, ahead=_any)
    assert not B._rebuilds and made_here.edges[1] < first.edges[1]


def test_shares_that_moved_far_get_their_layout_in_the_call(monkeypatch):
    """A GPU's share of the speeds moved by more than STALE_SHARE (and more than the layout's making would cost on
    the call's slowest GPU): the call makes its layout itself, no kept layout serves it and no worker is started;
    a layout that took long to make still serves such a shift while a worker makes the new one."""
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    monkeypatch.setattr(B, "_rebuilds", {})
    wb, up = 45e9, 50e9
    gemmt = build("gemmt", "CN", 4096, 4096, Z, True, "F")
    first = B.layout_for(gemmt, [5.2e13, 5.2e13], wb, up, ahead=_any)
    first.build_s = 0.0
    throttled = [5.2e13, 2.4e13]                           # GPU 1 at 0.46 of GPU 0: shares 0.68 against 0.5
    asked = []
    made = B.layout_for(gemmt, throttled, wb, up, ahead=lambda lay: asked.append(lay) or True)
    assert made is not first and not asked and not B._rebuilds
    assert made.edges[1] > first.edges[1]                  # GPU 0's band the wider
    assert B.layout_for(gemmt, throttled, wb, up, ahead=_any) is made
    assert not B._moved_little(([5.2e13] * 4, first), [5.2e13, 2.4e13] * 2, 2)
    assert B._moved_little(([5.2e13] * 4, first), [5.2e13, 4.5e13] * 2, 2)     # 0.536 against 0.5
    first.build_s = 0.2 * 2 * first.modelled               # its making costs what a shift of 0.2 does
    assert B._moved_little(([5.2e13] * 4, first), [5.2e13, 2.4e13] * 2, 2)


def test_a_rebuild_that_raises_leaves_the_next_call_to_make_its_layout(monkeypatch):
    """A worker's rebuild that raised is not lost: wait_rebuilds raises it, and the next call that needs the
    layout makes it itself (the error, where there is one, reaches that caller)."""
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    monkeypatch.setattr(B, "_rebuilds", {})
    monkeypatch.setattr(B, "REBUILD_GAIN", -1.0)    # a good rebuild keeps its new layout
    speeds, moved, wb, up = [5.2e13, 5.2e13], [6.0e13, 4.4e13], 45e9, 50e9
    gemmt = build("gemmt", "CN", 4096, 4096, Z, True, "F")
    first = B.layout_for(gemmt, speeds, wb, up, ahead=_any)
    first.build_s = 0.0
    real = B._build

    def broken(*args):
        raise MemoryError("layout")
    monkeypatch.setattr(B, "_build", broken)
    assert B.layout_for(gemmt, moved, wb, up, ahead=_any) is first
    with pytest.raises(MemoryError):
        B.wait_rebuilds(timeout=30)
    assert not B._rebuilds
    assert B.layout_for(gemmt, moved, wb, up, ahead=_any) is first      # a new job, which fails again
    assert B._rebuilds and list(B._rebuilds.values())[0].wait(30)
    with pytest.raises(MemoryError):                                    # the failed job: made in the call
        B.layout_for(gemmt, moved, wb, up, ahead=_any)
    assert not B._rebuilds
    monkeypatch.setattr(B, "_build", real)
    assert B.layout_for(gemmt, moved, wb, up, ahead=_any) is first      # kept one serves; a good rebuild now
    assert B.wait_rebuilds(timeout=30)
    assert B.layout_for(gemmt, moved, wb, up, ahead=_any) is not first


def test_herk_and_syrk_take_the_outer_order_only_up_to_outer_max_k():
    """2 x H100: the outer order measured faster for zherk at n = k = 8192 and 16384, slower at 24576; her2k and
    gemmt keep the model's choice past OUTER_MAX_K."""
    speeds, wb, up = [5.1e13, 5.0e13], 42e9, 54e9
    assert B.layout_for(build("herk", "N", 8192, 8192), speeds, wb, up).order == "outer"
    assert B.layout_for(build("herk", "N", 8192, B.OUTER_MAX_K), speeds, wb, up).order == "outer"
    assert B.layout_for(build("herk", "N", 8192, B.OUTER_MAX_K + 64), speeds, wb, up).order == "k"
    assert B.layout_for(build("herk", "N", 8192, B.OUTER_MAX_K + 64, np.float64), speeds, wb, up).order == "k"
    assert B.layout_for(build("her2k", "N", 8192, B.OUTER_MAX_K + 64), speeds, wb, up).order == "outer"
    assert B.layout_for(build("gemmt", "CN", 8192, B.OUTER_MAX_K + 64), speeds, wb, up).order == "outer"


def test_layout_for_tells_apart_which_factors_are_one_array():
    a, b = mat((640, 512), Z), mat((640, 512), Z)
    one = P.build_problem("her2k", 1.0, [a, a], 0.0, None, [P.N, P.N], True, None)
    two = P.build_problem("her2k", 1.0, [a, b], 0.0, None, [P.N, P.N], True, None)
    l1, l2 = B.layout_for(one, [1e13, 1e13], 1e10, 1e10), B.layout_for(two, [1e13, 1e13], 1e10, 1e10)
    assert len(l1.uniques) == 1 and len(l2.uniques) == 2
    c = mat((640, 512), Z)
    assert B.layout_for(P.build_problem("her2k", 1.0, [b, c], 0.0, None, [P.N, P.N], True, None),
                        [1e13, 1e13], 1e10, 1e10) is l2


def test_model_is_monotone_in_the_rates():
    prob = build("gemmt", "CN", 4096, 4096, Z, True, "F")
    for order in ("k", "outer"):
        times = []
        for scale in (0.5, 1.0, 2.0):
            lay = B.BandLayout(prob, [5e13, 5e13], 45e9 * scale, 50e9 * scale, order=order)
            times.append(O.simulate(lay, [5e13, 5e13], 50e9 * scale, 45e9 * scale))
        assert times[0] > times[1] > times[2] > prob.flops() / 1e14


def test_order_is_checked():
    with pytest.raises(ValueError, match="final_start"):
        B.BandLayout(build("herk", "N", 640, 640, Z, True, "F"), [1.0], 1.0, order="outer", final_start=5)
    with pytest.raises(ValueError, match="order"):
        B.BandLayout(build("gemm", "NN", 64, 64, Z, True, "F", 64), [1.0], 1.0, order="outer")
    with pytest.raises(ValueError, match="order"):
        B.BandLayout(build("herk", "N", 64, 64, Z, True, "F"), [1.0], 1.0, order="x")


def test_a_gpu_with_an_empty_band_uploads_nothing():
    """A GPU too slow for a band of its own holds no factors: it owns no piece, in either order."""
    for args in (("gemmt", "CN", 8192, 8192, Z, True, "F"), ("herk", "N", 8192, 8192, Z, False, "F")):
        prob = build(*args)
        for rates in ([5e13, 5e13, 2e11], [1e8, 5e13, 5e13]):
            for order in ("k", "outer"):
                lay = B.BandLayout(prob, rates, 25e9, 25e9, shared=True, order=order)
                empty = [g for g in range(3) if not lay.band_tasks[g]]
                assert empty and not [p for p in lay.pieces if p.owner in empty], (args, rates, order)
                assert B.device_bytes(prob, None, edges=lay.edges)[0][empty[0]] == 0


def test_one_gpu_takes_the_outer_order_only_by_outer_gain_one_gpu():
    """One H100, zher2k 8192: the outer order (modelled at 0.98 of the k order) measured 99 ms against 90."""
    speeds, wb, up = [5.1e13], 42e9, 54e9
    her2k = build("her2k", "N", 8192, 8192)
    outer = B.BandLayout(her2k, speeds, wb, up, order="outer")
    k_order = B.BandLayout(her2k, speeds, wb, up)
    assert B.OUTER_GAIN_ONE_GPU * O.simulate(k_order, speeds, up, wb) < outer.modelled < O.simulate(
        k_order, speeds, up, wb)
    assert B.layout_for(her2k, speeds, wb, up).order == "k"
    assert B.layout_for(her2k, speeds * 2, wb, up).order == "outer"


@pytest.mark.parametrize("case", TRI, ids=[IDS[i] for i in TRI])
def test_pieces_read_the_blocks_once_and_lay_out_as_if_afresh(case, monkeypatch):
    """The outer order's model lays out pieces for several final starts over the same blocks: what the blocks
    read is worked out once per list of blocks, and the pieces are those a fresh reading gives."""
    prob = build(*CASES[case])
    lay = B.BandLayout(prob, [1e13, 3e13], *SLOW, order="outer")
    k0, k1 = lay.final
    steps = [x for x in lay.pieces if x.k1 <= k0]
    clock = [0.0] * lay.slots

    def again(layout):
        layout.pieces = list(steps)
        return O.pieces(layout, True, [1e13, 3e13], B.Piece, k0, k1, [0] * lay.slots, clock)
    kept = again(copy.copy(lay))
    counted = []
    monkeypatch.setattr(O, "needs", lambda *args: counted.append(1) or needs(*args))
    afresh = copy.copy(lay)
    afresh._kept_reads = None
    assert again(afresh) == kept
    assert len(counted) == sum(len(bl) for bl in lay.blocks)
    counted.clear()
    assert again(afresh) == kept and not counted


def test_a_kept_layout_is_compared_on_speeds_less_the_diagonal_blocks_cost(monkeypatch):
    """The diagonal blocks' share of a GPU's flops is the measuring call's layout's: a call whose measured speed and
    share moved together (the same plain speed, plain_speeds) keeps the layout; a moved plain speed or ratio does not."""
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    wb, up = 45e9, 50e9
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")
    speeds, mixes = [5.0e13, 5.0e13], [(0.8, 0.16), (0.8, 0.08)]
    lay = B.layout_for(gemmt, speeds, wb, up, mixes=mixes)
    lay.build_s = 0.0
    plain = B.plain_speeds(speeds, mixes)
    assert plain[0] == pytest.approx(5.0e13 * (1 - 0.16 + 0.16 / 0.8)) and plain[0] > plain[1] > 5.0e13
    other = [(0.8, 0.02), (0.8, 0.30)]                    # another layout's shares, the same plain speeds
    same = [p / (1 - sh + sh / r) for p, (r, sh) in zip(plain, other)]
    assert B.layout_for(gemmt, same, wb, up, mixes=other) is lay
    assert B.layout_for(gemmt, speeds, wb, up, mixes=other) is not lay            # plain shares moved 2.2 %
    assert B.layout_for(gemmt, speeds, wb, up, mixes=[(0.5, 0.16), (0.8, 0.08)]) is not lay    # a ratio moved


def test_a_rebuild_keeps_the_served_layout_where_the_model_takes_it_about_as_fast(monkeypatch):
    """Rates that moved past the kept layout's but left the GPUs' shares (the default rates, then both GPUs
    measured alike): the worker's new layout is no faster in the model, so the served one is kept for the new
    rates (no new layout whose first call loads its kernels); shares that moved get the new layout."""
    from collections import OrderedDict
    monkeypatch.setattr(B, "_cache", OrderedDict())
    monkeypatch.setattr(B, "_rebuilds", {})
    wb, up = 45e9, 48e9
    gemmt = build("gemmt", "CN", 8192, 8192, Z, True, "F")
    first = B.layout_for(gemmt, [4e13, 4e13], 5e10, 5e10, ahead=_any)
    first.build_s = 0.0                 # shares served by SHARE_SLACK alone (_serves' payback: its own test)
    alike = [5.3e13, 5.3e13]
    assert B.layout_for(gemmt, alike, wb, up, ahead=_any) is first          # served while the worker makes one
    assert B.wait_rebuilds(timeout=60)
    assert B.layout_for(gemmt, alike, wb, up, ahead=_any) is first          # kept for the new rates
    assert O.simulate(first, alike, up, wb) <= (1 + B.REBUILD_GAIN) * B._build(
        gemmt, alike, wb, up, True, alike, None, None).modelled
    apart = [4.6e13, 6.0e13]                    # a shift within STALE_SHARE: served while the worker makes one
    assert B.layout_for(gemmt, apart, wb, up, ahead=_any) is first
    assert B.wait_rebuilds(timeout=60)
    new = B.layout_for(gemmt, apart, wb, up, ahead=_any)
    assert new is not first and new.edges[1] < first.edges[1]
    assert O.simulate(first, apart, up, wb) > (1 + B.REBUILD_GAIN) * new.modelled
