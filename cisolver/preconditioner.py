"""Block-diagonal preconditioner from the diagonal tiles of H (paper §3.4).

A tile is a set of basis states with the same orbital occupations (MFDn's many-body basis orbitals).
Column i of the residual block is solved with the tiles shifted: small tiles exactly through their
eigendecomposition (batched by tile size), large tiles by a few FOM (Lanczos) steps run on all of them at
once (one block-diagonal product per step).

The shift: ``shift="below"`` (default) uses σ = min(θ) − ``below`` for every column, so K − σ is positive
definite; ``shift="ritz"`` uses each column's Ritz value θ_i, as MFDn describes. Measured (tol 1e-8, 5
pairs, `cisolver spectrum --precond tiles` on a 2-core CPU, docs/performance.md): without a preconditioner
24Mg/44Ti/46Ti take 47/41/65 iterations; with Ritz shifts 67/–/266, with σ = min(θ) − 5 MeV 39–41/26/39.
Solved exactly at a Ritz value, a tile amplifies the directions of its own eigenvalues near θ, which these
tiles do not share with H.
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

    def __init__(self, h, labels, *, upper=False, dense_max=400, fom_steps=3, shift_floor=1e-2,
                 shift="below", below=5.0, xp=np):
        if shift not in ("below", "ritz"):
            raise ValueError(f"shift must be 'below' or 'ritz', got {shift!r}")
        if not below > 0:
            raise ValueError(f"below must be a positive energy, got {below!r}")
        self.shift, self.below = shift, float(below)
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
        # the large tiles side by side: one block-diagonal matrix, and a tile-membership matrix whose
        # products give per-tile sums (and spread per-tile numbers back to the rows)
        big = np.nonzero(~small)[0]
        self.large = None
        if len(big):
            idx = np.concatenate([perm[start[t]:start[t + 1]] for t in big])
            offset = np.zeros(len(sizes), dtype=np.int64)
            offset[big] = np.concatenate([[0], np.cumsum(sizes[big])[:-1]])
            sel = ~small[ent_tile]
            rows, cols = offset[ent_tile[sel]] + pos[r[sel]], offset[ent_tile[sel]] + pos[c[sel]]
            n_big = int(sizes[big].sum())
            m = sp.csr_matrix((v[sel], (rows, cols)), shape=(n_big, n_big))
            member = sp.csr_matrix((np.ones(n_big), (np.repeat(np.arange(len(big)), sizes[big]), np.arange(n_big))),
                                   shape=(len(big), n_big))
            if xp is not np:
                import cupyx.scipy.sparse as csp
                m, member = csp.csr_matrix(m), csp.csr_matrix(member)
            self.large = (xp.asarray(idx), m, member, member.T.tocsr())

    def _safe(self, d):
        xp = module_of(d)
        small = xp.abs(d) < self.shift_floor
        return xp.where(small, xp.where(d >= 0, self.shift_floor, -self.shift_floor), d)

    def apply(self, r, theta):
        """K^{-1} r column by column; theta is a host array of the Ritz values (one per column)."""
        xp = module_of(r)
        theta = np.asarray(theta, dtype=np.float64)
        if self.shift == "below":
            theta = np.full_like(theta, theta.min() - self.below)
        th = xp.asarray(theta)
        w = xp.empty_like(r)
        for idx, q, lam in self.groups:
            rt = r[idx].astype(xp.float64)                               # (t, s, k)
            y = xp.matmul(xp.swapaxes(q, 1, 2), rt)
            y /= self._safe(lam[:, :, None] - th[None, None, :])
            w[idx] = xp.matmul(q, y).astype(r.dtype)
        if self.large is not None:
            idx, m, member, spread = self.large
            w[idx] = self._fom(m, member, spread, r[idx].astype(xp.float64), theta).astype(r.dtype)
        return w

    def _fom(self, m, member, spread, b, theta):
        """A few Lanczos-FOM steps for every large tile and column at once: V from the Krylov space of
        the (unshifted) tile, then the shifted tridiagonal system (T - θ_i) y = |b| e_1 per tile and
        column. ``member`` sums rows per tile, ``spread`` copies per-tile numbers back to the rows."""
        xp = module_of(b)

        def dot(x, y):                       # per-tile, per-column inner products: (tiles, k)
            return member @ (x * y)

        def per_row(t):
            return spread @ t

        beta0 = xp.sqrt(dot(b, b))
        beta0 = xp.where(beta0 == 0, 1.0, beta0)
        vs = [b / per_row(beta0)]
        alphas, betas = [], []
        prev, beta_prev = xp.zeros_like(b), xp.zeros_like(beta0)
        for j in range(self.fom_steps):
            u = m @ vs[-1] - per_row(beta_prev) * prev
            a = dot(u, vs[-1])
            u -= per_row(a) * vs[-1]
            for v_old in vs:                       # full re-orthogonalisation: a handful of vectors
                u -= per_row(dot(u, v_old)) * v_old
            bnext = xp.sqrt(dot(u, u))
            alphas.append(a)
            if j == self.fom_steps - 1:
                break
            betas.append(bnext)
            prev, beta_prev = vs[-1], bnext
            vs.append(u / per_row(xp.where(bnext == 0, 1.0, bnext)))
        steps = len(alphas)
        host = (lambda x: x.get()) if xp is not np else np.asarray
        a_h = np.stack([host(a) for a in alphas], axis=-1)           # (tiles, k, steps)
        t = np.zeros(a_h.shape + (steps,))
        diag = np.arange(steps)
        t[..., diag, diag] = a_h - theta[None, :, None]
        if betas:
            b_h = np.stack([host(x) for x in betas], axis=-1)        # (tiles, k, steps - 1)
            t[..., diag[:-1], diag[1:]] = b_h
            t[..., diag[1:], diag[:-1]] = b_h
        rhs = np.zeros(a_h.shape[:2] + (steps, 1))
        rhs[..., 0, 0] = host(beta0)
        coeff = (np.linalg.pinv(t, rcond=1e-12) @ rhs)[..., 0]        # (tiles, k, steps)
        coeff = xp.asarray(coeff)
        out = xp.zeros_like(b)
        for j, v in enumerate(vs[:steps]):
            out += v * per_row(coeff[..., j])
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
