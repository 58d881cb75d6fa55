"""Reduced E2 and M1 matrix elements, B(E2), B(M1), spectroscopic quadrupole and magnetic dipole moments.

Conventions (Bohr–Mottelson, as KSHELL prints them):
    <J_f M_f | T_(λμ) | J_i M_i> = <J_i M_i λ μ | J_f M_f> <J_f || T_λ || J_i> / sqrt(2 J_f + 1)
    B(λ; i -> f) = |<J_f || T_λ || J_i>|² / (2 J_i + 1)
    E2: T_(2μ) = Σ_k e_k r_k² Y_(2μ)(k)                            B(E2) in e² fm⁴
    M1: T_(1μ) = sqrt(3/4π) Σ_k (g_l l_μ + g_s s_μ)(k)               B(M1) in μ_N²
    Q(J) = sqrt(16π/5) <J J | T_(20) | J J>  (e fm²),  μ(J) = <J J | g_l l_z + g_s s_z | J J>  (μ_N)
The states come with one M (the basis' 2M). Each is also raised to M + 1 by J₊ (|J, M+1> = J₊|J, M> / sqrt(J(J+1) -
M(M+1)), the Condon–Shortley phase), and the reduced matrix element is the least-squares fit of the Wigner–Eckart form
to the four matrix elements <f, M_f| T_(λ, M_f - M_i) |i, M_i> with M_i, M_f in {M, M+1}: a transition whose
Clebsch–Gordan coefficient vanishes at μ = 0 (2+ -> 3+ at M = 0, every M1 moment at M = 0) is taken from the others.
The largest misfit is returned as a check (``wigner_eckart_residual``): it is at rounding level when the J labels
are right.
"""
from dataclasses import dataclass
from math import isfinite, pi, sqrt

import numpy as np

from ..arrays import column_sumsq, to_host
from ..shellmodel.clebsch import clebsch_gordan
from . import single_particle
from .mscheme import BlockVectors, OneBodyOperator
from .states import normalised
from .oscillator import hbar_omega, hbar_omega_of_length, oscillator_length

J_LABEL_TOLERANCE = 1e-3        # |<J²> - J(J+1)| above this: the state has no usable J label


PAIR_LIMIT = 1e3                          # |effective charge| (e), |g-factor| (μ_N): physical values are below 10
RANGES = {"b": (0.01, 100.0), "hbar_omega": (0.01, 1000.0)}   # fm, MeV: nuclei have b ~ 1-3 fm, ħω ~ 5-20 MeV


def _pair(value, name):
    try:
        a, b = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of numbers (proton, neutron), got {value!r}") from None
    if not (isfinite(a) and isfinite(b)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if max(abs(a), abs(b)) > PAIR_LIMIT:
        raise ValueError(f"{name} must be at most {PAIR_LIMIT:g} in size (e or μ_N), got {value!r}")
    return a, b


@dataclass(frozen=True)
class TransitionOptions:
    """Effective charges (e), orbital and spin g-factors (μ_N), each (proton, neutron), and the oscillator length:
    ``b`` in fm, or ``hbar_omega`` in MeV, or neither (ħω = 45 A^(-1/3) - 25 A^(-2/3) MeV). The defaults are the
    usual sd/pf-shell effective charges and the free-nucleon g-factors (quenched spin g-factors, e.g. 0.75 of the
    free ones, are a common choice: pass them as ``gs``)."""
    eff_charge: tuple = (1.5, 0.5)
    gl: tuple = (1.0, 0.0)
    gs: tuple = (5.586, -3.826)
    b: float = None
    hbar_omega: float = None

    def __post_init__(self):
        for name in ("eff_charge", "gl", "gs"):
            object.__setattr__(self, name, _pair(getattr(self, name), name))
        for name in ("b", "hbar_omega"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not isfinite(v) or v <= 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
            low, high = RANGES[name]
            if v is not None and not low <= v <= high:
                raise ValueError(f"{name} must be between {low:g} and {high:g} ({'fm' if name == 'b' else 'MeV'}), "
                                 f"got {v!r}")
        if self.b is not None and self.hbar_omega is not None:
            raise ValueError(f"give b or hbar_omega, not both (got b={self.b!r}, hbar_omega={self.hbar_omega!r})")

    def oscillator(self, mass):
        """(b in fm, ħω in MeV) for mass number ``mass``."""
        if self.b is not None:
            return float(self.b), hbar_omega_of_length(float(self.b))
        hw = float(self.hbar_omega) if self.hbar_omega is not None else hbar_omega(mass)
        return oscillator_length(hw), hw


class RaisedStates:
    """Normalised states |i, M> and |i, M+1> = J₊|i, M>/norm (BlockVectors ``v`` and ``u``, where the given vectors
    are), with <J²> = |J₊ψ|² + M² + M and the J labels (host arrays)."""

    def __init__(self, problem, vectors):
        self.problem = problem
        self.v = normalised(problem, vectors)
        self.twice_m = problem.basis.twice_m
        m = self.twice_m / 2.0
        jp = OneBodyOperator(problem, -sqrt(2.0) * single_particle.total(problem.pspace, 1),
                             -sqrt(2.0) * single_particle.total(problem.nspace, 1), 1)
        self.raised_basis = jp.target
        u = jp.apply(self.v)
        up2 = column_sumsq(u)
        self.j2 = up2 + m * m + m
        j = (-1.0 + np.sqrt(1.0 + 4.0 * np.maximum(self.j2, 0.0))) / 2.0
        self.twoj = np.round(2.0 * j).astype(np.int64)
        self.labelled = (np.abs(self.j2 - self.twoj * (self.twoj + 2) / 4.0) <= J_LABEL_TOLERANCE) \
            & (self.twoj >= abs(self.twice_m)) & ((self.twoj - self.twice_m) % 2 == 0)
        self.raised = self.labelled & (self.twoj >= self.twice_m + 2)
        u *= self.v.xp.asarray(np.where(self.raised, 1.0 / np.sqrt(np.where(self.raised, up2, 1.0)), 0.0))
        self.u = BlockVectors(self.raised_basis, u)

    def reduced(self, rank, proton, neutron):
        """<f || T_rank || i> as an array [i, f] (NaN where a state has no J label) and the largest Wigner–Eckart
        misfit. ``proton(mu)``, ``neutron(mu)``: single-particle matrices of T_(rank, mu) of each species."""
        prob, v, u = self.problem, self.v, self.u
        t0 = OneBodyOperator(prob, proton(0), neutron(0), 0)
        # [i, f] = <f, M_f | T | i, M_i>
        elements = [((0, 0), t0.elements(v, v))]
        if self.raised_basis.dim:
            tp = OneBodyOperator(prob, proton(1), neutron(1), 1)
            tm = OneBodyOperator(prob, proton(-1), neutron(-1), -1, source=self.raised_basis)
            elements += [((0, 1), tp.elements(v, u)), ((1, 0), tm.elements(u, v)),
                         ((1, 1), t0.acting_on(self.raised_basis).elements(u, u))]
        elements = [(key, to_host(mat)) for key, mat in elements]
        twoj, tm2 = self.twoj, self.twice_m
        values = np.unique(twoj)
        where = np.searchsorted(values, twoj)
        num = np.zeros_like(elements[0][1])
        den = np.zeros_like(num)
        fits = []
        for (di, df), mat in elements:
            table = np.array([[clebsch_gordan(int(ji), tm2 + 2 * di, 2 * rank, 2 * (df - di), int(jf), tm2 + 2 * df)
                               for jf in values] for ji in values])
            cg = table[where[:, None], where[None, :]]
            num += cg * mat
            den += cg * cg
            fits.append((cg, mat))
        hat_f = np.sqrt(twoj + 1.0)[None, :]
        allowed = (np.abs(twoj[:, None] - twoj[None, :]) <= 2 * rank) & (twoj[:, None] + twoj[None, :] >= 2 * rank)
        ok = self.labelled[:, None] & self.labelled[None, :]
        if np.any(ok & allowed & (den < 1e-12)):
            raise RuntimeError("no M-component determines a reduced matrix element (an unexpected J, M combination)")
        red = np.where(ok & allowed, hat_f * num / np.where(den > 0, den, 1.0), 0.0)
        red = np.where(ok, red, np.nan)
        misfit = 0.0
        for cg, mat in fits:
            diff = np.abs(mat - cg * red / hat_f)
            if np.any(ok):
                misfit = max(misfit, float(np.max(diff[ok])))
        return red, misfit


def electromagnetic(problem, vectors, options=None):
    """E2 and M1 observables of the given states (columns of ``vectors``): a JSON-ready dict. B values are
    [initial][final]; NaN (None in JSON) where a state has no J label."""
    opts = options if options is not None else TransitionOptions()
    states = RaisedStates(problem, vectors)
    b, hw = opts.oscillator(problem.mass)
    ep, en = opts.eff_charge
    (glp, gln), (gsp, gsn) = opts.gl, opts.gs
    pp, nn = problem.pspace, problem.nspace
    red_e2, res_e2 = states.reduced(2, lambda mu: ep * b * b * single_particle.quadrupole(pp, mu),
                                    lambda mu: en * b * b * single_particle.quadrupole(nn, mu))
    red_m1, res_m1 = states.reduced(
        1, lambda mu: glp * single_particle.orbital(pp, mu) + gsp * single_particle.spin(pp, mu),
        lambda mu: gln * single_particle.orbital(nn, mu) + gsn * single_particle.spin(nn, mu))
    twoj = states.twoj
    hat_i = (twoj + 1.0)[:, None]
    diag_e2 = np.diag(red_e2)
    diag_m1 = np.diag(red_m1)
    cg2 = np.array([clebsch_gordan(int(j), int(j), 4, 0, int(j), int(j)) for j in twoj])
    cg1 = np.array([clebsch_gordan(int(j), int(j), 2, 0, int(j), int(j)) for j in twoj])
    hat = np.sqrt(twoj + 1.0)
    return {
        "j2": states.j2, "twoj": twoj, "labelled": states.labelled,
        "b": b, "hbar_omega": hw,
        "e2": {"b": red_e2 ** 2 / hat_i, "reduced": red_e2,
               "moment": sqrt(16 * pi / 5) * cg2 * diag_e2 / hat, "wigner_eckart_residual": res_e2},
        "m1": {"b": 3.0 / (4.0 * pi) * red_m1 ** 2 / hat_i, "reduced": sqrt(3.0 / (4.0 * pi)) * red_m1,
               "moment": cg1 * diag_m1 / hat, "wigner_eckart_residual": res_m1},
    }
