"""Harmonic-oscillator length and radial integrals <n l | r^k | n' l'> (radial functions positive at r -> 0+).

ħω = 45 A^(-1/3) - 25 A^(-2/3) MeV (Blomqvist–Molinari, KSHELL's default formula), b = ħc / sqrt(m c² ħω) with
m c² the mean nucleon mass. R_nl(r) = N r^l L_n^(l+1/2)(r²/b²) exp(-r²/2b²), n = 0, 1, ... the number of nodes.
"""
from functools import lru_cache
from math import isfinite, sqrt

import numpy as np
from scipy.special import eval_genlaguerre, roots_genlaguerre

HBAR_C = 197.327                         # MeV fm
NUCLEON_MASS = (938.272 + 939.565) / 2   # MeV, mean of the proton and neutron masses


def hbar_omega(mass):
    """ħω (MeV) = 45 A^(-1/3) - 25 A^(-2/3) for mass number A."""
    if not isinstance(mass, (int, np.integer)) or mass < 1:
        raise ValueError(f"mass must be a positive integer mass number, got {mass!r}")
    return 45.0 * mass ** (-1.0 / 3.0) - 25.0 * mass ** (-2.0 / 3.0)


def oscillator_length(hw):
    """b (fm) = ħc / sqrt(m c² ħω) for ħω in MeV."""
    if not isinstance(hw, (int, float)) or not isfinite(hw) or hw <= 0:
        raise ValueError(f"hbar_omega must be a positive number of MeV, got {hw!r}")
    return HBAR_C / sqrt(NUCLEON_MASS * hw)


def hbar_omega_of_length(b):
    """ħω (MeV) of the oscillator of length b (fm): the inverse of ``oscillator_length``."""
    if not isinstance(b, (int, float)) or not isfinite(b) or b <= 0:
        raise ValueError(f"b must be a positive number of fm, got {b!r}")
    return HBAR_C ** 2 / (NUCLEON_MASS * b * b)


@lru_cache(maxsize=None)
def _norm(n, l):
    return 1.0 / sqrt(_raw_integral(n, l, n, l, 0))


def _raw_integral(n1, l1, n2, l2, k):
    """∫ r^(2+k) r^(l1+l2) L_n1 L_n2 exp(-r²) dr (b = 1, unnormalised) as (1/2) ∫ x^alpha L_n1 L_n2 e^-x dx with
    x = r², alpha = (k + 1 + l1 + l2) / 2: Gauss–Laguerre with that weight is exact for the polynomial L_n1 L_n2."""
    x, w = roots_genlaguerre(n1 + n2 + 2, (k + 1 + l1 + l2) / 2.0)
    return 0.5 * float(np.sum(w * eval_genlaguerre(n1, l1 + 0.5, x) * eval_genlaguerre(n2, l2 + 0.5, x)))


@lru_cache(maxsize=None)
def radial_integral(n1, l1, n2, l2, k=2):
    """<n1 l1 | r^k | n2 l2> in units of b^k (n counts nodes from 0; both functions positive near the origin)."""
    for name, v in (("n1", n1), ("l1", l1), ("n2", n2), ("l2", l2), ("k", k)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if (l1 + l2 + k) % 2:
        raise ValueError(f"l1 + l2 + k must be even for a polynomial integrand, got l1={l1} l2={l2} k={k}")
    return _norm(n1, l1) * _norm(n2, l2) * _raw_integral(n1, l1, n2, l2, k)
