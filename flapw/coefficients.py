"""H and S from matching coefficients and T matrices that a FLAPW code already has (FLEUR, SIRIUS, ...).

    H, S = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=idx, method="refined", context=ctx)

computes, for the n atoms whose coefficients are given (one batch, or all atoms),

    S[G', G] = Σ_j Σ_L conj(A^j_L(G')) A^j_L(G) + conj(B^j_L(G')) |u^j_L|² B^j_L(G)
    H[G', G] = Σ_j Σ_{L'L} conj(A^j_L'(G')) T^AA_L'L A^j_L(G) + conj(A^j_L'(G')) T^AB_L'L B^j_L(G)
                          + conj(B^j_L'(G')) T^BA_L'L A^j_L(G) + conj(B^j_L'(G')) T^BB_L'L B^j_L(G),

(eqs. (6)-(7) of the paper, T = the atom's set ``t_index[j]``, T^BA = (T^AB)ᴴ) with the refined HSDLA
(Algorithm 3: zherk, zherk, zher2k, zherkx) or the original one (Algorithm 1), every large product through
hybridblas (``context``) or a backend of flapw.backends. ``flapw.build_hs`` runs the same batch algorithm
(flapw/hsdla.py) on each of its batches. The layouts, units and conventions are listed in
hs_from_coefficients' docstring and in docs/flapw.md.
"""
import numpy as np

from .backends import get_backend
from .hsdla import METHODS, _Batch, _cholesky_factors, _device_t, _original_batch, _refined_batch, _sync, \
    hermitian_fill, scale_ub
from .report import BuildReport

__all__ = ["hs_from_coefficients"]

HERMITIAN_RTOL = 1e-10
_TOO_HARD = getattr(np, "exceptions", np).TooHardError      # numpy < 1.25 keeps it at the top level


def hs_from_coefficients(a, b, taa, tab, tbb, u, *, tba=None, t_index=None, method="refined", context=None,
                         blas="hybridblas", h=None, s=None, accumulate=False, lower_only=False, work=None,
                         report=None, hermitian_rtol=HERMITIAN_RTOL):
    """H and S (N_G × N_G, complex128, Hermitian) from the coefficients of n atoms; returns (h, s).

    Shapes (N_G plane waves, n atoms, N_L angular channels: any order of (l, m) that A, B, T and u share):
    a, b:   (N_G, n·N_L) complex128 numpy (host) or cupy (GPU) arrays, any memory order or strides:
            a[g, j·N_L + L] = A^j_L(G_g). Column block j is atom j's coefficients, one row per G: SIRIUS's
            alm(G, lm) of each atom side by side, the transpose of the paper's stacked A. Read only.
    taa, tab, tbb:  (n_t, N_L, N_L) or (N_L, N_L) float64/complex128 host arrays: T sets, row L' pairs with
            the conjugated coefficient of G'. T^AA and T^BB must be Hermitian: max|T - Tᴴ| ≤
            hermitian_rtol · max|T| per set (average T with Tᴴ first where it carries more round-off).
    tba:    optional, the same shape: checked to be (T^AB)ᴴ to hermitian_rtol (T^BA is not read otherwise).
    u:      (n_t, N_L) or (N_L,) float64: the diagonal of U (‖u̇_l‖ of each channel; S uses |u|²).
    t_index: (n,) integers: atom j uses T set t_index[j] (atoms of one class share a set). Default: set j
            for atom j (n_t = n), or the only set (n_t = 1).
    Units: H is in the units of T (Ha in flapw), S in those of |A|². Phases: every phase (e^{iK·τ}, the
    i^l of the Rayleigh expansion, FLEUR's i^{l-l'} in T) is the caller's, inside A, B and T; this call
    multiplies what it is given.
    Output: h, s: (N_G, N_G) complex128 arrays of a's kind to write into (default: new Fortran-ordered
    zeros). Only the lower triangle (G' ≥ G) is accumulated; the upper one is then filled with the conjugate
    transpose (and the diagonal made real) unless ``lower_only`` (then it is left as it was, except that
    "original" leaves junk there). accumulate: add to h, s (β = 1) instead of overwriting them (β = 0):
    atoms in several batches, ``lower_only=True`` on all but the last call.
    method: "refined" or "original"; work: scratch arrays of a's shape and dtype, reused across batches
    (refined: [X]; original: [Z, UB]), allocated when None; report: a BuildReport that collects
    per-stage seconds and flops. Bad input raises ValueError naming the argument before any work.
    """
    xp = _module(a, "a")
    n_g, width = _coefficients(a, b, xp)
    sets = {name: _t_stack(value, name) for name, value in (("taa", taa), ("tab", tab), ("tbb", tbb))}
    n_t, n_l = sets["taa"].shape[:2]
    for name, t in sets.items():
        if t.shape != (n_t, n_l, n_l):
            raise ValueError(f"{name} has shape {t.shape}, taa has {(n_t, n_l, n_l)}: give every T set the same shape")
    u = _u_stack(u, n_t, n_l)
    _hermitian("taa", sets["taa"], sets["taa"], hermitian_rtol)
    _hermitian("tbb", sets["tbb"], sets["tbb"], hermitian_rtol)
    if tba is not None:
        tba = _t_stack(tba, "tba")
        if tba.shape != (n_t, n_l, n_l):
            raise ValueError(f"tba has shape {tba.shape}, tab has {(n_t, n_l, n_l)}")
        _hermitian("tba", tba, sets["tab"], hermitian_rtol)
    if n_l == 0 or width % n_l:
        raise ValueError(f"a has {width} columns, not a multiple of N_L = {n_l} (taa is {n_l}x{n_l}): "
                         "a, b must be (N_G, n·N_L)")
    n_atoms = width // n_l
    index = _t_index(t_index, n_atoms, n_t)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    backend = get_backend(blas, context) if isinstance(blas, str) else blas
    h = _output(h, "h", n_g, xp, (a, b))
    s = _output(s, "s", n_g, xp, (a, b, h))
    work = _work(work, 1 if method == "refined" else 2, a, xp, (a, b, h, s))

    rep = report if report is not None else BuildReport(method=method, n_atoms=n_atoms, n_g=n_g, n_l=n_l,
                                                        batch_atoms=n_atoms, backend=backend.name)
    used = sorted({int(c) for c in index})
    dev_t = _device_t(sets["taa"], sets["tab"], sets["tbb"], u, used, xp)
    bt = _Batch(rep, backend, a, b, h, s, index, dev_t, accumulate, n_l, _sync(xp), xp)
    if method == "refined":
        _refined_batch(bt, work[0], lambda: scale_ub(bt, work[0]))
    else:
        _original_batch(bt, *work, _cholesky_factors({c: sets["taa"][c] for c in used}, xp))
    rep.settle()
    if not lower_only:
        hermitian_fill(h, xp)
        hermitian_fill(s, xp)
    return h, s


def _module(x, name):
    """numpy for host arrays, cupy for GPU arrays; anything else is refused (no silent copies)."""
    if isinstance(x, np.ndarray):
        return np
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    raise ValueError(f"{name} must be a numpy or cupy array, got {type(x).__name__}")


def _coefficients(a, b, xp):
    for name, x in (("a", a), ("b", b)):
        if _module(x, name) is not xp:
            raise ValueError(f"a and b must both be numpy or both cupy arrays, got {type(a).__name__} and "
                             f"{type(b).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be a 2-D (N_G, n·N_L) array, got shape {x.shape}")
        if x.dtype != np.complex128:
            raise ValueError(f"{name} must be complex128, got {x.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (N_G, n·N_L), got {a.shape} and {b.shape}")
    return a.shape


def _host(value):
    return value.get() if type(value).__module__.split(".")[0] == "cupy" else value


def _t_stack(value, name):
    arr = np.asarray(_host(value))
    if arr.dtype not in (np.float64, np.complex128):
        raise ValueError(f"{name} must be float64 or complex128, got {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
        raise ValueError(f"{name} must be (n_t, N_L, N_L) or (N_L, N_L), got shape {np.shape(value)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or infinite entries")
    return arr.astype(np.complex128)


def _u_stack(u, n_t, n_l):
    arr = np.asarray(_host(u))
    if arr.dtype != np.float64:
        raise ValueError(f"u must be float64 (the real diagonal of U), got {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None]
    if arr.shape != (n_t, n_l):
        raise ValueError(f"u must be ({n_t}, {n_l}) or ({n_l},) like taa, got shape {np.shape(u)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("u holds NaN or infinite entries")
    return arr


def _hermitian(name, t, partner, rtol):
    """t[c] must equal partner[c]ᴴ (partner = t: Hermitian) to rtol · max|partner[c]|."""
    dev = np.abs(t - partner.conj().transpose(0, 2, 1)).max(axis=(1, 2), initial=0.0)
    scale = np.abs(partner).max(axis=(1, 2), initial=0.0)
    bad = np.flatnonzero(dev > rtol * scale)
    if len(bad):
        c = int(bad[0])
        want = "Hermitian" if t is partner else "the conjugate transpose of tab"
        raise ValueError(f"{name}[{c}] is not {want}: max deviation {dev[c]:.3g} > hermitian_rtol={rtol:g} "
                         f"× max|T| = {scale[c]:.3g}")


def _t_index(t_index, n_atoms, n_t):
    if t_index is None:
        if n_t not in (n_atoms, 1):
            raise ValueError(f"t_index is needed: {n_t} T sets for {n_atoms} atoms (one set per atom, or one set "
                             "for all, need none)")
        return np.arange(n_atoms) if n_t == n_atoms else np.zeros(n_atoms, int)
    index = np.asarray(_host(t_index))
    if index.dtype.kind not in "iu" or index.shape != (n_atoms,):
        raise ValueError(f"t_index must be {n_atoms} integers (one per atom), got {t_index!r}")
    if n_atoms and (index.min() < 0 or index.max() >= n_t):
        raise ValueError(f"t_index must lie in [0, {n_t}) (there are {n_t} T sets), got {t_index!r}")
    return index


def _overlap(x, y, xp):
    if xp is np:
        try:
            return np.shares_memory(x, y)
        except _TOO_HARD:
            return np.may_share_memory(x, y)
    return xp.may_share_memory(x, y)


def _output(c, name, n_g, xp, inputs):
    if c is None:
        return xp.zeros((n_g, n_g), complex, order="F")
    if _module(c, name) is not xp or c.shape != (n_g, n_g) or c.dtype != np.complex128:
        raise ValueError(f"{name} must be a ({n_g}, {n_g}) complex128 {xp.__name__} array like a, got "
                         f"{type(c).__name__} {getattr(c, 'shape', '')} {getattr(c, 'dtype', '')}")
    for other in inputs:
        if other is not None and _overlap(c, other, xp):
            raise ValueError(f"{name} shares memory with another argument; give it its own array")
    return c


def _work(work, count, a, xp, others):
    if work is None:
        return [xp.empty(a.shape, complex) for _ in range(count)]
    work = list(work)
    if len(work) != count:
        raise ValueError(f"work must be {count} array(s) for this method, got {len(work)}")
    for i, w in enumerate(work):
        if _module(w, f"work[{i}]") is not xp or w.shape != a.shape or w.dtype != np.complex128:
            raise ValueError(f"work[{i}] must be a complex128 array of a's shape {a.shape}, got "
                             f"{type(w).__name__} {getattr(w, 'shape', '')} {getattr(w, 'dtype', '')}")
        if any(_overlap(w, o, xp) for o in list(others) + work[:i]):
            raise ValueError(f"work[{i}] shares memory with another argument; give it its own array")
    return work
