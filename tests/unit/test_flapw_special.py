"""flapw.special: Y_lm and j_l by recurrences against scipy.special (the reference here only), at the poles,
the zero vector, x = 0 and the series/recurrence seam; the same bits however the points are split; bad input."""
import numpy as np
import pytest
from scipy.special import sph_harm_y_all, spherical_jn

import flapw
from flapw import special
from flapw.potential import lm_index

LMAX = 12


def _scipy_ylm(lmax, theta, phi):
    """scipy's Y_lm in the layout (N_L, N), row L = l² + l + m (negative m stored from the end by scipy)."""
    ls = lm_index(lmax)
    ms = np.arange(len(ls)) - ls * ls - ls
    return sph_harm_y_all(lmax, lmax, theta, phi)[ls, ms % (2 * lmax + 1)]


def _angles(v):
    """Polar and azimuthal angles of the rows of v (θ = φ = 0 for a zero vector)."""
    x, y, z = v.T
    return np.arctan2(np.hypot(x, y), z), np.arctan2(y, x)


def _directions():
    """Random vectors of random lengths, some crowded near the poles, and the special ones: the zero vector,
    both poles, the z axis at other lengths, φ = 0 and φ = π on the x axis, the xy plane, a tiny vector."""
    rng = np.random.default_rng(7)
    v = rng.standard_normal((3000, 3)) * rng.uniform(0.01, 10, (3000, 1))
    v[1500:, 2] *= 1e3                                                    # within ~0.1° of a pole
    special_rows = [[0, 0, 0], [0, 0, 1], [0, 0, -1], [0, 0, 3.7], [0, 0, -0.2], [2, 0, 0], [-2, 0, 0],
                    [1.5, 0, 0.5], [0, 1, 0], [0.6, -0.8, 0], [1e-200, 0, 0], [1e-9, 0, 1], [0, -1e-9, -1]]
    return np.vstack([special_rows, v])


@pytest.mark.parametrize("lmax", [0, 1, 2, 7, LMAX])
def test_spherical_harmonics_equal_scipy(lmax):
    v = _directions()
    got = special.spherical_harmonics(lmax, v)
    assert got.shape == ((lmax + 1) ** 2, len(v))
    want = _scipy_ylm(lmax, *_angles(v))
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1.5e-14)     # |Y_lm| <= 1.41 for l <= 12
    # the zero vector and the north pole: Y_l0 = √((2l+1)/4π), every m != 0 exactly 0
    pole = np.sqrt((2 * lm_index(lmax) + 1) / (4 * np.pi)) * (np.arange((lmax + 1) ** 2) == lm_index(lmax) ** 2
                                                             + lm_index(lmax))
    np.testing.assert_allclose(got[:, 0], pole, rtol=1e-14, atol=0)
    np.testing.assert_allclose(got[:, 1], pole, rtol=1e-14, atol=0)


def test_direction_cosines_of_special_vectors():
    ct, st, cp, sp = special.direction_cosines(np.array([[0, 0, 0], [0, 0, -2.0], [-3.0, 0, 0], [0, 4.0, 0]]))
    np.testing.assert_array_equal(ct, [1, -1, 0, 0])
    np.testing.assert_array_equal(st, [0, 0, 1, 1])
    np.testing.assert_array_equal(cp, [1, 1, -1, 0])
    np.testing.assert_array_equal(sp, [0, 0, 0, 1])


def test_ylm_conj_of_a_basis_with_k_zero_equals_scipy():
    """On a real basis at Γ (K = 0 among the vectors): conj(Y) in the (N_G, N_L) layout, with scipy at the
    vectors' polar and azimuthal angles (θ = φ = 0 for K = 0)."""
    from flapw.matching import ylm_conj
    cell = flapw.System.preset("NaCl", kmax=2.5, k=(0.0, 0.0, 0.0), supercell=(1, 1, 1), lmax=10)
    basis = cell.basis
    assert np.any(basis.norm == 0)
    got = ylm_conj(basis, cell.lmax)
    assert got.shape == (basis.n_g, (cell.lmax + 1) ** 2) and got.flags.c_contiguous
    np.testing.assert_allclose(got, np.conj(_scipy_ylm(cell.lmax, *_angles(basis.kpg))).T, rtol=1e-14, atol=1.5e-14)


def _bessel_points():
    rng = np.random.default_rng(11)
    seam = special.SERIES_BELOW
    return np.concatenate([[0.0, 1e-100, 1e-20, 1e-8, 1e-3, 0.5, np.nextafter(seam, 0), seam, np.nextafter(seam, 2),
                            2.0, 3.0, 29.0, 30.0], np.pi * np.arange(1, 10), 4.493409457909064 * np.ones(1),
                           np.linspace(0, 30, 1201), rng.uniform(0, 30, 2000)])


@pytest.mark.parametrize("lmax", [0, 1, 5, 10, LMAX])
def test_spherical_jn_equal_scipy(lmax):
    """Value and derivative within 1e-13 relative or 1e-15 absolute (near zeros) of scipy for x in [0, 30].
    Below x = 1 the derivative is checked against (l/x) j_l - j_{l+1} of scipy's values (no cancellation
    there; scipy's own derivative cancels: at x = 1e-100 it is 4e-14 off for l = 1)."""
    x = _bessel_points()
    j, dj = special.spherical_jn_all(lmax, x)
    assert j.shape == dj.shape == (lmax + 1, len(x))
    ls = np.arange(lmax + 1)[:, None]
    np.testing.assert_allclose(j, spherical_jn(ls, x), rtol=1e-13, atol=1e-15)
    big, small = x >= 1, (x > 0) & (x < 1)
    np.testing.assert_allclose(dj[:, big], spherical_jn(ls, x[big], derivative=True), rtol=1e-13, atol=1e-15)
    ref = ls / x[small] * spherical_jn(ls, x[small]) - spherical_jn(ls + 1, x[small])
    np.testing.assert_allclose(dj[:, small], ref, rtol=1e-13, atol=1e-15)


def test_spherical_jn_at_zero_exact():
    j, dj = special.spherical_jn_all(LMAX, np.zeros(3))
    np.testing.assert_array_equal(j, np.eye(LMAX + 1, 1) * np.ones(3))
    np.testing.assert_array_equal(dj, np.eye(LMAX + 1, 1, -1) * np.ones(3) / 3)     # only j_1'(0) = 1/3


def test_empty_and_single_points():
    assert special.spherical_harmonics(4, np.zeros((0, 3))).shape == (25, 0)
    j, dj = special.spherical_jn_all(4, np.zeros(0))
    assert j.shape == dj.shape == (5, 0)
    for x in (0.3, 7.5):
        j, dj = special.spherical_jn_all(3, np.array([x]))
        np.testing.assert_allclose(j[:, 0], spherical_jn(np.arange(4), x), rtol=1e-14)


def test_same_bits_for_any_split():
    """Each point's values depend on that point alone: any split of the points, series and recurrence
    points mixed or not, gives the same bits (what k_only_factors' chunks rely on)."""
    rng = np.random.default_rng(3)
    v = rng.standard_normal((1001, 3)) * rng.uniform(0, 4, (1001, 1))
    v[:3] = [[0, 0, 0], [0, 0, -1], [1e-3, 0, 0]]
    x = np.sort(np.linalg.norm(v, axis=1)) * 2.7                             # as |k+G| R: sorted, from 0
    whole_y = special.spherical_harmonics(LMAX, v)
    whole_j, whole_dj = special.spherical_jn_all(LMAX, x)
    for edges in ([0, 1, 8, 9, 400, 1001], [0, 333, 666, 1001], [0, 1000, 1001]):
        for r0, r1 in zip(edges[:-1], edges[1:]):
            np.testing.assert_array_equal(special.spherical_harmonics(LMAX, v[r0:r1]), whole_y[:, r0:r1])
            j, dj = special.spherical_jn_all(LMAX, x[r0:r1])
            np.testing.assert_array_equal(j, whole_j[:, r0:r1])
            np.testing.assert_array_equal(dj, whole_dj[:, r0:r1])


@pytest.mark.parametrize("lmax,x,match", [
    (-1, [1.0], "lmax must be a non-negative integer, got -1"),
    (True, [1.0], "lmax must be a non-negative integer, got True"),
    (2.0, [1.0], "lmax must be a non-negative integer, got 2.0"),
    (special.JN_LMAX + 1, [1.0], f"lmax must be at most {special.JN_LMAX}.*got {special.JN_LMAX + 1}"),
    (3, [[1.0]], r"x must be a 1-D array, got shape \(1, 1\)"),
    (3, [1.0, -0.5], r"x must be finite and >= 0, got values in \[-0.5, 1.0\]"),
    (3, [1.0, np.nan], "x must be finite and >= 0"),
])
def test_spherical_jn_refuses_bad_input(lmax, x, match):
    with pytest.raises(ValueError, match=match):
        special.spherical_jn_all(lmax, np.array(x))


def test_spherical_harmonics_refuse_bad_input():
    with pytest.raises(ValueError, match=r"vectors must be an \(N, 3\) array, got shape \(4,\)"):
        special.spherical_harmonics(2, np.ones(4))
    with pytest.raises(ValueError, match="lmax must be a non-negative integer, got -2"):
        special.spherical_harmonics(-2, np.ones((4, 3)))
