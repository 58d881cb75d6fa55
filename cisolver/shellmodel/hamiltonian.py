"""Assemble the M-scheme shell-model Hamiltonian as a sparse symmetric matrix (proton–neutron factorised).

H = H_p ⊗ 1 + 1 ⊗ H_n + Σ v̄_pn(αβ,γδ) (c†_α c_γ)_p (c†_β c_δ)_n.  For a pair of proton-2M blocks
(rows B, columns B') every nonzero is one of:
  * diagonal:                        H_p(p,p) + H_n(n,n) + occ_p · D · occ_n
  * proton moves, neutron spectator:  H_p(p',p) + s_p Σ_{β∈n} v̄(αβ,γβ)           (B = B' only)
  * neutron moves, proton spectator:  H_n(n',n) + s_n Σ_{α∈p} v̄(αβ,αδ)           (B = B' only)
  * both move (one jump each):        s_p s_n v̄(αβ,γδ)                              (outer product)
so no element is generated twice. ``build`` writes the rows straight into CSR arrays (shellmodel.rowblocks):
it counts every row's stored entries first (from the jump lists and v̄'s nonzero pattern, no values), lays
out indptr, allocates data and indices once, and fills groups of rows on a thread pool, each group into its
own slice; no COO, no per-block conversion, no stacking. ``plan_rows`` gives the counts and the row blocks'
pieces without filling, for GPUs to fill the rows there (cisolver.gpu_build).

Sizes before building, for memory checks:
  * ``m_scheme_dimension(interaction, n_protons, n_neutrons, twice_m=None)``: the exact M-scheme dimension,
    counted per 2M without listing a determinant (what ``ShellModelProblem(...).dimension`` will be);
  * ``ShellModelProblem.stored_nonzeros(storage, blocks=..., rows=...)``: the exact stored entries of each
    row block that ``build`` with the same arguments returns (a fraction of the build's time, no values);
  * ``ShellModelProblem.csr_nbytes(storage, dtype, blocks=..., rows=...)``: the bytes of that CSR matrix.
"""
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from hybridblas import workers

from . import basis as _basis
from . import elements, rowblocks, species

_GROUP_MIN, _GROUP_MAX = 1 << 16, 1 << 21     # stored entries of the groups of rows filled by one task


@dataclass
class BuildInfo:
    dimension: int
    nnz_stored: int
    storage: str
    seconds: dict = field(default_factory=dict)
    tbme_factor: float = 1.0
    mass: int = 0


def _checked_twice_m(inter, n_protons, n_neutrons, twice_m):
    """ValueError naming the argument for particle numbers outside 0..capacity or a 2M of the wrong parity;
    returns 2M (default: 0 for even A, 1 for odd A)."""
    for name, val, orbits in (("n_protons", n_protons, inter.proton_orbits),
                              ("n_neutrons", n_neutrons, inter.neutron_orbits)):
        cap = sum(o.twoj + 1 for o in orbits)
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or not 0 <= val <= cap:
            raise ValueError(f"{name} must be an integer in 0..{cap} for {inter.path}, got {val!r}")
    parity_m = (n_protons + n_neutrons) % 2   # odd A: 2M odd
    if twice_m is None:
        return parity_m
    if isinstance(twice_m, bool) or not isinstance(twice_m, (int, np.integer)) or twice_m % 2 != parity_m:
        mass = inter.core_z + inter.core_n + n_protons + n_neutrons
        raise ValueError(f"twice_m must be an integer with the parity of A = {mass} "
                         f"(2M {'odd' if parity_m else 'even'}), got {twice_m!r}")
    return int(twice_m)


def _determinants_by_twice_m(orbits, n_particles):
    """{2M: number of n_particles-determinants} of one species (exact integers, no determinant listed)."""
    ways = [{} for _ in range(n_particles + 1)]
    ways[0][0] = 1
    for twom in _basis.SingleParticleSpace(orbits).twom:
        for k in range(n_particles, 0, -1):          # each m-state taken at most once
            for m, c in ways[k - 1].items():
                ways[k][m + int(twom)] = ways[k].get(m + int(twom), 0) + c
    return ways[n_particles]


def m_scheme_dimension(interaction, n_protons, n_neutrons, twice_m=None):
    """Exact M-scheme dimension (0 where no state has this 2M), from the per-2M determinant counts of each
    species: cheap for any nucleus the bit strings can hold, and the same arguments and checks as
    ShellModelProblem."""
    twice_m = _checked_twice_m(interaction, n_protons, n_neutrons, twice_m)
    protons = _determinants_by_twice_m(interaction.proton_orbits, int(n_protons))
    neutrons = _determinants_by_twice_m(interaction.neutron_orbits, int(n_neutrons))
    return sum(c * neutrons.get(twice_m - m, 0) for m, c in protons.items())


class ShellModelProblem:
    """Interaction + valence particles + 2M: basis, species matrices, pn tensor; builds H."""

    def __init__(self, interaction, n_protons, n_neutrons, twice_m=None):
        inter = interaction
        twice_m = _checked_twice_m(inter, n_protons, n_neutrons, twice_m)
        self.interaction = inter
        self.n_protons, self.n_neutrons = int(n_protons), int(n_neutrons)
        self.mass = inter.core_z + inter.core_n + self.n_protons + self.n_neutrons
        self.factor = inter.tbme_factor(self.mass)
        t0 = time.perf_counter()
        pg = [o.index for o in inter.proton_orbits]
        ng = [o.index for o in inter.neutron_orbits]
        self.pspace = _basis.SingleParticleSpace(inter.proton_orbits)
        self.nspace = _basis.SingleParticleSpace(inter.neutron_orbits)
        self.pdets = _basis.SpeciesDeterminants(self.pspace, self.n_protons)
        self.ndets = _basis.SpeciesDeterminants(self.nspace, self.n_neutrons)
        self.basis = _basis.MSchemeBasis(self.pdets, self.ndets, twice_m)
        if self.basis.dim == 0:
            raise ValueError(f"no M-scheme states with 2M = {twice_m} for Z={n_protons}, N={n_neutrons}")
        t1 = time.perf_counter()
        spe_p = np.array([inter.spe.get(pg[o], 0.0) for o in self.pspace.orbit])
        spe_n = np.array([inter.spe.get(ng[o], 0.0) for o in self.nspace.orbit])
        pa, pb, pmat = elements.like_pair_matrix(self.pspace, pg, inter, self.factor)
        na, nb, nmat = elements.like_pair_matrix(self.nspace, ng, inter, self.factor)
        self.v_pn = elements.pn_tensor(self.pspace, pg, self.nspace, ng, inter, self.factor)
        nsp_p, nsp_n = self.pspace.size, self.nspace.size
        v4 = self.v_pn
        self.v2 = v4.reshape(nsp_p * nsp_p, nsp_n * nsp_n)                       # [αγ, βδ]
        self.w_p = np.einsum("agbb->bag", v4).reshape(nsp_n, nsp_p * nsp_p)      # proton jump, neutron spectator
        self.w_n = np.einsum("aabd->abd", v4).reshape(nsp_p, nsp_n * nsp_n)      # neutron jump, proton spectator
        self.d_pn = np.einsum("aabb->ab", v4)                                    # both spectators
        t2 = time.perf_counter()
        # each species' 2M groups that the basis uses: their rows only (one 2M of 184756 for 50Ca's neutrons)
        groups_p = {b.twom_p for b in self.basis.blocks}
        groups_n = {self.basis.twice_m - b.twom_p for b in self.basis.blocks}
        self.h_p = species.like_particle_matrix(self.pdets, spe_p, pa, pb, pmat, groups=groups_p)
        self.jumps_p = species.JumpList(self.pdets, groups_p)
        if (groups_p == groups_n and species.same_determinants(self.pdets, self.ndets)
                and all(np.array_equal(x, y) for x, y in ((spe_p, spe_n), (pa, na), (pb, nb), (pmat, nmat)))):
            # N = Z in one space for both (48Cr, 24Mg): the neutrons' inputs equal the protons', so do their
            # matrix and jump list; both read-only from here, so one object serves both species
            self.h_n, self.jumps_n = self.h_p, self.jumps_p
        else:
            self.h_n = species.like_particle_matrix(self.ndets, spe_n, na, nb, nmat, groups=groups_n)
            self.jumps_n = species.JumpList(self.ndets, groups_n)
        self.h_p_diagonal, self.h_n_diagonal = self.h_p.diagonal(), self.h_n.diagonal()
        self.pair_p = self.jumps_p.alpha * nsp_p + self.jumps_p.gamma
        self.pair_n = self.jumps_n.alpha * nsp_n + self.jumps_n.gamma
        t3 = time.perf_counter()
        self.setup_seconds = {"basis": t1 - t0, "m_scheme_elements": t2 - t1, "species_matrices": t3 - t2}

    @property
    def dimension(self):
        return self.basis.dim

    @property
    def _column_dtype(self):
        """Column indices are computed in int32 where the dimension allows (the CSR's indices dtype then)."""
        return np.int32 if self.dimension <= np.iinfo(np.int32).max else np.int64

    def row_block_weights(self):
        """About how many nonzeros each row block of the full H has (an upper bound: the element pairs the
        build visits, before exact zeros are dropped), from the jump lists alone, without building: a
        distributed build gives ranks equal sparse work with it."""
        bas = self.basis
        weights = np.zeros(len(bas.blocks))
        for bi, B in enumerate(bas.blocks):
            w = B.size
            for h_s, jumps, twom, start, n_mov, n_spec in (
                    (self.h_p, self.jumps_p, B.twom_p, B.p_start, B.n_p, B.n_n),
                    (self.h_n, self.jumps_n, bas.twice_m - B.twom_p, B.n_start, B.n_n, B.n_p)):
                js = jumps.between(twom, twom)
                w += (h_s[start:start + n_mov].nnz + js.stop - js.start) * n_spec
            for C in bas.blocks:
                jp = self.jumps_p.between(C.twom_p, B.twom_p)
                jn = self.jumps_n.between(bas.twice_m - C.twom_p, bas.twice_m - B.twom_p)
                w += (jp.stop - jp.start) * (jn.stop - jn.start)
            weights[bi] = w
        return weights

    def _proton_ranges(self, lo, hi):
        """{block: (p0, p1)} of the proton determinants whose rows make up [lo, hi)."""
        if not 0 <= lo <= hi <= self.dimension:
            raise ValueError(f"rows must be a range inside 0..{self.dimension}, got ({lo}, {hi})")
        out = {}
        for i, B in enumerate(self.basis.blocks):
            a, b = max(lo, B.offset) - B.offset, min(hi, B.offset + B.size) - B.offset
            if a >= b:
                continue
            if a % B.n_n or b % B.n_n:
                raise ValueError(f"rows ({lo}, {hi}) cut block {i} between proton determinants "
                                 f"(its rows come in groups of {B.n_n} from {B.offset})")
            out[i] = (a // B.n_n, b // B.n_n)
        return out

    def _parts(self, blocks, rows):
        """(block, p0, p1) of the rows asked for, in output order."""
        chosen = list(range(len(self.basis.blocks))) if blocks is None else [int(b) for b in blocks]
        if any(not 0 <= b < len(self.basis.blocks) for b in chosen):
            raise ValueError(f"blocks must name row blocks in 0..{len(self.basis.blocks) - 1}, got {blocks!r}")
        protons = None if rows is None else self._proton_ranges(*rows)
        if protons is not None:
            return [(b, *protons[b]) for b in chosen if b in protons]
        return [(b, 0, self.basis.blocks[b].n_p) for b in chosen]

    def _products(self, bi):
        """The BLAS products of row block ``bi``, over the whole block: the spectator sums y_p = occ_n · w_p
        (neutron row, pair index of a proton jump inside the block, the sorted pair indices used_p) and
        y_n = occ_p · w_n (proton row, neutron jump pair in used_n), and the diagonal (proton row, neutron row).
        BLAS may round a product differently for another thread count or shape, so they are taken with the
        caller's BLAS threads, and for the whole block even where only some of its rows are built."""
        B = self.basis.blocks[bi]
        gp = slice(B.p_start, B.p_start + B.n_p)
        gn = slice(B.n_start, B.n_start + B.n_n)
        occ_p, occ_n = self.pdets.occ[gp], self.ndets.occ[gn]
        used_p = np.unique(self.pair_p[self.jumps_p.between(B.twom_p, B.twom_p)])
        tn = self.basis.twice_m - B.twom_p
        used_n = np.unique(self.pair_n[self.jumps_n.between(tn, tn)])
        y_p = occ_n @ self.w_p[:, used_p] if len(used_p) else np.zeros((B.n_n, 1))
        y_n = occ_p @ self.w_n[:, used_n] if len(used_n) else np.zeros((B.n_p, 1))
        diag = (self.h_p_diagonal[gp][:, None] + self.h_n_diagonal[gn][None, :] + (occ_p @ self.d_pn) @ occ_n.T)
        return y_p, used_p, y_n, used_n, diag

    def _row_block(self, bi, p0, p1, upper, products):
        """The pieces of row block ``bi``'s rows of proton determinants p0..p1-1, in column order."""
        bas = self.basis
        B = bas.blocks[bi]
        tn = bas.twice_m - B.twom_p
        cols = self._column_dtype
        pieces = []
        for cj, C in enumerate(bas.blocks):
            if cj == bi:
                lo, own, hi = self._inside(B, p0, p1, upper, *products)
                pieces += [own, hi] if upper else [lo, own, hi]
                continue
            if upper and cj < bi:
                continue
            jp = self.jumps_p.between(C.twom_p, B.twom_p)
            jn = self.jumps_n.between(bas.twice_m - C.twom_p, tn)
            target = self.jumps_p.target[jp] - B.p_start
            sel = slice(jp.start + int(np.searchsorted(target, p0)), jp.start + int(np.searchsorted(target, p1)))
            if sel.start == sel.stop or jn.start == jn.stop:
                continue
            pieces.append(rowblocks.JumpGrid(
                self.v2, self.jumps_p.target[sel] - B.p_start - p0,
                (C.offset + (self.jumps_p.source[sel] - C.p_start) * C.n_n).astype(cols), self.pair_p[sel],
                self.jumps_p.sign[sel].astype(np.float64), p1 - p0, self.jumps_n.target[jn] - B.n_start,
                (self.jumps_n.source[jn] - C.n_start).astype(cols), self.pair_n[jn], self.jumps_n.sign[jn], B.n_n))
        return rowblocks.RowBlock(pieces, p1 - p0, B.n_n)

    def _moves(self, h_s, jumps, pair, start, n, twom, diagonal=False):
        """One species' moves inside a 2M group: the union of H_s's off-diagonal pattern and the jumps (and
        the diagonal), as sorted keys row * n + col with H_s's value (0 where absent), the jump's pair index
        (-1: none) and sign (0: none)."""
        blk = h_s[start:start + n, start:start + n].tocoo()
        off = blk.row != blk.col
        js = jumps.between(twom, twom)
        key_h = blk.row[off].astype(np.int64) * n + blk.col[off]
        key_j = (jumps.target[js] - start) * n + (jumps.source[js] - start)
        key_d = np.arange(n, dtype=np.int64) * (n + 1) if diagonal else np.zeros(0, dtype=np.int64)
        keys, inv = np.unique(np.concatenate([key_h, key_j, key_d]), return_inverse=True)
        base = np.zeros(len(keys))
        base[inv[:len(key_h)]] += blk.data[off]
        pair_of = np.full(len(keys), -1, dtype=np.int64)
        sign = np.zeros(len(keys))
        pair_of[inv[len(key_h):len(key_h) + len(key_j)]] = pair[js]
        sign[inv[len(key_h):len(key_h) + len(key_j)]] = jumps.sign[js]
        return keys, base, pair_of, sign

    def _inside(self, B, p0, p1, upper, y_p, used_p, y_n, used_n, diag):
        """The pieces lo (None for upper storage), own, hi of block B (proton sources below, at, above p')."""
        n_p, n_n = B.n_p, B.n_n
        tn = self.basis.twice_m - B.twom_p
        # proton moves (neutrons spectators) and the neutron jumps of the both-move elements inside B
        keys, base, pair_of, sign = self._moves(self.h_p, self.jumps_p, self.pair_p, B.p_start, n_p, B.twom_p)
        column = np.where(pair_of >= 0, np.searchsorted(used_p, pair_of), 0)
        r_u, c_u = keys // n_p, keys % n_p
        jn = self.jumps_n.between(tn, tn)
        cols = self._column_dtype
        nr, nc = self.jumps_n.target[jn] - B.n_start, (self.jumps_n.source[jn] - B.n_start).astype(cols)

        def side(sel):
            sel &= (r_u >= p0) & (r_u < p1)
            own = rowblocks.OwnColumn(r_u[sel] - p0, (B.offset + c_u[sel] * n_n).astype(cols), base[sel], sign[sel],
                                      column[sel], pair_of[sel] >= 0, y_p, p1 - p0)
            jump = sel & (pair_of >= 0)
            return rowblocks.JumpGrid(self.v2, r_u[jump] - p0, (B.offset + c_u[jump] * n_n).astype(cols),
                                      pair_of[jump], sign[jump], p1 - p0, nr, nc, self.pair_n[jn],
                                      self.jumps_n.sign[jn], n_n, own=own)

        lo, hi = None if upper else side(c_u < r_u), side(c_u > r_u)
        # neutron moves (protons spectators) and the diagonal
        keys, base, pair_of, sign = self._moves(self.h_n, self.jumps_n, self.pair_n, B.n_start, n_n, tn,
                                                diagonal=True)
        r_u, c_u = keys // n_n, keys % n_n
        if upper:
            sel = c_u >= r_u
            keys, base, pair_of, sign, r_u, c_u = keys[sel], base[sel], pair_of[sel], sign[sel], r_u[sel], c_u[sel]
        column = np.where(pair_of >= 0, np.searchsorted(used_n, pair_of), 0)
        own = rowblocks.OwnPiece(r_u, c_u.astype(cols), base, sign, column, r_u == c_u, diag[p0:p1].T.copy(),
                                 y_n[p0:p1].T.copy(),
                                 (B.offset + np.arange(p0, p1, dtype=np.int64) * n_n).astype(cols), n_n)
        return lo, own, hi

    def _plans(self, upper, blocks, rows, threads):
        """The RowBlock of every part of the rows asked for: the BLAS products first (see _products), then
        the rest on ``threads`` threads with BLAS on one."""
        parts = self._parts(blocks, rows)
        products = {bi: self._products(bi) for bi in dict.fromkeys(bi for bi, _, _ in parts)}
        with _one_blas_thread():
            return workers.map(lambda part: self._row_block(*part, upper, products[part[0]]), parts, threads)

    def _planned(self, upper, blocks, rows, threads):
        """The RowBlocks of the rows asked for and the starts of every row's stored entries (int64, from 0)."""
        plans = self._plans(upper, blocks, rows, threads)
        counts = np.concatenate([pl.counts for pl in plans]) if plans else np.zeros(0, dtype=np.int64)
        indptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return plans, indptr

    def plan_rows(self, storage="full", n_threads=None, blocks=None, rows=None):
        """What ``build`` with these arguments works from, without filling: (the RowBlock of every part of the
        rows, on the host, in row order; the int64 starts of every row's stored entries, from 0). A GPU fills
        the same rows from them (cisolver.gpu_build)."""
        upper = _check_storage(storage)
        return self._planned(upper, blocks, rows, _threads(n_threads))

    def stored_nonzeros(self, storage="upper", n_threads=None, blocks=None, rows=None):
        """Exact stored nonzeros of every row block (int64, one per row block built, in build order) that
        ``build`` with the same arguments stores, counted from the jump lists and v̄'s nonzero pattern
        without computing H; ``.sum()`` sizes H before it is built."""
        upper = _check_storage(storage)
        plans = self._plans(upper, blocks, rows, _threads(n_threads))
        return np.array([int(pl.counts.sum()) for pl in plans], dtype=np.int64)

    def csr_nbytes(self, storage="upper", dtype=np.float64, n_threads=None, blocks=None, rows=None):
        """Bytes of the CSR matrix ``build`` returns for these arguments (data, indices and indptr), exact."""
        nnz = int(self.stored_nonzeros(storage, n_threads, blocks, rows).sum())
        n_rows = sum((p1 - p0) * self.basis.blocks[b].n_n for b, p0, p1 in self._parts(blocks, rows))
        index = 4 if max(nnz, self.dimension) <= np.iinfo(np.int32).max else 8
        return nnz * (np.dtype(dtype).itemsize + index) + (n_rows + 1) * index

    def build(self, storage="full", dtype=np.float64, n_threads=None, progress=None, blocks=None, rows=None):
        """Sparse H in CSR. storage='full' (both triangles) or 'upper' (upper triangle incl. diagonal).

        blocks: row blocks (e.g. a contiguous range, for distributed builds): only their rows are built, in
        the order given, as a (rows x dimension) CSR matrix.
        rows: (lo, hi), a row range whose ends lie between proton determinants of their blocks (multiples of
        the block's n_n from its start): only those rows are built, also inside a block.
        n_threads: threads of the build (default: the cores this process may run on). progress(done, total)
        is called as groups of rows are finished.
        The CSR has sorted, unique column indices per row, int32 indices and indptr unless the stored entries
        or the dimension need int64, and the same arrays for any n_threads.
        """
        upper = _check_storage(storage)
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        n_threads = _threads(n_threads)
        t0 = time.perf_counter()
        plans, indptr = self._planned(upper, blocks, rows, n_threads)
        nnz = int(indptr[-1])
        index_dtype = np.int32 if max(nnz, self.dimension) <= np.iinfo(np.int32).max else np.int64
        data = np.empty(nnz, dtype=dtype)
        indices = np.empty(nnz, dtype=index_dtype)
        t1 = time.perf_counter()
        scratch = threading.local()

        def fill(group):
            i, g0, g1, q0, q1, s0, s1 = group
            plans[i].fill(g0, g1, q0, q1, data[s0:s1], indices[s0:s1], scratch)
        workers.map(fill, row_groups(plans, indptr), n_threads, progress=progress)
        h = sp.csr_matrix((data, indices, indptr.astype(index_dtype, copy=False)),
                          shape=(len(indptr) - 1, self.dimension), copy=False)
        h.has_canonical_format = True          # sorted, each (row, column) once: by construction
        t2 = time.perf_counter()
        info = BuildInfo(self.dimension, nnz, storage, dict(self.setup_seconds, count=t1 - t0, fill=t2 - t1),
                         self.factor, self.mass)
        return h, info


_blas = None


def _one_blas_thread():
    """BLAS on one thread while the build's threads count rows: those products are small integer ones, exact
    in any order, and OpenBLAS's threads would spin on the cores the build uses."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController
        _blas = ThreadpoolController().select(user_api="blas")
    return _blas.limit(limits=1)


def _check_storage(storage):
    if storage not in ("full", "upper"):
        raise ValueError(f"storage must be 'full' or 'upper', got {storage!r}")
    return storage == "upper"


def _threads(n_threads):
    if n_threads is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive integer, got {n_threads!r}")
    return int(n_threads)


def row_groups(plans, indptr, group_entries=None):
    """Cut every row block into groups of contiguous rows filled by one task: one proton determinant's
    rows (its pieces then write each row's entries close together), runs of determinants while they hold
    at most _GROUP_MIN entries, and a determinant's neutron rows cut into parts of at most _GROUP_MAX (both
    ``group_entries`` where given: a GPU fills far larger groups). A list of (plan, g0, g1, q0, q1, s0, s1),
    in row order, with s0:s1 the group's entries in the CSR arrays."""
    group_min, group_max = (_GROUP_MIN, _GROUP_MAX) if group_entries is None else (group_entries, group_entries)
    groups = []
    row0 = 0
    for i, pl in enumerate(plans):
        n_t, n_n = pl.shape
        per_proton = pl.counts.reshape(n_t, n_n).sum(axis=1)
        g0 = 0
        while g0 < n_t:
            first = row0 + g0 * n_n
            if per_proton[g0] > group_max:
                edges = indptr[first:first + n_n + 1]
                cuts = np.searchsorted(edges, edges[0] + group_max * np.arange(1, per_proton[g0] // group_max + 1))
                bounds = np.unique(np.concatenate([[0], np.minimum(cuts, n_n), [n_n]]))
                groups += [(i, g0, g0 + 1, int(q0), int(q1), int(edges[q0]), int(edges[q1]))
                           for q0, q1 in zip(bounds[:-1], bounds[1:])]
                g0 += 1
                continue
            g1, total = g0 + 1, per_proton[g0]
            while g1 < n_t and total + per_proton[g1] <= group_min:
                total += per_proton[g1]
                g1 += 1
            groups.append((i, g0, g1, 0, n_n, int(indptr[first]), int(indptr[row0 + g1 * n_n])))
            g0 = g1
        row0 += n_t * n_n
    return groups
