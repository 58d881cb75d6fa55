"""Block-diagonal preconditioner from the diagonal tiles of H (paper §3.4).

A tile is a set of basis states with the same orbital occupations (MFDn's many-body basis orbitals).
Column i of the residual block is solved with the tile shifted by the Ritz value θ_i:
small tiles exactly through their eigendecomposition (batched by tile size), large tiles by a few
FOM (Lanczos) steps on the sparse tile.
"""
import numpy as np
import scipy.sparse as sp

from .arrays import module_of


def _tile_entries(h, labels, upper, chunk_rows=200_000):
    """(rows, cols, vals) of H restricted to same-label pairs, read in row chunks to bound memory."""
    out_r, out_c, out_v = [], [], []
    n = h.shape[0]
    for r0 in range(0, n, chunk_rows):
        r1 = min(n, r0 + chunk_rows)
        lo, hi = h.indptr[r0], h.indptr[r1]
        rows = np.repeat(np.arange(r0, r1), np.diff(h.indptr[r0:r1 + 1]))
        cols = h.indices[lo:hi]
        keep = labels[rows] == labels[cols]
        out_r.append(rows[keep]), out_c.append(cols[keep]), out_v.append(h.data[lo:hi][keep])
    r, c, v = (np.concatenate(a) for a in (out_r, out_c, out_v))
    if upper:   # mirror the strict upper part
        off = r != c
        r, c, v = np.concatenate([r, c[off]]), np.concatenate([c, r[off]]), np.concatenate([v, v[off]])
    return r, c, v


class TilePreconditioner:
    """W = K^{-1} R with K = blockdiag(H_tile - θ_i)."""

    def __init__(self, h, labels, *, upper=False, dense_max=400, fom_steps=5, shift_floor=1e-2,
                 xp=np):
        labels = np.asarray(labels)
        if labels.shape != (h.shape[0],):
            raise ValueError(f"labels must have one entry per row ({h.shape[0]}), got shape {labels.shape}")
        self.xp = xp
        self.fom_steps = int(fom_steps)
        self.shift_floor = float(shift_floor)
        h = h.tocsr()
        uniq, tile_of = np.unique(labels, return_inverse=True)
        sizes = np.bincount(tile_of)
        perm = np.argsort(tile_of, kind="stable")                 # states of tile t are contiguous
        start = np.concatenate([[0], np.cumsum(sizes)])
        pos = np.empty(len(labels), dtype=np.int64)
        pos[perm] = np.arange(len(labels)) - start[tile_of[perm]]
        r, c, v = _tile_entries(h, tile_of, upper)
        v = v.astype(np.float64)
        self.n_tiles, self.max_tile = len(uniq), int(sizes.max())
        self.groups = []        # (state index array (t, s), eigvecs (t, s, s), eigvals (t, s))
        small = sizes <= dense_max
        ent_tile = tile_of[r]
        for s in np.unique(sizes[small]):
            tiles = np.nonzero(sizes == s)[0]
            slot = np.full(len(sizes), -1)
            slot[tiles] = np.arange(len(tiles))
            sel = slot[ent_tile] >= 0
            dense = np.zeros((len(tiles), s, s))
            dense[slot[ent_tile[sel]], pos[r[sel]], pos[c[sel]]] = v[sel]
            lam, q = np.linalg.eigh(dense)
            idx = perm[start[tiles][:, None] + np.arange(s)[None, :]]
            self.groups.append((xp.asarray(idx), xp.asarray(q), xp.asarray(lam)))
        self.large = []         # (state indices, sparse tile)
        for t in np.nonzero(~small)[0]:
            sel = ent_tile == t
            m = sp.csr_matrix((v[sel], (pos[r[sel]], pos[c[sel]])), shape=(sizes[t], sizes[t]))
            idx = perm[start[t]:start[t + 1]]
            if xp is not np:
                import cupyx.scipy.sparse as csp
                m = csp.csr_matrix(m)
            self.large.append((xp.asarray(idx), m))

    def _safe(self, d):
        xp = module_of(d)
        small = xp.abs(d) < self.shift_floor
        return xp.where(small, xp.where(d >= 0, self.shift_floor, -self.shift_floor), d)

    def apply(self, r, theta):
        """K^{-1} r column by column; theta is a host array of the shifts (one per column)."""
        xp = module_of(r)
        th = xp.asarray(np.asarray(theta, dtype=np.float64))
        w = xp.empty_like(r)
        for idx, q, lam in self.groups:
            rt = r[idx].astype(xp.float64)                               # (t, s, k)
            y = xp.matmul(xp.swapaxes(q, 1, 2), rt)
            y /= self._safe(lam[:, :, None] - th[None, None, :])
            w[idx] = xp.matmul(q, y).astype(r.dtype)
        for idx, m in self.large:
            w[idx] = self._fom(m, r[idx].astype(xp.float64), th).astype(r.dtype)
        return w

    def _fom(self, m, b, th):
        """A few Lanczos-FOM steps per column: V from the Krylov space of the (unshifted) tile, then
        the shifted tridiagonal system (T - θ_i) y = |b_i| e_1 for each column i."""
        xp = module_of(b)
        k = b.shape[1]
        beta0 = xp.linalg.norm(b, axis=0)
        beta0 = xp.where(beta0 == 0, 1.0, beta0)
        vs = [b / beta0]
        alphas, betas = [], []
        prev, beta_prev = xp.zeros_like(b), xp.zeros(k)
        for j in range(self.fom_steps):
            u = m @ vs[-1] - beta_prev * prev
            a = xp.sum(u * vs[-1], axis=0)
            u -= a * vs[-1]
            for v_old in vs:                       # full re-orthogonalisation: a handful of vectors
                u -= xp.sum(u * v_old, axis=0) * v_old
            bnext = xp.linalg.norm(u, axis=0)
            alphas.append(a)
            if j == self.fom_steps - 1:
                break
            betas.append(bnext)
            prev, beta_prev = vs[-1], bnext
            vs.append(u / xp.where(bnext == 0, 1.0, bnext))
        steps = len(alphas)
        a_h = np.stack([np.asarray(a.get() if hasattr(a, "get") else a) for a in alphas])   # (steps, k)
        b_h = np.stack([np.asarray(x.get() if hasattr(x, "get") else x) for x in betas]) if betas else None
        th_h = np.asarray(th.get() if hasattr(th, "get") else th)
        nb = np.asarray(beta0.get() if hasattr(beta0, "get") else beta0)
        coeff = np.zeros((steps, k))
        for i in range(k):
            t = np.diag(a_h[:, i] - th_h[i])
            if b_h is not None:
                t += np.diag(b_h[:, i], 1) + np.diag(b_h[:, i], -1)
            rhs = np.zeros(steps)
            rhs[0] = nb[i]
            coeff[:, i] = np.linalg.lstsq(t, rhs, rcond=1e-12)[0]
        coeff = xp.asarray(coeff)
        out = xp.zeros_like(b)
        for j, v in enumerate(vs[:steps]):
            out += v * coeff[j]
        return out


def configuration_labels(problem):
    """One integer per basis state: its (proton, neutron) orbital-occupation configuration."""
    def conf_ids(dets):
        counts = np.zeros((len(dets), len(dets.space.orbits)), dtype=np.int64)
        for o in range(len(dets.space.orbits)):
            counts[:, o] = dets.occ[:, dets.space.orbit == o].sum(axis=1)
        _, ids = np.unique(counts, axis=0, return_inverse=True)
        return ids.ravel(), int(ids.max()) + 1
    pid, _ = conf_ids(problem.pdets)
    nid, n_nconf = conf_ids(problem.ndets)
    out = np.empty(problem.dimension, dtype=np.int64)
    for b in problem.basis.blocks:
        p = pid[b.p_start:b.p_start + b.n_p]
        n = nid[b.n_start:b.n_start + b.n_n]
        out[b.offset:b.offset + b.size] = (p[:, None] * n_nconf + n[None, :]).ravel()
    return out
