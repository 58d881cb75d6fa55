"""BandLayout (hybridblas.band_plan) on host problems, without a GPU (only shapes and dtypes are read), for
herk, her2k, syrk, syr2k, gemmt and gemm, either triangle, 1 to 3 GPUs, n from 1 to 8192:

- the bands' edges run from 0 to n on multiples of ALIGN (or at n), near plan.band_edges, so the bands' flops
  follow the rates; the bands cover C's triangle (all of gemm's C) exactly once; each band's final blocks
  cover that band exactly once, inside its box, over all of k, cut at multiples of ALIGN into similar areas;
- units cut k contiguously (k-minor factors' units at least MIN_SEGMENT bytes along k), the steps run on
  unit edges, doubling, up to the final range, which ends at k;
- the pieces a GPU reads cover each factor's need once per unit (k-minor pieces no more than it needs);
  with peer access every piece crosses PCIe once and two GPUs upload about as much; without it nobody
  copies from another GPU;
- the same memory passed twice is one factor; device_bytes agrees with the layout; the final range follows
  the write-back model.

Cells of C are counted on the grid cut at every task edge, so even n = 8192 is checked entry by entry.
"""
import functools

import numpy as np
import pytest

from hybridblas import band_plan as B
from hybridblas import plan
from hybridblas import problem as P

OPS = {"N": P.N, "T": P.T, "C": P.C}
Z, D = np.complex128, np.float64
RATES = [(1e13,), (1e13, 1e13), (1e13, 3e13), (1e13, 1e13, 1e13), (2e13, 1e13, 5e12)]     # flop/s
WRITEBACK = 10e9
MODELS = [(WRITEBACK, None), (3e9, 8 << 20)]        # (write-back bytes/s, unit_bytes): uploads twice as fast

# (kind, trans, n, k, dtype, lower, memory layout of the operands, m for gemm)
CASES = [
    ("herk", "N", 1, 1, Z, True, "F", None),
    ("herk", "C", 2, 3, Z, False, "ld", None),
    ("herk", "N", 65, 7, Z, True, "C", None),
    ("herk", "C", 8192, 8192, Z, True, "F", None),
    ("herk", "N", 8192, 8192, Z, False, "F", None),
    ("her2k", "N", 517, 301, Z, True, "C-ld", None),
    ("her2k", "C", 65, 130, Z, False, "F", None),
    ("syrk", "T", 7011, 3136, D, True, "F", None),
    ("syrk", "N", 517, 301, D, False, "ld", None),
    ("syr2k", "N", 2, 5, D, True, "C", None),
    ("syr2k", "T", 7011, 3136, Z, False, "F", None),
    ("gemmt", "CN", 517, 301, Z, True, "F", None),
    ("gemmt", "NT", 7011, 3136, Z, False, "C", None),
    ("gemmt", "NT", 65, 1, D, True, "ld", None),
    ("gemmt", "CN", 1, 2, Z, False, "C-ld", None),
    ("gemm", "NN", 517, 301, D, True, "F", 300),
    ("gemm", "TN", 1000, 3136, Z, True, "ld", 7011),
    ("gemm", "NC", 65, 9, Z, True, "C", 2),
]
IDS = [f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-{'zd'[c[4] is D]}-{'LU'[not c[5]]}-{c[6]}" for c in CASES]


def mat(shape, dtype, how="F"):
    """An uninitialised array: F, C, or a slice of a larger F ("ld") or C ("C-ld") array."""
    r, q = shape
    if how == "ld":
        return np.empty((r + 3, q + 2), dtype, order="F")[1:r + 1, 2:q + 2]
    if how == "C-ld":
        return np.empty((r + 2, q + 5), dtype)[:r, 3:q + 3]
    return np.empty(shape, dtype, order=how)


def build(kind, trans, n, k, dtype=Z, lower=True, how="F", m=None):
    stored = {"N": (n, k), "T": (k, n), "C": (k, n)}          # the array whose op is n x k
    if kind in ("herk", "syrk", "her2k", "syr2k"):
        count = 2 if kind.endswith("2k") else 1
        arrays, ops = [mat(stored[trans], dtype, how) for _ in range(count)], [OPS[trans]] * count
    else:
        rows = n if kind == "gemmt" else m
        a = mat((rows, k) if trans[0] == "N" else (k, rows), dtype, how)
        b = mat((k, n) if trans[1] == "N" else (n, k), dtype, how)
        arrays, ops = [a, b], [OPS[trans[0]], OPS[trans[1]]]
    return P.build_problem(kind, 1.0, arrays, 0.0, None, ops, lower, None)


@functools.cache
def problem(case):
    return build(*CASES[case])


@functools.cache
def layout(case, rates, shared=True, model=MODELS[0]):
    writeback, unit_bytes = model
    return B.BandLayout(problem(case), list(rates), writeback, 2 * writeback, shared=shared, unit_bytes=unit_bytes)


SETUPS = [(rates, shared, model) for rates in RATES for shared in (True, False) for model in MODELS]


def layouts(case):
    return [layout(case, *setup) for setup in SETUPS]


def grid(prob, *task_lists):
    """Row and column cuts at every task edge (the same for both axes of a triangle)."""
    tasks = [t for ts in task_lists for t in ts]
    rows = {0, prob.m} | {x for t in tasks for x in (t.i0, t.i1)}
    cols = {0, prob.n} | {x for t in tasks for x in (t.j0, t.j1)}
    if prob.triangular:
        rows = cols = rows | cols
    return sorted(rows), sorted(cols)


def tally(prob, tasks, rows, cols):
    """How often each cell of the grid is covered whole, and as the triangle of a diagonal block."""
    at_r, at_c = {x: i for i, x in enumerate(rows)}, {x: i for i, x in enumerate(cols)}
    whole = np.zeros((len(rows) - 1, len(cols) - 1), int)
    tri = np.zeros_like(whole)
    for t in tasks:
        i0, i1, j0, j1 = at_r[t.i0], at_r[t.i1], at_c[t.j0], at_c[t.j1]
        if t.diag:
            assert (t.i0, t.i1) == (t.j0, t.j1)
            one = np.ones((i1 - i0, i1 - i0), int)
            whole[i0:i1, j0:j1] += np.tril(one, -1) if prob.lower else np.triu(one, 1)
            tri[i0:i1, j0:j1] += np.eye(i1 - i0, dtype=int)
        else:
            whole[i0:i1, j0:j1] += 1
    return whole, tri


def triangle(prob, rows, cols):
    """The tally of C's triangle (all of gemm's C)."""
    shape = (len(rows) - 1, len(cols) - 1)
    if not prob.triangular:
        return np.ones(shape, int), np.zeros(shape, int)
    one = np.ones(shape, int)
    return (np.tril(one, -1) if prob.lower else np.triu(one, 1)), np.eye(shape[0], dtype=int)


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def area(t):
    rows = t.i1 - t.i0
    return rows * (rows + 1) // 2 if t.diag else rows * (t.j1 - t.j0)


def inside(t, box):
    r0, r1, c0, c1 = box
    return r0 <= t.i0 <= t.i1 <= r1 and c0 <= t.j0 <= t.j1 <= c1


def reads(piece, g):
    return piece.owner == g or g in piece.readers


def unit_edges(lay):
    return {k0 for k0, _ in lay.units} | {lay.problem.k}


def disjoint(intervals):
    pairs = sorted(intervals)
    return all(b <= c for (_, b), (c, _) in zip(pairs, pairs[1:]))


def covers(intervals, lo, hi):
    """The intervals together cover [lo, hi)."""
    reach = lo
    for a, b in sorted(intervals):
        if a > reach:
            break
        reach = max(reach, b)
    return reach >= hi


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_bands_cover_c_once(case):
    prob = problem(case)
    for rates, shared, model in SETUPS:
        lay = layout(case, rates, shared, model)
        e = lay.edges
        assert e[0] == 0 and e[-1] == prob.n and len(e) == lay.slots + 1
        assert all(a <= b for a, b in zip(e, e[1:]))
        assert all(x % B.ALIGN == 0 or x == prob.n for x in e[1:-1])
        tasks = [t for ts in lay.band_tasks for t in ts]
        rows, cols = grid(prob, tasks)
        assert same(tally(prob, tasks, rows, cols), triangle(prob, rows, cols))
        assert sum(t.flops for t in tasks) == pytest.approx(prob.flops())
        assert sum(lay.band_area(g) for g in range(lay.slots)) == (
            prob.n * (prob.n + 1) // 2 if prob.triangular else prob.m * prob.n)
        assert all(inside(t, lay.boxes[g]) for g in range(lay.slots) for t in lay.band_tasks[g])
        if prob.n >= 1000:                       # the bands' flops follow the rates, up to ALIGN-ed edges
            share = np.array([sum(t.flops for t in ts) for ts in lay.band_tasks]) / prob.flops()
            assert np.abs(share - np.array(rates) / sum(rates)).max() <= 2 * B.ALIGN / prob.n


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_final_blocks_cover_each_band_once(case):
    prob = problem(case)
    for lay in layouts(case):
        for g, (g0, g1) in enumerate(lay.bands):
            blocks = lay.blocks[g]
            tasks = [t for blk in blocks for t in blk]
            assert bool(blocks) == (g1 > g0)
            rows, cols = grid(prob, lay.band_tasks[g], tasks)
            assert same(tally(prob, tasks, rows, cols), tally(prob, lay.band_tasks[g], rows, cols))
            assert all(inside(t, lay.boxes[g]) and (t.k0, t.k1) == (0, prob.k) for t in tasks)
            height = prob.m if not prob.triangular else (g1 - g0 if prob.lower else g1)
            assert all(sum(map(area, blk)) <= lay.band_area(g) / B.BLOCKS + 2 * B.ALIGN * height for blk in blocks)
            if blocks:
                spans = [(min(t.j0 for t in blk), max(t.j1 for t in blk)) for blk in blocks]
                start = 0 if prob.triangular and prob.lower else g0
                assert spans[0][0] == start and spans[-1][1] == g1
                assert all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))
                assert all(b % B.ALIGN == 0 and a < b for (a, b) in spans[:-1])


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_units_steps_and_final_range_cut_k(case):
    prob = problem(case)
    for lay in layouts(case):
        units = lay.units
        assert units[0][0] == 0 and units[-1][1] == prob.k
        assert all(a < b for a, b in units) and all(b == c for (_, b), (c, _) in zip(units, units[1:]))
        assert all(b % B.ALIGN == 0 for _, b in units[:-1])
        lengths = [b - a for a, b in units]
        if len(units) > 2:
            assert lengths[0] <= lengths[1] and len(set(lengths[1:-1])) == 1
        if 0 in lay.kaxis:
            assert all(x * lay.item >= B.MIN_SEGMENT for x in lengths[1:-1])
            assert len(units) == 1 or lengths[0] * lay.item >= B.MIN_SEGMENT // 2
        assert lay.final == (lay.final_start, prob.k) and lay.final[0] in {a for a, _ in units}
        steps = lay.steps
        assert steps[:1] == (units[:1] if lay.final[0] else [])
        assert all(d - c >= min(B.STEP_K, 2 * (b - a)) for (a, b), (c, d) in zip(steps, steps[1:-1]))
        assert all(b == c for (_, b), (c, _) in zip(steps, steps[1:]))
        assert (steps[-1][1] if steps else 0) == lay.final[0]
        assert all(a < b and a in unit_edges(lay) and b in unit_edges(lay) for a, b in steps)


@pytest.mark.parametrize("kind,trans,n,k,unit_k,first", [
    ("herk", "N", 8192, 8192, 1024, 256),       # UNIT_BYTES alone: units of 512 along k, the first 128
    ("herk", "N", 16384, 16384, 1024, 256),     # 256, the first 64
    ("her2k", "N", 8192, 8192, 1024, 256),      # 256, 64
    ("gemmt", "CN", 8192, 8192, 2048, 1024),    # k-minor factors: MIN_SEGMENT's 2048 already
    ("herk", "N", 512, 40000, 8192, 2048),      # UNIT_BYTES alone: 8192 along k
])
def test_units_are_at_least_unit_k_long_unless_units_are_given(kind, trans, n, k, unit_k, first):
    prob = build(kind, trans, n, k)
    lay = B.BandLayout(prob, [1e13, 1e13], 10e9, 20e9)
    lengths = [b - a for a, b in lay.units]
    assert lengths[0] == first and set(lengths[1:-1]) == {unit_k} and 0 < lengths[-1] <= unit_k
    given = B.BandLayout(prob, [1e13, 1e13], 10e9, 20e9, unit_bytes=B.UNIT_BYTES)
    per_k = sum(given.outer) * given.item
    assert given.units[1][1] - given.units[1][0] == max(B.ALIGN, B.UNIT_BYTES // per_k // B.ALIGN * B.ALIGN, *(
        [-(-B.MIN_SEGMENT // given.item // B.ALIGN) * B.ALIGN] if 0 in given.kaxis else []))


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_pieces_cover_each_need_once(case):
    k = problem(case).k
    for rates, shared, model in SETUPS:
        lay = layout(case, rates, shared, model)
        assert [p.index for p in lay.pieces] == list(range(len(lay.pieces)))
        for p in lay.pieces:
            assert (p.k0, p.k1) in lay.units and 0 <= p.o0 < p.o1 <= lay.outer[p.factor]
            assert p.nbytes == (p.o1 - p.o0) * (p.k1 - p.k0) * lay.item
            assert p.owner not in p.readers and (shared or p.readers == ())
        for g in range(lay.slots):
            for u, need in enumerate(lay.needs[g]):
                if need is None or need[1] <= need[0]:
                    continue
                for k0, _ in lay.units:
                    mine = [(p.o0, p.o1) for p in lay.pieces if p.factor == u and p.k0 == k0 and reads(p, g)]
                    assert covers(mine, *need) and disjoint(mine), (g, u, need, k0, mine)
                    assert lay.kaxis[u] == 1 or all(need[0] <= a and b <= need[1] for a, b in mine)
            got = [p.index for a, b in lay.steps + [lay.final] for p in lay.pieces_for(g, a, b)]
            assert sorted(got) == [p.index for p in lay.pieces if reads(p, g)]
            for a, b in [(0, k), (1, k), (0, k - 1), (lay.units[0][1], k), *lay.units]:
                assert lay.pieces_for(g, a, b) == [p for p in lay.pieces if reads(p, g) and a <= p.k0 and p.k1 <= b]
        if shared:
            for u in range(len(lay.uniques)):
                for k0, _ in lay.units:
                    spans = [(p.o0, p.o1) for p in lay.pieces if p.factor == u and p.k0 == k0]
                    assert disjoint(spans) and (lay.kaxis[u] == 0 or len(spans) <= 1)


@pytest.mark.parametrize("trans", ["N", "C"])
def test_uploads_balance_over_two_gpus(trans):
    lay = B.BandLayout(build("herk", trans, 8192, 8192), [1e13, 1e13], WRITEBACK, 2 * WRITEBACK, shared=True)
    unit = max(b - a for a, b in lay.units) * sum(lay.outer) * lay.item
    sent = [sum(p.nbytes for p in lay.uploads(g)) for g in range(2)]
    assert abs(sent[0] - sent[1]) <= unit, (sent, unit)
    assert sum(p.nbytes for p in lay.pieces) == 8192 * 8192 * 16
    assert all(p.readers == ((1 - p.owner,) if p.o0 < lay.edges[1] else ()) for p in lay.pieces)


def test_same_memory_twice_is_one_factor():
    for how in ("F", "C"):
        a = mat((300, 200), Z, how)
        lay = B.BandLayout(P.build_problem("her2k", 1.0, [a, a], 0.0, None, [P.N, P.N], True, None),
                           [1.0, 1.0], WRITEBACK)
        assert len(lay.uniques) == 1 and lay.factor_of == [0, 0]
        assert sum(p.nbytes for p in lay.pieces) == a.nbytes
        b = mat((300, 200), Z, how)
        lay = B.BandLayout(P.build_problem("her2k", 1.0, [a, b], 0.0, None, [P.N, P.N], True, None),
                           [1.0, 1.0], WRITEBACK)
        assert len(lay.uniques) == 2 and lay.factor_of == [0, 1]
        assert sum(p.nbytes for p in lay.pieces) == 2 * a.nbytes


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_device_bytes_match_the_layout(case):
    prob = problem(case)
    for rates in RATES:
        lay = layout(case, rates)
        per_gpu, factors = B.device_bytes(prob, list(rates))
        item = prob.dtype.itemsize
        assert factors == sum(B.padded_rows(prob.factors[f].base.shape[0]) * prob.factors[f].base.shape[1] * item
                              for f in lay.uniques)
        boxes = [B.padded_rows(r1 - r0) * (c1 - c0) * item for r0, r1, c0, c1 in lay.boxes]
        assert per_gpu == [factors + b if g1 > g0 else 0 for b, (g0, g1) in zip(boxes, lay.bands)]


def test_aligned_edges_stay_monotone_and_near_the_flop_shares():
    for n in (0, 1, 2, 65, 70, 100, 127, 130, 7011, 8192):
        for rates in ([1.0] * 4, [1.0] * 7, [5.0, 1.0, 1.0, 0.1], [0.1, 1.0, 9.0]):
            for tri in (True, False):
                e = B.aligned_edges(n, rates, tri)
                raw = plan.band_edges(n, rates, tri)
                assert all(abs(a - b) <= B.ALIGN // 2 for a, b in zip(e, raw))
                assert len(e) == len(rates) + 1 and e[0] == 0 and e[-1] == n
                assert all(0 <= a <= b <= n for a, b in zip(e, e[1:]))
                assert all(x % B.ALIGN == 0 or x == n for x in e[1:-1])
    assert B.aligned_edges(70, [1.0] * 4, True) == [0, 64, 64, 64, 70]


def test_bands_follow_the_measured_speeds_over_the_rates():
    prob = build("herk", "N", 16384, 16384)
    assert B.BandLayout(prob, [1e13, 1e13], 1e10).edges == [0, 11584, 16384]
    lay = B.BandLayout(prob, [1e13, 1e13], 1e10, speeds=[4.4e13, 5.0e13])   # GPU 0 measured slower: fewer rows
    assert lay.edges == B.aligned_edges(16384, [4.4e13, 5.0e13], True) and lay.edges[1] < 11584


def test_final_range_follows_the_write_back_model():
    fast = [B.BandLayout(problem(case), [1e13, 2e13], 1e15, 1e15) for case in range(len(CASES))]
    several = [lay for lay in fast if len(lay.units) > 1]
    assert len(several) >= 5 and all(lay.final[0] == lay.units[-1][0] for lay in several)
    prob = build("herk", "C", 8192, 8192)
    speed = 8 * 8192 * 1e6 / 16            # a band's compute takes about as long as its write-back at 1 MB/s
    lay = B.BandLayout(prob, [speed, speed], 1e6, 1e15)
    assert len(lay.units) > 1 and lay.final == (0, 8192) and lay.steps == []
    lay = B.BandLayout(prob, [speed, speed], 1e6, 1e6)      # the uploads land last: no final range hides more
    assert lay.final[0] == lay.units[-1][0]


def _gathered(lay, g, u, k1):
    """Per base cell of unique factor u: whether a piece GPU g reads for k < k1 covers it (small problems)."""
    base = lay.problem.factors[lay.uniques[u]].base
    have = np.zeros(base.shape, bool)
    for p in lay.pieces_for(g, 0, k1):
        if p.factor == u:
            have[B.region(lay, u, p.o0, p.o1, p.k0, p.k1)] = True
    return have


def _read(lay, f, o0, o1, k0, k1):
    """The cells of factor f's base that op(factor) rows (or columns) [o0, o1) over k [k0, k1) read, along f's
    own k axis (which need not be its unique's)."""
    fac = lay.problem.factors[f]
    if P.k_axis(lay.problem.kind, f, fac.op) == 0:
        return slice(k0, k1), slice(o0, o1)
    return slice(o0, o1), slice(k0, k1)


SAME_ARRAY = [("gemm", "NN", "F"), ("gemm", "TT", "F"), ("gemm", "NN", "C"), ("gemm", "NT", "F"),
              ("her2k", "N", "F"), ("her2k", "C", "C"), ("syr2k", "T", "F")]


@pytest.mark.parametrize("kind,trans,how", SAME_ARRAY)
@pytest.mark.parametrize("gpus", [1, 2])
def test_every_product_reads_only_what_has_landed(kind, trans, how, gpus, monkeypatch):
    """The same array passed as both factors (gemm(a, a): read along k by columns on the left, by rows on the
    right): each step's and each final block's products read only cells of pieces gathered by then."""
    monkeypatch.setattr(B, "MIN_SEGMENT", 64 * 16)
    n = 320
    a = mat((n, n), Z, how)
    ops = [OPS[t] for t in trans] if kind == "gemm" else [OPS[trans]] * 2
    prob = P.build_problem(kind, 1.0, [a, a], 0.0, None, ops, True, None)
    lay = B.BandLayout(prob, [1e13] * gpus, 1e15, 1e15, unit_bytes=64 * n * 16)
    assert len(lay.steps) >= 2
    tagged = [P.Operand(f, fac.op) for f, fac in enumerate(prob.factors)]
    for g in range(gpus):
        phases = [(k0, k1, lay.band_tasks[g]) for k0, k1 in lay.steps]
        phases.append((*lay.final, [t for block in lay.blocks[g] for t in block]))
        for k0, k1, tasks in phases:
            have = [_gathered(lay, g, u, k1) for u in range(len(lay.uniques))]
            for t in tasks:
                for _coef, x, y in prob.terms(tagged):
                    for f, (o0, o1) in ((x.base, (t.i0, t.i1)), (y.base, (t.j0, t.j1))):
                        cells = have[lay.factor_of[f]][_read(lay, f, o0, o1, k0, k1)]
                        assert cells.all(), f"slot {g}, k [{k0}, {k1}), task {t}: factor {f} reads cells not landed"
