"""Crystals from ASE: System.from_ase, System.from_file and `flapw build --structure` build H and S; the
default muffin-tin radii and lmax; refused input."""
import json
import math
import sys

import numpy as np
import pytest

import flapw
from flapw.reference import direct_hs
from flapw.structures import ANGSTROM, neighbour_pairs

ase = pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402
import ase.io  # noqa: E402

CRYSTALS = {"Si": lambda: bulk("Si", "diamond", a=5.43), "Al": lambda: bulk("Al", "fcc", a=4.05)}


def _rel(x, ref):
    return np.abs(x - ref).max() / np.abs(ref).max()


def _free_electrons(cell, n, v0):
    return np.sort(v0 + cell.basis.norm ** 2 / 2)[:n]


@pytest.mark.parametrize("name", sorted(CRYSTALS))
def test_cif_crystal_builds_and_meets_the_empty_lattice(name, tmp_path, capsys):
    """A CIF written by ASE, read back through the API and the CLI: with V = v0 everywhere the lowest
    eigenvalues lie at or above the free-electron v0 + |k+G|²/2 (variational), and within 5 mHa of it where
    they are within 0.5 Ha of E_l = 0 (the linearisation error grows as (E - E_l)²; the primitive cells'
    8 lowest states span up to 1.2 Ha)."""
    path = tmp_path / f"{name}.cif"
    ase.io.write(path, CRYSTALS[name]())
    v0, nev = -0.5, 8
    cell = flapw.System.from_file(path, kmax=2.5, potential="empty", v0=v0)
    assert cell.name == f"{name}.cif" and cell.n_atoms == len(CRYSTALS[name]())
    h, s = flapw.build_hs(cell, interstitial=True)
    ev = flapw.solve(h, s, nev)
    free = _free_electrons(cell, nev, v0)
    err = ev - free
    assert err.min() > -1e-9, err
    near = np.abs(free) <= 0.5
    assert near.sum() >= 5 and err[near].max() < 5e-3, (free, err)
    # the same crystal through from_ase: the same matrices
    h2, s2 = flapw.build_hs(flapw.System.from_ase(ase.io.read(path), kmax=2.5, potential="empty", v0=v0),
                            interstitial=True)
    np.testing.assert_array_equal(h2, h)
    np.testing.assert_array_equal(s2, s)
    # and through the CLI
    from flapw.cli import main
    out = tmp_path / "hs.npz"
    rc = main(["build", "--structure", str(path), "--kmax", "2.5", "--potential", "empty", "--v0", str(v0),
               "--interstitial", "--solve", str(nev), "--json", "--output", str(out)])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["system"] == f"{name}.cif"
    rep = doc["reports"][0]
    assert (rep["N_A"], rep["N_G"], rep["N_L"]) == (cell.n_atoms, cell.n_g, cell.n_l)
    np.testing.assert_allclose(rep["eigenvalues"], ev, rtol=0, atol=1e-10)
    data = np.load(out)
    assert _rel(data["H_0"], h) <= 1e-12 and _rel(data["S_0"], s) <= 1e-12


@pytest.mark.parametrize("method", flapw.METHODS)
def test_model_potential_crystal_equals_direct_sums(method):
    """Rocksalt NaCl in its 2-atom primitive cell with the model potential: both HSDLA builds equal the
    per-entry sums of eqs. (4)-(5); the crystal field has the cubic site symmetry (λ = 2 vanishes)."""
    cell = flapw.System.from_ase(bulk("NaCl", "rocksalt", a=5.64), kmax=2.2)
    assert sorted(s.symbol for s in cell.structure.species) == ["Cl", "Na"]
    assert [sp.z for sp in cell.structure.species] == [11.0, 17.0]
    for cls in cell.classes:
        assert sorted(cls.field) == [4, 6]
    h_ref, s_ref = direct_hs(cell)
    h, s = flapw.build_hs(cell, method=method)
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12


@pytest.mark.parametrize("atoms", [bulk("Si", "diamond", a=5.43), bulk("NaCl", "rocksalt", a=5.64),
                                   bulk("Ti", "hcp", a=2.95, c=4.68), bulk("Al", "fcc", a=4.05, cubic=True)],
                         ids=["Si", "NaCl", "Ti-hcp", "Al-cubic"])
def test_default_radii_touch_at_095_and_lmax_follows_rmt_kmax(atoms):
    """Checked against ASE's own minimum-image distances: no two spheres overlap, the closest pair of
    spheres fills 0.95 of its distance, and lmax = ceil(max R_MT · Kmax)."""
    kmax = 3.0
    cell = flapw.System.from_ase(atoms, kmax=kmax)
    rmt = np.array([sp.rmt for sp in cell.structure.species])
    dist = atoms.get_all_distances(mic=True) * ANGSTROM
    np.fill_diagonal(dist, np.inf)
    own = min(np.linalg.norm(atoms.cell.array, axis=1)) * ANGSTROM      # an atom's nearest own image, here
    nearest = np.minimum(dist.min(axis=1), own)
    for sym in set(atoms.get_chemical_symbols()):
        mine = [i for i, s in enumerate(atoms.get_chemical_symbols()) if s == sym]
        assert rmt[mine[0]] == pytest.approx(0.95 * nearest[mine].min() / 2, rel=1e-12)
    fill = (rmt[:, None] + rmt[None, :]) / dist
    assert fill.max() == pytest.approx(0.95, rel=1e-12)
    assert cell.lmax == min(12, max(2, math.ceil(rmt.max() * kmax)))


def test_given_radii_lmax_and_supercell():
    si = bulk("Si", "diamond", a=5.43)
    cell = flapw.System.from_ase(si, kmax=2.0, rmt=2.0, lmax=5, supercell=(2, 1, 1), name="Si x2")
    assert cell.name == "Si x2" and cell.n_atoms == 4 and cell.lmax == 5
    assert cell.omega == pytest.approx(2 * si.get_volume() * ANGSTROM ** 3, rel=1e-12)
    assert all(sp.rmt == 2.0 for sp in cell.structure.species)
    nacl = flapw.System.from_ase(bulk("NaCl", "rocksalt", a=5.64), rmt={"Cl": 2.6})
    radii = {sp.symbol: sp.rmt for sp in nacl.structure.species}
    assert radii["Cl"] == 2.6 and radii["Na"] == pytest.approx(0.95 * 5.64 * ANGSTROM / 4, rel=1e-12)


def test_neighbour_pairs_in_a_skewed_cell_match_ase(rng):
    """A cell whose vectors are far from orthogonal needs translations beyond ±1: the pair distances equal
    ASE's minimum-image ones."""
    cell = np.array([[3.0, 0.0, 0.0], [8.7, 1.1, 0.0], [5.2, 3.3, 1.4]])
    atoms = ase.Atoms("H5", scaled_positions=rng.uniform(0, 1, (5, 3)), cell=cell, pbc=True)
    want = atoms.get_all_distances(mic=True)
    i, j, d = neighbour_pairs(cell, atoms.get_scaled_positions(), want.max() + 1e-9)
    got = np.full((5, 5), np.inf)
    np.minimum.at(got, (i, j), d)
    off = ~np.eye(5, dtype=bool)
    np.testing.assert_allclose(got[off], want[off], rtol=1e-12)


def _si():
    return bulk("Si", "diamond", a=5.43)


def _with(atoms, **changes):
    for key, value in changes.items():
        setattr(atoms, key, value)
    return atoms


BAD_ATOMS = [
    (lambda: ase.Atoms(cell=np.eye(3) * 4, pbc=True), {}, "empty structure"),
    (lambda: _with(_si(), pbc=False), {}, r"periodic in all three directions, got pbc=\[False, False, False\]"),
    (lambda: ase.Atoms("Si", cell=[[3, 0, 0], [0, 3, 0], [0, 0, 0]], pbc=True), {}, "span three dimensions"),
    (lambda: ase.Atoms("Si2", positions=[[0, 0, 0], [0, 0, 0]], cell=np.eye(3) * 4, pbc=True), {}, "same site"),
    (lambda: ase.Atoms("X", cell=np.eye(3) * 4, pbc=True), {}, "dummy atom 'X'"),
    (_si, dict(rmt=3.0), r"muffin-tin spheres overlap: atom 0 \(Si, rmt=3.0000\) and atom 1 \(Si, rmt=3.0000\)"),
    (_si, dict(rmt={"Ge": 2.0}), r"rmt names species \['Ge'\] that the crystal lacks"),
    (_si, dict(rmt=-1.0), "rmt must be a positive number, got -1.0"),
    (_si, dict(rmt=[2.0]), r"rmt must be None, a number \(bohr\) or a dict"),
    (_si, dict(rmt={"Si": "2"}), "rmt must be a positive number, got '2'"),
    (_si, dict(lmax=-1), "lmax must be a non-negative integer, got -1"),
    (_si, dict(lmax=2.5), "lmax must be a non-negative integer, got 2.5"),
    (_si, dict(lmax={"Si": 6}), "lmax must be a non-negative integer"),
    (_si, dict(kmax=0.0), "kmax must be a positive number"),
    (_si, dict(supercell=(0, 1, 1)), r"supercell must be three positive integers, got \(0, 1, 1\)"),
]


@pytest.mark.parametrize("make,kw,match", BAD_ATOMS)
def test_bad_crystals_are_refused(make, kw, match):
    with pytest.raises(ValueError, match=match):
        flapw.System.from_ase(make(), **kw)


def test_bad_files_and_objects(tmp_path, capsys):
    with pytest.raises(TypeError, match="atoms must be an ase.Atoms, got dict"):
        flapw.System.from_ase({"Si": [0, 0, 0]})
    with pytest.raises(ValueError, match="does not exist"):
        flapw.System.from_file(tmp_path / "none.cif")
    junk = tmp_path / "junk.cif"
    junk.write_text("this is not a crystal\n")
    with pytest.raises(ValueError, match="could not read a crystal from .*junk.cif"):
        flapw.System.from_file(junk)
    from flapw.cli import main
    assert main(["build", "--structure", str(tmp_path / "none.cif")]) == 2
    err = capsys.readouterr().err
    assert "none.cif" in err and "does not exist" in err and "Traceback" not in err


def test_missing_ase_names_the_extra(monkeypatch, tmp_path):
    path = tmp_path / "Si.cif"
    ase.io.write(path, _si())
    monkeypatch.setitem(sys.modules, "ase", None)
    monkeypatch.setitem(sys.modules, "ase.io", None)
    for call in (lambda: flapw.System.from_file(path), lambda: flapw.System.from_ase(object())):
        with pytest.raises(ImportError, match=r'pip install "hybridblas\[ase\]"') as info:
            call()
        assert isinstance(info.value, ValueError)          # a CLI reports it as bad input, exit code 2


def test_structures_by_hand_are_checked():
    lat = np.eye(3) * 6.0
    na = flapw.Species("Na", 11.0, 2.0)
    cell = flapw.System(flapw.Structure("Na bcc", lat, [[0, 0, 0], [.5, .5, .5]], [na, na], 4), kmax=1.5)
    assert cell.n_atoms == 2 and cell.n_l == 25
    with pytest.raises(ValueError, match="species 'Na' appears with two values"):
        flapw.Structure("x", lat, [[0, 0, 0], [.5, .5, .5]], [na, flapw.Species("Na", 11.0, 2.1)], 4)
    with pytest.raises(ValueError, match="species Na: z must be a positive number, got 0"):
        flapw.Species("Na", 0, 2.0)
    with pytest.raises(ValueError, match=r"positions must be an \(N_A, 3\) array with N_A >= 1, got shape \(0,\)"):
        flapw.Structure("x", lat, [], [], 4)
    with pytest.raises(ValueError, match=r"species must be one Species per atom \(2\), got 1 items"):
        flapw.Structure("x", lat, [[0, 0, 0], [.5, .5, .5]], [na], 4)
    with pytest.raises(ValueError, match="muffin-tin spheres overlap"):
        flapw.Structure("x", lat, [[0, 0, 0], [.3, 0, 0]], [na, na], 4)


def test_radial_inputs_that_would_give_nan_are_refused():
    """Muffin tins below MIN_RMT (also the default radii of two atoms 1e-5 Å apart), E_l beyond ±100 Ha, E_l
    of a species the crystal lacks, E_l lists of the wrong length: ValueError naming them; kmax may be a numpy
    float; solve names h of no numbers."""
    ase = pytest.importorskip("ase")
    from ase.build import bulk
    si = bulk("Si", "diamond", a=5.43)
    for kw, match in [(dict(rmt=1e-5), "species Si: rmt must be at least 0.05 bohr"),
                      (dict(e_l=-1e5), r"e_l must be finite energies within ±100 Ha"),
                      (dict(e_l={"Xx": 1.0}), r"e_l names species \['Xx'\] that the crystal does not hold"),
                      (dict(e_l={"Si": [0, 0, 0]}), r"e_l must be a number or \d+ numbers \(one per l\)")]:
        with pytest.raises(ValueError, match=match):
            flapw.System.from_ase(si, kmax=2.0, **kw)
    pair = ase.Atoms("Na2", positions=[[0, 0, 0], [1e-5, 0, 0]], cell=[5, 5, 5], pbc=True)
    with pytest.raises(ValueError, match="species Na: rmt must be at least 0.05 bohr"):
        flapw.System.from_ase(pair, kmax=2.0)
    assert flapw.System.from_ase(si, kmax=np.float32(2.0)).kmax == 2.0
    with pytest.raises(TypeError, match="h must hold numbers, got dtype object"):
        flapw.solve(np.eye(3, dtype=object), np.eye(3), 1)
