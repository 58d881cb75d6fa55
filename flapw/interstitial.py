"""Interstitial (plane-wave) parts of H and S through the step function Θ.

    Θ(q) = (1/Ω) ∫_IR e^{-iq·r} d³r = δ_q0 - Σ_a (4π/Ω) e^{-iq·τ_a} (sin qR_a - qR_a cos qR_a)/q³
    S_IR[G', G] = Θ(G' - G)          (row G', column G: the MT part carries e^{i(G-G')·τ})
    H_IR[G', G] = [¼(|k+G'|² + |k+G|²) + v0] Θ(G' - G)

The symmetrised kinetic form pairs with the ½ on the diagonal of T^AB (both sides of the sphere
boundary carry half of the surface term), which keeps the generalised eigenvalues variational.
The potential outside the spheres is the constant v0, so (VΘ)(q) = v0 Θ(q).

Θ is tabulated once per crystal on the integer box |q_i| <= span_i, which holds every difference of two
Miller indices of any k-point's basis (``table_span``). The table is C-ordered, so the entry of
q = m_r - m_c is table.flat[L[r] - L[c] + L0] with L = miller @ strides, L0 = span @ strides: one integer
outer difference and one take per block of H and S. Only the lower triangle (G' >= G) is added.
"""
import threading

import numpy as np

from .basis import reciprocal

__all__ = ["step_function_table", "table_span", "add_interstitial"]

# elements of H and S one host thread adds at once (its scratch: 32 B each) and the columns of such a tile
# (F-ordered H and S: contiguous runs of 4096 rows). AuAg Kmax 4.0 (N_G 13371) on 32 cores of a 2 x H200 node:
# 0.65-0.69 s with tiles of 2^16 elements in 16 columns, 0.20-0.21 s with 2^18 in 64, 0.22-0.24 s with 2^20 in
# 64 or 256, 0.31 s with 2^22 in 1024 (fewer numpy calls, each holding the interpreter lock for less of it)
HOST_TILE = 1 << 18
HOST_COLUMNS = 64
DEVICE_BLOCK = 1 << 22       # elements of H and S one GPU pass adds at once (scratch: 32 B each)
SCRATCH_BYTES = 32           # per element of a tile or block: the flat indices, Θ, the kinetic factors
_ATOMS = 64                  # atoms per structure-factor product


def _sphere_form(q, big_r):
    """(sin qR - qR cos qR)/q³, with its q -> 0 limit R³/3 (series below qR = 1e-3)."""
    x = q * big_r
    out = np.empty_like(q)
    small = x < 1e-3
    xs = x[~small]
    out[~small] = (np.sin(xs) - xs * np.cos(xs)) / q[~small] ** 3
    out[small] = big_r ** 3 * (1.0 / 3 - x[small] ** 2 / 30)
    return out


def table_span(lattice, kmax):
    """The largest |m_i - m'_i| of two Miller indices of a basis |k+G| <= kmax, at any k: a_i·(k+G) =
    2π (m_i + k_i) and |a_i·(k+G)| <= |a_i| kmax, so m_i + k_i lies in an interval of length |a_i| kmax / π."""
    lengths = np.linalg.norm(np.asarray(lattice, float), axis=1)
    return np.floor(kmax * lengths / np.pi + 1e-9).astype(np.int64)


def step_function_table(structure, span):
    """Θ(q) for every integer q with |q_i| <= span_i: a C-ordered complex array of shape 2·span + 1 whose
    entry [q + span] is Θ(q). The structure factor Σ_a e^{-2πi q·f_a} factorises over the three axes
    (f: fractional positions), so each group of atoms is one product of (q1 q2) x atoms by atoms x q3."""
    span = np.asarray(span, np.int64)
    dims = tuple(int(d) for d in 2 * span + 1)
    axes = [np.arange(-s, s + 1) for s in span]
    b = reciprocal(structure.lattice)
    qcart = (axes[0][:, None, None, None] * b[0] + axes[1][None, :, None, None] * b[1]
             + axes[2][None, None, :, None] * b[2])
    q = np.linalg.norm(qcart, axis=-1)
    del qcart
    theta = np.zeros(dims, complex)
    by_radius = {}
    for a, sp in enumerate(structure.species):
        by_radius.setdefault(sp.rmt, []).append(a)
    for big_r, atoms in by_radius.items():
        sfac = np.zeros((dims[0] * dims[1], dims[2]), complex)
        for chunk in range(0, len(atoms), _ATOMS):
            pos = np.asarray(structure.positions)[atoms[chunk:chunk + _ATOMS]]
            e = [np.exp(-2j * np.pi * np.outer(pos[:, i], axes[i])) for i in range(3)]     # (atoms, dims[i])
            pair = (e[0][:, :, None] * e[1][:, None, :]).reshape(len(pos), -1)
            sfac += pair.T @ e[2]
        theta -= (4 * np.pi / structure.omega) * _sphere_form(q, big_r) * sfac.reshape(dims)
    theta[tuple(span)] += 1.0
    return theta


def _flat_indices(miller, span):
    """(L, L0): the table's flat index of q = m_r - m_c is L[r] - L[c] + L0."""
    dims = 2 * np.asarray(span, np.int64) + 1
    strides = np.array([dims[1] * dims[2], dims[2], 1], np.int64)
    m = np.asarray(miller, np.int64)
    if len(m) and np.any(np.ptp(m, axis=0) > span):
        raise ValueError(f"the step-function table spans {tuple(int(x) for x in span)}, less than the basis's "
                         f"Miller index range {tuple(int(x) for x in np.ptp(m, axis=0))}")
    return m @ strides, int(np.asarray(span, np.int64) @ strides)


def add_interstitial(h, s, cell, xp=np, threads=None):
    """H += H_IR, S += S_IR on the lower triangle (G' >= G, diagonal included) of H and S, in place; the
    strict upper triangle is left as it was. ``xp``: numpy for host arrays (tiles spread over ``threads``
    threads, default every core this process may use), cupy for GPU arrays (column blocks in order on the
    current stream). Returns (h, s)."""
    basis = cell.basis
    n = basis.n_g
    if n == 0:
        return h, s
    table, span = cell.step_table
    big, base = _flat_indices(basis.miller, span)
    kin = basis.norm ** 2 / 4.0
    v0 = float(cell.model.v0)
    if xp is np:
        _host(h, s, table.reshape(-1), big, base, kin, v0, threads)
    else:
        _device(h, s, xp.asarray(table.reshape(-1)), xp.asarray(big - base), xp.asarray(big),
                xp.asarray(kin), xp.asarray(kin + v0), xp)
    return h, s


def _add_tile(h, s, r0, r1, c0, c1, table, lr, lc, kr, kc, idx, th, kin, xp, take):
    """Rows r0:r1, columns c0:c1 (r0 >= c0): S += Θ, H += (kin_r + kin_c + v0) Θ, the entries above the
    diagonal left out. lc = L[c] - L0 and kc = kin[c] + v0 for the columns; idx, th, kin: scratch."""
    xp.subtract(lr[:, None], lc[None, :], out=idx)
    take(table, idx, th)
    if r0 < c1:                          # the tile crosses the diagonal: drop its entries with column > row
        th[...] = xp.tril(th, r0 - c0)
    sv = s[r0:r1, c0:c1]
    xp.add(sv, th, out=sv)
    xp.add(kr[:, None], kc[None, :], out=kin)
    xp.multiply(th, kin, out=th)
    hv = h[r0:r1, c0:c1]
    xp.add(hv, th, out=hv)


def _host_take(table, idx, out):
    np.take(table, idx, out=out, mode="clip")      # every index is in range; "clip" writes out unbuffered


def _host(h, s, table, big, base, kin, v0, threads):
    """Tiles of about HOST_TILE elements down each column panel, on a pool of threads with scratch of their
    own: numpy releases the GIL in the take and the arithmetic."""
    from hybridblas.blas_threads import available_cores
    n = len(big)
    width = min(n, HOST_COLUMNS)
    rows = HOST_TILE // HOST_COLUMNS
    tiles = [(r0, min(n, r0 + rows), c0, min(n, c0 + width))
             for c0 in range(0, n, width) for r0 in range(c0, n, rows)]
    lc_all, kc_all = big - base, kin + v0
    local = threading.local()

    def one(tile):
        r0, r1, c0, c1 = tile
        if not hasattr(local, "idx"):
            local.idx = np.empty(rows * width, np.int64)
            local.th = np.empty(rows * width, complex)
            local.kin = np.empty(rows * width)
        shape = (r1 - r0, c1 - c0)
        size = shape[0] * shape[1]
        _add_tile(h, s, r0, r1, c0, c1, table, big[r0:r1], lc_all[c0:c1], kin[r0:r1], kc_all[c0:c1],
                  local.idx[:size].reshape(shape), local.th[:size].reshape(shape), local.kin[:size].reshape(shape),
                  np, _host_take)
    from hybridblas import workers
    workers.map(one, tiles, min(threads or available_cores(), len(tiles)))


def _device(h, s, table, lc_all, big, kin, kc_all, xp):
    """Column blocks of about DEVICE_BLOCK elements, each from its diagonal down, queued on the stream."""
    n = len(big)
    width = int(max(1, min(n, DEVICE_BLOCK // n)))

    def take(tab, idx, out):
        xp.take(tab, idx, out=out)
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width)
        shape = (n - c0, c1 - c0)
        _add_tile(h, s, c0, n, c0, c1, table, big[c0:], lc_all[c0:c1], kin[c0:], kc_all[c0:c1],
                  xp.empty(shape, np.int64), xp.empty(shape, complex), xp.empty(shape), xp, take)


def scratch_bytes(n_g, on_device, threads=None):
    """Bytes add_interstitial's scratch takes at once for N_G = n_g (the table is counted apart)."""
    if on_device:
        return SCRATCH_BYTES * min(n_g * n_g, max(n_g, DEVICE_BLOCK))
    from hybridblas.blas_threads import available_cores
    return SCRATCH_BYTES * min(n_g * n_g, HOST_TILE * (threads or available_cores()))
