"""band_tail: the end of a band call in balance, without a GPU. Pace and Lane arithmetic, Balance.split's choice of
taker and cut (aligned, capped, worth its cost, never both giver and taker), closing under threads, the pieces a
part reads, and a simulated call: GPUs whose kernels run off their modelled speed end closer together and sooner
than without the parts, and GPUs on their speeds hand nothing out."""
import heapq
import threading

import numpy as np
import pytest

from hybridblas import band_plan, band_tail
from hybridblas.band_tail import Balance, Lane, Pace, split_k

from test_band_plan import build


def test_pace_is_one_until_two_observations_then_the_ratio_within_limits():
    p = Pace()
    assert p.factor() == 1.0
    p.observe(10.0, 1.0)
    assert p.factor() == 1.0
    p.observe(10.5, 1.4)                  # 0.5 s for 0.4 modelled
    assert p.factor() == pytest.approx(1.25)
    p.observe(30.0, 1.5)
    assert p.factor() == band_tail.PACE_LIMITS[1]
    q = Pace()
    q.observe(0.0, 0.0)
    q.observe(0.001, 1.0)
    assert q.factor() == band_tail.PACE_LIMITS[0]


@pytest.mark.parametrize("k0,k1,share,align,want", [
    (0, 8192, 0.5, 64, 4096), (0, 8192, 0.01, 64, 8192 - 64), (0, 8192, 0.001, 64, None),
    (0, 8192, 1.0, 64, None), (1024, 2048, 0.25, 64, 1792), (0, 100, 0.5, 64, 36), (0, 64, 0.5, 64, None)])
def test_split_k_cuts_an_aligned_share_and_never_an_empty_side(k0, k1, share, align, want):
    cut = split_k(k0, k1, share, align)
    assert cut == want
    if cut is not None:
        assert k0 < cut < k1 and (k1 - cut) % align == 0


def test_lane_tracks_the_last_share_and_gives_only_from_its_last_blocks():
    lane = Lane(0, [1.0] * 10)
    assert lane.first == 10 - int(band_tail.TRACK * 10)
    assert lane.give_from == 10 - band_tail.GIVE_BLOCKS
    one = Lane(1, [5.0])
    assert one.first == 0 and one.give_from == 0
    assert Lane(2, []).first == 0


def _cost(seconds):
    return lambda t: seconds


def test_split_needs_a_reported_taker_and_balances_both_ends():
    bal = Balance(2)
    assert bal.split(0, 0.0, 0.1, 0.02, _cost(0.02), 0, 8192, 64) is None     # GPU 1 has not reported
    bal.report(1, 0.0, 0.05)
    taker, cut = bal.split(0, 0.0, 0.1, 0.04, _cost(0.04), 0, 8192, 64)
    assert taker == 1 and 0 < cut < 8192 and (8192 - cut) % 64 == 0
    share = (8192 - cut) / 8192
    assert share == pytest.approx(min(band_tail.MAX_SHARE, 0.05 / (0.04 + 0.04 * band_tail.PART_COST)), abs=64 / 8192)
    assert bal.ends[0] == pytest.approx(0.1 - share * 0.04)
    assert bal.ends[1] == pytest.approx(0.05 + share * 0.04 * band_tail.PART_COST)
    assert bal.giver == [True, False] and bal.taker == [False, True]
    assert bal.inbox[1].empty()          # the caller puts the part
    # a taker never gives, a giver never takes
    assert bal.split(1, 0.0, 1.0, 0.5, _cost(0.5), 0, 8192, 64) is None
    bal.report(1, 0.0, 0.0)
    assert bal.split(0, 0.0, 1.0, 0.5, _cost(0.5), 0, 8192, 64)[0] == 1    # gives again, to the same taker


def test_split_is_capped_and_skips_moves_too_small_or_backwards():
    bal = Balance(3)
    bal.report(1, 0.0, 0.0)
    bal.report(2, 0.0, 0.001)
    taker, cut = bal.split(0, 0.0, 10.0, 0.01, _cost(0.01), 0, 8192, 64)
    assert taker == 1                                       # the one free first
    assert (8192 - cut) / 8192 == pytest.approx(band_tail.MAX_SHARE, abs=64 / 8192)
    other = Balance(2)
    other.report(1, 0.0, 0.2)
    assert other.split(0, 0.0, 0.1, 0.05, _cost(0.05), 0, 8192, 64) is None   # GPU 1 ends later
    other.report(1, 0.0, 0.1)
    assert other.split(0, 0.0, 0.1 + band_tail.MIN_MOVE, 0.05, _cost(0.05), 0, 8192, 64) is None   # worth too little
    assert other.giver == [False, False]


def test_closed_once_every_gpu_closed_under_threads():
    slots = 8
    bal = Balance(slots)
    start = threading.Barrier(slots)
    roles = []

    def worker(g):
        start.wait()
        for i in range(50):
            now = i * 1e-3
            bal.report(g, now, 0.01 * (g + 1))
            got = bal.split(g, now, 0.01 * (g + 1), 0.005, _cost(0.005), 0, 4096, 64)
            if got is not None:
                roles.append((g, got[0]))
        bal.close(g)

    threads = [threading.Thread(target=worker, args=(g,)) for g in range(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bal.closed.is_set()
    assert all(box.get_nowait() is None and box.empty() for box in bal.inbox)     # a taker's wait ends at once
    givers, takers = {g for g, _ in roles}, {t for _, t in roles}
    assert givers and not givers & takers
    assert all(bal.giver[g] for g in givers) and all(bal.taker[t] for t in takers)
    assert Balance(0).closed.is_set()


def _covered(pieces, u, lo, hi, k0, k1):
    """Whether ``pieces`` of unique factor u cover outer [lo, hi) x k [k0, k1)."""
    cuts_o = sorted({lo, hi} | {x.o0 for x in pieces if lo < x.o0 < hi} | {x.o1 for x in pieces if lo < x.o1 < hi})
    cuts_k = sorted({k0, k1} | {x.k0 for x in pieces if k0 < x.k0 < k1} | {x.k1 for x in pieces if k0 < x.k1 < k1})
    for a, b in zip(cuts_o, cuts_o[1:]):
        for c, d in zip(cuts_k, cuts_k[1:]):
            if not any(x.factor == u and x.o0 <= a and b <= x.o1 and x.k0 <= c and d <= x.k1 for x in pieces):
                return False
    return True


@pytest.mark.parametrize("kind,trans,n,k,order", [
    ("gemmt", "CN", 2048, 2048, "outer"), ("gemmt", "NT", 1500, 700, "k"), ("herk", "N", 1024, 3000, "outer"),
    ("her2k", "C", 777, 1200, "k")])
def test_a_part_gathers_every_piece_of_what_it_reads(kind, trans, n, k, order):
    prob = build(kind, trans, n, k, np.complex128, True, "F")
    lay = band_plan.BandLayout(prob, [1e13, 1.5e13], 20e9, 40e9, shared=True, order=order)
    k0, k1 = lay.final
    for g in range(lay.slots):
        for block in lay.blocks[g]:
            reads = band_plan.task_reads(prob, lay.factor_of, block)
            for cut in (k0, (k0 + k1) // 2 // 64 * 64, k1 - 64):
                if not k0 <= cut < k1:
                    continue
                got = band_tail.pieces_over(lay.pieces, reads, cut, k1)
                assert all(x.k0 < k1 and cut < x.k1 for x in got)
                for u, lo, hi in reads:
                    assert _covered(got, u, lo, hi, cut, k1), (g, u, lo, hi, cut)


def _simulate(seconds, factors, balance=True, k=8192, writes=None):
    """A call's end on GPUs whose blocks take ``seconds`` by the model and ``factors`` times that: each worker steps
    its lane at the end of block b - 2; parts run on their taker after its own blocks. ``writes``: each block's
    write-back seconds (a split block before the last is written after the giver's end; the last one always is).
    (ends of each GPU, parts)."""
    lanes = [Lane(g, s) for g, s in enumerate(seconds)]
    bal = Balance(len(seconds))
    ends = [[0.0] * len(s) for s in seconds]
    parts = []
    heap = []
    for g, lane in enumerate(lanes):
        t = 0.0
        first = lane.first if balance else len(seconds[g])
        for b in range(first):
            t += seconds[g][b] * factors[g]
            ends[g][b] = t
        if first < len(seconds[g]):
            heapq.heappush(heap, (ends[g][first - 2] if first >= 2 else 0.0, g, first))
    while heap:
        now, g, b = heapq.heappop(heap)
        last = b == len(seconds[g]) - 1
        after = 0.0 if writes is None or last else writes[g][b]
        got = lanes[g].step(bal, b, now, lambda t, s=seconds[g][b]: s, 0, k, 64, after)
        if got is not None:
            parts.append((g, got[0], (k - got[1]) / k * seconds[g][b], after, b))
        prev = ends[g][b - 1] if b else 0.0
        ends[g][b] = max(prev, now) + seconds[g][b] * factors[g] * lanes[g].kept[b]
        if b + 1 < len(seconds[g]):
            heapq.heappush(heap, (ends[g][b - 1] if b else 0.0, g, b + 1))
    own = [e[-1] if e else 0.0 for e in ends]
    busy = list(own)                        # each GPU's compute, its parts taken after its own blocks
    done = {}
    for g, t, s, _, b in parts:
        busy[t] += s * factors[t]
        done[(g, b)] = busy[t]
    finish = list(busy)
    for g, _, _, _, b in parts:
        finish[g] = max(finish[g], done[(g, b)])
    if writes is not None:                  # the last block's write-back, and a split earlier one's, come after
        finish = [max(own[g] + writes[g][-1], busy[g]) if not any(p[0] == g for p in parts) else
                  finish[g] + writes[g][-1] + sum(p[3] for p in parts if p[0] == g) for g in range(len(seconds))]
    return finish, parts


CORNER = [0.0007, 0.0007, 0.0014, 0.0014, 0.002, 0.002, 0.0027, 0.0027, 0.0043, 0.005, 0.007, 0.008, 0.012, 0.014,
          0.019, 0.023, 0.021, 0.018, 0.016, 0.0086, 0.0034]         # GPU 0's blocks, zgemmt n = k = 16384 (s)
RECT = [0.0007, 0.0007, 0.0014, 0.0014, 0.002, 0.002, 0.0027, 0.0027, 0.0043, 0.005, 0.007, 0.008, 0.0147, 0.0155,
        0.017, 0.022, 0.027, 0.030, 0.0129]                           # GPU 1's


@pytest.mark.parametrize("factors", [(1.04, 0.97), (0.97, 1.04), (1.0, 1.08), (1.1, 1.0), (1.0, 1.02)])
def test_gpus_off_their_speeds_end_sooner_and_closer(factors):
    plain, none = _simulate([CORNER, RECT], factors, balance=False)
    assert not none
    even, parts = _simulate([CORNER, RECT], factors)
    assert parts and len({p[0] for p in parts}) == 1
    assert max(even) < max(plain) - 0.4 * abs(plain[0] - plain[1])
    assert abs(even[0] - even[1]) < 0.25 * abs(plain[0] - plain[1])


@pytest.mark.parametrize("factors", [(3.0, 1.0), (1.0, 0.6)])
def test_far_off_speeds_give_the_most_of_the_last_blocks(factors):
    plain, _ = _simulate([CORNER, RECT], factors, balance=False)
    even, parts = _simulate([CORNER, RECT], factors)
    assert max(even) < max(plain)
    late = int(np.argmax(plain))
    assert {p[0] for p in parts} == {late} and len(parts) == band_tail.GIVE_BLOCKS
    given = sum(p[2] for p in parts)
    assert 0.5 * sum(CORNER[-2:]) < given <= band_tail.MAX_SHARE * sum(CORNER[-2:]) * 1.01


def test_gpus_on_their_speeds_hand_nothing_out():
    scale = sum(RECT) / sum(CORNER)
    even, parts = _simulate([[s * scale for s in CORNER], RECT], (1.0, 1.0))
    assert not parts
    assert even[0] == pytest.approx(even[1])


@pytest.mark.parametrize("factors", [(1.04, 0.97), (0.97, 1.04), (1.0, 1.08), (1.1, 1.0), (1.0, 1.02), (1.0, 1.0),
                                     (3.0, 1.0), (1.0, 0.6)])
def test_a_block_before_the_last_is_split_only_where_it_repays_its_later_write_back(factors):
    """With each block's write-back counted (the last one's after the call's compute, a split earlier one's too):
    the parts never make the call end later, and sooner where the GPUs' speeds are 5 % or more off the model; where
    write-backs are long, only last blocks are split."""
    blocks = [CORNER, RECT]
    for scale in (0.2, 2.0):
        writes = [[scale * x for x in lane] for lane in blocks]
        plain, _ = _simulate(blocks, factors, balance=False, writes=writes)
        even, parts = _simulate(blocks, factors, writes=writes)
        assert max(even) <= max(plain) + 1e-12
        if scale == 2.0 and max(factors) < 1.5:
            assert all(b == len(blocks[g]) - 1 for g, _, _, _, b in parts)
        if abs(factors[0] - factors[1]) >= 0.05 and scale < 1:      # (long write-backs can end the call instead)
            assert max(even) < max(plain)
