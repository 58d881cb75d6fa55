"""J-coupled TBMEs expanded to antisymmetrised m-scheme elements v̄ (README, 'Building the M-scheme Hamiltonian')."""
from math import sqrt

import numpy as np

from .clebsch import clebsch_gordan


def _coupled(inter, factor, a, b, c, d, twoj_a, twoj_b, twoj_c, twoj_d, tma, tmb, tmc, tmd):
    """Σ_J CG CG V_J(ab, cd) · factor for global orbits a, b, c, d (a <= b, c <= d as in the file)."""
    total = 0.0
    tm = tma + tmb
    for jj in range(max(abs(twoj_a - twoj_b), abs(twoj_c - twoj_d)) // 2,
                    min(twoj_a + twoj_b, twoj_c + twoj_d) // 2 + 1):
        v = inter.tbme.get((a, b, c, d, jj))
        if v is None or abs(tm) > 2 * jj:
            continue
        total += (clebsch_gordan(twoj_a, tma, twoj_b, tmb, 2 * jj, tm)
                  * clebsch_gordan(twoj_c, tmc, twoj_d, tmd, 2 * jj, tm) * v)
    return total * factor


def like_pair_matrix(space, orbit_global, inter, factor):
    """Pairs (α<β) of one species and the dense matrix v̄(αβ, γδ) over them (0 unless M is conserved)."""
    n = space.size
    alpha, beta = np.triu_indices(n, k=1)
    npair = len(alpha)
    pair_twom = space.twom[alpha] + space.twom[beta]
    mat = np.zeros((npair, npair))
    for i in range(npair):
        a_l, b_l = space.orbit[alpha[i]], space.orbit[beta[i]]
        a, b = orbit_global[a_l], orbit_global[b_l]
        n_ab = sqrt(2.0) if a == b else 1.0
        for j in np.nonzero(pair_twom == pair_twom[i])[0]:
            c_l, d_l = space.orbit[alpha[j]], space.orbit[beta[j]]
            c, d = orbit_global[c_l], orbit_global[d_l]
            n_cd = sqrt(2.0) if c == d else 1.0
            mat[i, j] = n_ab * n_cd * _coupled(
                inter, factor, a, b, c, d, space.twoj[alpha[i]], space.twoj[beta[i]],
                space.twoj[alpha[j]], space.twoj[beta[j]],
                space.twom[alpha[i]], space.twom[beta[i]], space.twom[alpha[j]], space.twom[beta[j]])
    return alpha, beta, mat


def pn_tensor(pspace, p_global, nspace, n_global, inter, factor):
    """V[α, γ, β, δ] = v̄(αβ, γδ) for α, γ proton and β, δ neutron m-states (explicit-pn, N = 1)."""
    npp, nnn = pspace.size, nspace.size
    v = np.zeros((npp, npp, nnn, nnn))
    for al in range(npp):
        for ga in range(npp):
            dm = pspace.twom[al] - pspace.twom[ga]
            a, c = p_global[pspace.orbit[al]], p_global[pspace.orbit[ga]]
            for be in range(nnn):
                de = nspace.twom[be] + dm          # m_α + m_β = m_γ + m_δ
                matches = np.nonzero(nspace.twom == de)[0]
                b = n_global[nspace.orbit[be]]
                for dl in matches:
                    d = n_global[nspace.orbit[dl]]
                    v[al, ga, be, dl] = _coupled(
                        inter, factor, a, b, c, d, pspace.twoj[al], nspace.twoj[be], pspace.twoj[ga],
                        nspace.twoj[dl], pspace.twom[al], nspace.twom[be], pspace.twom[ga], nspace.twom[dl])
    return v
