"""Exact Wigner 3j symbols (Racah's formula in rational arithmetic) and Gaunt coefficients.

scipy has no 3j symbol; Racah's alternating sum loses digits in floating point for l >~ 10, so the
sum is done exactly with Python integers and only the final square root is taken in floating point.
"""
import functools
import math
from fractions import Fraction

import numpy as np

__all__ = ["wigner3j", "gaunt", "gaunt_table"]


@functools.lru_cache(maxsize=None)
def wigner3j(j1, j2, j3, m1, m2, m3):
    """(j1 j2 j3; m1 m2 m3) for integer arguments; 0 outside the selection rules."""
    for name, v in (("j1", j1), ("j2", j2), ("j3", j3), ("m1", m1), ("m2", m2), ("m3", m3)):
        if int(v) != v:
            raise ValueError(f"wigner3j takes integer arguments only, got {name}={v!r}")
    if m1 + m2 + m3 != 0 or min(j1, j2, j3) < 0:
        return 0.0
    if abs(m1) > j1 or abs(m2) > j2 or abs(m3) > j3:
        return 0.0
    if j3 > j1 + j2 or j3 < abs(j1 - j2):
        return 0.0
    f = math.factorial
    delta = Fraction(f(j1 + j2 - j3) * f(j1 - j2 + j3) * f(-j1 + j2 + j3), f(j1 + j2 + j3 + 1))
    pref = delta * (f(j1 + m1) * f(j1 - m1) * f(j2 + m2) * f(j2 - m2) * f(j3 + m3) * f(j3 - m3))
    t_min = max(0, j2 - j3 - m1, j1 - j3 + m2)
    t_max = min(j1 + j2 - j3, j1 - m1, j2 + m2)
    s = Fraction(0)
    for t in range(t_min, t_max + 1):
        den = (f(t) * f(j3 - j2 + t + m1) * f(j3 - j1 + t - m2) * f(j1 + j2 - j3 - t)
               * f(j1 - t - m1) * f(j2 - t + m2))
        s += Fraction((-1) ** t, den)
    if s == 0:
        return 0.0
    # value = sign * sqrt(pref) * s, evaluated as sqrt(pref * s^2) to round once
    sign = (-1) ** (j1 - j2 - m3) * (1 if s > 0 else -1)
    return sign * math.sqrt(pref * s * s)


def gaunt(l1, m1, l2, m2, l3, m3):
    """∫ Y*_{l1 m1} Y_{l2 m2} Y_{l3 m3} dΩ for complex spherical harmonics with the Condon–Shortley phase."""
    if (l1 + l2 + l3) % 2 or m1 != m2 + m3:
        return 0.0
    w0 = wigner3j(l1, l2, l3, 0, 0, 0)
    if w0 == 0.0:
        return 0.0
    pref = math.sqrt((2 * l1 + 1) * (2 * l2 + 1) * (2 * l3 + 1) / (4.0 * math.pi))
    return (-1) ** m1 * pref * w0 * wigner3j(l1, l2, l3, -m1, m2, m3)


@functools.lru_cache(maxsize=None)
def gaunt_table(lmax, lam):
    """Dense array G[L', μ+λ, L] = gaunt(l', m', λ, μ, l, m) with L = l² + l + m (read-only)."""
    n_l = (lmax + 1) ** 2
    out = np.zeros((n_l, 2 * lam + 1, n_l))
    for lp in range(lmax + 1):
        for l in range(abs(lp - lam), min(lmax, lp + lam) + 1):
            if (lp + l + lam) % 2:
                continue
            for mp in range(-lp, lp + 1):
                for m in range(-l, l + 1):
                    mu = mp - m
                    if abs(mu) <= lam:
                        out[lp * lp + lp + mp, mu + lam, l * l + l + m] = gaunt(lp, mp, lam, mu, l, m)
    out.setflags(write=False)
    return out
