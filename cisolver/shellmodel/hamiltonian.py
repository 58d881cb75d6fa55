"""Assemble the M-scheme shell-model Hamiltonian as a sparse symmetric matrix (proton–neutron factorised).

H = H_p ⊗ 1 + 1 ⊗ H_n + Σ v̄_pn(αβ,γδ) (c†_α c_γ)_p (c†_β c_δ)_n.  For a pair of proton-2M blocks
(rows B, columns B') every nonzero is one of:
  * diagonal:                        H_p(p,p) + H_n(n,n) + occ_p · D · occ_n
  * proton moves, neutron spectator:  H_p(p',p) + s_p Σ_{β∈n} v̄(αβ,γβ)           (B = B' only)
  * neutron moves, proton spectator:  H_n(n',n) + s_n Σ_{α∈p} v̄(αβ,αδ)           (B = B' only)
  * both move (one jump each):        s_p s_n v̄(αβ,γδ)                              (outer product)
so no element is generated twice and each row block is produced by a few broadcasts.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import basis as _basis
from . import elements, species

_OUTER_CHUNK = 1 << 23      # bound the temporaries of one outer product (entries)


@dataclass
class BuildInfo:
    dimension: int
    nnz_stored: int
    storage: str
    seconds: dict = field(default_factory=dict)
    tbme_factor: float = 1.0
    mass: int = 0


class ShellModelProblem:
    """Interaction + valence particles + 2M: basis, species matrices, pn tensor; builds H."""

    def __init__(self, interaction, n_protons, n_neutrons, twice_m=None):
        inter = interaction
        for name, val, limit in (("n_protons", n_protons, inter.proton_orbits),
                                 ("n_neutrons", n_neutrons, inter.neutron_orbits)):
            cap = sum(o.twoj + 1 for o in limit)
            if not isinstance(val, (int, np.integer)) or not 0 <= val <= cap:
                raise ValueError(f"{name} must be an integer in 0..{cap} for {inter.path}, got {val!r}")
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
        parity_m = (self.n_protons + self.n_neutrons) % 2   # odd A: 2M odd
        if twice_m is None:
            twice_m = parity_m
        if not isinstance(twice_m, (int, np.integer)) or twice_m % 2 != parity_m:
            raise ValueError(f"twice_m must be an integer with the parity of A = {self.mass} "
                             f"(2M {'odd' if parity_m else 'even'}), got {twice_m!r}")
        self.basis = _basis.MSchemeBasis(self.pdets, self.ndets, int(twice_m))
        if self.basis.dim == 0:
            raise ValueError(f"no M-scheme states with 2M = {twice_m} for Z={n_protons}, N={n_neutrons}")
        t1 = time.perf_counter()
        spe_p = np.array([inter.spe.get(pg[o], 0.0) for o in self.pspace.orbit])
        spe_n = np.array([inter.spe.get(ng[o], 0.0) for o in self.nspace.orbit])
        pa, pb, pmat = elements.like_pair_matrix(self.pspace, pg, inter, self.factor)
        na, nb, nmat = elements.like_pair_matrix(self.nspace, ng, inter, self.factor)
        self.v_pn = elements.pn_tensor(self.pspace, pg, self.nspace, ng, inter, self.factor)
        t2 = time.perf_counter()
        self.h_p = species.like_particle_matrix(self.pdets, spe_p, pa, pb, pmat)
        self.h_n = species.like_particle_matrix(self.ndets, spe_n, na, nb, nmat)
        self.jumps_p = species.JumpList(self.pdets)
        self.jumps_n = species.JumpList(self.ndets)
        t3 = time.perf_counter()
        self.setup_seconds = {"basis": t1 - t0, "m_scheme_elements": t2 - t1, "species_matrices": t3 - t2}

    @property
    def dimension(self):
        return self.basis.dim

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

    # ---- one row block -------------------------------------------------------------------------
    def _row_block(self, bi, upper, dtype, protons=None):
        """COO pieces (local rows, global cols, values) of row block ``bi``; ``protons`` = (p0, p1): only the
        rows of the block's proton determinants p0..p1-1 (local rows then count from p0 * n_n)."""
        bas = self.basis
        B = bas.blocks[bi]
        p0, p1 = protons or (0, B.n_p)
        first = p0 * B.n_n                        # the first row built, as a row of the block
        nsp_p, nsp_n = self.pspace.size, self.nspace.size
        v4 = self.v_pn
        rows, cols, vals = [], [], []
        # the products below are taken over the whole block and then sliced to the range, so that a range's
        # elements are those of the whole build to the last bit (BLAS may round a sub-block differently)
        gp = slice(B.p_start, B.p_start + B.n_p)
        gn = slice(B.n_start, B.n_start + B.n_n)
        occ_p, occ_n = self.pdets.occ[gp], self.ndets.occ[gn]

        # diagonal
        dpn = np.einsum("aabb->ab", v4)
        diag = (self.h_p.diagonal()[gp][:, None] + self.h_n.diagonal()[gn][None, :]
                + (occ_p @ dpn) @ occ_n.T)[p0:p1]
        idx = np.arange((p1 - p0) * B.n_n)
        rows.append(idx), cols.append(idx + first + B.offset), vals.append(diag.ravel())

        # proton moves, neutrons spectators (and the mirror); with ``protons`` the moving protons' targets, or
        # the spectator protons, are those of the range
        for moving, h_s, jumps, occ_spec, n_mov, n_spec, mov_start in (
                ("p", self.h_p, self.jumps_p, occ_n, B.n_p, B.n_n, B.p_start),
                ("n", self.h_n, self.jumps_n, occ_p, B.n_n, B.n_p, B.n_start)):
            twom = B.twom_p if moving == "p" else bas.twice_m - B.twom_p
            blk = h_s[mov_start:mov_start + n_mov, mov_start:mov_start + n_mov].tocoo()
            off = blk.row != blk.col
            r_h, c_h, v_h = blk.row[off], blk.col[off], blk.data[off]
            js = jumps.between(twom, twom)
            r_j = jumps.target[js] - mov_start
            c_j = jumps.source[js] - mov_start
            if moving == "p":
                q = jumps.alpha[js] * nsp_p + jumps.gamma[js]
                w = np.einsum("agbb->bag", v4).reshape(nsp_n, nsp_p * nsp_p)
            else:
                q = jumps.alpha[js] * nsp_n + jumps.gamma[js]
                w = np.einsum("aabd->abd", v4).reshape(nsp_p, nsp_n * nsp_n)
            # union of the like-particle pattern and the jump pattern, one entry per (row, col)
            key = np.concatenate([r_h * n_mov + c_h, r_j * n_mov + c_j])
            uniq, inv = np.unique(key, return_inverse=True)
            base = np.zeros(len(uniq))
            np.add.at(base, inv[:len(r_h)], v_h)
            qsel = np.full(len(uniq), -1, dtype=np.int64)
            ssel = np.zeros(len(uniq))
            qsel[inv[len(r_h):]] = q
            ssel[inv[len(r_h):]] = jumps.sign[js]
            r_u, c_u = uniq // n_mov, uniq % n_mov
            used_q, qpos = np.unique(qsel[qsel >= 0], return_inverse=True)
            y = occ_spec @ w[:, used_q] if len(used_q) else np.zeros((n_spec, 0))
            has = qsel >= 0
            if moving == "p" and (p0, p1) != (0, B.n_p):     # only target protons in the range
                keep = (r_u >= p0) & (r_u < p1)
                qpos = qpos[keep[has]]
                r_u, c_u, base, ssel, has = r_u[keep], c_u[keep], base[keep], ssel[keep], has[keep]
            elif moving == "n":                              # only spectator protons in the range
                y, n_spec = y[p0:p1], p1 - p0
            val = np.repeat(base[None, :], n_spec, axis=0)      # (spectator, entry)
            val[:, has] += ssel[has][None, :] * y[:, qpos]
            spec = np.arange(n_spec)[:, None]
            if moving == "p":
                r = r_u[None, :] * B.n_n + spec
                c = c_u[None, :] * B.n_n + spec
            else:
                r = (spec + p0) * B.n_n + r_u[None, :]
                c = (spec + p0) * B.n_n + c_u[None, :]
            rows.append(r.ravel() - first), cols.append(c.ravel() + B.offset), vals.append(val.ravel())

        # both move: outer product of proton and neutron jumps, for every column block B'
        v2 = v4.reshape(nsp_p * nsp_p, nsp_n * nsp_n)
        for bj, C in enumerate(bas.blocks):
            if upper and bj < bi:
                continue
            jp = self.jumps_p.between(C.twom_p, B.twom_p)
            jn = self.jumps_n.between(bas.twice_m - C.twom_p, bas.twice_m - B.twom_p)
            if jp.stop == jp.start or jn.stop == jn.start:
                continue
            pr = self.jumps_p.target[jp] - B.p_start
            inside = (pr >= p0) & (pr < p1)              # target protons in the range
            pr = pr[inside]
            pc = (self.jumps_p.source[jp] - C.p_start)[inside]
            qa = (self.jumps_p.alpha[jp] * nsp_p + self.jumps_p.gamma[jp])[inside]
            sp_ = self.jumps_p.sign[jp][inside].astype(np.float64)
            nr = self.jumps_n.target[jn] - B.n_start
            nc = self.jumps_n.source[jn] - C.n_start
            qb = self.jumps_n.alpha[jn] * nsp_n + self.jumps_n.gamma[jn]
            sn = self.jumps_n.sign[jn].astype(np.float64)
            step = max(1, _OUTER_CHUNK // len(nr))
            for s in range(0, len(pr), step):
                e = slice(s, s + step)
                val = (sp_[e, None] * sn[None, :]) * v2[qa[e, None], qb[None, :]]
                nz = val != 0
                r = (pr[e, None] * B.n_n + nr[None, :])[nz] - first
                c = (pc[e, None] * C.n_n + nc[None, :])[nz] + C.offset
                rows.append(r), cols.append(c), vals.append(val[nz])
        r = np.concatenate(rows)
        c = np.concatenate(cols)
        v = np.concatenate(vals)
        if upper:
            keep = c >= r + first + B.offset
            r, c, v = r[keep], c[keep], v[keep]
        return r, c, v.astype(dtype, copy=False)

    def _row_block_csr(self, bi, upper, dtype, protons=None):
        r, c, v = self._row_block(bi, upper, dtype, protons)
        p0, p1 = protons or (0, self.basis.blocks[bi].n_p)
        n = (p1 - p0) * self.basis.blocks[bi].n_n
        m = sp.csr_matrix((v, (r, c)), shape=(n, self.basis.dim))
        return m

    def build(self, storage="full", dtype=np.float64, n_threads=None, progress=None, blocks=None, rows=None):
        """Sparse H in CSR. storage='full' (both triangles) or 'upper' (upper triangle incl. diagonal).

        blocks: a contiguous range of row blocks (distributed builds): only their rows are built,
        as a (rows x dimension) CSR matrix.
        rows: (lo, hi), a row range whose ends lie between proton determinants of their blocks (multiples of
        the block's n_n from its start): only those rows are built, also inside a block.
        """
        if storage not in ("full", "upper"):
            raise ValueError(f"storage must be 'full' or 'upper', got {storage!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        n_threads = n_threads or min(8, os.cpu_count() or 1)
        t0 = time.perf_counter()
        chosen = list(range(len(self.basis.blocks))) if blocks is None else list(blocks)
        protons = {}
        if rows is not None:
            protons = self._proton_ranges(*rows)
            chosen = [i for i in chosen if i in protons]
        nblk = len(chosen)
        # biggest blocks first so the pool finishes together
        order = sorted(chosen, key=lambda i: -self.basis.blocks[i].size)
        parts = {}
        done = 0
        with ThreadPoolExecutor(max_workers=n_threads) as pool:
            futures = {pool.submit(self._row_block_csr, i, storage == "upper", dtype, protons.get(i)): i
                       for i in order}
            for fut in futures:
                parts[futures[fut]] = fut.result()
                done += 1
                if progress:
                    progress(done, nblk)
        t1 = time.perf_counter()
        h = (sp.vstack([parts[i] for i in chosen], format="csr") if chosen
             else sp.csr_matrix((0, self.dimension), dtype=dtype))
        t2 = time.perf_counter()
        info = BuildInfo(self.dimension, int(h.nnz), storage,
                         dict(self.setup_seconds, assemble=t1 - t0, stack=t2 - t1),
                         self.factor, self.mass)
        return h, info
