"""The host side of the INT8 emulation (hybridblas.devices.cuda_ozaki): which blocks and panels of C it computes,
how it reads the operands' strides, when it applies, the kernels' source, and the Context's options.
The GPU side: tests/gpu/test_gpu_emulation.py."""
import numpy as np
import pytest

import hybridblas as hb
from hybridblas import ozaki
from hybridblas.devices import cuda_ozaki
from hybridblas.problem import C, N, T, Operand


def _covered(blocks, m, n):
    count = np.zeros((m, n), int)
    for i0, i1, j0, j1 in blocks:
        count[i0:i1, j0:j1] += 1
    return count


_SHAPES = [(100, 100, 40, 16), (37, 37, 8, 8), (5, 5, 40, 16)]


@pytest.mark.parametrize("lower,m,n,sub,strip", [(lower,) + shape for lower in (None, True, False)
                                                 for shape in _SHAPES] + [(None, 90, 61, 32, 16)])
def test_blocks_cover_the_wanted_part_once(lower, m, n, sub, strip, monkeypatch):
    """Every entry of the triangle (or of C) in exactly one block; a block never lies wholly outside it."""
    monkeypatch.setattr(cuda_ozaki, "SUB", sub)
    monkeypatch.setattr(cuda_ozaki, "STRIP", strip)
    wanted = np.ones((m, n), bool) if lower is None else (np.tril if lower else np.triu)(np.ones((m, n), bool))
    count = np.zeros((m, n), int)
    for rows, cols in cuda_ozaki._panels(m, n, lower, 2, 1 << 40):
        blocks = list(cuda_ozaki._blocks(rows, cols, lower))
        for i0, i1, j0, j1 in blocks:
            assert rows[0] <= i0 < i1 <= rows[1] and cols[0] <= j0 < j1 <= cols[1]
            assert i1 - i0 <= sub and j1 - j0 <= sub
            assert wanted[i0:i1, j0:j1].any()
        count += _covered(blocks, m, n)
    assert (count[wanted] == 1).all()


@pytest.mark.parametrize("lower", [None, True, False])
def test_panels_split_c_when_the_planes_do_not_fit(lower, monkeypatch):
    monkeypatch.setattr(cuda_ozaki, "SUB", 16)
    monkeypatch.setattr(cuda_ozaki, "PANEL_MIN", 16)
    n, planes = 100, 32
    whole = list(cuda_ozaki._panels(n, n, lower, planes, planes * 100 * 100))
    assert len(whole) == 1
    parts = list(cuda_ozaki._panels(n, n, lower, planes, planes * 100 * 20))
    assert len(parts) > 1 and all(c1 - c0 <= 16 for _, (c0, c1) in parts)
    assert [c for _, c in parts] == [(c0, min(n, c0 + 16)) for c0 in range(0, n, 16)]
    for (r0, r1), (c0, c1) in parts:       # a triangle's panel holds only the rows that reach it
        assert (r0, r1) == ((c0, n) if lower is True else ((0, c1) if lower is False else (0, n)))


@pytest.mark.parametrize("lower", [None, True, False])
@pytest.mark.parametrize("cplx", [False, True])
def test_one_set_of_buffers_holds_every_panel_and_block(lower, cplx, monkeypatch):
    """_Work sizes its buffers once, for the largest panel and block: every panel's reduced planes, every group's
    residue planes and every block's INT32 products fit in them (nothing is allocated after C is written)."""
    from types import SimpleNamespace
    monkeypatch.setattr(cuda_ozaki, "SUB", 24)
    monkeypatch.setattr(cuda_ozaki, "PANEL_MIN", 8)
    monkeypatch.setattr(cuda_ozaki, "STRIP", 8)
    fake = SimpleNamespace(empty=lambda size, dtype: np.empty(size, dtype))
    m = n = 70
    k, moduli = 45, ozaki.MODULI[:5]
    out_planes = (2 if cplx else 1) * len(moduli)
    for budget in (1 << 30, out_planes * 72 * 20, 500):
        panels = list(cuda_ozaki._panels(m, n, lower, out_planes, budget))
        work = cuda_ozaki._Work(fake, panels, lower, moduli, cplx, k, budget)
        parts, depth = (3 if cplx else 1), work.depth
        assert depth % cuda_ozaki.ALIGN == 0 and depth >= k and 1 <= work.group <= len(moduli)
        for rows, cols in panels:
            pm, pn = rows[1] - rows[0], cols[1] - cols[0]
            assert work.planes.size >= out_planes * pn * (-(-pm // 4) * 4)
            assert work.left.size >= parts * work.group * pm * depth
            assert work.right.size >= parts * work.group * pn * depth
            for i0, i1, j0, j1 in cuda_ozaki._blocks(rows, cols, lower):
                assert work.scratch[0].shape == (parts, work.scratch[0].shape[1])
                assert work.scratch[0].shape[1] >= (j1 - j0) * (-(-(i1 - i0) // 4) * 4)


@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("op", [N, T, C])
def test_rows_read_op_x_and_the_columns_of_op_y(op, order, rng):
    """Entry (r, q) of the rows is base[r * sr + q * sq] (conjugated when conj): op(x)[r, q] for the left
    factor, op(y)[q, r] for the right one."""
    base = np.array(rng.standard_normal((6, 9)) + 1j * rng.standard_normal((6, 9)), order=order)
    if order == "C":                       # a column-major view of the same memory, as the problem holds it
        base = base.T
    opx = {N: base, T: base.T, C: base.conj().T}[op]
    flat = np.lib.stride_tricks.as_strided(base, shape=(base.size,), strides=(base.itemsize,))

    def entries(rows):
        out = np.empty((rows.count, rows.depth), complex)
        for r in range(rows.count):
            for q in range(rows.depth):
                v = flat[r * rows.sr + q * rows.sq]
                out[r, q] = np.conj(v) if rows.conj else v
        return out
    np.testing.assert_array_equal(entries(cuda_ozaki.rows_left(Operand(base, op))), opx)
    np.testing.assert_array_equal(entries(cuda_ozaki.rows_right(Operand(base, op))), opx.T)


def test_where_emulation_applies():
    edge = cuda_ozaki.MIN_EDGE
    for kind, dtype in (("c", np.complex128), ("f", np.float64)):
        for triangle in (False, True):
            k = cuda_ozaki.MIN_K[kind, triangle]
            assert cuda_ozaki.applies(dtype, edge, edge, k, 1.0, triangle)
            assert not cuda_ozaki.applies(dtype, edge, edge, k - 1, 1.0, triangle)
            assert not cuda_ozaki.applies(dtype, edge - 1, edge, k, 1.0, triangle)
            assert not cuda_ozaki.applies(dtype, edge, edge, k, 0.0, triangle)
    for dtype in (np.float32, np.complex64):
        assert not cuda_ozaki.applies(dtype, 1 << 15, 1 << 15, 1 << 15, 1.0)


def test_kernel_source_names_every_modulus():
    """One source per number of moduli: Garner's constants from ozaki.garner_weights, every modulus a constant."""
    for count in (1, 7, 8, 16, len(ozaki.MODULI)):
        src = cuda_ozaki.source(count)
        for name in ("residues_r", "residues_c", "reduce_r", "reduce_c", "rebuild_r", "rebuild_c"):
            assert f"void {name}(" in src
        for i, ((w, q), p) in enumerate(zip(ozaki.garner_weights(ozaki.MODULI[:count]), ozaki.MODULI)):
            assert f"case {i}: reduce_real<{p}>" in src
            if i:
                assert f"int d{i} = balanced<{p}>(modp<{p}>(modp<{p}>(r{i} - (" in src and f") * {q}));" in src


def test_context_options():
    ctx = hb.Context("cpu", emulation="int8", emulation_bits=60)
    assert (ctx.emulation, ctx.emulation_bits) == ("int8", 60)
    assert hb.Context("cpu").emulation is None
    with pytest.raises(ValueError, match="emulation must be one of .*'int4'"):
        hb.Context("cpu", emulation="int4")
    with pytest.raises(TypeError, match="emulation must be one of .*8 \\(int\\)"):
        hb.Context("cpu", emulation=8)
    for bad in (7, 63):
        with pytest.raises(ValueError, match=f"emulation_bits must be an integer in 8..62, got {bad}"):
            hb.Context("cpu", emulation="int8", emulation_bits=bad)
    for bad in (True, 54.0, "54"):
        with pytest.raises(TypeError, match="emulation_bits must be an integer"):
            hb.Context("cpu", emulation_bits=bad)


def test_cpu_calls_stay_native_under_emulation(rng):
    """The CPU computes natively with emulation on: the same result as without."""
    a = rng.standard_normal((70, 50)) + 1j * rng.standard_normal((70, 50))
    on = hb.herk(1.0, a, context=hb.Context("cpu", emulation="int8"))
    off = hb.herk(1.0, a, context=hb.Context("cpu"))
    np.testing.assert_array_equal(np.tril(on), np.tril(off))


def test_which_calls_want_emulation():
    from types import SimpleNamespace
    def call(bits, dtype):
        return SimpleNamespace(run=SimpleNamespace(emulation=bits), dtype=np.dtype(dtype))
    assert cuda_ozaki.wanted(call(54, np.complex128)) and cuda_ozaki.wanted(call(54, np.float64))
    assert not cuda_ozaki.wanted(call(None, np.complex128))
    assert not cuda_ozaki.wanted(call(54, np.complex64)) and not cuda_ozaki.wanted(call(54, np.float32))
