"""One-species pieces of the Hamiltonian: the like-particle matrix and the one-body jump list."""
import numpy as np
import scipy.sparse as sp

from . import bits


def like_particle_matrix(dets, spe_state, pair_alpha, pair_beta, pair_mat, chunk=20000, groups=None):
    """CSR over all determinants of one species: Σ e c†c + Σ_{α<β,γ<δ} v̄ c†_α c†_β c_δ c_γ.

    Vectorised: every occupied pair (γ<δ) of every determinant is expanded over the pairs (α<β) it
    connects to (nonzero v̄), the target found by searchsorted. Conserves 2M, so the matrix is block
    diagonal over the (contiguous) 2M groups. groups: the 2M groups whose two-body rows are built (default
    all; the other groups keep only their diagonal): a many-body basis with one 2M uses few of them.
    """
    n_det, n = len(dets), dets.n_particles
    diag = dets.occ @ spe_state
    rows, cols, vals = [np.arange(n_det)], [np.arange(n_det)], [diag]
    sources = _in_groups(dets, groups)
    if n >= 2:
        nsp = dets.space.size
        pair_id = np.full((nsp, nsp), -1, dtype=np.int64)
        pair_id[pair_alpha, pair_beta] = np.arange(len(pair_alpha))
        src, dst = np.nonzero(pair_mat)
        tval = pair_mat[src, dst]
        tptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=len(pair_alpha)))])
        occ_idx = bits.occupied_lists(dets.states, nsp, n)
        i_pos, j_pos = np.triu_indices(n, k=1)
        for start in range(0, len(sources), chunk):
            block = sources[start:start + chunk]
            gam = occ_idx[block][:, i_pos].ravel()
            dlt = occ_idx[block][:, j_pos].ravel()
            det = np.repeat(block, len(i_pos))
            g = pair_id[gam, dlt]
            count = tptr[g + 1] - tptr[g]
            det, gam, dlt = np.repeat(det, count), np.repeat(gam, count), np.repeat(dlt, count)
            first = np.repeat(tptr[g], count)
            t = first + (np.arange(len(first)) - np.repeat(np.cumsum(count) - count, count))
            alp, bet, v = pair_alpha[dst[t]], pair_beta[dst[t]], tval[t]
            state = dets.states[det]
            sign = bits.parity_below(state, gam)
            state = state ^ bits.bit(gam)
            sign *= bits.parity_below(state, dlt)
            state = state ^ bits.bit(dlt)
            ok = (state & (bits.bit(alp) | bits.bit(bet))) == 0
            state, sign, alp, bet, v, det = state[ok], sign[ok], alp[ok], bet[ok], v[ok], det[ok]
            sign *= bits.parity_below(state, bet)
            state = state | bits.bit(bet)
            sign *= bits.parity_below(state, alp)
            state = state | bits.bit(alp)
            rows.append(dets.lookup(state, dets.twom[det]))
            cols.append(det)
            vals.append(sign * v)
    mat = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                        shape=(n_det, n_det)).tocsr()
    mat.sum_duplicates()
    return mat


def same_determinants(a, b):
    """Whether two species' determinants are the same list (the same bit strings, 2M and occupations, in the same
    order, over spaces of one size): what like_particle_matrix and JumpList read of them."""
    return (a.n_particles == b.n_particles and a.space.size == b.space.size and np.array_equal(a.states, b.states)
            and np.array_equal(a.twom, b.twom) and np.array_equal(a.occ, b.occ))


class JumpList:
    """All one-body jumps c†_α c_γ (α != γ) from the determinants of one species (those of ``groups``, the
    2M groups a basis uses, by default all) to any, with signs.

    Sorted by (source 2M group, target 2M group, target determinant, source determinant): the jumps between
    two 2M groups are one contiguous slice, in the row order of the jump matrix (target) and, within a
    target, in column order (source).
    """

    def __init__(self, dets, groups=None):
        nsp, n = dets.space.size, dets.n_particles
        sources = _in_groups(dets, groups)
        occ_idx = bits.occupied_lists(dets.states, nsp, n)[sources]
        det = np.repeat(sources, n * nsp)
        gam = np.repeat(occ_idx.ravel(), nsp)
        alp = np.tile(np.arange(nsp), len(sources) * n)
        state = dets.states[det]
        ok = (state & bits.bit(alp)) == 0
        det, gam, alp, state = det[ok], gam[ok], alp[ok], state[ok]
        sign = bits.parity_below(state, gam)
        state = state ^ bits.bit(gam)
        sign *= bits.parity_below(state, alp)
        state = state | bits.bit(alp)
        twom_to = dets.twom[det] + dets.space.twom[alp] - dets.space.twom[gam]
        target = dets.lookup(state, twom_to)
        order = np.lexsort((det, target, twom_to, dets.twom[det]))
        self.source, self.target = det[order], target[order]
        self.alpha, self.gamma, self.sign = alp[order], gam[order], sign[order]
        src_m, dst_m = dets.twom[self.source], twom_to[order]
        edges = np.flatnonzero((np.diff(src_m) != 0) | (np.diff(dst_m) != 0)) + 1
        starts, stops = np.r_[0, edges], np.r_[edges, len(src_m)]
        self._slices = {(int(src_m[s]), int(dst_m[s])): (int(s), int(e)) for s, e in zip(starts, stops) if e > s}

    def between(self, twom_from, twom_to):
        """Slice of the jumps from group 2M = twom_from to group twom_to."""
        s, e = self._slices.get((int(twom_from), int(twom_to)), (0, 0))
        return slice(s, e)


def _in_groups(dets, groups):
    """Indices of the determinants whose 2M is one of ``groups`` (None: all), ascending."""
    if groups is None:
        return np.arange(len(dets))
    return np.flatnonzero(np.isin(dets.twom, np.fromiter(groups, dtype=np.int64)))
