"""One-body operators between the m-states of one species (a ``SingleParticleSpace``): dense nsp x nsp matrices
<α | O | γ>, real, in the order of the space (orbit by orbit, m ascending).

|n l j m> = Σ <l m_l 1/2 m_s | j m> |n l m_l>|m_s> (l coupled before s, Condon–Shortley), oscillator radial
functions positive at the origin: the conventions of KSHELL's operators. Spherical components of a vector V:
V_(+1) = -(V_x + i V_y)/√2, V_0 = V_z, V_(-1) = (V_x - i V_y)/√2.
"""
from math import pi, sqrt

import numpy as np

from ..shellmodel.clebsch import clebsch_gordan
from .oscillator import radial_integral


def _ls_parts(l, twoj, twom):
    """[(2m_l, 2m_s, <l m_l 1/2 m_s | j m>)] of |l j m>."""
    out = []
    for tms in (-1, 1):
        tml = twom - tms
        if abs(tml) <= 2 * l:
            c = clebsch_gordan(2 * l, tml, 1, tms, twoj, twom)
            if c:
                out.append((tml, tms, c))
    return out


def _vector_component(tl, tm_bra, tm_ket, mu):
    """<l m' | L_mu | l m> of an angular momentum L (twice-units for l, m): the spherical components above."""
    if tm_bra != tm_ket + 2 * mu:
        return 0.0
    if mu == 0:
        return tm_ket / 2.0
    if mu == 1:
        return -sqrt((tl - tm_ket) * (tl + tm_ket + 2) / 8.0)
    return sqrt((tl + tm_ket) * (tl - tm_ket + 2) / 8.0)


def _spherical_harmonic(l_bra, tml_bra, rank, mu, l_ket, tml_ket):
    """<l m | Y_(rank, mu) | l' m'> = sqrt((2l'+1)(2 rank+1) / (4π(2l+1))) <l' 0 rank 0 | l 0> <l' m' rank mu | l m>."""
    c0 = clebsch_gordan(2 * l_ket, 0, 2 * rank, 0, 2 * l_bra, 0)
    if not c0:
        return 0.0
    c = clebsch_gordan(2 * l_ket, tml_ket, 2 * rank, 2 * mu, 2 * l_bra, tml_bra)
    return sqrt((2 * l_ket + 1) * (2 * rank + 1) / (4 * pi * (2 * l_bra + 1))) * c0 * c


def _matrix(space, element):
    """nsp x nsp matrix of element(orbit_bra, orbit_ket, 2m_bra, 2m_ket) over the m-states of ``space``."""
    n = space.size
    out = np.zeros((n, n))
    for a in range(n):
        oa = space.orbits[space.orbit[a]]
        for g in range(n):
            out[a, g] = element(oa, space.orbits[space.orbit[g]], int(space.twom[a]), int(space.twom[g]))
    return out


def quadrupole(space, mu):
    """<α | r² Y_(2 mu) | γ> in units of b² (b the oscillator length)."""
    def element(oa, og, tma, tmg):
        if tma != tmg + 2 * mu or (oa.l + og.l) % 2 or abs(oa.l - og.l) > 2:
            return 0.0
        ang = 0.0
        for tml_a, tms_a, ca in _ls_parts(oa.l, oa.twoj, tma):
            for tml_g, tms_g, cg in _ls_parts(og.l, og.twoj, tmg):
                if tms_a == tms_g:
                    ang += ca * cg * _spherical_harmonic(oa.l, tml_a, 2, mu, og.l, tml_g)
        return radial_integral(oa.n, oa.l, og.n, og.l, 2) * ang if ang else 0.0
    return _matrix(space, element)


def orbital(space, mu):
    """<α | l_mu | γ> (diagonal in n and l)."""
    def element(oa, og, tma, tmg):
        if (oa.n, oa.l) != (og.n, og.l) or tma != tmg + 2 * mu:
            return 0.0
        return sum(ca * cg * _vector_component(2 * oa.l, tml_a, tml_g, mu)
                   for tml_a, tms_a, ca in _ls_parts(oa.l, oa.twoj, tma)
                   for tml_g, tms_g, cg in _ls_parts(og.l, og.twoj, tmg) if tms_a == tms_g)
    return _matrix(space, element)


def spin(space, mu):
    """<α | s_mu | γ> (s = σ/2; diagonal in n and l)."""
    def element(oa, og, tma, tmg):
        if (oa.n, oa.l) != (og.n, og.l) or tma != tmg + 2 * mu:
            return 0.0
        return sum(ca * cg * _vector_component(1, tms_a, tms_g, mu)
                   for tml_a, tms_a, ca in _ls_parts(oa.l, oa.twoj, tma)
                   for tml_g, tms_g, cg in _ls_parts(og.l, og.twoj, tmg) if tml_a == tml_g)
    return _matrix(space, element)


def total(space, mu):
    """<α | j_mu | γ> from the Wigner–Eckart theorem (<j m' | j_mu | j m> = sqrt(j(j+1)) <j m 1 mu | j m'>)."""
    def element(oa, og, tma, tmg):
        if oa is not og:
            return 0.0
        return sqrt(oa.twoj * (oa.twoj + 2) / 4.0) * clebsch_gordan(og.twoj, tmg, 2, 2 * mu, oa.twoj, tma)
    return _matrix(space, element)
