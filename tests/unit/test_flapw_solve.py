"""flapw.solve on the lower triangles: the host path equals the full-matrix solve, the Cholesky reduction
that runs on a GPU equals LAPACK's zhegvx (run here with numpy), eigenvectors, a singular S, the CLI."""
import json

import numpy as np
import pytest
import scipy.linalg

import flapw
import hybridblas as hb
from flapw import cli
from flapw.eigen import _host_ops, _reduced


@pytest.fixture(scope="module")
def nacl():
    """NaCl (8 atoms) at Kmax 3.0, N_G 552: lower-triangle build, and the full one."""
    cell = flapw.System.preset("NaCl", kmax=3.0, supercell=(1, 1, 1))
    lower = flapw.build_hs(cell, interstitial=True, lower_only=True)
    full = flapw.build_hs(cell, interstitial=True)
    return cell, lower, full


def _poisoned_upper(m):
    m = m.copy()
    m[np.triu_indices(len(m), 1)] = np.nan
    return m


def test_lower_triangle_solve_equals_the_full_matrix_solve(nacl):
    _, (h, s), (hf, sf) = nacl
    assert not np.triu(h, 1).any() and not np.triu(s, 1).any()       # the upper triangles were not filled
    want = scipy.linalg.eigvalsh(hf, sf)[:12]
    got = flapw.solve(_poisoned_upper(h), _poisoned_upper(s), 12)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(flapw.solve(h, s, 12), flapw.solve(hf, sf, 12))


def test_cholesky_reduction_equals_zhegvx(nacl):
    """The GPU path's steps (Cholesky, two triangular solves, eigh, X = L⁻ᴴZ) on numpy: eigenvalues equal
    scipy's to 1e-10 Ha, eigenvectors S-orthonormal, H x = E S x, the same as zhegvx's up to phase."""
    _, (h, s), (hf, sf) = nacl
    nev = 10
    values, x = _reduced(_poisoned_upper(h), _poisoned_upper(s), nev, True, _host_ops())
    ref, xr = flapw.solve(h, s, nev, vectors=True)
    np.testing.assert_allclose(values, ref, rtol=0, atol=1e-10)
    assert np.abs(x.conj().T @ sf @ x - np.eye(nev)).max() < 1e-10
    assert np.abs(hf @ x - sf @ x * values).max() < 1e-9
    overlap = np.abs(xr.conj().T @ sf @ x)               # unitary between the two bases (degenerate levels mix)
    np.testing.assert_allclose(overlap @ overlap.T, np.eye(nev), atol=1e-8)
    alone, none = _reduced(h, s, nev, False, _host_ops())
    assert none is None
    np.testing.assert_allclose(alone, values, rtol=0, atol=1e-12)


def test_inputs_are_left_alone(nacl):
    _, (h, s), _ = nacl
    h0, s0 = h.copy(), s.copy()
    flapw.solve(h, s, 3, vectors=True)
    _reduced(h, s, 3, True, _host_ops())
    np.testing.assert_array_equal(h, h0)
    np.testing.assert_array_equal(s, s0)


def test_singular_overlap_names_the_interstitial_part():
    """Muffin-tin S alone at N_G = 880 > 2 N_A N_L = 784 is singular: both paths refuse, naming the cause."""
    cell = flapw.System.preset("NaCl", kmax=3.5, supercell=(1, 1, 1))
    h, s = flapw.build_hs(cell, lower_only=True)
    with pytest.raises(ValueError, match=r"S is not positive definite.*--interstitial.*lower Kmax"):
        flapw.solve(h, s, 3)
    with pytest.raises(ValueError, match=r"S is not positive definite.*--interstitial"):
        _reduced(h, s, 3, False, _host_ops())


_EYE = np.eye(4, dtype=complex)


@pytest.mark.parametrize("args, kw, error, match", [
    ((_EYE, _EYE, 0), {}, ValueError, r"nev must be an integer in \[1, 4\], got 0"),
    ((_EYE, _EYE, 5), {}, ValueError, r"nev must be an integer in \[1, 4\], got 5"),
    ((_EYE, _EYE, 2.0), {}, ValueError, r"nev must be an integer in \[1, 4\], got 2.0"),
    ((_EYE, _EYE, 2), dict(vectors="yes"), TypeError, r"vectors must be True or False, got str 'yes'"),
    ((_EYE, np.eye(3), 2), {}, ValueError, r"h and s must be square arrays of one shape and kind"),
    (([[1.0]], _EYE, 1), {}, ValueError, r"h and s must be numpy or cupy arrays, got list"),
])
def test_bad_arguments(args, kw, error, match):
    with pytest.raises(error, match=match):
        flapw.solve(*args, **kw)


def test_non_finite_lower_triangle_is_refused(nacl):
    _, (h, s), _ = nacl
    bad = h.copy()
    bad[5, 2] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        flapw.solve(bad, s, 3)


def test_cli_solve_vectors_and_the_file(tmp_path, capsys, nacl):
    cell, _, (hf, sf) = nacl
    out = tmp_path / "hs.npz"
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "3.0", "--interstitial",
                   "--solve", "6", "--vectors", "--output", str(out), "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)["reports"][0]
    want = scipy.linalg.eigvalsh(hf, sf)[:6]
    np.testing.assert_allclose(rep["eigenvalues"], want, rtol=0, atol=1e-12)
    assert rep["triangle"] == "lower" and rep["solve_seconds"] > 0
    assert "hermitian fill" not in [st["name"] for st in rep["stages"]]
    got = flapw.read_hs(out)["kpoints"][0]
    np.testing.assert_allclose(got["H"], hf, rtol=0, atol=1e-13 * np.abs(hf).max())      # both triangles
    np.testing.assert_allclose(got["eigenvalues"], rep["eigenvalues"], rtol=0, atol=0)
    x = got["eigenvectors"]
    assert x.shape == (cell.n_g, 6)
    assert np.abs(x.conj().T @ sf @ x - np.eye(6)).max() < 1e-10


def test_cli_full_fills_both_triangles(capsys):
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "2.0", "--interstitial",
                   "--full", "--solve", "2", "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)["reports"][0]
    assert rep["triangle"] == "full" and "hermitian fill" in [st["name"] for st in rep["stages"]]


def test_cli_vectors_needs_solve_and_output(capsys, tmp_path):
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "2.0", "--vectors"])
    err = capsys.readouterr().err
    assert rc == 2 and "--vectors" in err and "--solve" in err and "--output" in err and "Traceback" not in err


def test_cli_singular_overlap_exits_2(capsys, monkeypatch):
    """A build whose S is singular (here: the interstitial part left out behind the CLI's back) ends with
    exit 2 and a message naming the cause, no traceback."""
    real = cli.build_hs_with_fallback
    monkeypatch.setattr(cli, "build_hs_with_fallback", lambda *a, **kw: real(*a, **dict(kw, interstitial=False)))
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "3.5", "--interstitial",
                   "--solve", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and "S is not positive definite" in err and "--interstitial" in err and "Traceback" not in err


@pytest.mark.gpu
def test_gpu_solve_equals_host(nacl):
    import cupy
    _, (h, s), (hf, sf) = nacl
    want, xw = flapw.solve(h, s, 10, vectors=True)
    hd, sd = cupy.asarray(_poisoned_upper(h), order="F"), cupy.asarray(_poisoned_upper(s), order="F")
    got = flapw.solve(hd, sd, 10)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_allclose(got.get(), want, rtol=0, atol=1e-10)
    values, x = flapw.solve(hd, sd, 10, vectors=True)
    x = x.get()
    np.testing.assert_allclose(values.get(), want, rtol=0, atol=1e-10)
    assert np.abs(x.conj().T @ sf @ x - np.eye(10)).max() < 1e-10
    assert np.abs(hf @ x - sf @ x * values.get()).max() < 1e-9
    assert np.isnan(hd[0, 1].get())                              # the caller's arrays untouched


@pytest.mark.gpu
def test_gpu_solve_refuses_a_singular_overlap():
    import cupy
    cell = flapw.System.preset("NaCl", kmax=3.5, supercell=(1, 1, 1))
    h, s = flapw.build_hs(cell, lower_only=True)
    with pytest.raises(ValueError, match=r"S is not positive definite.*--interstitial"):
        flapw.solve(cupy.asarray(h), cupy.asarray(s), 3)


@pytest.mark.gpu
def test_gpu_cli_device_arrays_solve_on_the_gpu(tmp_path, capsys):
    """NaCl Kmax 2.5 (64 atoms) on device arrays: the GPU solve's eigenvalues equal scipy's on the host
    build to 1e-10 Ha; the file holds both triangles and the eigenvectors."""
    out = tmp_path / "hs.h5"
    rc = cli.main(["build", "--system", "NaCl", "--kmax", "2.5", "--interstitial", "--devices", "cuda:0",
                   "--arrays", "device", "--solve", "20", "--vectors", "--output", str(out), "--json"])
    assert rc == 0, capsys.readouterr().err
    rep = json.loads(capsys.readouterr().out)["reports"][0]
    assert rep["arrays"] == "device"
    cell = flapw.System.preset("NaCl", kmax=2.5)
    h, s = flapw.build_hs(cell, interstitial=True, context=hb.Context("cpu"))
    np.testing.assert_allclose(rep["eigenvalues"], scipy.linalg.eigh(h, s, eigvals_only=True, subset_by_index=[0, 19]),
                               rtol=0, atol=1e-10)
    got = flapw.read_hs(out)["kpoints"][0]
    assert np.abs(got["H"] - h).max() <= 1e-12 * np.abs(h).max()
    x = got["eigenvectors"]
    assert np.abs(x.conj().T @ s @ x - np.eye(20)).max() < 1e-10
