"""Interstitial (plane-wave) parts of H and S through the step function Θ.

    Θ(q) = (1/Ω) ∫_IR e^{-iq·r} d³r = δ_q0 - Σ_a (4π/Ω) e^{-iq·τ_a} (sin qR_a - qR_a cos qR_a)/q³
    S_IR[G', G] = Θ(G' - G)          (row G', column G: the MT part carries e^{i(G-G')·τ})
    H_IR[G', G] = [¼(|k+G'|² + |k+G|²) + v0] Θ(G' - G)

The symmetrised kinetic form pairs with the ½ on the diagonal of T^AB (both sides of the sphere
boundary carry half of the surface term), which keeps the generalised eigenvalues variational.
The potential outside the spheres is the constant v0, so (VΘ)(q) = v0 Θ(q).
"""
import numpy as np

from .basis import reciprocal

__all__ = ["step_function_table", "add_interstitial"]


def _sphere_form(q, big_r):
    """(sin qR - qR cos qR)/q³, with its q -> 0 limit R³/3 (series below qR = 1e-3)."""
    x = q * big_r
    out = np.empty_like(q)
    small = x < 1e-3
    xs = x[~small]
    out[~small] = (np.sin(xs) - xs * np.cos(xs)) / q[~small] ** 3
    out[small] = big_r ** 3 * (1.0 / 3 - x[small] ** 2 / 30)
    return out


def step_function_table(structure, miller):
    """Θ on every integer difference of the Miller indices in ``miller``: (table, offset)."""
    span = miller.max(axis=0) - miller.min(axis=0)
    axes = [np.arange(-s, s + 1) for s in span]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    qcart = grid @ reciprocal(structure.lattice)
    q = np.linalg.norm(qcart, axis=1)
    theta = np.zeros(len(grid), complex)
    omega = structure.omega
    by_radius = {}
    for a, sp in enumerate(structure.species):
        by_radius.setdefault(sp.rmt, []).append(a)
    for big_r, atoms in by_radius.items():
        sfac = np.zeros(len(grid), complex)
        for chunk in range(0, len(atoms), 64):
            pos = structure.positions[atoms[chunk:chunk + 64]]
            sfac += np.exp(-2j * np.pi * (grid @ pos.T)).sum(axis=1)
        theta -= (4 * np.pi / omega) * _sphere_form(q, big_r) * sfac
    theta[np.all(grid == 0, axis=1)] += 1.0
    return theta.reshape([2 * s + 1 for s in span]), span


def add_interstitial(h, s, cell, xp=np, rows=1024):
    """H += H_IR, S += S_IR in place on full (or at least the lower triangle of) H and S."""
    basis = cell.basis
    table, span = step_function_table(cell.structure, basis.miller)
    m = basis.miller
    kin = basis.norm ** 2 / 4.0
    v0 = cell.model.v0
    n = basis.n_g
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        d = m[r0:r1, None, :] - m[None, :, :] + span
        th = table[d[..., 0], d[..., 1], d[..., 2]]
        hk = (kin[r0:r1, None] + kin[None, :] + v0) * th
        s[r0:r1] += xp.asarray(th)
        h[r0:r1] += xp.asarray(hk)
    return h, s
