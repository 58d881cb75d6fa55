"""Operators on M-scheme vectors, applied block by block through the proton x neutron factorisation, where the
vectors are: numpy arrays on the host, CuPy arrays on their GPU (the same code; cisolver.arrays.module_of).

A many-body vector restricted to a basis block (one proton 2M) is an n_p x n_n matrix X (proton determinant, neutron
determinant), so an operator A ⊗ B (A on the proton determinants, B on the neutron ones) maps it to A X Bᵀ in the
target block. A one-body operator O_p ⊗ 1 + 1 ⊗ O_n takes one sparse product per block and species: O_p on the rows
of X, O_n on the rows of Xᵀ, which ``BlockVectors`` holds beside X (transposed once per set of vectors, not once per
product). A matrix element <w| O |v> is summed block by block from those products, without the vector O v. The
species' sparse matrices (n_det x n_det of one species: small) are made on the host, cut into their pieces between
two 2M groups, and copied to the device once. A ladder product like T₋ = Σ_α c†_(p α) c_(n α) is a sum of terms
whose factors map determinants one to one: one sparse matrix, its elements listed block by block where the vectors
are.
Nothing of the size of H is built.
"""
import copy
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..arrays import module_of
from ..shellmodel import bits, species
from ..shellmodel.basis import MSchemeBasis


class Jumps(NamedTuple):
    """One-body jumps c†_α c_γ (α != γ) of one species: source and target determinants, α, γ and the sign (the
    arrays of ``species.JumpList``, in any order)."""
    source: np.ndarray
    target: np.ndarray
    alpha: np.ndarray
    gamma: np.ndarray
    sign: np.ndarray


def every_jump(problem):
    """The proton and neutron jumps from every 2M group of the species' determinants, each species' as a dict
    {change of 2m: Jumps}: the problem's own lists, which start only in the groups its basis uses, and those of
    the other groups (the operators here also act on bases of other M). Made once per problem."""
    lists = getattr(problem, "_every_jump", None)
    if lists is None:
        basis = problem.basis
        used_p = {b.twom_p for b in basis.blocks}
        used_n = {basis.twice_m - b.twom_p for b in basis.blocks}
        lists = problem._every_jump = (_by_shift(problem.pdets, problem.jumps_p, used_p),
                                       _by_shift(problem.ndets, problem.jumps_n, used_n))
    return lists


def _by_shift(dets, own, used):
    rest = set(dets.group_start) - used
    parts = [own] + ([species.JumpList(dets, rest)] if rest else [])
    every = Jumps(*(np.concatenate([getattr(p, f) for p in parts]) for f in Jumps._fields))
    shift = dets.space.twom[every.alpha] - dets.space.twom[every.gamma]
    order = np.argsort(shift, kind="stable")
    every, shift = Jumps(*(a[order] for a in every)), shift[order]
    values, starts = np.unique(shift, return_index=True)
    stops = np.r_[starts[1:], len(shift)]
    return {int(d): Jumps(*(a[s:e] for a in every)) for d, s, e in zip(values, starts, stops)}


def _no_jumps():
    return Jumps(*(np.zeros(0, np.int64) for _ in Jumps._fields))


def species_one_body(dets, jumps, matrix):
    """Σ_(αγ) o_αγ c†_α c_γ over the determinants of one species (sparse n_det x n_det), from the single-particle
    matrix ``o`` (nsp x nsp), the species' jumps (α != γ: a ``JumpList`` or ``Jumps``) and the occupations (α = γ)."""
    o = np.asarray(matrix, dtype=np.float64)
    coef = o[jumps.alpha, jumps.gamma] * jumps.sign
    keep = coef != 0
    diag = dets.occ @ np.diag(o)
    on = np.flatnonzero(diag)
    rows = np.concatenate([jumps.target[keep], on])
    cols = np.concatenate([jumps.source[keep], on])
    vals = np.concatenate([coef[keep], diag[on]])
    n = len(dets)
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def device_csr(data, indices, indptr, shape):
    """A cupyx.scipy.sparse CSR matrix of CuPy arrays whose rows hold sorted, distinct column indices, marked
    canonical: its product with a dense block goes straight to cuSPARSE, without cupyx's canonical-format test
    (a kernel and a reduction that NVRTC compiles on a machine whose kernel cache is empty, 3 s a size class)."""
    import cupyx.scipy.sparse
    m = cupyx.scipy.sparse.csr_matrix((data, indices, indptr), shape=shape)
    m.has_canonical_format = True
    return m


def _device(xp):
    """Where xp's arrays are made now: None for numpy, the current device's id for CuPy."""
    return None if xp is np else xp.cuda.Device().id


class SpeciesOperator:
    """Σ_(αγ) o_αγ c†_α c_γ on the determinants of one species (``species_one_body``), every element of ``o``
    raising 2m by ``dtwom``: it maps the 2M group g to g + dtwom alone, so its rows of that group, columns counted
    from the first determinant of g, are the piece that acts on a basis block. Pieces are cut on the host and copied
    to a device the first time they are used there."""

    def __init__(self, dets, jumps, matrix, dtwom):
        """``jumps``: the species' jumps (those changing 2m by ``dtwom`` suffice)."""
        o = np.asarray(matrix, dtype=np.float64)
        nsp = dets.space.size
        if o.shape != (nsp, nsp):
            raise ValueError(f"a single-particle matrix must be {nsp} x {nsp}, got shape {o.shape}")
        a, g = np.nonzero(o)
        off = dets.space.twom[a] - dets.space.twom[g] != dtwom
        if off.any():
            raise ValueError(f"a single-particle matrix with 2mu = {dtwom} must change 2m by {dtwom}, got element "
                             f"[{a[off][0]}, {g[off][0]}] = {o[a[off][0], g[off][0]]!r} between 2m = "
                             f"{dets.space.twom[a[off][0]]} and {dets.space.twom[g[off][0]]}")
        self.dets, self.dtwom = dets, int(dtwom)
        self.matrix = species_one_body(dets, jumps, o)
        self._pieces = {}

    def piece(self, twom, xp):
        """The part from the group 2M = ``twom`` to the group twom + dtwom (CSR, target x source determinants of
        the groups) as xp's sparse matrix on the current device; None when it has no elements."""
        key = (int(twom), _device(xp))
        if key not in self._pieces:
            self._pieces[key] = self._cut(int(twom), xp)
        return self._pieces[key]

    def _cut(self, twom, xp):
        s0, ns = self.dets.group(twom)
        t0, nt = self.dets.group(twom + self.dtwom)
        m = self.matrix
        lo, hi = m.indptr[t0], m.indptr[t0 + nt]
        if ns == 0 or nt == 0 or hi == lo:
            return None
        cols = m.indices[lo:hi] - s0
        if cols.min() < 0 or cols.max() >= ns:       # species_one_body keeps no element outside the groups
            raise RuntimeError(f"the species operator reaches 2M = {twom + self.dtwom} from outside 2M = {twom}")
        piece = sp.csr_matrix((m.data[lo:hi], cols, m.indptr[t0:t0 + nt + 1] - lo), shape=(nt, ns))
        piece.sum_duplicates()              # canonical (species_one_body's rows are: this only confirms it)
        if xp is np:
            return piece
        return device_csr(xp.asarray(piece.data), xp.asarray(piece.indices), xp.asarray(piece.indptr), piece.shape)


class BlockVectors:
    """k vectors of a basis (dim x k, float64, C order, numpy or CuPy) and, made on first use, the same numbers
    with each block transposed: rows by (neutron determinant, proton determinant) at the block's offset, the layout
    in which an operator on the neutrons is one sparse product per block."""

    def __init__(self, basis, vectors):
        self.basis, self.v = basis, vectors
        self.xp = module_of(vectors)
        self.k = vectors.shape[1]
        self._t = None

    @property
    def t(self):
        if self._t is None:
            self._t = self.xp.empty_like(self.v)
            for b in self.basis.blocks:
                rows = slice(b.offset, b.offset + b.size)
                self._t[rows].reshape(b.n_n, b.n_p, self.k)[...] = self.v[rows].reshape(b.n_p, b.n_n, self.k) \
                    .transpose(1, 0, 2)
        return self._t

    def proton_rows(self, b):
        """Block ``b`` as n_p x (n_n k)."""
        return self.v[b.offset:b.offset + b.size].reshape(b.n_p, b.n_n * self.k)

    def neutron_rows(self, b):
        """Block ``b`` transposed, as n_n x (n_p k)."""
        return self.t[b.offset:b.offset + b.size].reshape(b.n_n, b.n_p * self.k)


class OneBodyOperator:
    """O = O_p ⊗ 1 + 1 ⊗ O_n raising 2M by 2μ, from single-particle matrices (nsp x nsp, either may be None).
    Applied to vectors of ``problem.basis`` (or of ``source``, a basis of the same determinants)."""

    def __init__(self, problem, proton_matrix, neutron_matrix, mu, source=None):
        self.problem, self.mu = problem, int(mu)
        jumps_p, jumps_n = (lists.get(2 * self.mu) or _no_jumps() for lists in every_jump(problem))
        self.p = None if proton_matrix is None else SpeciesOperator(problem.pdets, jumps_p, proton_matrix, 2 * self.mu)
        self.n = None if neutron_matrix is None else SpeciesOperator(problem.ndets, jumps_n, neutron_matrix,
                                                                     2 * self.mu)
        self._act_on(source if source is not None else problem.basis)

    def acting_on(self, source):
        """The same operator (its species pieces shared) on vectors of ``source``."""
        other = copy.copy(self)
        other._act_on(source)
        return other

    def _act_on(self, source):
        self.source = source
        self.target = (source if self.mu == 0
                       else MSchemeBasis(self.problem.pdets, self.problem.ndets, source.twice_m + 2 * self.mu))
        tb = self.target.block_of_twom
        # O_p moves a block's protons to 2M_p + 2μ (its neutrons stay); O_n keeps 2M_p and moves the neutrons
        self._proton_pairs = [(b, self.target.blocks[tb[b.twom_p + 2 * self.mu]]) for b in source.blocks
                              if b.twom_p + 2 * self.mu in tb]
        self._neutron_pairs = [(b, self.target.blocks[tb[b.twom_p]]) for b in source.blocks if b.twom_p in tb]

    def _products(self, x):
        """(source block, target block, True for the protons, the product in the target block's proton rows or
        neutron rows) of every nonzero piece."""
        for species_op, pairs, protons in ((self.p, self._proton_pairs, True), (self.n, self._neutron_pairs, False)):
            if species_op is None:
                continue
            for b, tb in pairs:
                twom = b.twom_p if protons else self.source.twice_m - b.twom_p
                piece = species_op.piece(twom, x.xp)
                if piece is not None:
                    yield b, tb, protons, piece @ (x.proton_rows(b) if protons else x.neutron_rows(b))

    def _block_vectors(self, vectors, basis):
        if isinstance(vectors, BlockVectors):
            if vectors.basis.twice_m != basis.twice_m or vectors.basis.dim != basis.dim:
                raise ValueError(f"vectors must belong to the basis of 2M = {basis.twice_m} (dimension {basis.dim}),"
                                 f" got 2M = {vectors.basis.twice_m} (dimension {vectors.basis.dim})")
            return vectors
        xp = module_of(vectors)
        v = xp.asarray(vectors)
        if v.ndim != 2 or v.shape[0] != basis.dim:
            raise ValueError(f"vectors must have {basis.dim} rows (one column per state), got shape {v.shape}")
        return BlockVectors(basis, xp.ascontiguousarray(v, dtype=np.float64))

    def apply(self, vectors):
        """O vectors: an array (target.dim x k, float64) where the vectors are. ``vectors``: an array of
        ``source.dim`` rows or BlockVectors of ``source``."""
        x = self._block_vectors(vectors, self.source)
        k = x.k
        out = x.xp.zeros((self.target.dim, k))
        if self.target.dim == 0 or k == 0:
            return out
        for b, tb, protons, y in self._products(x):
            dst = out[tb.offset:tb.offset + tb.size].reshape(tb.n_p, tb.n_n, k)
            dst += y.reshape(tb.n_p, tb.n_n, k) if protons else y.reshape(tb.n_n, tb.n_p, k).transpose(1, 0, 2)
        return out

    def elements(self, right, left):
        """[i, f] = <left_f | O | right_i> (a k_right x k_left array where the vectors are): ``right`` vectors of
        ``source``, ``left`` of ``target`` (arrays or BlockVectors)."""
        r = self._block_vectors(right, self.source)
        w = self._block_vectors(left, self.target)
        out = r.xp.zeros((r.k, w.k))
        if r.k == 0 or w.k == 0:
            return out
        for b, tb, protons, y in self._products(r):
            rows = tb.offset, tb.offset + tb.size
            out += y.reshape(tb.size, r.k).T @ (w.v if protons else w.t)[rows[0]:rows[1]]
        return out


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


def _rectangles(source, target, proton_map, neutron_map, dtwom_p):
    """Per source block, what (A ⊗ B) maps of it: (first rows of its proton determinants, their neutron
    determinants' offsets, the same two in ``target``, the proton signs, the neutron signs); the rows taken are
    every sum of a first row and an offset. A, B: index maps of the proton and neutron determinants
    (``species_ladder``), A changing the proton 2M by ``dtwom_p``."""
    (p_src, p_dst, p_sign), (n_src, n_dst, n_sign) = proton_map, neutron_map
    for blk in source.blocks:
        ti = target.block_of_twom.get(blk.twom_p + dtwom_p)
        if ti is None:
            continue
        tb = target.blocks[ti]
        p0, p1 = np.searchsorted(p_src, [blk.p_start, blk.p_start + blk.n_p])
        n0, n1 = np.searchsorted(n_src, [blk.n_start, blk.n_start + blk.n_n])
        if p0 < p1 and n0 < n1:
            yield (blk.offset + (p_src[p0:p1] - blk.p_start) * blk.n_n, n_src[n0:n1] - blk.n_start,
                   tb.offset + (p_dst[p0:p1] - tb.p_start) * tb.n_n, n_dst[n0:n1] - tb.n_start,
                   p_sign[p0:p1], n_sign[n0:n1])


def ladder_operator(source, target, terms, xp=np):
    """Σ (A ⊗ B) from basis ``source`` to basis ``target`` over ``terms`` (proton map, neutron map, dtwom_p), each
    term mapping basis states one to one (index maps of ``species_ladder``, A changing the proton 2M by dtwom_p)
    and no two terms joining the same source and target states (T₋'s terms c†_(p α) c_(n α) don't: the target
    tells which α was added): a target.dim x source.dim CSR matrix of xp's (on the current device), its elements
    listed there; None when it has no elements. The elements are sorted by (row, column) (on a GPU by CuPy's
    Thrust sort) and the row starts found by a binary search."""
    rects = [r for a, b, dtwom_p in terms for r in _rectangles(source, target, a, b, dtwom_p)]
    count = sum(len(r[0]) * len(r[1]) for r in rects)
    if count == 0:
        return None
    index = np.int32 if max(source.dim, target.dim) < 2 ** 31 else np.int64
    # the rectangles' sides, concatenated on the host and moved once; their sums (products) filled in where xp is
    src_p, src_n, dst_p, dst_n = (xp.asarray(np.concatenate([r[i] for r in rects]).astype(index)) for i in range(4))
    sign_p, sign_n = (xp.asarray(np.concatenate([r[i] for r in rects]).astype(np.float64)) for i in (4, 5))
    src, dst, sign = xp.empty(count, index), xp.empty(count, index), xp.empty(count)
    at = ip = jn = 0
    for r in rects:
        lp, ln = len(r[0]), len(r[1])
        p, n, part = slice(ip, ip + lp), slice(jn, jn + ln), slice(at, at + lp * ln)
        xp.add(src_p[p, None], src_n[None, n], out=src[part].reshape(lp, ln))
        xp.add(dst_p[p, None], dst_n[None, n], out=dst[part].reshape(lp, ln))
        xp.multiply(sign_p[p, None], sign_n[None, n], out=sign[part].reshape(lp, ln))
        at, ip, jn = part.stop, p.stop, n.stop
    order = xp.lexsort(xp.stack([src, dst]))            # by row, then column
    indptr = xp.searchsorted(dst[order], xp.arange(target.dim + 1, dtype=index)).astype(index, copy=False)
    shape = (target.dim, source.dim)
    if xp is np:
        return sp.csr_matrix((sign[order], src[order], indptr), shape=shape)
    return device_csr(sign[order], src[order], indptr, shape)
