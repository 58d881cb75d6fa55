"""Crystal presets as P1 supercells: lattice vectors in bohr, fractional positions, species data."""
from dataclasses import dataclass

import numpy as np

ANGSTROM = 1.0 / 0.529177210903     # bohr per ångström (CODATA 2018)

__all__ = ["Species", "Structure", "PRESETS", "make_structure", "ANGSTROM"]


@dataclass(frozen=True)
class Species:
    """One chemical species: nuclear charge of the model potential and muffin-tin radius (bohr)."""
    symbol: str
    z: float
    rmt: float


SPECIES = {
    "Na": Species("Na", 11.0, 2.2), "Cl": Species("Cl", 17.0, 2.6),
    "Au": Species("Au", 79.0, 2.5), "Ag": Species("Ag", 47.0, 2.5),
    "Ti": Species("Ti", 22.0, 1.95), "O": Species("O", 8.0, 1.55),
}


@dataclass
class Structure:
    name: str
    lattice: np.ndarray          # rows are the supercell lattice vectors (bohr)
    positions: np.ndarray        # (N_A, 3) fractional coordinates in the supercell
    species: list                # Species per atom
    lmax: int

    @property
    def n_atoms(self):
        return len(self.species)

    @property
    def omega(self):
        return abs(float(np.linalg.det(self.lattice)))

    @property
    def cartesian(self):
        return self.positions @ self.lattice


def _tile(cell, frac, supercell):
    """Repeat a conventional cell (fractional sites) n1×n2×n3 times; return supercell lattice, sites."""
    n = np.asarray(supercell, dtype=int)
    shifts = np.array([(i, j, k) for i in range(n[0]) for j in range(n[1]) for k in range(n[2])], float)
    sites = (frac[None, :, :] + shifts[:, None, :]).reshape(-1, 3) / n
    return cell * n[:, None], sites


def _nacl(supercell):
    a = 5.64 * ANGSTROM
    fcc = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]])
    frac = np.vstack([fcc, fcc + [0.5, 0, 0]]) % 1.0
    lat, pos = _tile(np.eye(3) * a, frac, supercell)
    per = ["Na"] * 4 + ["Cl"] * 4
    names = per * (len(pos) // 8)
    return lat, pos, names


def _auag(supercell):
    a = 4.08 * ANGSTROM
    fcc = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]])
    lat, pos = _tile(np.eye(3) * a, fcc, supercell)
    n = len(pos)
    n_ag = max(1, round(n * 10 / 108))                       # 98 Au + 10 Ag in the 108-site cell
    ag = {int(j * n / n_ag) for j in range(n_ag)}            # spread evenly through the site list
    return lat, pos, ["Ag" if i in ag else "Au" for i in range(n)]


def _tio2(supercell):
    a, c, u = 4.594 * ANGSTROM, 2.959 * ANGSTROM, 0.305
    frac = np.array([[0, 0, 0], [.5, .5, .5],
                     [u, u, 0], [-u, -u, 0], [.5 + u, .5 - u, .5], [.5 - u, .5 + u, .5]]) % 1.0
    lat, pos = _tile(np.diag([a, a, c]), frac, supercell)
    return lat, pos, (["Ti"] * 2 + ["O"] * 4) * (len(pos) // 6)


# name -> (builder, default supercell, lmax)
PRESETS = {
    "NaCl": (_nacl, (2, 2, 2), 6),        # 64 atoms: the cell the paper's Table-1 N_G fit
    "NaCl-512": (_nacl, (4, 4, 4), 6),    # 512 atoms: the N_A the paper's Table 1 names
    "AuAg": (_auag, (3, 3, 3), 10),
    "TiO2": (_tio2, (4, 4, 4), 8),
}


def make_structure(name, supercell=None, lmax=None):
    if name not in PRESETS:
        raise ValueError(f"system must be one of {sorted(PRESETS)}, got {name!r}")
    builder, default_sc, default_lmax = PRESETS[name]
    sc = default_sc if supercell is None else tuple(supercell)
    if len(sc) != 3 or any(int(s) != s or s < 1 for s in sc):
        raise ValueError(f"supercell must be three positive integers, got {supercell!r}")
    lm = default_lmax if lmax is None else lmax
    if int(lm) != lm or lm < 0:
        raise ValueError(f"lmax must be a non-negative integer, got {lmax!r}")
    lat, pos, names = builder(tuple(int(s) for s in sc))
    return Structure(name, lat, pos, [SPECIES[s] for s in names], int(lm))
