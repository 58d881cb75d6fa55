"""Independent references for tests: per-entry sums of eqs. (4)-(5) and S by the addition theorem."""
import numpy as np
from scipy.special import eval_legendre

from .matching import phases, radial_matching, species_factors

__all__ = ["direct_hs", "overlap_legendre"]


def _atom_blocks(cell):
    basis, radial = cell.basis, cell.radial
    fac = {s: species_factors(basis, radial[s], cell.lmax, cell.omega) for s in radial}
    ph = phases(basis, cell.structure.positions)
    for a, sp in enumerate(cell.structure.species):
        fa, fb = fac[sp.symbol]
        yield a, (fa * ph[:, a:a + 1]).T, (fb * ph[:, a:a + 1]).T      # A_a, B_a: N_L × N_G


def direct_hs(cell):
    """Eqs. (4)-(5) summed entry by entry (einsum without BLAS-shaped regrouping): full H_MT and S_MT."""
    n = cell.n_g
    h = np.zeros((n, n), complex)
    s = np.zeros((n, n), complex)
    cls_of = cell.atom_class_index()
    for a, am, bm in _atom_blocks(cell):
        t = cell.tmats[cls_of[a]]
        u2 = t.udot_norm_lm ** 2
        s += np.einsum("lg,lh->gh", am.conj(), am, optimize=False)
        s += np.einsum("lg,l,lh->gh", bm.conj(), u2, bm, optimize=False)
        for left, tm, right in ((am, t.taa, am), (am, t.tab, bm), (bm, t.tab.conj().T, am), (bm, t.tbb, bm)):
            h += np.einsum("pg,pq,qh->gh", left.conj(), tm, right, optimize=False)
    return h, s


def overlap_legendre(cell):
    """S_MT[G',G] = Σ_a (4π)²/Ω e^{i(K-K')·τ_a} Σ_l (2l+1)/(4π) P_l(K̂'·K̂) [a_l a_l + ‖u̇_l‖² b_l b_l]."""
    basis, radial = cell.basis, cell.radial
    khat = basis.kpg / basis.norm[:, None]
    cosg = np.clip(khat @ khat.T, -1.0, 1.0)
    ph = phases(basis, cell.structure.positions)
    s = np.zeros((basis.n_g, basis.n_g), complex)
    for sym, rad in radial.items():
        a, b = radial_matching(basis, rad, cell.lmax)
        radial_sum = np.zeros_like(cosg)
        for l in range(cell.lmax + 1):
            radial_sum += ((2 * l + 1) / (4 * np.pi) * eval_legendre(l, cosg)
                           * (np.outer(a[:, l], a[:, l]) + rad.udot_norm[l] ** 2 * np.outer(b[:, l], b[:, l])))
        atoms = [i for i, sp in enumerate(cell.structure.species) if sp.symbol == sym]
        pair_phase = ph[:, atoms].conj() @ ph[:, atoms].T              # Σ_a e^{-iK'τ} e^{iKτ}
        s += (4 * np.pi) ** 2 / cell.omega * pair_phase * radial_sum
    return s
