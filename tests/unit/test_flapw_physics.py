"""Radial functions, matching coefficients, T matrices, G+k basis sizes and the empty lattice."""
import numpy as np
import pytest
from scipy.special import spherical_jn, sph_harm_y

import flapw
from flapw.basis import GkBasis
from flapw.matching import phases, species_factors
from flapw.radial import RadialMesh, solve_radial
from flapw.structures import make_structure

TABLE1 = {"AuAg": [3275, 5638, 8970, 13379], "TiO2": [7094, 12293, 19553, 29144]}


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_n_g_matches_table1(name):
    st = make_structure(name)
    for kmax, want in zip((2.5, 3.0, 3.5, 4.0), TABLE1[name]):
        n_g = GkBasis(st.lattice, flapw.DEFAULT_K, kmax).n_g
        assert abs(n_g - want) / want <= 0.005, (name, kmax, n_g, want)


def test_preset_sizes_and_laziness():
    cell = flapw.System.preset("TiO2", kmax=4.0, k=(0.1234, 0.2345, 0.3456))
    assert (cell.n_atoms, cell.n_l) == (384, 81)
    assert cell._shared.radial is None and cell._shared.tmats is None     # nothing heavy yet
    assert abs(cell.n_g - 29144) <= 0.005 * 29144
    assert flapw.System.preset("AuAg", kmax=2.5).n_atoms == 108
    assert sum(s.symbol == "Ag" for s in flapw.System.preset("AuAg").structure.species) == 10
    assert flapw.System.preset("NaCl").n_atoms == 64
    assert flapw.System.preset("NaCl-512").n_atoms == 512
    assert flapw.System.preset("NaCl").n_l == 49


def test_bad_inputs():
    with pytest.raises(ValueError, match="system must be one of"):
        flapw.System.preset("GaAs")
    with pytest.raises(ValueError, match="kmax"):
        flapw.System.preset("NaCl", kmax=-1.0)
    with pytest.raises(ValueError, match="potential"):
        flapw.System.preset("NaCl", potential="jellium")
    with pytest.raises(ValueError, match="supercell"):
        flapw.System.preset("NaCl", supercell=(1, 0, 1))


def test_radial_free_electron_is_bessel():
    mesh = RadialMesh.log(2.5)
    sol = solve_radial(lambda r: np.full_like(r, -0.5), 10, 0.0, mesh)     # κ² = 2(E - V) = 1
    for l in range(11):
        j = spherical_jn(l, mesh.r)
        j /= np.sqrt(mesh.integrate((j * mesh.r) ** 2))
        assert np.allclose(sol.p[l] / mesh.r, j, atol=1e-6 * np.abs(j).max())


@pytest.mark.parametrize("symbol", ["Au", "Ti", "O"])
def test_radial_wronskian_and_orthogonality(symbol):
    cell = flapw.System.preset({"Au": "AuAg", "Ti": "TiO2", "O": "TiO2"}[symbol], supercell=(1, 1, 1))
    rad = cell.radial[symbol]
    big_r = rad.mesh.r[-1]
    assert np.allclose(big_r ** 2 * rad.wronskian, 2.0, rtol=1e-4)
    assert np.allclose(rad.mesh.integrate(rad.p * rad.pdot), 0.0, atol=1e-12)
    assert np.allclose(rad.mesh.integrate(rad.p ** 2), 1.0, atol=1e-12)
    # ‖u̇‖ is converged in the mesh
    species = next(s for s in cell.structure.species if s.symbol == symbol)
    fine = solve_radial(cell.model.spherical(species), cell.lmax, 0.0, RadialMesh.log(big_r, n=3001))
    assert np.allclose(fine.udot_norm, rad.udot_norm, rtol=1e-4)


def test_matching_reproduces_plane_wave_on_sphere():
    """Σ_lm (A u_l + B u̇_l) Y_lm equals e^{iK·r}/√Ω on the sphere (value and radial slope)."""
    cell = flapw.System.preset("NaCl", kmax=1.2, supercell=(1, 1, 1), lmax=16)
    basis, atom = cell.basis, 5
    sp = cell.structure.species[atom]
    rad = cell.radial[sp.symbol]
    fa, fb = species_factors(basis, rad, cell.lmax, cell.omega)
    ph = phases(basis, cell.structure.positions[[atom]])
    a, b = fa * ph, fb * ph
    rng = np.random.default_rng(1)
    theta, phi = np.arccos(rng.uniform(-1, 1, 5)), rng.uniform(0, 2 * np.pi, 5)
    ls = np.concatenate([np.full(2 * l + 1, l) for l in range(cell.lmax + 1)])
    ms = np.concatenate([np.arange(-l, l + 1) for l in range(cell.lmax + 1)])
    y = sph_harm_y(ls[:, None], ms[:, None], theta[None, :], phi[None, :])          # (N_L, points)
    big_r = sp.rmt
    rhat = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)
    r = cell.structure.cartesian[atom] + big_r * rhat
    pw = np.exp(1j * r @ basis.kpg.T) / np.sqrt(cell.omega)                          # (points, N_G)
    dpw = pw * 1j * (rhat @ basis.kpg.T)
    val = (a * rad.u[ls] + b * rad.udot[ls]) @ y
    slope = (a * rad.du[ls] + b * rad.dudot[ls]) @ y
    assert np.allclose(val.T, pw, atol=1e-9)
    assert np.allclose(slope.T, dpw, atol=1e-8)


def test_t_matrices_hermitian_and_site_symmetry():
    cubic = flapw.System.preset("NaCl", supercell=(1, 1, 1))
    rutile = flapw.System.preset("TiO2", supercell=(1, 1, 1))
    for cls in cubic.classes:
        assert sorted(cls.field) == [4, 6]
    for cls in rutile.classes:
        assert 2 in cls.field
    assert len(rutile.classes) >= 3          # two Ti orientations and the O sites differ
    for cell in (cubic, rutile):
        for t in cell.tmats:
            assert np.allclose(t.taa, t.taa.conj().T, atol=1e-14)
            assert np.allclose(t.tbb, t.tbb.conj().T, atol=1e-14)
            assert np.abs(t.taa - np.diag(np.diag(t.taa))).max() > 1e-4     # the non-spherical terms are there


@pytest.mark.parametrize("name,kmax", [("AuAg", 3.0), ("TiO2", 3.0), ("NaCl", 2.5)])
def test_empty_lattice_free_electrons_from_above(name, kmax):
    cell = flapw.System.preset(name, kmax=kmax, supercell=(1, 1, 1), potential="empty", v0=-0.5)
    h, s = flapw.build_hs(cell, interstitial=True)
    ev = flapw.solve(h, s, 8)
    free = np.sort(-0.5 + cell.basis.norm ** 2 / 2)[:8]
    err = ev - free
    assert err.min() > -1e-9, err              # variational: never below the exact energies
    assert err.max() < 5e-3, err               # a few mHa at E_l = 0


def test_with_k_reuses_k_independent_data():
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    rad, tm = cell.radial, cell.tmats
    other = cell.with_k((0.3, -0.1, 0.2))
    assert other.radial is rad and other.tmats is tm
    assert other.basis is not cell.basis and other.k == (0.3, -0.1, 0.2)


@pytest.mark.parametrize("chunk", [1000, 37])
def test_k_only_factors_in_threaded_chunks_equal_one_piece(monkeypatch, chunk):
    from flapw import matching
    monkeypatch.setattr(matching, "CHUNK", chunk)                # NaCl at Kmax 2.5: 2561 G, 3 or 70 chunks
    cell = flapw.System.preset("NaCl", kmax=2.5)
    radials = [cell.radial[s] for s in sorted(cell.radial)]
    whole = [matching.species_factors(cell.basis, r, cell.lmax, cell.omega) for r in radials]   # one piece
    for threads in (1, 3):
        split = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, threads=threads)
        for (wa, wb), (sa, sb) in zip(whole, split, strict=True):
            np.testing.assert_array_equal(sa, wa)
            np.testing.assert_array_equal(sb, wb)


def test_k_only_factors_into_given_arrays_overwrite_them_whole():
    from flapw import matching
    cell = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1))
    radials = [cell.radial[s] for s in sorted(cell.radial)]
    fresh = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, threads=2)
    shape = (cell.n_g, cell.n_l)
    out = [(np.full(shape, np.nan, complex), np.full(shape, np.nan, complex)) for _ in radials]
    got = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, threads=2, out=out)
    for (fa, fb), (ga, gb), (oa, ob) in zip(fresh, got, out, strict=True):
        assert ga is oa and gb is ob
        np.testing.assert_array_equal(ga, fa)
        np.testing.assert_array_equal(gb, fb)
    bad = [(np.zeros(shape, complex), np.zeros(shape, complex))]
    with pytest.raises(ValueError, match=f"out must hold a \\(fa, fb\\) pair for each of the 2 radials, got 1"):
        matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, out=bad)
    wrong = [(np.zeros(shape, complex), np.asfortranarray(np.zeros(shape, complex))), out[1]]
    with pytest.raises(ValueError, match=r"out's arrays must be C-ordered complex128 of shape"):
        matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, out=wrong)


@pytest.mark.gpu
def test_k_only_factors_into_gpu_arrays_equal_the_host_ones():
    import cupy
    from flapw import matching
    cell = flapw.System.preset("NaCl", kmax=2.5)
    radials = [cell.radial[s] for s in sorted(cell.radial)]
    host = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, threads=3)
    with cupy.cuda.Device(1 if cupy.cuda.runtime.getDeviceCount() > 1 else 0):     # not only the default device
        out = [(cupy.full((cell.n_g, cell.n_l), np.nan, complex), cupy.full((cell.n_g, cell.n_l), np.nan, complex))
               for _ in radials]
    got = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, threads=3, out=out)
    for (fa, fb), (ga, gb) in zip(host, got, strict=True):          # the same products, formed on the GPU
        np.testing.assert_allclose(cupy.asnumpy(ga), fa, rtol=1e-15, atol=0)
        np.testing.assert_allclose(cupy.asnumpy(gb), fb, rtol=1e-15, atol=0)


def test_radial_matching_equals_scipy_bessel():
    """a_l, b_l of both NaCl species at Γ (K = 0 among the G) against the bracketed factors formed with
    scipy's j_l and j_l' (scipy's own error is up to ~3e-14 relative at l = 10, x ≈ 10)."""
    from flapw.matching import radial_matching
    cell = flapw.System.preset("NaCl", kmax=3.0, k=(0.0, 0.0, 0.0), supercell=(1, 1, 1), lmax=10)
    basis = cell.basis
    assert np.any(basis.norm == 0)
    kk, ls = basis.norm[:, None], np.arange(cell.lmax + 1)[None, :]
    for rad in cell.radial.values():
        x = kk * rad.mesh.r[-1]
        j, dj = spherical_jn(ls, x), kk * spherical_jn(ls, x, derivative=True)
        a, b = radial_matching(basis, rad, cell.lmax)
        assert a.shape == b.shape == (basis.n_g, cell.lmax + 1)
        np.testing.assert_allclose(a, (rad.udot * dj - rad.dudot * j) / rad.wronskian, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(b, (rad.du * j - rad.u * dj) / rad.wronskian, rtol=1e-13, atol=1e-14)


def test_k_only_factors_refuse_outputs_on_several_devices():
    """Output arrays must be all numpy or all on one GPU (the kernel writes through every pointer from one GPU);
    stand-ins with a device id are enough: the check comes before any GPU work."""
    from types import SimpleNamespace

    from flapw import matching
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    radials = [cell.radial[s] for s in sorted(cell.radial)]
    shape = (cell.n_g, cell.n_l)

    def on_gpu(i):
        return SimpleNamespace(shape=shape, dtype=np.dtype(complex), flags=SimpleNamespace(c_contiguous=True),
                               device=SimpleNamespace(id=i))
    host = np.zeros(shape, complex)
    with pytest.raises(ValueError, match="must all be numpy arrays or all CuPy arrays on one GPU, got GPU 0, GPU 1"):
        matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega,
                                out=[(on_gpu(0), on_gpu(0)), (on_gpu(1), on_gpu(1))])
    with pytest.raises(ValueError, match="got GPU 1, numpy"):
        matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega,
                                out=[(host, on_gpu(1)), (host.copy(), host.copy())])


def test_gpu_k_only_factors_check_their_inputs_like_the_host():
    """matching_gpu refuses what the host recurrences refuse, before it imports CuPy or launches anything."""
    from types import SimpleNamespace

    from flapw import matching_gpu
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    radials = [cell.radial[s] for s in sorted(cell.radial)]
    for lmax, message in ((101, "lmax must be at most 100"), (-1, "lmax must be a non-negative integer")):
        with pytest.raises(ValueError, match=message):
            matching_gpu.k_only_factors_gpu(cell.basis, radials, lmax, cell.omega, out=None)
    bad = SimpleNamespace(norm=np.array([0.0, np.inf]), n_g=2)
    with pytest.raises(ValueError, match=r"\|k\+G\| must be finite"):
        matching_gpu.k_only_factors_gpu(bad, radials, cell.lmax, cell.omega, out=None)
    with pytest.raises(ValueError, match=f"radial functions must have lmax \\+ 1 = {cell.lmax + 2} values"):
        matching_gpu.k_only_factors_gpu(cell.basis, radials, cell.lmax + 1, cell.omega, out=None)
