"""Crystals: lattice vectors in bohr, fractional positions, species data; the presets and ASE crystals."""
import math
from dataclasses import dataclass

import numpy as np

from .basis import reciprocal

ANGSTROM = 1.0 / 0.529177210903     # bohr per ångström (CODATA 2018)
RMT_FILL = 0.95                     # default muffin-tin radii: this fraction of touching spheres
LMAX_RANGE = (2, 12)                # default lmax = ceil(max R_MT · Kmax), clipped to this range
ASE_HINT = 'install the ASE extra: pip install "hybridblas[ase]"'

__all__ = ["Species", "Structure", "PRESETS", "make_structure", "structure_from_ase", "import_ase", "default_rmt",
           "default_lmax", "neighbour_pairs", "ANGSTROM", "MissingDependency"]


class MissingDependency(ImportError, ValueError):
    """An optional dependency is not installed (an ImportError, and a ValueError so CLIs report it as bad input)."""


MIN_RMT = 0.05          # bohr: muffin tins below this leave the radial functions no mesh (NaN in H, S)


@dataclass(frozen=True)
class Species:
    """One chemical species: symbol, nuclear charge Z of the model potential, muffin-tin radius R_MT (bohr)."""
    symbol: str
    z: float
    rmt: float

    def __post_init__(self):
        if not isinstance(self.symbol, str) or not self.symbol:
            raise ValueError(f"species symbol must be a non-empty string, got {self.symbol!r}")
        for name in ("z", "rmt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                    or not np.isfinite(value) or value <= 0:
                raise ValueError(f"species {self.symbol}: {name} must be a positive number, got {value!r}")
        if self.rmt < MIN_RMT:
            raise ValueError(f"species {self.symbol}: rmt must be at least {MIN_RMT} bohr (the radial mesh starts at "
                             f"1e-5 bohr; atoms this close are not a crystal), got {self.rmt!r}")


SPECIES = {
    "Na": Species("Na", 11.0, 2.2), "Cl": Species("Cl", 17.0, 2.6),
    "Au": Species("Au", 79.0, 2.5), "Ag": Species("Ag", 47.0, 2.5),
    "Ti": Species("Ti", 22.0, 1.95), "O": Species("O", 8.0, 1.55),
}


@dataclass
class Structure:
    """A periodic crystal: ``lattice`` rows are the cell vectors (bohr), ``positions`` the (N_A, 3) fractional
    coordinates, ``species`` one Species per atom, ``lmax`` the angular cutoff of every muffin tin.

    Checked on creation: a 3D cell, at least one atom, finite coordinates, one Species per atom, one
    Species value per symbol (radial functions are computed per symbol) and muffin tins that do not overlap.
    """
    name: str
    lattice: np.ndarray
    positions: np.ndarray
    species: list
    lmax: int

    def __post_init__(self):
        self.lattice = np.array(self.lattice, dtype=float)
        self.positions = np.array(self.positions, dtype=float)
        if self.positions.ndim != 2 or self.positions.shape[1:] != (3,) or len(self.positions) == 0:
            raise ValueError(f"positions must be an (N_A, 3) array with N_A >= 1, got shape {self.positions.shape}"
                             + (" (an empty structure)" if self.positions.size == 0 else ""))
        if not np.all(np.isfinite(self.positions)):
            raise ValueError("positions must be finite fractional coordinates")
        _check_lattice(self.lattice)
        self.species = list(self.species)
        if len(self.species) != len(self.positions) or not all(isinstance(s, Species) for s in self.species):
            raise ValueError(f"species must be one Species per atom ({len(self.positions)}), "
                             f"got {len(self.species)} items")
        by_symbol = {}
        for sp in self.species:
            if by_symbol.setdefault(sp.symbol, sp) != sp:
                raise ValueError(f"species {sp.symbol!r} appears with two values, {by_symbol[sp.symbol]} and {sp}: "
                                 "give each distinct species its own symbol")
        if isinstance(self.lmax, bool) or not isinstance(self.lmax, (int, np.integer)) or self.lmax < 0:
            raise ValueError(f"lmax must be a non-negative integer, got {self.lmax!r}")
        self.lmax = int(self.lmax)
        _check_muffin_tins(self)

    @property
    def n_atoms(self):
        return len(self.species)

    @property
    def omega(self):
        return abs(float(np.linalg.det(self.lattice)))

    @property
    def cartesian(self):
        return self.positions @ self.lattice


def _check_lattice(lattice):
    if lattice.shape != (3, 3) or not np.all(np.isfinite(lattice)):
        raise ValueError(f"lattice must be three finite vectors (a 3x3 array, bohr), got {lattice!r}")
    volume = abs(float(np.linalg.det(lattice)))
    if volume <= 1e-10 * float(np.prod(np.linalg.norm(lattice, axis=1))):
        raise ValueError(f"lattice vectors must span three dimensions, got {lattice.tolist()} "
                         f"(cell volume {volume:.3g} bohr^3)")


def neighbour_pairs(lattice, positions, cutoff):
    """(i, j, d): every pair of atoms i, j (periodic images of j included; i's own site excluded) at a
    distance d <= cutoff (bohr). Translations are searched as far as the cutoff needs: a vector's fractional
    component along a_n is at most cutoff·|b_n|/2π, so skewed cells are covered too."""
    n = len(positions)
    span = np.ceil(cutoff * np.linalg.norm(reciprocal(lattice), axis=1) / (2 * np.pi) + 0.5).astype(int)
    shifts = np.stack(np.meshgrid(*[np.arange(-s, s + 1) for s in span], indexing="ij"), -1).reshape(-1, 3)
    t = shifts @ lattice                                       # Cartesian translations
    t2 = np.einsum("ij,ij->i", t, t)
    zero = int(np.flatnonzero(np.all(shifts == 0, axis=1))[0])
    rows = max(1, 2 ** 22 // max(1, n * len(shifts)))        # atoms i per step: ~32 MB of distances
    out_i, out_j, out_d = [], [], []
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        d = positions[None, :, :] - positions[i0:i1, None, :]
        v = (d - np.round(d)) @ lattice                         # (rows, n, 3)
        # |v + t|² = |v|² + 2 v·t + |t|²: one product over all translations
        dist2 = np.einsum("abk,abk->ab", v, v)[:, :, None] + 2.0 * (v @ t.T) + t2[None, None, :]
        own = np.arange(i0, i1)
        dist2[own - i0, own, zero] = np.inf                     # an atom's own site
        i, j, s = np.nonzero(dist2 <= cutoff * cutoff)
        out_i.append(i + i0)
        out_j.append(j)
        out_d.append(np.sqrt(np.maximum(dist2[i, j, s], 0.0)))
    return np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_d)


def _check_muffin_tins(structure):
    """ValueError naming the two atoms, their radii and distance where muffin-tin spheres overlap."""
    rmt = np.array([sp.rmt for sp in structure.species])
    i, j, d = neighbour_pairs(structure.lattice, structure.positions, 2 * rmt.max())
    excess = rmt[i] + rmt[j] - d
    if len(excess) == 0 or excess.max() <= 1e-12 * d.max():
        return
    w = int(np.argmax(excess))
    a, b, dist = int(i[w]), int(j[w]), float(d[w])
    sa, sb = structure.species[a], structure.species[b]
    if dist < 1e-8:
        raise ValueError(f"atoms {a} ({sa.symbol}) and {b} ({sb.symbol}) sit at the same site")
    raise ValueError(f"muffin-tin spheres overlap: atom {a} ({sa.symbol}, rmt={sa.rmt:.4f}) and atom {b} "
                     f"({sb.symbol}, rmt={sb.rmt:.4f}) are {dist:.4f} bohr apart, less than rmt sum "
                     f"{sa.rmt + sb.rmt:.4f}; give smaller rmt")


def default_rmt(lattice, positions, symbols, fill=RMT_FILL):
    """{symbol: R_MT}: ``fill`` times half the shortest distance from any atom of that species to another atom
    (touching spheres scaled down). Any two spheres then stay ``fill`` times their distance apart or less."""
    lattice, positions = np.asarray(lattice, float), np.asarray(positions, float)
    cutoff = float(np.linalg.norm(lattice, axis=1).min())     # an atom's own image is this far at most
    i, _, d = neighbour_pairs(lattice, positions, cutoff * (1 + 1e-9))
    nearest = np.full(len(positions), np.inf)
    np.minimum.at(nearest, i, d)
    out = {}
    for a, s in enumerate(symbols):
        if nearest[a] < 1e-8:
            raise ValueError(f"atom {a} ({s}) sits at the same site as another atom")
        out[s] = min(out.get(s, np.inf), float(fill * nearest[a] / 2))
    return out


def default_lmax(rmt, kmax):
    """ceil(max R_MT · Kmax) clipped to LMAX_RANGE: the LAPW rule of thumb l_max ≈ R_MT·K_max."""
    lo, hi = LMAX_RANGE
    return int(min(hi, max(lo, np.ceil(max(rmt) * kmax - 1e-9))))


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


MAX_CELLS = 1000        # cells of a supercell: 10 x 10 x 10 (TiO2: 6000 atoms) is far beyond what a node builds


def _supercell(supercell):
    try:
        sc = tuple(supercell)
        ok = len(sc) == 3 and not any(isinstance(s, bool) or int(s) != s or s < 1 for s in sc)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"supercell must be three positive integers, got {supercell!r}")
    if math.prod(int(s) for s in sc) > MAX_CELLS:
        raise ValueError(f"supercell must hold at most {MAX_CELLS} cells, got {supercell!r}")
    return tuple(int(s) for s in sc)


def make_structure(name, supercell=None, lmax=None):
    if name not in PRESETS:
        raise ValueError(f"system must be one of {sorted(PRESETS)}, got {name!r}")
    builder, default_sc, preset_lmax = PRESETS[name]
    sc = _supercell(default_sc if supercell is None else supercell)
    lm = preset_lmax if lmax is None else lmax
    if int(lm) != lm or lm < 0:
        raise ValueError(f"lmax must be a non-negative integer, got {lmax!r}")
    lat, pos, names = builder(sc)
    return Structure(name, lat, pos, [SPECIES[s] for s in names], int(lm))


def import_ase():
    """The ase package with ase.io, or MissingDependency naming the pip extra."""
    try:
        import ase
        import ase.io
    except ImportError:
        raise MissingDependency(f"reading crystals needs ASE (the Atomic Simulation Environment); {ASE_HINT}") from None
    return ase


def structure_from_ase(atoms, kmax, rmt=None, lmax=None, supercell=None, name=None):
    """A Structure from an ase.Atoms crystal (ångström converted to bohr); the defaults are System.from_ase's."""
    ase = import_ase()
    if not isinstance(atoms, ase.Atoms):
        raise TypeError(f"atoms must be an ase.Atoms, got {type(atoms).__name__}")
    if len(atoms) == 0:
        raise ValueError("atoms is an empty structure (no atoms)")
    if not all(atoms.pbc):
        raise ValueError(f"atoms must be periodic in all three directions, got pbc={atoms.pbc.tolist()}")
    if supercell is not None:
        atoms = atoms.repeat(_supercell(supercell))
    symbols = atoms.get_chemical_symbols()
    if "X" in symbols:
        raise ValueError(f"atoms holds a dummy atom 'X' (atom {symbols.index('X')}); every atom needs an element")
    lattice = np.array(atoms.cell.array, float) * ANGSTROM
    _check_lattice(lattice)
    positions = atoms.get_scaled_positions(wrap=True)
    radii = _species_rmt(rmt, lattice, positions, symbols)
    charge = dict(zip(symbols, atoms.numbers.tolist()))
    species = {s: Species(s, float(charge[s]), radii[s]) for s in charge}
    lm = default_lmax([sp.rmt for sp in species.values()], kmax) if lmax is None else lmax
    return Structure(name or atoms.get_chemical_formula(), lattice, positions, [species[s] for s in symbols], lm)


def _species_rmt(rmt, lattice, positions, symbols):
    """{symbol: R_MT} from None (defaults), one number (every species) or {symbol: number} (defaults for the rest)."""
    present = sorted(set(symbols))
    if rmt is None:
        given = {}
    elif isinstance(rmt, dict):
        unknown = sorted(set(rmt) - set(present))
        if unknown:
            raise ValueError(f"rmt names species {unknown} that the crystal lacks (it has {present})")
        given = dict(rmt)
    elif isinstance(rmt, (int, float, np.number)) and not isinstance(rmt, bool):
        given = {s: rmt for s in present}
    else:
        raise ValueError(f"rmt must be None, a number (bohr) or a dict {{symbol: bohr}}, got {rmt!r}")
    if len(given) < len(present):
        given = {**default_rmt(lattice, positions, symbols), **given}
    return given
