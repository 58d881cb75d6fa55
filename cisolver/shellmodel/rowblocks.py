"""Rows of the shell-model H laid out straight in CSR order, one row block (proton 2M block) at a time.

Row (p', n') of block B (proton determinant p', neutron determinant n' of the block) holds, in column order,
one *piece* per column block C that a proton jump connects to B and, inside B, three pieces: the proton
sources below p' (``lo``), p' itself (``own``) and above p' (``hi``). Inside a piece the columns run over the
piece's proton sources p (ascending) and, for each, over the neutron columns of row n' (ascending): the
row's part of a piece is an a(p') x b(n') grid, and the pieces follow each other in every row.

* C != B (both species move by one jump): sources are the proton jumps C -> p', neutron columns the neutron
  jumps C -> n'; value s_p s_n v̄(αβ,γδ), exact zeros dropped.
* lo / hi: sources are H_p's pattern and the proton jumps inside B. A jump source's grid row holds the
  neutron jumps inside B (s_p s_n v̄ as above) and n' itself, another source's n' only; at n' the
  proton-move element H_p(p',p) + s_p Σ_β v̄(αβ,γβ), kept even where it is 0.
* own: neutron columns are n' (the diagonal) and H_n's pattern and the neutron jumps inside B (the
  neutron-move element H_n(n',n) + s_n Σ_α v̄(αβ,αδ)); all kept.

A row's count needs no values: the zeros dropped are exactly those of v̄, so it is a product of jump counts
and v̄'s nonzero pattern (P · [v̄ != 0] · Nᵀ per piece). A fill lays a group of rows out uncompacted (every
grid entry at its place), scatters values and columns there and compresses the dropped zeros out into the
caller's CSR arrays (straight into them where the group drops none). Every product and sum is the one of
the element formulas above, in the same order, so the matrix does not depend on how the rows are grouped
or on the number of threads.

A GPU fills the same rows with kernels of its own (cisolver.gpu_fill) from the same plan: ``RowBlock.to_device``
copies a row block's pieces there in one packed copy, keeping on the host the run starts (``ptr``) that cut a
group's slices.
"""
import copy

import numpy as np


def _ranked(keys, n):
    """Entries sorted by key in 0..n-1: (count of each key, start of each key's run, rank inside its run)."""
    counts = np.bincount(keys, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)])
    return counts, starts, np.arange(len(keys)) - starts[keys]


def _per_source(by_target, target):
    """Columns of a (neutron column, target row) table for each source's target row (broadcast for one)."""
    return by_target if by_target.shape[1] == 1 else by_target.take(target, axis=1)


class _Arrays:
    """Arrays that ``on_device`` copies to the current GPU, but those named in _HOST (kept on the host)."""
    _HOST = ("ptr",)

    def host_arrays(self):
        """(owner, name, array) of every array ``on_device`` copies, this object's and its parts'."""
        for name, value in vars(self).items():
            if isinstance(value, _Arrays):
                yield from value.host_arrays()
            elif isinstance(value, np.ndarray) and name not in self._HOST:
                yield self, name, value

    def on_device(self, moved):
        """A copy whose arrays are the device arrays ``moved`` maps them to (id(host array) -> device array)."""
        out = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, _Arrays):
                setattr(out, name, value.on_device(moved))
            elif isinstance(value, np.ndarray) and name not in self._HOST:
                setattr(out, name, moved[id(value)])
        return out


def _upload_packed(arrays, xp):
    """{id(a): a on the current GPU} for host arrays ``arrays``, sent in one copy: packed into one host buffer
    (each at a 16-byte aligned offset, C order) and cut into views there (thousands of small copies took 0.8 s
    for 48Cr's pieces)."""
    unique = list({id(a): a for a in arrays}.values())
    offsets, size = [], 0
    for a in unique:
        offsets.append(size)
        size += -(-a.nbytes // 16) * 16
    host = np.empty(max(size, 16), np.uint8)
    for a, off in zip(unique, offsets):
        host[off:off + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    dev = xp.asarray(host)
    return {id(a): dev[off:off + a.nbytes].view(a.dtype).reshape(a.shape) for a, off in zip(unique, offsets)}


class _Sources(_Arrays):
    """Proton sources of a piece, sorted by (target row p' of the block range, source): for each the column
    base (column block offset + p n_n of that block) and the rank inside its target row."""

    def __init__(self, target, col_base, n_targets):
        self.target, self.col_base = target, col_base
        self.a, self.ptr, self.rank = _ranked(target, n_targets)

    def span(self, g0, g1):
        return slice(int(self.ptr[g0]), int(self.ptr[g1]))


class _Columns(_Arrays):
    """Neutron columns of a piece, sorted by (target neutron row n', source n): for each the source and its
    place inside the row's list."""

    def __init__(self, target, source, n_rows):
        self.target, self.source = target, source
        self.b, self.ptr, self.place = _ranked(target, n_rows)
        self.width = self.b[target]                                  # the row's column count at each entry

    def span(self, q0, q1):
        return slice(int(self.ptr[q0]), int(self.ptr[q1]))


class OwnColumn(_Arrays):
    """Column n' itself for the proton sources p of lo / hi (H_p's pattern and the proton jumps inside the
    block, sorted by (target, source)): the proton-move element H_p(p',p) + s_p Σ_β v̄(αβ,γβ), kept even
    where it is 0. base: H_p's value (0 where absent); sign: the jump's (0: no jump); column: the jump's
    column of y = occ_n · w_p, the spectator sums of every neutron row."""

    def __init__(self, target, col_base, base, sign, column, is_jump, y, n_targets):
        self.src = _Sources(target, col_base, n_targets)
        self.base, self.sign, self.column, self.is_jump, self.y = base, sign, column, is_jump, y
        jumps = np.concatenate([[0], np.cumsum(is_jump)])
        self.jumps_before = jumps[:-1] - jumps[self.src.ptr[target]]   # jump sources ahead in the row


class JumpGrid(_Arrays):
    """One piece whose grid entries are s_p s_n v̄ (exact zeros dropped) over proton jumps (sources) x
    neutron jumps (columns); for lo / hi also the column n' itself (``own``, an OwnColumn, over every
    source: a jump source's grid row then holds its neutron jumps and n' in column order, another source
    only n')."""

    def __init__(self, v2, target, col_base, pair, sign, n_targets, col_target, col_source, col_pair, col_sign,
                 n_rows, own=None):
        ua, ia = np.unique(pair, return_inverse=True)
        ub, ib = np.unique(col_pair, return_inverse=True)
        tab = v2[np.ix_(ua, ub)]
        self.nonzero = (tab != 0).astype(np.float64)
        self.tab2 = np.concatenate([tab, -tab], axis=1)     # a negative neutron sign picks the negated column
        self.src = _Sources(target, col_base, n_targets)
        self.ia, self.ib, self.sign = ia.ravel(), ib.ravel(), sign
        self.ib2 = self.ib + tab.shape[1] * (col_sign < 0)
        self.own = own
        self.cols = _Columns(col_target, col_source, n_rows)
        if own is not None:         # n' sits among the row's jump columns, after those with a smaller source
            self.cols.place = self.cols.place + (col_source > col_target)
            before = np.searchsorted(col_target * n_rows + col_source, np.arange(n_rows) * (n_rows + 1))
            self.own_place = before - self.cols.ptr[:-1]
            self.lead = own.src.rank[own.is_jump]           # sources (jumps or not) ahead of each jump source

    def sizes(self, g0, g1, q0, q1):
        """Grid entries (dropped ones included) of each (neutron row, target row)."""
        size = self.cols.b[q0:q1, None] * self.src.a[g0:g1]
        if self.own is not None:
            size += self.own.src.a[g0:g1]
        return size

    def kept(self):
        """Stored entries of every (target row, neutron row): P · [v̄ != 0] · Nᵀ (+ the column n')."""
        n_t, n_r = len(self.src.a), len(self.cols.b)
        nrow, ncol = self.nonzero.shape
        p = np.bincount(self.src.target * nrow + self.ia, minlength=n_t * nrow).reshape(n_t, nrow)
        n = np.bincount(self.cols.target * ncol + self.ib, minlength=n_r * ncol).reshape(n_r, ncol)
        k = np.rint((p.astype(np.float64) @ self.nonzero) @ n.T.astype(np.float64)).astype(np.int64)
        if self.own is not None:
            k += self.own.src.a[:, None]
        return k

    def scatter(self, offsets, g0, g1, q0, q1, val, col, keep):
        """Entries of target rows g0..g1-1 and neutron rows q0..q1-1; ``offsets`` (neutron row, target row):
        where the piece starts in each row. A source's grid row starts after the grid rows of the sources
        ahead of it; arrays run (neutron column, source), so a row's entries are written together."""
        s = self.src.span(g0, g1)
        e = self.cols.span(q0, q1)
        if s.start < s.stop and e.start < e.stop:
            at = self.cols.width[e, None] * self.src.rank[s]
            at += _per_source(offsets[self.cols.target[e] - q0] + self.cols.place[e, None], self.src.target[s] - g0)
            if self.own is not None:
                at += self.lead[s]
            v = (self.tab2[self.ia[s]] * self.sign[s, None]).T.take(self.ib2[e], axis=0)
            val[at] = v
            col[at] = self.cols.source[e, None] + self.src.col_base[s]
            if keep is not None:
                keep[at[v == 0]] = False
        if self.own is not None:
            own = self.own
            s = own.src.span(g0, g1)
            if s.start == s.stop:
                return
            at = self.cols.b[q0:q1, None] * own.jumps_before[s]
            at += _per_source(offsets, own.src.target[s] - g0)
            at += own.src.rank[s]
            at += self.own_place[q0:q1, None] * own.is_jump[s]
            val[at] = own.base[s] + own.sign[s] * own.y[q0:q1].take(own.column[s], axis=1)
            col[at] = np.arange(q0, q1, dtype=own.src.col_base.dtype)[:, None] + own.src.col_base[s]


class OwnPiece(_Arrays):
    """p' itself: the diagonal at n' and the neutron-move elements H_n(n',n) + s_n Σ_α v̄(αβ,αδ), all stored.
    Columns: H_n's pattern, the neutron jumps and n' (``is_own``), with H_n's value (base), the jump's sign
    (0: none) and its column of y_n (pair used, proton row: the spectator sums); diag: (neutron row, proton
    row)."""

    def __init__(self, target, source, base, sign, column, is_own, diag, y_n, col_base, n_rows):
        self.cols = _Columns(target, source, n_rows)
        self.base, self.sign, self.column = base, sign, column
        self.own_entry = np.flatnonzero(is_own)          # one per neutron row, in row order
        self.is_own = np.asarray(is_own, dtype=bool)      # the same as a flag per entry (the GPU fill's)
        self.diag, self.y_n, self.col_base = diag, y_n, col_base
        self.a = np.ones(diag.shape[1], dtype=np.int64)

    def sizes(self, g0, g1, q0, q1):
        return np.repeat(self.cols.b[q0:q1, None], g1 - g0, axis=1)

    def kept(self):
        return np.broadcast_to(self.cols.b, (len(self.a), len(self.cols.b)))

    def scatter(self, offsets, g0, g1, q0, q1, val, col, keep):
        e = self.cols.span(q0, q1)
        at = offsets[self.cols.target[e] - q0] + self.cols.place[e, None]
        v = self.base[e, None] + self.sign[e, None] * self.y_n[self.column[e], g0:g1]
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

    def to_device(self, xp):
        """A copy whose pieces' arrays are ``xp`` arrays (CuPy: on the current GPU), the run starts and the
        counts kept on the host."""
        out = copy.copy(self)
        moved = _upload_packed([a for piece in self.pieces for _, _, a in piece.host_arrays()], xp)
        out.pieces = [piece.on_device(moved) for piece in self.pieces]
        return out

    def fill(self, g0, g1, q0, q1, data, indices, scratch):
        """Rows of protons g0..g1-1 and neutrons q0..q1-1 (one proton, or every neutron, so that the rows are
        contiguous) into ``data`` / ``indices``, which hold exactly their stored entries. ``scratch``: a
        threading.local whose buffers this thread reuses from group to group."""
        sizes = [p.sizes(g0, g1, q0, q1) for p in self.pieces]                 # (neutron row, proton row)
        total = np.sum(sizes, axis=0).T.ravel()                               # rows in CSR order
        offsets = (np.cumsum(total) - total).reshape(g1 - g0, q1 - q0).T
        n_all = int(total.sum())
        if n_all == len(data):          # no zero dropped: straight into the caller's arrays
            val, col, keep = data, indices, None
        else:
            val, col, keep = scratch_buffers(scratch, n_all, data.dtype, indices.dtype)
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


def scratch_buffers(scratch, n, data_dtype, index_dtype, xp=np):
    """Views of n entries of this thread's uncompacted value, column and keep buffers (grown as needed; ``xp``'s
    arrays, on the current GPU for CuPy)."""
    have = getattr(scratch, "buffers", None)
    if have is None or len(have[0]) < n:
        size = max(n, 2 * len(have[0]) if have is not None else 0)
        have = scratch.buffers = (xp.empty(size, data_dtype), xp.empty(size, index_dtype), xp.empty(size, bool))
    return tuple(b[:n] for b in have)
