"""J-coupled TBMEs expanded to antisymmetrised m-scheme elements v̄ (README, 'Building the M-scheme Hamiltonian').

v̄(αβ, γδ) = N_ab N_cd Σ_J <j_a m_α j_b m_β | J M> <j_c m_γ j_d m_δ | J M> V_J(ab, cd), summed over J in
ascending order as (CG · CG) · V and then scaled: for every (α, β, γ, δ) at once, one J at a time. A J or an
M with no coupling contributes an exact ±0, which leaves every sum unchanged.
"""
from math import sqrt

import numpy as np

from .clebsch import clebsch_gordan


def _couplings(twoj_a, twom_a, twoj_b, twom_b, n_j):
    """<j_a m_a j_b m_b | J, m_a + m_b> for every (a, b) of the given m-state lists and J = 0..n_j-1."""
    return np.array([[[clebsch_gordan(int(ja), int(ma), int(jb), int(mb), 2 * jj, int(ma + mb)) for jj in range(n_j)]
                      for jb, mb in zip(twoj_b, twom_b)] for ja, ma in zip(twoj_a, twom_a)]).reshape(
        len(twom_a), len(twom_b), n_j)


def _tbme_table(inter, orbits_1, orbits_2, n_j):
    """V_J(ab, cd) (0 where the file has none) for a, c in orbits_1 and b, d in orbits_2 (global indices)."""
    table = np.zeros((len(orbits_1), len(orbits_2), len(orbits_1), len(orbits_2), n_j))
    for key, v in inter.tbme.items():
        a, b, c, d, jj = key
        if a in orbits_1 and b in orbits_2 and c in orbits_1 and d in orbits_2 and jj < n_j:
            table[orbits_1.index(a), orbits_2.index(b), orbits_1.index(c), orbits_2.index(d), jj] = v
    return table


def _summed(cg_ab, cg_cd, same_m, tbme):
    """Σ_J (cg_ab · cg_cd) · V_J over J ascending, cg_cd zero where M differs (arrays broadcast alike)."""
    total = np.zeros(np.broadcast_shapes(cg_ab.shape[:-1], cg_cd.shape[:-1], same_m.shape, tbme.shape[:-1]))
    for jj in range(tbme.shape[-1]):
        total += (cg_ab[..., jj] * np.where(same_m, cg_cd[..., jj], 0.0)) * tbme[..., jj]
    return total


def like_pair_matrix(space, orbit_global, inter, factor):
    """Pairs (α<β) of one species and the dense matrix v̄(αβ, γδ) over them (0 unless M is conserved)."""
    n = space.size
    alpha, beta = np.triu_indices(n, k=1)
    n_j = int(space.twoj.max()) + 1 if n else 1
    pair_twom = space.twom[alpha] + space.twom[beta]
    full = _couplings(space.twoj, space.twom, space.twoj, space.twom, n_j)
    cg = full[alpha, beta]                                        # (pair, J)
    glob = list(orbit_global)
    table = _tbme_table(inter, glob, glob, n_j)
    oa, ob = space.orbit[alpha], space.orbit[beta]
    tbme = table[oa[:, None], ob[:, None], oa[None, :], ob[None, :]]   # (pair, pair, J)
    total = _summed(cg[:, None, :], cg[None, :, :], pair_twom[:, None] == pair_twom[None, :], tbme)
    norm = np.where(oa == ob, sqrt(2.0), 1.0)
    return alpha, beta, (norm[:, None] * norm[None, :]) * (total * factor)


def pn_tensor(pspace, p_global, nspace, n_global, inter, factor):
    """V[α, γ, β, δ] = v̄(αβ, γδ) for α, γ proton and β, δ neutron m-states (explicit-pn, N = 1)."""
    n_j = (int(pspace.twoj.max(initial=0)) + int(nspace.twoj.max(initial=0))) // 2 + 1
    cg = _couplings(pspace.twoj, pspace.twom, nspace.twoj, nspace.twom, n_j)      # (α, β, J)
    twom = pspace.twom[:, None] + nspace.twom[None, :]                             # (α, β)
    table = _tbme_table(inter, list(p_global), list(n_global), n_j)
    po, no = pspace.orbit, nspace.orbit
    tbme = table[po[:, None, None, None], no[None, None, :, None], po[None, :, None, None], no[None, None, None, :]]
    cg_ab = cg[:, None, :, None, :]                               # [α, ·, β, ·, J]
    cg_cd = cg[None, :, None, :, :]                               # [·, γ, ·, δ, J]
    same_m = twom[:, None, :, None] == twom[None, :, None, :]
    return _summed(cg_ab, cg_cd, same_m, tbme) * factor
