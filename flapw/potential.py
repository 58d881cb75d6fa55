"""Model potentials and the k-independent T matrices (computed once, reused for every k-point).

Model ("model"): inside sphere a, V(r) = v_sph(r) + Σ_{λ,μ} V_λμ(r) Y_λμ(r̂) with a screened Coulomb
    v_sph(r) = -Z e^{-r/s}/r + Z e^{-R/s}/R + v0      (s = R/4; continuous with the constant v0 outside)
and a crystal field from the nearest-neighbour shell (directions d̂_n, n = 1..N):
    V_λμ(r) = c_ns (r/R)^λ (4π/(2λ+1)) (1/N) Σ_n Y*_λμ(d̂_n),   λ ∈ {2, 4, 6}.
Built from the neighbours, V_λμ has exactly the site symmetry: λ = 2 cancels on cubic sites (NaCl,
fcc AuAg) and survives on the rutile sites. V is real since V_λ,-μ = (-1)^μ V*_λμ.
Empty lattice ("empty"): V = v0 everywhere, no non-spherical terms.
"""
from dataclasses import dataclass

import numpy as np
from scipy.special import sph_harm_y

from .radial import RadialMesh, solve_radial
from .wigner import gaunt_table

__all__ = ["PotentialModel", "AtomClass", "TMatrices", "build_t_matrices", "lm_index"]

LAMBDAS = (2, 4, 6)


def lm_index(lmax):
    """l of each compound index L = l² + l + m."""
    return np.concatenate([np.full(2 * l + 1, l) for l in range(lmax + 1)])


@dataclass(frozen=True)
class PotentialModel:
    kind: str = "model"        # "model" or "empty"
    v0: float = 0.0            # interstitial (muffin-tin zero) potential, Ha
    ns_strength: float = 0.1   # c_ns, Ha: size of the non-spherical terms at r = R
    screening: float = 0.25    # s / R

    def __post_init__(self):
        if self.kind not in ("model", "empty"):
            raise ValueError(f"potential must be 'model' or 'empty', got {self.kind!r}")

    def spherical(self, species):
        if self.kind == "empty":
            return lambda r: np.full_like(r, self.v0)
        z, big_r, s = species.z, species.rmt, self.screening * species.rmt
        shift = z * np.exp(-big_r / s) / big_r + self.v0
        return lambda r: -z * np.exp(-r / s) / r + shift


def _neighbour_directions(structure, atom, tol=1.02):
    """Unit vectors to the nearest-neighbour shell of ``atom`` (periodic images included)."""
    lat = structure.lattice
    d = structure.positions - structure.positions[atom]
    d -= np.round(d)
    imgs = np.array([(i, j, k) for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)], float)
    vec = ((d[:, None, :] + imgs[None, :, :]).reshape(-1, 3)) @ lat
    dist = np.linalg.norm(vec, axis=1)
    vec, dist = vec[dist > 1e-8], dist[dist > 1e-8]
    shell = dist <= dist.min() * tol
    return vec[shell] / dist[shell][:, None]


def crystal_field(structure, atom, model):
    """{λ: array of V_λμ / (r/R)^λ for μ = -λ..λ} on ``atom`` (empty for the empty lattice)."""
    if model.kind == "empty" or model.ns_strength == 0:
        return {}
    dirs = _neighbour_directions(structure, atom)
    theta = np.arccos(np.clip(dirs[:, 2], -1, 1))
    phi = np.arctan2(dirs[:, 1], dirs[:, 0])
    out = {}
    for lam in LAMBDAS:
        mus = np.arange(-lam, lam + 1)
        ylm = sph_harm_y(lam, mus[:, None], theta[None, :], phi[None, :])
        c = model.ns_strength * 4 * np.pi / (2 * lam + 1) * np.conj(ylm).mean(axis=1)
        c[np.abs(c) < 1e-12 * model.ns_strength] = 0.0      # symmetry-forbidden terms are exact zeros
        if np.any(c):
            out[lam] = c
    return out


@dataclass
class AtomClass:
    """Atoms that share species and crystal field share radial functions and T matrices."""
    species: object
    field: dict
    atoms: list


def atom_classes(structure, model):
    classes, index = [], {}
    for a, sp in enumerate(structure.species):
        field = crystal_field(structure, a, model)
        key = (sp.symbol,) + tuple((lam, tuple(np.round(c, 10))) for lam, c in sorted(field.items()))
        if key not in index:
            index[key] = len(classes)
            classes.append(AtomClass(sp, field, []))
        classes[index[key]].atoms.append(a)
    return classes


@dataclass
class TMatrices:
    """Per atom class: T^AA, T^AB (T^BA = T^ABᴴ), T^BB (N_L×N_L) and U = diag(‖u̇_l‖)."""
    taa: np.ndarray
    tab: np.ndarray
    tbb: np.ndarray
    udot_norm_lm: np.ndarray


def build_t_matrices(cls, radial, lmax):
    """T^AA = δ E_l + Σ G ∫u V u r²dr,  T^AB = δ ½ + Σ G ∫u V u̇ r²dr,  T^BB = δ E_l‖u̇‖² + Σ G ∫u̇ V u̇ r²dr."""
    ls = lm_index(lmax)
    e = radial.e_l[ls]
    un = radial.udot_norm[ls]
    taa = np.diag(e).astype(complex)
    tab = np.diag(np.full(len(ls), 0.5)).astype(complex)
    tbb = np.diag(e * un ** 2).astype(complex)
    mesh, p, pd = radial.mesh, radial.p, radial.pdot
    big_r = mesh.r[-1]
    for lam, coef in cls.field.items():
        g = gaunt_table(lmax, lam)                               # [L', μ+λ, L]
        gc = np.tensordot(g, coef, axes=([1], [0]))              # Σ_μ G(L',λμ,L) c_λμ
        rad = (mesh.r / big_r) ** lam
        i_uu = mesh.integrate(p[:, None, :] * p[None, :, :] * rad)     # [l', l]
        i_ud = mesh.integrate(p[:, None, :] * pd[None, :, :] * rad)
        i_dd = mesh.integrate(pd[:, None, :] * pd[None, :, :] * rad)
        taa += gc * i_uu[np.ix_(ls, ls)]
        tab += gc * i_ud[np.ix_(ls, ls)]
        tbb += gc * i_dd[np.ix_(ls, ls)]
    return TMatrices(taa, tab, tbb, un)


def radial_for_species(species, model, lmax, e_l, n_mesh=1501):
    mesh = RadialMesh.log(species.rmt, n=n_mesh)
    return solve_radial(model.spherical(species), lmax, e_l, mesh)
