"""System: a crystal, its G+k basis at one k-point, and the k-independent data (radial functions, T).

Crystals come from the presets (``System.preset``), from ASE (``System.from_ase``, ``System.from_file``)
or from a ``Structure`` made by hand (``System(structure, kmax)``). A system is cheap: nothing heavy is
computed until a build asks for it.  ``with_k`` returns the same
crystal at another k-point sharing the k-independent caches, so radial functions and T matrices are
computed once for all k-points (SIRIUS's split between the k-independent Hamiltonian and the k-set).
"""
import math
import numbers
import time

import numpy as np

from .basis import GkBasis
from .potential import PotentialModel, atom_classes, build_t_matrices, radial_for_species
from .structures import PRESETS, import_ase, make_structure, structure_from_ase

__all__ = ["System", "DEFAULT_K"]

DEFAULT_K = (0.1234, 0.2345, 0.3456)     # generic k (supercell reciprocal units); Table 1's N_G are even


class _Shared:
    """k-independent data, filled on first use and shared by every k-point of a crystal."""

    def __init__(self, kmax):
        self.classes = None
        self.radial = None
        self.tmats = None
        self.step_table = None
        self.kmax = kmax            # the largest cutoff of the systems sharing it: the step table's box is made for it
        self.seconds = {}


def _check_kmax(kmax):
    if isinstance(kmax, (bool, np.bool_)) or not isinstance(kmax, numbers.Real) or not np.isfinite(kmax) or kmax <= 0:
        raise ValueError(f"kmax must be a positive number (1/bohr), got {kmax!r}")


K_LIMIT = 100.0     # |k| per coordinate: k and k + G are one k-point; the basis search grows with |k| (and past
                    # ~1e15 |k + G| loses its digits)
V0_LIMIT = 100.0    # Ha: |v0| and |ns_strength| beyond this make the radial solutions overflow (NaN in H, S)


def _check_k(k):
    try:
        out = tuple(float(x) for x in k)
    except (TypeError, ValueError):
        raise ValueError(f"k must be three fractional coordinates, got {k!r}") from None
    if len(out) != 3 or not all(math.isfinite(x) and abs(x) <= K_LIMIT for x in out):
        raise ValueError(f"k must be three finite fractional coordinates in [-{K_LIMIT:g}, {K_LIMIT:g}] (k and k + G "
                         f"are the same k-point), got {k!r}")
    return out


def _bounded(value, name, limit, unit):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or abs(value) > limit:
        raise ValueError(f"{name} must be a finite number of {unit} in [-{limit:g}, {limit:g}], got {value!r}")
    return float(value)


class System:
    def __init__(self, structure, kmax, k=DEFAULT_K, potential="model", v0=0.0, e_l=None,
                 ns_strength=0.1, _shared=None):
        _check_kmax(kmax)
        self.structure = structure
        self.kmax = float(kmax)
        self.k = _check_k(k)
        self.model = PotentialModel(potential, _bounded(v0, "v0", V0_LIMIT, "Ha"),
                                    _bounded(ns_strength, "ns_strength", V0_LIMIT, "Ha"))
        self.e_l = self._parse_e_l(e_l, structure.lmax)
        held = {sp.symbol for sp in structure.species}
        unknown = sorted(set(self.e_l) - {"*"} - held)
        if unknown:
            raise ValueError(f"e_l names species {unknown} that the crystal does not hold ({sorted(held)})")
        self._basis = None
        self._shared = _shared if _shared is not None else _Shared(self.kmax)

    @staticmethod
    def _parse_e_l(e_l, lmax):
        """E_l per species symbol: None -> 0 Ha for every l; a number; a list per l; or {symbol: ...}."""
        def one(v):
            try:
                arr = np.broadcast_to(np.asarray(0.0 if v is None else v, float), (lmax + 1,)).copy()
            except (TypeError, ValueError):
                raise ValueError(f"e_l must be a number or {lmax + 1} numbers (one per l) per species, got "
                                 f"{v!r}") from None
            if not np.all(np.isfinite(arr)) or np.abs(arr).max() > V0_LIMIT:
                raise ValueError(f"e_l must be finite energies within ±{V0_LIMIT:g} Ha, got {v!r}")
            return arr
        if isinstance(e_l, dict):
            return {s: one(v) for s, v in e_l.items()}
        try:
            return {"*": one(e_l)}
        except ValueError as exc:
            raise ValueError(f"e_l must be a number, {lmax + 1} numbers or a dict by species, got {e_l!r} "
                             f"({exc})") from None

    @classmethod
    def preset(cls, name, kmax=3.0, k=DEFAULT_K, *, potential="model", v0=0.0, e_l=None,
               supercell=None, lmax=None, ns_strength=0.1):
        """NaCl (64 atoms), NaCl-512, AuAg (108 atoms), TiO2 (384 atoms); ``supercell`` shrinks them for tests."""
        if name not in PRESETS:
            raise ValueError(f"system must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(make_structure(name, supercell, lmax), kmax, k, potential, v0, e_l, ns_strength)

    @classmethod
    def from_ase(cls, atoms, kmax=3.0, k=DEFAULT_K, *, rmt=None, lmax=None, supercell=None, potential="model",
                 v0=0.0, e_l=None, ns_strength=0.1, name=None):
        """A crystal given as an ``ase.Atoms`` (periodic in 3D; ASE's ångström are converted to bohr).

        rmt:       muffin-tin radii in bohr: None, one number for every species, or {symbol: bohr} (the
                   species it leaves out get the default). Default: 0.95 × half the shortest distance from
                   an atom of that species to any other atom (touching spheres, scaled down by 5 %).
        lmax:      one angular cutoff for every atom (the stacked HSDLA operands have one N_L per atom).
                   Default: ceil(max R_MT · Kmax) clipped to [2, 12], the LAPW rule l_max ≈ R_MT·K_max.
        supercell: repeat the cell n1×n2×n3 first (``atoms.repeat``); k is in units of the repeated cell.
        name:      the report's system name (default: the chemical formula).
        Species are the chemical elements; the model potential's Z is the atomic number (the screening
        length R_MT/4, ``v0``, ``e_l``, ``ns_strength`` are as for the presets). Raises ValueError for an
        empty or non-periodic structure, a cell that does not span 3D, coincident atoms or overlapping
        muffin tins, naming the value; MissingDependency (an ImportError and a ValueError) without ASE.
        """
        _check_kmax(kmax)
        structure = structure_from_ase(atoms, kmax, rmt=rmt, lmax=lmax, supercell=supercell, name=name)
        return cls(structure, kmax, k, potential, v0, e_l, ns_strength)

    @classmethod
    def from_file(cls, path, kmax=3.0, k=DEFAULT_K, *, format=None, index=-1, name=None, **options):
        """The crystal in a file that ``ase.io.read`` reads (CIF, POSCAR, extended XYZ, ...; ``format`` as
        ASE names it, guessed from the name when None; ``index``: which image of a multi-image file). The
        other options are ``from_ase``'s; the default name is the file's name."""
        import os
        ase = import_ase()
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"structure file {path!r} does not exist or is not a file")
        try:
            atoms = ase.io.read(path, index=index, format=format)
        except Exception as exc:       # ASE's readers raise many kinds; report one, naming the file
            raise ValueError(f"could not read a crystal from {path!r}: {type(exc).__name__}: {exc}") from None
        if not isinstance(atoms, ase.Atoms):
            raise ValueError(f"index={index!r} selects {len(atoms)} images of {path!r}; give one image")
        return cls.from_ase(atoms, kmax, k, name=name or os.path.basename(path), **options)

    def with_k(self, k):
        """The same crystal and potential at another k-point; radial functions and T are shared."""
        other = System.__new__(System)
        other.__dict__.update(self.__dict__)
        other.k = _check_k(k)
        other._basis = None
        return other

    def with_kmax(self, kmax):
        """The same crystal and k-point with a smaller (or equal) cutoff, sharing the k-independent data
        (radial functions and T do not depend on Kmax; the step-function table of the larger cutoff holds
        every Miller index difference of the smaller basis)."""
        _check_kmax(kmax)
        if kmax > self.kmax:
            raise ValueError(f"kmax must not exceed this system's {self.kmax}, got {kmax!r}")
        other = self.with_k(self.k)
        other.kmax = float(kmax)
        return other

    # ---------------------------------------------------------------- sizes
    @property
    def name(self):
        return self.structure.name

    @property
    def n_atoms(self):
        return self.structure.n_atoms

    @property
    def n_l(self):
        return (self.structure.lmax + 1) ** 2

    @property
    def lmax(self):
        return self.structure.lmax

    @property
    def omega(self):
        return self.structure.omega

    @property
    def basis(self):
        if self._basis is None:
            self._basis = GkBasis(self.structure.lattice, self.k, self.kmax)
        return self._basis

    @property
    def n_g(self):
        return self.basis.n_g

    # ---------------------------------------------------------------- k-independent data
    def e_l_for(self, symbol):
        return self.e_l.get(symbol, self.e_l.get("*", np.zeros(self.lmax + 1)))

    @property
    def classes(self):
        sh = self._shared
        if sh.classes is None:
            t0 = time.perf_counter()
            sh.classes = atom_classes(self.structure, self.model)
            sh.seconds["crystal field"] = time.perf_counter() - t0
        return sh.classes

    @property
    def radial(self):
        """{species symbol: RadialSolution}."""
        sh = self._shared
        if sh.radial is None:
            t0 = time.perf_counter()
            species = {sp.symbol: sp for sp in self.structure.species}
            sh.radial = {s: radial_for_species(sp, self.model, self.lmax, self.e_l_for(s))
                         for s, sp in species.items()}
            sh.seconds["radial functions"] = time.perf_counter() - t0
        return sh.radial

    @property
    def tmats(self):
        """T matrices per atom class (list parallel to ``classes``)."""
        sh = self._shared
        if sh.tmats is None:
            classes, radial = self.classes, self.radial
            t0 = time.perf_counter()
            sh.tmats = [build_t_matrices(c, radial[c.species.symbol], self.lmax) for c in classes]
            sh.seconds["T matrices"] = time.perf_counter() - t0
        return sh.tmats

    @property
    def step_table(self):
        """(Θ table, span): the step function on every integer q with |q_i| <= span_i, a box that holds the
        Miller index differences of the basis at any k-point (flapw.interstitial), computed once."""
        sh = self._shared
        if sh.step_table is None:
            from .interstitial import step_function_table, table_span
            t0 = time.perf_counter()
            span = table_span(self.structure.lattice, sh.kmax)     # a smaller-cutoff copy may ask first
            sh.step_table = (step_function_table(self.structure, span), span)
            sh.seconds["step function"] = time.perf_counter() - t0
        return sh.step_table

    def atom_class_index(self):
        out = np.empty(self.n_atoms, int)
        for i, c in enumerate(self.classes):
            out[c.atoms] = i
        return out

    def setup_seconds(self):
        return dict(self._shared.seconds)

    def __repr__(self):
        return (f"System({self.name!r}, N_A={self.n_atoms}, N_L={self.n_l}, kmax={self.kmax}, "
                f"k={self.k}, potential={self.model.kind!r})")
