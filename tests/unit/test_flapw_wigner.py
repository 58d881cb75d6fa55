"""Wigner 3j symbols and Gaunt coefficients against closed forms, orthogonality and quadrature."""
import math

import numpy as np
import pytest
from scipy.special import roots_legendre, sph_harm_y

from flapw.wigner import gaunt, gaunt_table, wigner3j


def test_closed_forms():
    assert wigner3j(1, 1, 0, 0, 0, 0) == pytest.approx(-1 / math.sqrt(3), abs=1e-15)
    assert wigner3j(2, 2, 2, 0, 0, 0) == pytest.approx(-math.sqrt(2 / 35), abs=1e-15)
    assert wigner3j(1, 1, 1, 1, -1, 0) == pytest.approx(1 / math.sqrt(6), abs=1e-15)
    # (j j 0; m -m 0) = (-1)^(j-m) / sqrt(2j+1)
    for j in range(0, 12):
        for m in range(-j, j + 1):
            assert wigner3j(j, j, 0, m, -m, 0) == pytest.approx((-1) ** (j - m) / math.sqrt(2 * j + 1), abs=1e-15)


def test_selection_rules_are_exact_zeros():
    assert wigner3j(2, 2, 5, 0, 0, 0) == 0.0           # triangle
    assert wigner3j(2, 2, 2, 1, 1, 0) == 0.0           # m sum
    assert wigner3j(1, 1, 1, 0, 0, 0) == 0.0           # odd sum with all m = 0
    assert gaunt(2, 0, 2, 0, 1, 0) == 0.0              # parity


@pytest.mark.parametrize("j1,j2", [(5, 4), (10, 6), (16, 12)])
def test_orthogonality(j1, j2):
    for j3 in (abs(j1 - j2), j1 + j2 - 1, j1 + j2):
        for j3p in (j3, j3 - 1):
            total = 0.0
            for m1 in range(-j1, j1 + 1):
                for m2 in range(-j2, j2 + 1):
                    m3 = -m1 - m2
                    total += wigner3j(j1, j2, j3, m1, m2, m3) * wigner3j(j1, j2, j3p, m1, m2, m3)
            want = 1.0 if j3 == j3p else 0.0      # 1/(2j3+1) per m3, summed over m3
            assert total == pytest.approx(want, abs=1e-13)


def test_column_swap_symmetry():
    rng = np.random.default_rng(3)
    for _ in range(50):
        j1, j2 = rng.integers(0, 12, 2)
        j3 = rng.integers(abs(j1 - j2), j1 + j2 + 1)
        m1, m2 = rng.integers(-j1, j1 + 1), rng.integers(-j2, j2 + 1)
        w = wigner3j(int(j1), int(j2), int(j3), int(m1), int(m2), int(-m1 - m2))
        ws = wigner3j(int(j2), int(j1), int(j3), int(m2), int(m1), int(-m1 - m2))
        assert ws == pytest.approx((-1) ** (j1 + j2 + j3) * w, abs=1e-15)


def test_rejects_half_integers():
    with pytest.raises(ValueError, match="integer"):
        wigner3j(0.5, 0.5, 1, 0.5, -0.5, 0)


def test_gaunt_against_quadrature():
    x, wx = roots_legendre(40)
    theta = np.arccos(x)
    phi = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    th, ph = np.meshgrid(theta, phi, indexing="ij")
    w = np.outer(wx, np.full(64, 2 * np.pi / 64))
    rng = np.random.default_rng(7)
    checked = 0
    while checked < 25:
        l1, lam = int(rng.integers(0, 11)), int(rng.choice([2, 4, 6]))
        l3 = int(rng.integers(abs(l1 - lam), min(10, l1 + lam) + 1))
        m3 = int(rng.integers(-l3, l3 + 1))
        mu = int(rng.integers(-lam, lam + 1))
        m1 = m3 + mu
        if abs(m1) > l1:
            continue
        integrand = np.conj(sph_harm_y(l1, m1, th, ph)) * sph_harm_y(lam, mu, th, ph) * sph_harm_y(l3, m3, th, ph)
        assert gaunt(l1, m1, lam, mu, l3, m3) == pytest.approx(np.sum(w * integrand).real, abs=1e-12)
        checked += 1


def test_gaunt_table_layout():
    g = gaunt_table(4, 2)
    assert g.shape == (25, 5, 25)
    assert g[2 * 2 + 2 + 1, 2 + 1, 0] == pytest.approx(gaunt(2, 1, 2, 1, 0, 0))
    assert not g.flags.writeable
