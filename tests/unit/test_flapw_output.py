"""H/S files (.npz and .h5): what is written is read back bit for bit, the Miller indices rebuild the basis,
the crystal and units travel with the matrices, and a bad matrix or a failed run leaves no file."""
import importlib.util
import itertools
import json
import sys

import numpy as np
import pytest

import flapw
from flapw.basis import reciprocal
from flapw.cli import _kpoints, main
from flapw.output import HSWriter, check_writable, file_format, rank_path, read_hs, write_hs

needs_h5py = pytest.mark.skipif(importlib.util.find_spec("h5py") is None, reason="h5py not installed (the hdf5 extra)")
H5 = pytest.param("h5", marks=needs_h5py)
FORMATS = ["npz", H5, pytest.param("hdf5", marks=needs_h5py)]


@pytest.fixture(scope="module")
def nacl():
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))
    built = []
    for k in _kpoints(2, cell.k):
        kc = cell.with_k(k)
        built.append((kc, *flapw.build_hs(kc, interstitial=True)))
    return cell, built


def _brute_force_miller(lattice, k, kmax):
    """Every integer G in a generous box with |k+G| <= kmax (no use of flapw.basis)."""
    b = 2 * np.pi * np.linalg.inv(lattice).T
    n = int(np.ceil(kmax * np.linalg.norm(lattice, axis=1).max() / (2 * np.pi))) + 2
    box = np.array(list(itertools.product(range(-n, n + 1), repeat=3)))
    return box[np.linalg.norm((box + k) @ b, axis=1) <= kmax]


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("order", ["F", "C"])
def test_round_trip(tmp_path, nacl, suffix, order):
    cell, built = nacl
    path = tmp_path / f"hs.{suffix}"
    with HSWriter(path, cell, method="refined", interstitial=True, n_kpoints=2) as out:
        for ik, (kc, h, s) in reversed(list(enumerate(built))):      # any order; read back sorted
            out.add(ik, kc, np.asarray(h, order=order), np.asarray(s, order=order))
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]     # no temporary left behind
    data = read_hs(path)
    st = cell.structure
    assert (data["system"], data["method"], data["kmax"], data["lmax"]) == ("NaCl", "refined", 1.8, 6)
    assert data["interstitial"] is True and data["triangle"] == "full" and data["n_kpoints"] == 2
    assert data["format"] == "flapw-hs" and data["format_version"] == 1
    assert "bohr" in data["units"] and "hartree" in data["units"]
    assert data["species"] == [sp.symbol for sp in st.species]
    np.testing.assert_array_equal(data["lattice"], st.lattice)
    np.testing.assert_array_equal(data["positions_frac"], st.positions)
    np.testing.assert_allclose(data["positions_cart"], st.positions @ st.lattice, rtol=1e-15)
    np.testing.assert_array_equal(data["rmt"], [sp.rmt for sp in st.species])
    np.testing.assert_allclose(data["omega"], abs(np.linalg.det(st.lattice)), rtol=1e-14)
    assert [p["index"] for p in data["kpoints"]] == [0, 1]
    for got, (kc, h, s) in zip(data["kpoints"], built):
        np.testing.assert_array_equal(got["H"], h)
        np.testing.assert_array_equal(got["S"], s)
        assert got["N_G"] == kc.n_g == got["H"].shape[0] == len(got["miller"])
        np.testing.assert_array_equal(got["k"], kc.k)
        np.testing.assert_allclose(got["k_cart"], np.asarray(kc.k) @ reciprocal(st.lattice), rtol=1e-14)


@pytest.mark.parametrize("suffix", ["npz", H5])
def test_miller_indices_rebuild_the_basis(tmp_path, nacl, suffix):
    """The stored G's are exactly the |k+G| <= Kmax set (brute force), ordered by |k+G|, each once."""
    cell, built = nacl
    path = tmp_path / f"hs.{suffix}"
    with HSWriter(path, cell, method="refined", interstitial=True, n_kpoints=2) as out:
        for ik, (kc, h, s) in enumerate(built):
            out.add(ik, kc, h, s)
    data = read_hs(path)
    for got in data["kpoints"]:
        m = got["miller"]
        assert m.dtype.kind == "i" and m.shape == (got["N_G"], 3)
        norms = np.linalg.norm(got["k_cart"] + m @ data["reciprocal"], axis=1)
        assert norms.max() <= data["kmax"]
        assert np.all(np.diff(norms) >= -1e-12)                         # basis order: by |k+G|
        want = _brute_force_miller(data["lattice"], got["k"], data["kmax"])
        assert len({tuple(g) for g in m}) == len(m) == len(want)
        assert {tuple(g) for g in m} == {tuple(g) for g in want}


def test_write_hs_one_k_point_and_rank_paths(tmp_path, nacl):
    cell, [(kc, h, s), _] = nacl
    path = write_hs(tmp_path / "one.npz", kc, h, s, method="original", interstitial=False, index=3)
    data = read_hs(path)
    assert data["method"] == "original" and data["interstitial"] is False
    assert [p["index"] for p in data["kpoints"]] == [3]
    assert rank_path("run/hs.h5", 2).as_posix() == "run/hs.rank2.h5"


def test_bad_matrices_and_failures_leave_no_file(tmp_path, nacl, rng):
    cell, [(kc, h, s), _] = nacl
    path = tmp_path / "hs.npz"
    lower = np.tril(h)
    poisoned = h.copy()
    poisoned[3, 1] = np.nan
    cases = [((lower, s), "not a full Hermitian"), ((h, poisoned), "not finite"),
             ((h[:-1, :-1], s), "N_G x N_G"),
             ((h, rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)), "not a full Hermitian")]
    for (hh, ss), message in cases:
        with pytest.raises(ValueError, match=message):
            with HSWriter(path, cell, method="refined", interstitial=True) as out:
                out.add(0, kc, hh, ss)
        assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="already in"):
        with HSWriter(path, cell, method="refined", interstitial=True) as out:
            out.add(0, kc, h, s)
            out.add(0, kc, h, s)
    with pytest.raises(ValueError, match="index must be"):
        with HSWriter(path, cell, method="refined", interstitial=True) as out:
            out.add(-1, kc, h, s)
    assert list(tmp_path.iterdir()) == []


@needs_h5py
def test_formats_paths_and_foreign_files(tmp_path, monkeypatch):
    assert [file_format(f"x.{s}") for s in ("npz", "h5", "hdf5", "H5")] == ["npz", "hdf5", "hdf5", "hdf5"]
    with pytest.raises(ValueError, match=r"--output 'x\.txt' must end in \.npz, \.h5 or \.hdf5"):
        file_format("x.txt", "--output")
    with pytest.raises(ValueError, match="cannot be written"):
        check_writable(tmp_path / "missing" / "x.npz", "--output")
    check_writable(tmp_path / "x.npz")
    assert list(tmp_path.iterdir()) == []
    np.savez(tmp_path / "other.npz", H_0=np.eye(2))
    with pytest.raises(ValueError, match="not a flapw H/S file"):
        read_hs(tmp_path / "other.npz")
    monkeypatch.setitem(sys.modules, "h5py", None)                     # h5py not installed
    with pytest.raises(ValueError, match=r'pip install "hybridblas\[hdf5\]"'):
        file_format("x.h5", "--output")


@pytest.mark.parametrize("suffix", ["npz", H5])
def test_cli_output_equals_the_library_build(tmp_path, capsys, suffix):
    path = tmp_path / f"hs.{suffix}"
    rc = main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "1.7", "--kpoints", "2",
               "--interstitial", "--json", "--output", str(path), "--batch-atoms", "3"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["output"] == str(path)
    data = read_hs(path)
    cell = flapw.System.preset("NaCl", kmax=1.7, supercell=(1, 1, 1))
    assert data["n_kpoints"] == 2 and data["interstitial"] is True
    for got, k, rep in zip(data["kpoints"], _kpoints(2, cell.k), doc["reports"]):
        h, s = flapw.build_hs(cell.with_k(k), interstitial=True)
        assert got["N_G"] == rep["N_G"] == h.shape[0]
        scale = np.abs(h).max()
        assert np.abs(got["H"] - h).max() <= 1e-12 * scale
        assert np.abs(got["S"] - s).max() <= 1e-12 * np.abs(s).max()
        np.testing.assert_array_equal(got["miller"], cell.with_k(k).basis.miller)


@pytest.mark.parametrize("suffix", FORMATS)
def test_lower_triangles_are_written_whole(tmp_path, nacl, suffix, monkeypatch):
    """H and S given as their lower triangles (upper ones NaN), in several row blocks: the file holds the
    Hermitian fill of them, bit for bit, and the arrays are not changed; eigenpairs travel along."""
    import flapw.output as output
    monkeypatch.setattr(output, "_ROW_BLOCK", 1000)                     # blocks of a few rows, a short last one
    cell, built = nacl
    path = tmp_path / f"hs.{suffix}"
    rng = np.random.default_rng(3)
    written = []
    with HSWriter(path, cell, method="refined", interstitial=True, n_kpoints=2) as out:
        for ik, (kc, h, s) in enumerate(built):
            lower = [np.tril(m) + np.triu(np.full_like(m, np.nan), 1) for m in (h, s)]
            before = [m.copy() for m in lower]
            values = np.sort(rng.standard_normal(3))
            vectors = rng.standard_normal((kc.n_g, 3)) + 1j * rng.standard_normal((kc.n_g, 3))
            out.add(ik, kc, np.asfortranarray(lower[0]), lower[1], lower=True, eigenvalues=values,
                    eigenvectors=vectors)
            for m, b in zip(lower, before):
                np.testing.assert_array_equal(m, b)
            written.append((h, s, values, vectors))
    data = read_hs(path)
    for got, (h, s, values, vectors) in zip(data["kpoints"], written, strict=True):
        np.testing.assert_array_equal(got["H"], flapw.hermitian_fill(np.tril(h)))
        np.testing.assert_array_equal(got["S"], flapw.hermitian_fill(np.tril(s)))
        np.testing.assert_array_equal(got["eigenvalues"], values)
        np.testing.assert_array_equal(got["eigenvectors"], vectors)


def test_lower_triangle_checks(tmp_path, nacl):
    cell, built = nacl
    kc, h, s = built[0]
    with HSWriter(tmp_path / "hs.npz", cell, method="refined", interstitial=True) as out:
        bad = np.tril(h)
        bad[4, 1] = np.inf
        with pytest.raises(ValueError, match="h has entries that are not finite"):
            out.add(0, kc, bad, s, lower=True)
        with pytest.raises(ValueError, match=r"h is not a full Hermitian matrix.*lower=True"):
            out.add(0, kc, np.tril(h), s)
        with pytest.raises(TypeError, match="lower must be True or False, got str 'yes'"):
            out.add(0, kc, h, s, lower="yes")
        with pytest.raises(ValueError, match=r"eigenvectors must be N_G x NEV"):
            out.add(0, kc, h, s, eigenvalues=[1.0, 2.0], eigenvectors=np.ones((kc.n_g, 3)))
        out.add(0, kc, h, s)
    assert "eigenvalues" not in read_hs(tmp_path / "hs.npz")["kpoints"][0]


@pytest.mark.parametrize("suffix", FORMATS)
def test_any_precision_is_written_as_complex128_and_the_writer_closes_once(tmp_path, nacl, suffix):
    """Real or single-precision H and S are written as the complex128 the file declares; close and discard
    inside the block, or twice, are harmless; a bad method, interstitial or n_kpoints is named."""
    cell, built = nacl
    kc, h, s = built[0]
    path = tmp_path / f"r.{suffix}"
    write_hs(path, kc, h.real.copy(), s.real.astype(np.float32), method="refined", interstitial=True)
    point = read_hs(path)["kpoints"][0]
    assert point["H"].dtype == complex
    np.testing.assert_array_equal(point["H"], h.real)
    np.testing.assert_array_equal(point["S"], s.real.astype(np.float32))
    with HSWriter(tmp_path / f"c.{suffix}", cell, method="refined", interstitial=True) as out:
        out.add(0, kc, h, s)
        out.close()
        with pytest.raises(ValueError, match="is closed"):
            out.add(1, kc, h, s)
    assert read_hs(tmp_path / f"c.{suffix}")["kpoints"][0]["N_G"] == kc.n_g
    with HSWriter(tmp_path / f"d.{suffix}", cell, method="refined", interstitial=True) as out:
        out.discard()
    assert not (tmp_path / f"d.{suffix}").exists()
    for kw, exc, match in ((dict(method="bogus"), ValueError, "method must be one of"),
                           (dict(interstitial="no"), TypeError, "interstitial must be True or False"),
                           (dict(n_kpoints=0.5), ValueError, "n_kpoints must be a positive integer")):
        with pytest.raises(exc, match=match):
            HSWriter(tmp_path / f"e.{suffix}", cell, **{**dict(method="refined", interstitial=True), **kw})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"r.{suffix}", f"c.{suffix}"])


@pytest.mark.parametrize("suffix", FORMATS)
def test_damaged_or_incomplete_files_are_refused_naming_them(tmp_path, nacl, suffix):
    cell, built = nacl
    kc, h, s = built[0]
    good = tmp_path / f"g.{suffix}"
    write_hs(good, kc, h, s, method="refined", interstitial=True)
    raw = good.read_bytes()
    for name, data in (("empty", b""), ("truncated", raw[:len(raw) // 2]), ("junk", b"\x00" * 300)):
        bad = tmp_path / f"{name}.{suffix}"
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=f"path '{bad}' is not a readable flapw H/S file"):
            read_hs(bad)
    if suffix == "npz":
        z = dict(np.load(good))
        z["H_0"] = z["H_0"][:2, :2]
        np.savez(tmp_path / "small.npz", **z)
        with pytest.raises(ValueError, match="is incomplete: k-point 0 lacks H, S or miller"):
            read_hs(tmp_path / "small.npz")
        del z["S_0"]
        np.savez(tmp_path / "nos.npz", **z)
        with pytest.raises(ValueError, match="is incomplete: k-point 0 lacks S"):
            read_hs(tmp_path / "nos.npz")
