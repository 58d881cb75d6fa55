"""Rows of the shell-model H laid out straight in CSR order, one row block (proton 2M block) at a time.

Row (p', n') of block B (proton determinant p', neutron determinant n' of the block) holds, in column order,
one *piece* per column block C that a proton jump connects to B and, inside B, three pieces: the proton
sources below p' (``lo``), p' itself (``own``) and above p' (``hi``). Inside a piece the columns run over the
piece's proton sources p (ascending) and, for each, over the neutron columns of row n' (ascending): the
row's part of a piece is an a(p') x b(n') grid, and the pieces follow each other in every row.

* C != B (both species move by one jump): sources are the proton jumps C -> p', neutron columns the neutron
  jumps C -> n'; value s_p s_n v̄(αβ,γδ), exact zeros dropped.
* lo / hi: sources are H_p's pattern and the proton jumps inside B; neutron columns are the neutron jumps
  inside B and n' itself. At n' the proton-move element H_p(p',p) + s_p Σ_β v̄(αβ,γβ) (kept even where it
  is 0); at a neutron jump, for jump sources only, s_p s_n v̄ as above.
* own: neutron columns are n' (the diagonal) and H_n's pattern and the neutron jumps inside B (the
  neutron-move element H_n(n',n) + s_n Σ_α v̄(αβ,αδ)); all kept.

A row's count needs no values: the zeros dropped are exactly those of v̄, so it is a product of jump counts
and v̄'s nonzero pattern (P · [v̄ != 0] · Nᵀ per piece). A fill lays a group of rows out uncompacted (every
grid entry at its place), scatters values and columns there and compresses the dropped zeros out into the
caller's CSR arrays. Every product and sum is the one of the element formulas above, in the same order, so
the matrix does not depend on how the rows are grouped or on the number of threads.
"""
import numpy as np


def _ranked(keys, n):
    """Entries sorted by key in 0..n-1: (count of each key, start of each key's run, rank inside its run)."""
    counts = np.bincount(keys, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)])
    return counts, starts, np.arange(len(keys)) - starts[keys]


def _per_source(by_target, target):
    """Columns of a (neutron column, target row) table for each source's target row (broadcast for one)."""
    return by_target if by_target.shape[1] == 1 else by_target.take(target, axis=1)


class _Sources:
    """Proton sources of a piece, sorted by (target row p' of the block range, source): for each the column
    base (column block offset + p n_n of that block), the rank inside its target row, and a row of the
    piece's v̄ table (the appended zero row for sources with no proton jump) with the jump's sign."""

    def __init__(self, target, col_base, ia, sign, n_targets):
        self.target, self.col_base, self.ia, self.sign = target, col_base, ia, sign
        self.a, self.ptr, self.rank = _ranked(target, n_targets)

    def span(self, g0, g1):
        return slice(int(self.ptr[g0]), int(self.ptr[g1]))


class _Columns:
    """Neutron columns of a piece, sorted by (target neutron row n', source n): for each the source, its
    place inside the row's list, and the signed column of the piece's v̄ table."""

    def __init__(self, target, source, ib2, n_rows, place=None, width=None):
        self.target, self.source, self.ib2 = target, source, ib2
        b, self.ptr, rank = _ranked(target, n_rows)
        self.b = b if width is None else width                       # grid width of every neutron row
        self.place = rank if place is None else place
        self.width = self.b[target]                                  # the grid width at each entry

    def span(self, q0, q1):
        return slice(int(self.ptr[q0]), int(self.ptr[q1]))


def _table(v2, qa, qb):
    """v̄ restricted to the pair indices used, as [V, -V] with a zero row appended (for sources without a
    proton jump), and each entry's row (qa < 0: the zero row) and signed column."""
    ua = np.unique(qa[qa >= 0])
    ub = np.unique(qb)
    tab = np.zeros((len(ua) + 1, len(ub)))
    tab[:-1] = v2[np.ix_(ua, ub)]
    ia = np.where(qa >= 0, np.searchsorted(ua, qa), len(ua))
    ib = np.searchsorted(ub, qb)
    return tab, ia, ib


class JumpGrid:
    """One piece whose grid entries are s_p s_n v̄ (exact zeros dropped), and for lo / hi the column n' itself
    with the proton-move element (``own_column``: H_p value, sign, column of y and y = occ_n · w_p, the
    spectator sums Σ_β v̄(αβ,γβ) of every neutron row and proton jump)."""

    def __init__(self, v2, sources_q, sources, col_target, col_source, col_q, col_sign, n_rows,
                 own_column=None):
        tab, ia, ib = _table(v2, sources_q, col_q)
        self.nonzero = (tab != 0).astype(np.float64)
        self.tab2 = np.concatenate([tab, -tab], axis=1)     # a negative neutron sign picks the negated column
        self.src = _Sources(*sources[:2], ia, sources[2], sources[3])
        ib2 = ib + tab.shape[1] * (col_sign < 0)
        self.ib = ib
        self.own = own_column
        if own_column is None:
            self.cols = _Columns(col_target, col_source, ib2, n_rows)
        else:       # n' sits among the row's jump columns, after those with a smaller source
            bj, ptr, rank = _ranked(col_target, n_rows)
            before = np.searchsorted(col_target * n_rows + col_source, np.arange(n_rows) * (n_rows + 1))
            self.own_place = before - ptr[:-1]
            self.cols = _Columns(col_target, col_source, ib2, n_rows, place=rank + (col_source > col_target),
                                 width=bj + 1)

    @property
    def a(self):
        return self.src.a

    @property
    def b(self):
        return self.cols.b

    def kept(self):
        """Stored entries of every (target row, neutron row): P · [v̄ != 0] · Nᵀ (+ the column n')."""
        n_t, n_r = len(self.src.a), len(self.cols.b)
        nrow, ncol = self.nonzero.shape
        p = np.bincount(self.src.target * nrow + self.src.ia, minlength=n_t * nrow).reshape(n_t, nrow)
        n = np.bincount(self.cols.target * ncol + self.ib, minlength=n_r * ncol).reshape(n_r, ncol)
        k = np.rint((p.astype(np.float64) @ self.nonzero) @ n.T.astype(np.float64)).astype(np.int64)
        if self.own is not None:
            k += self.src.a[:, None]
        return k

    def scatter(self, offsets, g0, g1, q0, q1, val, col, keep):
        """Entries of target rows g0..g1-1 and neutron rows q0..q1-1; ``offsets`` (neutron row, target row):
        where the piece starts in each row. Arrays run (neutron column, source): a row's entries are written
        together."""
        s = self.src.span(g0, g1)
        if s.start == s.stop:
            return
        tgt, rank = self.src.target[s] - g0, self.src.rank[s]
        e = self.cols.span(q0, q1)
        if e.start < e.stop:
            at = _per_source(offsets[self.cols.target[e] - q0] + self.cols.place[e, None], tgt)
            at = at + self.cols.width[e, None] * rank
            v = (self.tab2[self.src.ia[s]] * self.src.sign[s, None]).T.take(self.cols.ib2[e], axis=0)
            val[at] = v
            col[at] = self.cols.source[e, None] + self.src.col_base[s]
            if keep is not None:
                keep[at[v == 0]] = False
        if self.own is not None:
            base, sign, qpos, y = self.own
            at = _per_source(offsets + self.own_place[q0:q1, None], tgt) + self.cols.b[q0:q1, None] * rank
            val[at] = base[s] + sign[s] * y[q0:q1].take(qpos[s], axis=1)
            col[at] = np.arange(q0, q1)[:, None] + self.src.col_base[s]


class OwnPiece:
    """p' itself: the diagonal at n' and the neutron-move elements H_n(n',n) + s_n Σ_α v̄(αβ,αδ), all stored.
    diag: (neutron row, proton row); y_n: (pair used, proton row) spectator sums."""

    def __init__(self, target, source, base, sign, qpos, is_own, diag, y_n, col_base, n_rows):
        self.cols = _Columns(target, source, None, n_rows)
        self.base, self.sign, self.qpos = base, sign, qpos
        self.own_entry = np.flatnonzero(is_own)          # one per neutron row, in row order
        self.diag, self.y_n, self.col_base = diag, y_n, col_base
        self.a = np.ones(diag.shape[1], dtype=np.int64)

    @property
    def b(self):
        return self.cols.b

    def kept(self):
        return np.broadcast_to(self.cols.b, (len(self.a), len(self.cols.b)))

    def scatter(self, offsets, g0, g1, q0, q1, val, col, keep):
        e = self.cols.span(q0, q1)
        at = offsets[self.cols.target[e] - q0] + self.cols.place[e, None]
        v = self.base[e, None] + self.sign[e, None] * self.y_n[self.qpos[e], g0:g1]
        v[self.own_entry[q0:q1] - e.start] = self.diag[q0:q1, g0:g1]
        val[at] = v
        col[at] = self.cols.source[e, None] + self.col_base[g0:g1]


class RowBlock:
    """The pieces of one row block restricted to its proton determinants p0..p1-1 (the rows of those), in
    column order; ``counts``: stored entries of every row (row-major: proton, then neutron)."""

    def __init__(self, pieces, n_protons, n_neutrons):
        self.pieces = pieces
        self.shape = (n_protons, n_neutrons)
        kept = np.zeros(self.shape, dtype=np.int64)
        for piece in pieces:
            kept += piece.kept()
        self.counts = kept.ravel()

    def fill(self, g0, g1, q0, q1, data, indices, scratch):
        """Rows of protons g0..g1-1 and neutrons q0..q1-1 (one proton, or every neutron, so that the rows are
        contiguous) into ``data`` / ``indices``, which hold exactly their stored entries. ``scratch``: a
        threading.local whose buffers this thread reuses from group to group."""
        sizes = [p.b[q0:q1, None] * p.a[None, g0:g1] for p in self.pieces]     # (neutron row, proton row)
        total = np.sum(sizes, axis=0).T.ravel()                               # rows in CSR order
        offsets = (np.cumsum(total) - total).reshape(g1 - g0, q1 - q0).T
        n_all = int(total.sum())
        if n_all == len(data):          # no zero dropped: straight into the caller's arrays
            val, col, keep = data, indices, None
        else:
            val, col, keep = _buffers(scratch, n_all, data.dtype, indices.dtype)
            keep[:] = True
        for piece, size in zip(self.pieces, sizes):
            piece.scatter(offsets, g0, g1, q0, q1, val, col, keep)
            offsets = offsets + size
        if keep is None:
            return
        n_kept = int(np.count_nonzero(keep))
        if n_kept != len(data):
            raise RuntimeError(f"row count mismatch in a Hamiltonian row group: counted {len(data)} entries, "
                               f"built {n_kept}")
        data[:] = val[keep]
        indices[:] = col[keep]


def _buffers(scratch, n, data_dtype, index_dtype):
    """Views of n entries of this thread's uncompacted value, column and keep buffers (grown as needed)."""
    have = getattr(scratch, "buffers", None)
    if have is None or len(have[0]) < n or have[0].dtype != data_dtype or have[1].dtype != index_dtype:
        size = max(n, 2 * len(have[0]) if have is not None else 0)
        have = scratch.buffers = (np.empty(size, data_dtype), np.empty(size, index_dtype), np.empty(size, bool))
    return tuple(b[:n] for b in have)
