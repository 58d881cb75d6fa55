"""Total angular momentum of eigenvectors: <J²> = |J₊ψ|² + M² + M (J² = J₋J₊ + J_z² + J_z)."""
import numpy as np
import scipy.sparse as sp

from .basis import MSchemeBasis


def _raise_entries(jumps, dets):
    """Species J₊ jumps: c†_{m+1} c_m within one orbit, with sqrt(j(j+1) - m(m+1))."""
    sp_ = dets.space
    a, g = jumps.alpha, jumps.gamma
    ok = (sp_.orbit[a] == sp_.orbit[g]) & (sp_.twom[a] == sp_.twom[g] + 2)
    tj, tm = sp_.twoj[g[ok]], sp_.twom[g[ok]]
    coef = np.sqrt((tj * (tj + 2) - tm * (tm + 2)) / 4.0) * jumps.sign[ok]
    return jumps.source[ok], jumps.target[ok], coef


def j_plus(problem):
    """Sparse J₊ from the 2M basis to the 2M+2 basis (rows: target basis)."""
    bas = problem.basis
    tgt = MSchemeBasis(problem.pdets, problem.ndets, bas.twice_m + 2)
    rows, cols, vals = [], [], []
    for dets, jumps, moving in ((problem.pdets, problem.jumps_p, "p"), (problem.ndets, problem.jumps_n, "n")):
        src, dst, coef = _raise_entries(jumps, dets)
        for B in bas.blocks:
            twom_p_t = B.twom_p + 2 if moving == "p" else B.twom_p
            ti = tgt.block_of_twom.get(twom_p_t)
            if ti is None:
                continue
            T = tgt.blocks[ti]
            if moving == "p":
                sel = (src >= B.p_start) & (src < B.p_start + B.n_p)
                ps, pd, c = src[sel] - B.p_start, dst[sel] - T.p_start, coef[sel]
                nn = np.arange(B.n_n)
                r = T.offset + pd[:, None] * T.n_n + nn[None, :]
                k = B.offset + ps[:, None] * B.n_n + nn[None, :]
                v = np.repeat(c[:, None], B.n_n, axis=1)
            else:
                sel = (src >= B.n_start) & (src < B.n_start + B.n_n)
                ns, nd, c = src[sel] - B.n_start, dst[sel] - T.n_start, coef[sel]
                pp = np.arange(B.n_p)
                r = T.offset + pp[:, None] * T.n_n + nd[None, :]
                k = B.offset + pp[:, None] * B.n_n + ns[None, :]
                v = np.repeat(c[None, :], B.n_p, axis=0)
            rows.append(r.ravel()), cols.append(k.ravel()), vals.append(v.ravel())
    if not rows:
        return sp.csr_matrix((max(tgt.dim, 0), bas.dim))
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(tgt.dim, bas.dim))


def expectation_j2(problem, vectors):
    """<J²> of each (normalised) column of ``vectors`` (numpy, n x k)."""
    v = np.asarray(vectors, dtype=np.float64)
    v = v / np.linalg.norm(v, axis=0)
    jp = j_plus(problem)
    m = problem.basis.twice_m / 2.0
    return np.sum((jp @ v) ** 2, axis=0) + m * m + m


def j_from_j2(j2):
    """J with J(J+1) = <J²>, rounded to the nearest half-integer."""
    j = (-1.0 + np.sqrt(1.0 + 4.0 * np.maximum(np.asarray(j2, dtype=float), 0.0))) / 2.0
    return np.round(2.0 * j) / 2.0
