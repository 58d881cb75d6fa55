"""Operators on M-scheme vectors, applied block by block through the proton x neutron factorisation.

A many-body vector restricted to a basis block (one proton 2M) is an n_p x n_n matrix X (proton determinant, neutron
determinant), so an operator A ⊗ B (A on the proton determinants, B on the neutron ones) maps it to A X Bᵀ in the
target block. A one-body operator is O_p ⊗ 1 + 1 ⊗ O_n (sparse products per block); a ladder product like
T₋ = Σ_α c†_(p α) c_(n α) is a sum of such terms whose factors map determinants one to one, applied by a gather and a
scatter per block. Nothing of the size of H is built.
"""
import numpy as np
import scipy.sparse as sp

from ..shellmodel import bits, species
from ..shellmodel.basis import MSchemeBasis


def every_jump(problem):
    """The proton and neutron JumpLists from every 2M group of the species' determinants (the problem's own
    lists start only in the groups its basis uses; the operators here also act on bases of other M). Made
    once per problem."""
    lists = getattr(problem, "_every_jump", None)
    if lists is None:
        lists = problem._every_jump = (species.JumpList(problem.pdets), species.JumpList(problem.ndets))
    return lists


def species_one_body(dets, jumps, matrix):
    """Σ_(αγ) o_αγ c†_α c_γ over the determinants of one species (sparse n_det x n_det), from the single-particle
    matrix ``o`` (nsp x nsp), the species' ``JumpList`` (α != γ) and the occupations (α = γ)."""
    o = np.asarray(matrix, dtype=np.float64)
    coef = o[jumps.alpha, jumps.gamma] * jumps.sign
    keep = coef != 0
    diag = dets.occ @ np.diag(o)
    n = len(dets)
    rows = np.concatenate([jumps.target[keep], np.arange(n)])
    cols = np.concatenate([jumps.source[keep], np.arange(n)])
    vals = np.concatenate([coef[keep], diag])
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def species_ladder(source, target, state, create):
    """c†_state (create) or c_state from the determinants ``source`` to ``target`` of one species, as index maps
    (source positions ascending, target positions, signs (-1)^(occupied states below ``state``)): each source
    determinant goes to at most one target determinant."""
    b = bits.bit(np.array([state]))[0]
    has = (source.states & b) != 0
    pick = np.nonzero(~has if create else has)[0]
    states = source.states[pick]
    sign = bits.parity_below(states, np.full(len(pick), state)).astype(np.float64)
    new = states | b if create else states & ~b
    twom = source.twom[pick] + (1 if create else -1) * int(source.space.twom[state])
    return pick, target.lookup(new, twom), sign


def apply_ladders(source, target, proton_map, neutron_map, dtwom_p, vectors, out):
    """out += (A ⊗ B) vectors for one-to-one maps A, B of proton and neutron determinants (``species_ladder``),
    A changing the proton 2M by ``dtwom_p``: a gather and a scatter per basis block, no sparse products."""
    v = np.asarray(vectors)
    k = v.shape[1]
    (p_src, p_dst, p_sign), (n_src, n_dst, n_sign) = proton_map, neutron_map
    for blk in source.blocks:
        ti = target.block_of_twom.get(blk.twom_p + dtwom_p)
        if ti is None:
            continue
        tb = target.blocks[ti]
        p0, p1 = np.searchsorted(p_src, [blk.p_start, blk.p_start + blk.n_p])
        n0, n1 = np.searchsorted(n_src, [blk.n_start, blk.n_start + blk.n_n])
        if p0 == p1 or n0 == n1:
            continue
        x = v[blk.offset:blk.offset + blk.size].reshape(blk.n_p, blk.n_n, k)
        gathered = x[np.ix_(p_src[p0:p1] - blk.p_start, n_src[n0:n1] - blk.n_start)]
        signs = p_sign[p0:p1, None] * n_sign[None, n0:n1]
        y = out[tb.offset:tb.offset + tb.size].reshape(tb.n_p, tb.n_n, k)
        y[np.ix_(p_dst[p0:p1] - tb.p_start, n_dst[n0:n1] - tb.n_start)] += signs[:, :, None] * gathered
    return out


def apply_product(source, target, a, b, dtwom_p, vectors, out=None):
    """out += (A ⊗ B) vectors from basis ``source`` to basis ``target``. ``a`` acts on the proton determinants
    (sparse len(target.protons) x len(source.protons), None for the identity), ``b`` likewise on the neutrons; A
    changes the proton 2M by ``dtwom_p`` (B the neutron 2M by the rest of target.twice_m - source.twice_m)."""
    v = np.asarray(vectors)
    k = v.shape[1]
    if out is None:
        out = np.zeros((target.dim, k), dtype=np.result_type(v.dtype, np.float64))
    for blk in source.blocks:
        ti = target.block_of_twom.get(blk.twom_p + dtwom_p)
        if ti is None:
            continue
        tb = target.blocks[ti]
        x = v[blk.offset:blk.offset + blk.size].reshape(blk.n_p, blk.n_n * k)
        if a is not None:
            sub = a[tb.p_start:tb.p_start + tb.n_p, blk.p_start:blk.p_start + blk.n_p]
            if sub.nnz == 0:
                continue
            x = sub @ x
        x = x.reshape(tb.n_p, blk.n_n, k)
        if b is not None:
            sub = b[tb.n_start:tb.n_start + tb.n_n, blk.n_start:blk.n_start + blk.n_n]
            if sub.nnz == 0:
                continue
            x = (sub @ x.transpose(1, 0, 2).reshape(blk.n_n, tb.n_p * k)).reshape(tb.n_n, tb.n_p, k).transpose(1, 0, 2)
        out[tb.offset:tb.offset + tb.size] += x.reshape(tb.size, k)
    return out


class OneBodyOperator:
    """O = O_p ⊗ 1 + 1 ⊗ O_n raising 2M by 2μ, from single-particle matrices (nsp x nsp, either may be None).
    Applied to vectors of ``problem.basis`` (or of ``source``, a basis of the same determinants)."""

    def __init__(self, problem, proton_matrix, neutron_matrix, mu, source=None):
        self.source = source if source is not None else problem.basis
        self.mu = int(mu)
        self.target = (self.source if self.mu == 0
                       else MSchemeBasis(problem.pdets, problem.ndets, self.source.twice_m + 2 * self.mu))
        jumps_p, jumps_n = every_jump(problem)
        self.p = None if proton_matrix is None else species_one_body(problem.pdets, jumps_p, proton_matrix)
        self.n = None if neutron_matrix is None else species_one_body(problem.ndets, jumps_n, neutron_matrix)

    def apply(self, vectors):
        v = np.asarray(vectors)
        if v.ndim != 2 or v.shape[0] != self.source.dim:
            raise ValueError(f"vectors must have {self.source.dim} rows (one column per state), got shape {v.shape}")
        out = np.zeros((self.target.dim, v.shape[1]), dtype=np.result_type(v.dtype, np.float64))
        if self.target.dim == 0:
            return out
        if self.p is not None:
            apply_product(self.source, self.target, self.p, None, 2 * self.mu, v, out)
        if self.n is not None:
            apply_product(self.source, self.target, None, self.n, 0, v, out)
        return out
