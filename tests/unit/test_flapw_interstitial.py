"""The interstitial part: Θ from its defining sum, the table through flat indices, the lower triangle only,
tiles on threads, and the GPU path (its column blocks, run here with numpy as the array module)."""
import numpy as np
import pytest

import flapw
from flapw import interstitial
from flapw.basis import reciprocal
from flapw.interstitial import add_interstitial, step_function_table, table_span


def _theta_direct(structure, q):
    """Θ(q) for integer q (rows) from its definition, atom by atom: no table, no factorised phases."""
    qc = q @ reciprocal(structure.lattice)
    norm = np.linalg.norm(qc, axis=1)
    out = (np.all(q == 0, axis=1)).astype(complex)
    for pos, sp in zip(structure.positions, structure.species):
        x = norm * sp.rmt
        with np.errstate(invalid="ignore", divide="ignore"):
            form = np.where(x < 1e-3, sp.rmt ** 3 * (1 / 3 - x ** 2 / 30),
                            (np.sin(x) - x * np.cos(x)) / np.where(norm > 0, norm, 1) ** 3)
        out -= 4 * np.pi / structure.omega * form * np.exp(-2j * np.pi * (q @ pos))
    return out


def _interstitial_reference(cell):
    """H_IR and S_IR (full N_G x N_G) entry by entry: Θ(G' - G) from its definition for every pair."""
    m = cell.basis.miller
    d = (m[:, None, :] - m[None, :, :]).reshape(-1, 3)
    uniq, inverse = np.unique(d, axis=0, return_inverse=True)
    s = _theta_direct(cell.structure, uniq)[inverse.reshape(-1)].reshape(len(m), len(m))
    kin = cell.basis.norm ** 2 / 4
    return (kin[:, None] + kin[None, :] + cell.model.v0) * s, s


def _rel_lower(x, ref):
    lo = np.tril_indices(len(ref))
    return np.abs(x[lo] - ref[lo]).max() / np.abs(ref[lo]).max()


CELLS = [("NaCl", dict(kmax=2.0, supercell=(1, 1, 1), v0=-0.3)), ("TiO2", dict(kmax=2.4, supercell=(1, 1, 1))),
         ("AuAg", dict(kmax=2.0, supercell=(1, 1, 1), k=(0.4, -0.3, 0.7), v0=0.2)), ("NaCl", dict(kmax=1.6))]


@pytest.mark.parametrize("name, kw", CELLS, ids=[f"{n}-{kw.get('kmax')}" for n, kw in CELLS])
@pytest.mark.parametrize("order", ["F", "C"])
def test_lower_triangle_equals_the_entrywise_sums(name, kw, order, rng):
    """Added to random H and S: the lower triangle gains H_IR, S_IR to 1e-12; the strict upper one, NaN
    here, is not touched."""
    cell = flapw.System.preset(name, **kw)
    h_ir, s_ir = _interstitial_reference(cell)
    n = cell.n_g
    h0 = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    s0 = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    up = np.triu_indices(n, 1)
    h0[up] = s0[up] = np.nan
    h, s = np.array(h0, order=order), np.array(s0, order=order)
    out = add_interstitial(h, s, cell)
    assert out[0] is h and out[1] is s
    assert _rel_lower(h - h0, h_ir) <= 1e-12 and _rel_lower(s - s0, s_ir) <= 1e-12
    assert np.isnan(h[up]).all() and np.isnan(s[up]).all()


def test_tiles_on_threads_and_gpu_blocks_give_the_same_bits(monkeypatch, rng):
    """Small tiles (many crossing the diagonal, a short last one) on 1 and 3 threads, and the GPU path's
    column blocks run with numpy: every result is the same, bit for bit."""
    cell = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1))
    n = cell.n_g
    start = np.asfortranarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    whole = [start.copy(order="F"), start.copy(order="F")]
    add_interstitial(*whole, cell, threads=1)
    monkeypatch.setattr(interstitial, "HOST_TILE", 7 * 5)
    monkeypatch.setattr(interstitial, "HOST_COLUMNS", 5)
    for threads in (1, 3):
        got = [start.copy(order="F"), start.copy(order="F")]
        add_interstitial(*got, cell, threads=threads)
        np.testing.assert_array_equal(got[0], whole[0])
        np.testing.assert_array_equal(got[1], whole[1])
    monkeypatch.setattr(interstitial, "DEVICE_BLOCK", 11 * n)         # 11 columns a block, the last shorter
    got = [start.copy(order="F"), start.copy(order="F")]
    add_interstitial(*got, cell, xp=_NumpyAsDevice())
    np.testing.assert_array_equal(got[0], whole[0])
    np.testing.assert_array_equal(got[1], whole[1])


class _NumpyAsDevice:
    """numpy under another name: the code paths written for cupy arrays, run on the host."""

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("name", ["NaCl", "TiO2", "AuAg"])
def test_table_equals_the_definition_and_spans_every_k(name, rng):
    cell = flapw.System.preset(name, kmax=2.0, supercell=(1, 1, 1))
    span = np.array([3, 2, 4])
    table = step_function_table(cell.structure, span)
    assert table.shape == tuple(2 * span + 1) and table.flags.c_contiguous
    q = np.stack(np.meshgrid(*[np.arange(-s, s + 1) for s in span], indexing="ij"), -1).reshape(-1, 3)
    np.testing.assert_allclose(table.reshape(-1), _theta_direct(cell.structure, q), rtol=0, atol=1e-14)
    span = table_span(cell.structure.lattice, cell.kmax)
    for k in rng.uniform(-3, 3, (20, 3)):
        m = cell.with_k(k).basis.miller
        assert np.all(np.ptp(m, axis=0) <= span), (k, np.ptp(m, axis=0), span)


def test_table_is_k_independent_and_computed_once():
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    table, span = cell.step_table
    other = cell.with_k((0.3, -0.2, 0.1))
    assert other.step_table[0] is table
    assert "step function" in cell.setup_seconds()
    h, s = flapw.build_hs(other, interstitial=True, lower_only=True)
    h_mt, s_mt = flapw.build_hs(other, lower_only=True)
    h_ir, s_ir = _interstitial_reference(other)
    assert _rel_lower(s - s_mt, s_ir) <= 1e-12 and _rel_lower(h - h_mt, h_ir) <= 1e-12


def test_empty_basis_and_bad_table():
    empty = flapw.System.preset("NaCl", kmax=0.2, supercell=(1, 1, 1))
    h = s = np.zeros((0, 0), complex)
    assert add_interstitial(h, s, empty)[0].shape == (0, 0)
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    small = np.array([1, 1, 1])
    cell._shared.step_table = (step_function_table(cell.structure, small), small)
    n = cell.n_g
    with pytest.raises(ValueError, match=r"step-function table spans \(1, 1, 1\), less than"):
        add_interstitial(np.zeros((n, n), complex), np.zeros((n, n), complex), cell)
