"""H and S files a FLAPW code can read back: per k-point H, S, k, N_G and the basis G-vectors (integer
Miller indices in basis order), with the crystal, Kmax, method and units.

    with HSWriter("hs.h5", cell, method="refined", interstitial=True, n_kpoints=1) as out:
        out.add(0, cell, h, s)
    data = read_hs("hs.h5")                    # {"system": "NaCl", ..., "kpoints": [{"H": ..., ...}]}

Two containers, one layout (docs/flapw.md lists every field):

* ``.npz`` (numpy): per k-point ``H_<i>``, ``S_<i>``, ``k_<i>``, ``k_cart_<i>``, ``miller_<i>``, ``N_G_<i>``;
  the rest as top-level arrays (strings as 0-d unicode arrays: ``np.load`` needs no pickle).
* ``.h5`` / ``.hdf5`` (h5py, ``pip install "hybridblas[hdf5]"``): per k-point a group ``kpoint_<i>`` with
  datasets ``H``, ``S``, ``k``, ``k_cart``, ``miller`` and attribute ``N_G``; scalars and strings as
  attributes of the root, crystal arrays as root datasets. Complex numbers are h5py's compound (r, i).

H and S are stored whole (``triangle = "full"``): both triangles hold the Hermitian matrices. A build that
made only the lower triangle (``flapw build``'s default, ``build_hs(lower_only=True)``) is written with
``add(..., lower=True)``: the upper triangle is written as the conjugate of the lower one, row block by row
block, so the file is the same as after a Hermitian fill and the arrays in memory are not changed.
With eigenpairs (``flapw build --solve NEV --vectors``) a k-point also holds ``eigenvalues`` (NEV, Ha,
ascending) and ``eigenvectors`` (N_G x NEV, columns S-orthonormal: XᴴSX = 1).
H[i, j] = <φ_i|H|φ_j> (row i is the bra), φ_i = e^{i(k+G_i)·r}/√Ω in the interstitial with
G_i = miller[i] @ reciprocal. Arrays are written in numpy's (row-major) index order; a Fortran reader of
the HDF5 file sees every array transposed (H(j, i) = H[i, j]: the conjugate of the Hermitian H; miller(1:3, i)).

A file is written to a temporary name in the same folder and moved into place when complete, so a run
that fails leaves no partial file behind.
"""
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

import hybridblas as hb

from .basis import reciprocal

__all__ = ["HSWriter", "write_hs", "read_hs", "file_format", "check_writable", "rank_path", "FORMAT", "FORMAT_VERSION",
           "HDF5_HINT"]

FORMAT = "flapw-hs"
FORMAT_VERSION = 1
HDF5_HINT = 'install the HDF5 extra: pip install "hybridblas[hdf5]" (or pip install h5py)'
_SUFFIXES = {".npz": "npz", ".h5": "hdf5", ".hdf5": "hdf5"}
UNITS = ("lengths (lattice, positions_cart, rmt) in bohr; H and v0 in hartree; kmax, k_cart and reciprocal in "
         "1/bohr; k in units of the reciprocal lattice vectors (rows of reciprocal); S dimensionless")
CONVENTION = ("H[i, j] = <phi_i|H|phi_j> (row i is the bra); phi_i = exp(i(k+G_i).r)/sqrt(omega) in the "
              "interstitial, G_i = miller[i] @ reciprocal; basis ordered by |k+G|, then by Miller index")
_PER_K = ("H", "S", "k", "k_cart", "miller", "N_G")
_OPTIONAL_PER_K = ("eigenvalues", "eigenvectors")
_ROW_BLOCK = 1 << 22         # elements of H or S written at once


def _h5py(option, path):
    try:
        import h5py
    except ImportError:
        raise ValueError(f"{option} {str(path)!r}: HDF5 files need h5py, which is not installed; "
                         f"{HDF5_HINT}") from None
    return h5py


def file_format(path, option="path"):
    """'npz' or 'hdf5' from the file name's suffix; a ValueError naming ``option`` and the path for any
    other suffix, or for HDF5 without h5py installed. Writes nothing."""
    fmt = _SUFFIXES.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{option} {str(path)!r} must end in .npz, .h5 or .hdf5 (the file's format)")
    if fmt == "hdf5":
        _h5py(option, path)
    return fmt


def _temporary(path, option):
    """A new empty file beside ``path`` (its name), or a ValueError naming ``option`` when the folder refuses."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise ValueError(f"{option} {str(path)!r} cannot be written ({exc.strerror or exc})") from None
    os.close(fd)
    return Path(tmp)


def check_writable(path, option="path"):
    """Create and remove a file in ``path``'s folder: a refusal (read-only or virtual file system, no space
    for a name) becomes a ValueError naming ``option`` before any work. Leaves nothing behind."""
    _temporary(path, option).unlink()


def rank_path(path, rank):
    """The file MPI rank ``rank`` writes for ``path``: hs.npz -> hs.rank1.npz."""
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


def _crystal(cell, method, interstitial, n_kpoints):
    """The metadata every file carries (numbers, strings and small arrays), its arguments checked."""
    from .hsdla import METHODS
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(interstitial, (bool, np.bool_)):
        raise TypeError(f"interstitial must be True or False, got {type(interstitial).__name__} {interstitial!r}")
    if not isinstance(n_kpoints, (int, np.integer)) or isinstance(n_kpoints, bool) or n_kpoints < 1:
        raise ValueError(f"n_kpoints must be a positive integer, got {n_kpoints!r}")
    st = cell.structure
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "generator": f"flapw (hybridblas {hb.__version__})",
        "system": cell.name, "method": method, "kmax": cell.kmax, "lmax": cell.lmax,
        "interstitial": bool(interstitial), "potential": cell.model.kind, "v0": float(cell.model.v0),
        "triangle": "full", "units": UNITS, "convention": CONVENTION, "n_kpoints": int(n_kpoints),
        "omega": float(st.omega), "lattice": np.asarray(st.lattice, float),
        "reciprocal": reciprocal(np.asarray(st.lattice, float)),
        "species": np.array([sp.symbol for sp in st.species], dtype=str),
        "z": np.array([sp.z for sp in st.species], float), "rmt": np.array([sp.rmt for sp in st.species], float),
        "positions_frac": np.asarray(st.positions, float), "positions_cart": np.asarray(st.cartesian, float),
    }


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


class HSWriter:
    """Writes H and S of several k-points of one crystal into ``path`` (.npz, .h5 or .hdf5).

    ``cell``: the flapw.System (any k-point: the crystal, Kmax and potential are what is recorded).
    ``method`` and ``interstitial`` say how H and S were built (interstitial=False: muffin-tin parts only).
    ``n_kpoints``: how many k-points the whole run has (a rank's file holds some of them).
    Use as a context manager: the file appears when the block ends without an error.
    """

    def __init__(self, path, cell, *, method, interstitial, n_kpoints=1, option="path"):
        self.path = Path(path)
        self.format = file_format(self.path, option)
        self._meta = _crystal(cell, method, interstitial, n_kpoints)
        self._tmp = _temporary(self.path, option)
        self._indices = []
        self._done = False
        if self.format == "npz":
            self._file = zipfile.ZipFile(self._tmp, "w", zipfile.ZIP_STORED, allowZip64=True)
        else:
            self._file = _h5py(option, self.path).File(self._tmp, "w")

    def add(self, index, cell_k, h, s, *, lower=False, eigenvalues=None, eigenvectors=None):
        """H and S (N_G x N_G, numpy or cupy) of k-point ``index``, built for ``cell_k``: both triangles, or
        with ``lower`` only the lower one (the file gets the upper one as its conjugate; h and s are left
        as they are). Refuses (ValueError) a shape other than this k-point's N_G, non-finite entries (in the
        triangle that is read), and without ``lower`` a matrix whose first row is not the conjugate of its
        first column (one triangle only). ``eigenvalues`` (NEV,) and ``eigenvectors`` (N_G, NEV): optional."""
        if self._done:
            raise ValueError(f"{str(self.path)!r} is closed (or discarded): no k-point can be added")
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or index < 0:
            raise ValueError(f"index must be a k-point number >= 0, got {index!r}")
        if int(index) in self._indices:
            raise ValueError(f"index {index} is already in {str(self.path)!r}")
        if not isinstance(lower, (bool, np.bool_)):
            raise TypeError(f"lower must be True or False, got {type(lower).__name__} {lower!r}")
        basis = cell_k.basis
        n = basis.n_g
        h, s = _host(h), _host(s)
        for name, m in (("h", h), ("s", s)):
            if m.shape != (n, n):
                raise ValueError(f"{name} must be N_G x N_G = {n} x {n} for this k-point's basis, "
                                 f"got shape {m.shape}")
            if not finite(m, lower):
                raise ValueError(f"{name} has entries that are not finite (nan or inf); nothing is written for them")
            if not lower and m.size and not np.allclose(m[0, :], m[:, 0].conj(), rtol=1e-12,
                                                        atol=1e-14 * np.abs(m[:, 0]).max()):
                raise ValueError(f"{name} is not a full Hermitian matrix (its first row is not the conjugate of "
                                 f"its first column): pass both triangles (build_hs with lower_only=False), "
                                 f"or lower=True for the lower one")
        extra = _eigenpairs(eigenvalues, eigenvectors, n)
        k = np.asarray(basis.k, float)
        data = {"k": k, "k_cart": k @ reciprocal(np.asarray(cell_k.structure.lattice, float)),
                "miller": np.asarray(basis.miller, np.int64), "N_G": np.int64(n), **extra}
        if self.format == "npz":
            for name, m in (("H", h), ("S", s)):
                self._npz_matrix(f"{name}_{index}", m, lower)
            for name, value in data.items():
                self._npz_array(f"{name}_{index}", value)
        else:
            group = self._file.create_group(f"kpoint_{index}")
            for name, m in (("H", h), ("S", s)):
                dset = group.create_dataset(name, shape=(n, n), dtype=complex)
                for r0, r1 in _row_blocks(n):
                    dset[r0:r1] = _rows(m, r0, r1, lower)
            for name, value in data.items():
                if name == "N_G":
                    group.attrs[name] = value
                else:
                    group.create_dataset(name, data=np.ascontiguousarray(value))
        self._indices.append(int(index))

    def _npz_matrix(self, name, m, lower):
        """An N_G x N_G complex .npy member written row block by row block (C order)."""
        n = m.shape[0]
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(complex)), "fortran_order": False, "shape": (n, n)}
        with self._file.open(name + ".npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            for r0, r1 in _row_blocks(n):
                fh.write(_rows(m, r0, r1, lower).tobytes())

    def _npz_array(self, name, value):
        with self._file.open(name + ".npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array(fh, np.asanyarray(value), allow_pickle=False)

    def close(self):
        """Write the crystal's data and move the file into place (nothing appears if that fails; a second call
        does nothing)."""
        if self._done:
            return
        try:
            self._finish()
        except BaseException:
            self.discard()
            raise
        self._done = True

    def _finish(self):
        meta = dict(self._meta, kpoints=np.array(sorted(self._indices), np.int64))
        if self.format == "npz":
            for name, value in meta.items():
                self._npz_array(name, np.asarray(value))
        else:
            for name, value in meta.items():
                if isinstance(value, np.ndarray):
                    kind = self._file.create_dataset if value.dtype.kind != "U" else self._strings
                    kind(name, data=value)
                else:
                    self._file.attrs[name] = value
        self._file.close()
        os.replace(self._tmp, self.path)

    def _strings(self, name, data):
        import h5py
        self._file.create_dataset(name, data=data.astype(object), dtype=h5py.string_dtype())

    def discard(self):
        """Drop the partial file (nothing appears at ``path``; after ``close`` it does nothing)."""
        if self._done:
            return
        self._done = True
        try:
            self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None:
            self.close()
        else:
            self.discard()


def _row_blocks(n):
    rows = max(1, _ROW_BLOCK // max(n, 1))
    return [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)]


def finite(m, lower, xp=np):
    """No nan or inf in the square m (with ``lower``: in its lower triangle), checked row block by row block
    (numpy or cupy)."""
    n = m.shape[0]
    if not lower:
        return all(bool(xp.isfinite(m[r0:r1]).all()) for r0, r1 in _row_blocks(n))
    return all(bool(xp.isfinite(m[r0:r1, :r0]).all()) and bool(xp.isfinite(xp.tril(m[r0:r1, r0:r1])).all())
               for r0, r1 in _row_blocks(n))


def _rows(m, r0, r1, lower):
    """Rows r0:r1 of m as a C-ordered block; with ``lower`` those of the Hermitian matrix whose lower
    triangle m holds (columns right of the diagonal from the conjugate of the lower rows; real diagonal,
    as flapw.hermitian_fill makes it)."""
    if not lower:
        return np.ascontiguousarray(m[r0:r1], dtype=complex)      # the file's dtype, whatever m's
    n = m.shape[0]
    out = np.empty((r1 - r0, n), complex)
    out[:, :r0] = m[r0:r1, :r0]
    d = m[r0:r1, r0:r1]
    out[:, r0:r1] = np.tril(d, -1) + np.tril(d, -1).conj().T
    out[:, r1:] = m[r1:, r0:r1].conj().T
    idx = np.arange(r1 - r0)
    out[idx, r0 + idx] = d[idx, idx].real
    return out


def _eigenpairs(eigenvalues, eigenvectors, n):
    """{"eigenvalues": (nev,) float64, "eigenvectors": (n, nev) complex128} from what is given (either may
    be None; vectors need values)."""
    out = {}
    if eigenvalues is not None:
        out["eigenvalues"] = np.asarray(_host(eigenvalues), float).reshape(-1)
        if not np.isfinite(out["eigenvalues"]).all():
            raise ValueError("eigenvalues has entries that are not finite")
    if eigenvectors is not None:
        vec = np.asarray(_host(eigenvectors), complex)
        if "eigenvalues" not in out or vec.shape != (n, len(out["eigenvalues"])):
            raise ValueError(f"eigenvectors must be N_G x NEV = {n} x {len(out.get('eigenvalues', []))} with "
                             f"the eigenvalues, got shape {vec.shape}")
        out["eigenvectors"] = vec
    return out


def write_hs(path, cell, h, s, *, method, interstitial, index=0, lower=False):
    """One k-point's H and S (numpy or cupy; ``lower``: only their lower triangles are valid, the file gets
    both) of ``cell`` into ``path`` (.npz, .h5, .hdf5)."""
    with HSWriter(path, cell, method=method, interstitial=interstitial, n_kpoints=1) as out:
        out.add(index, cell, h, s, lower=lower)
    return Path(path)


def _scalar(value):
    value = value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value
    return value.item() if isinstance(value, np.generic) else value


def read_hs(path):
    """A file of HSWriter as a dict: the crystal's fields (``system``, ``kmax``, ``lattice``, ``species``
    as a list of str, ...) and ``kpoints``, a list of dicts (``index``, ``H``, ``S``, ``k``, ``k_cart``,
    ``miller``, ``N_G``, and ``eigenvalues``, ``eigenvectors`` where written) in k-point order. A file that is
    damaged, truncated or incomplete (a k-point without H, S or its basis, a matrix of another size) is refused
    with a ValueError naming it."""
    fmt = file_format(path, "path")
    try:
        meta = _read(path, fmt)
    except _FormatError as exc:
        raise ValueError(str(exc)) from None
    except (OSError, EOFError, KeyError, TypeError, ValueError, IndexError, zipfile.BadZipFile) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"path {str(path)!r} is not a readable flapw H/S file ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})") from None
    for point in meta["kpoints"]:
        _check_kpoint(point, path)
    return meta


class _FormatError(Exception):
    pass


def _check_kpoint(point, path):
    """Every k-point of a file holds H and S of N_G x N_G, k and its N_G Miller indices."""
    missing = [n for n in _PER_K if n not in point]
    n = point.get("N_G")
    if not missing and (np.shape(point["H"]) != (n, n) or np.shape(point["S"]) != (n, n)
                        or np.shape(point["miller"]) != (n, 3)):
        missing = [f"H, S or miller of N_G = {n}"]
    if missing:
        raise ValueError(f"path {str(path)!r} is incomplete: k-point {point['index']} lacks {', '.join(missing)}")


def _read(path, fmt):
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as z:
            meta = {n: _scalar(z[n]) for n in z.files if not n.rpartition("_")[2].isdigit()}
            _check_format(meta, path)
            indices = [int(i) for i in meta["kpoints"]]
            kpoints = [dict({n: _scalar(z[f"{n}_{i}"]) for n in _PER_K + _OPTIONAL_PER_K if f"{n}_{i}" in z.files},
                            index=i) for i in indices]
    else:
        h5py = _h5py("path", path)
        with h5py.File(path, "r") as f:
            meta = {n: _scalar(v) for n, v in f.attrs.items()}
            _check_format(meta, path)
            for n, d in f.items():
                if isinstance(d, h5py.Dataset):
                    meta[n] = d.asstr()[()] if h5py.check_string_dtype(d.dtype) else d[()]
            indices = [int(i) for i in meta["kpoints"]]
            kpoints = []
            for i in indices:
                g = f[f"kpoint_{i}"]
                kpoints.append(dict({n: g[n][()] for n in _PER_K + _OPTIONAL_PER_K if n != "N_G" and n in g},
                                    N_G=int(g.attrs["N_G"]), index=i))
    meta["species"] = [str(x) for x in np.asarray(meta["species"]).tolist()]
    meta["kpoints"] = kpoints
    return meta


def _check_format(meta, path):
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise _FormatError(f"path {str(path)!r} is not a flapw H/S file of format version {FORMAT_VERSION} "
                         f"(format {meta.get('format')!r}, version {meta.get('format_version')!r})")
