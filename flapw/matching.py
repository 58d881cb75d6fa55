"""Matching coefficients A^a_lm(G), B^a_lm(G) of the LAPW basis at one k-point.

    A^a_lm(G) = (4π/√Ω) i^l e^{iK·τ_a} Y*_lm(K̂) [u̇(R)|K| j_l'(|K|R) - u̇'(R) j_l(|K|R)] / W
    B^a_lm(G) = (4π/√Ω) i^l e^{iK·τ_a} Y*_lm(K̂) [u'(R) j_l(|K|R) - u(R)|K| j_l'(|K|R)] / W,  K = k+G

so that Σ_lm (A u_l + B u̇_l) Y_lm matches e^{iK·r}/√Ω in value and slope on the sphere (Rayleigh
expansion).  The i^l sits here, in A and B (as in SIRIUS), so the T matrices stay the plain Gaunt sums.

Everything except the phase e^{iK·τ_a} depends only on species (and k): ``SpeciesFactors`` holds it
once per species as an (N_G, N_L) array; an atom's block is that array times its phase column.
Blocks are stored transposed, A_a^T (N_G × N_L), side by side in one C-ordered (N_G, n·N_L) buffer,
i.e. a column-major (n·N_L) × N_G matrix: exactly the operand of zherk/zher2k/zherkx with trans='C'.

On a GPU (CuPy output arrays) one kernel computes the k-only factors (``matching_gpu``). On the host,
Y_lm and j_l come from numpy recurrences over the G vectors (``special``), chunk by chunk. A chunk's Python
steps hold the GIL; its large products release it. On one H100 node's 16 cores (benchmarks: k_only_factors
alone, best of 3, and two calls at once as side-by-side k-points make), CHUNK G vectors and threads:

    case (N_G)              1024, every core     4096, 4 threads      4096, 8 threads
    AuAg Kmax 4.0 (13371)   0.047 / 0.098 s      0.028 / 0.042 s      0.028 / 0.042 s
    NaCl Kmax 3.5 (7011)    0.023 / 0.044 s      0.008 / 0.015 s      0.008 / 0.015 s
    TiO2 Kmax 4.0 (29152)   0.090 / 0.200 s      0.032 / 0.060 s      0.032 / 0.060 s

so a stage takes at most MAX_THREADS threads: more only contend for the GIL.
"""
import numpy as np

from hybridblas import array_module

from .potential import lm_index
from .special import spherical_harmonics, spherical_jn_all

__all__ = ["species_factors", "fill_coefficients", "ylm_conj", "k_only_factors"]

CHUNK = 4096                # G vectors per task of the k-only stage at least (below 2 CHUNK: one task)
MAX_THREADS = 8             # threads of one k-only stage at most


def ylm_conj(basis, lmax):
    """Y*_lm(K̂) as an (N_G, N_L) array (K̂ = ẑ for K = 0, where only l = 0 survives)."""
    y = spherical_harmonics(lmax, basis.kpg)
    return np.conj(y, out=y).T.copy()


def radial_matching(basis, radial, lmax):
    """a_l(|K|), b_l(|K|) of shape (N_G, lmax+1): the bracketed factors divided by W."""
    kk = basis.norm
    j, dj = spherical_jn_all(lmax, kk * radial.mesh.r[-1])
    return _ab(j, dj, kk, radial)


def _ab(j, dj, kk, radial):
    """radial_matching's a_l, b_l from j_l(|K|R) and j_l'(|K|R) (dj is scaled in place)."""
    dj *= kk                                                             # |K| j_l'(|K|R)
    w = radial.wronskian[:, None]
    a = (radial.udot[:, None] * dj - radial.dudot[:, None] * j) / w
    b = (radial.du[:, None] * j - radial.u[:, None] * dj) / w
    return a.T, b.T


def prefactor_constants(lmax, omega):
    """(4π/√Ω) i^l for every L = (l, m): the constant part of A and B."""
    return (4 * np.pi / np.sqrt(omega)) * (1j ** lm_index(lmax))


def _prefactor(ylm_c, lmax, omega):
    """(4π/√Ω) i^l Y*_lm(K̂), in place of ``ylm_c`` (Y*_lm): the species-independent part of A and B."""
    ylm_c *= prefactor_constants(lmax, omega)[None, :]
    return ylm_c


def species_factors(basis, radial, lmax, omega, ylm_c=None):
    """(fa, fb), each (N_G, N_L): (4π/√Ω) i^l Y*_lm(K̂) a_l(|K|) and the same with b_l."""
    pref = _prefactor(ylm_conj(basis, lmax) if ylm_c is None else ylm_c.copy(), lmax, omega)
    ls = lm_index(lmax)
    a, b = radial_matching(basis, radial, lmax)
    return pref * a[:, ls], pref * b[:, ls]


def k_only_factors(basis, radials, lmax, omega, threads=None, out=None):
    """[species_factors(basis, r, ...) for r in radials], the k-only stage of a build, computed in chunks of
    CHUNK G vectors on ``threads`` threads (default and at most MAX_THREADS, no more than the cores), each
    chunk's prefactor once for all species and written straight into the results (no whole-array temporaries).
    Every value of Y_lm and j_l depends on its own G alone, so the result is the same, bit for bit, for any
    chunks and threads.

    out: a (fa, fb) pair of (N_G, N_L) complex128 C-ordered arrays per radial to write into, numpy or CuPy on
    one GPU (then one kernel on that GPU computes them: matching_gpu; ``threads`` is not used); default new
    numpy arrays. Returns the pairs; on a GPU they are queued on its current stream (complete once it is)."""
    from hybridblas import workers
    from hybridblas.blas_threads import available_cores
    n_g, n_l = basis.n_g, (lmax + 1) ** 2
    ls = lm_index(lmax)
    if out is None:
        out = [(np.empty((n_g, n_l), complex), np.empty((n_g, n_l), complex)) for _ in radials]
    out = [tuple(pair) for pair in out]
    if len(out) != len(radials) or any(len(pair) != 2 for pair in out):
        raise ValueError(f"out must hold a (fa, fb) pair for each of the {len(radials)} radials, got {len(out)}")
    for pair in out:
        for x in pair:
            if x.shape != (n_g, n_l) or x.dtype != np.complex128 or not x.flags.c_contiguous:
                raise ValueError(f"out's arrays must be C-ordered complex128 of shape {(n_g, n_l)}, got "
                                 f"{x.dtype} {x.shape}")
    kinds = {"numpy" if isinstance(x, np.ndarray) else f"GPU {getattr(getattr(x, 'device', None), 'id', '?')}"
             for pair in out for x in pair}
    if len(kinds) != 1:
        raise ValueError(f"out's arrays must all be numpy arrays or all CuPy arrays on one GPU, got "
                         f"{', '.join(sorted(kinds))}")
    if not isinstance(out[0][0], np.ndarray):
        from .matching_gpu import k_only_factors_gpu
        return k_only_factors_gpu(basis, radials, lmax, omega, out)
    edges = np.linspace(0, n_g, max(1, n_g // CHUNK) + 1).astype(int).tolist()   # chunks of CHUNK to 2 CHUNK

    def matching(part):
        """radial_matching(part, r, lmax) for every radial r, j_l of all of them in one call."""
        kk, n = part.norm, part.n_g
        j, dj = spherical_jn_all(lmax, np.concatenate([kk * r.mesh.r[-1] for r in radials]))
        return [_ab(j[:, i * n:(i + 1) * n], dj[:, i * n:(i + 1) * n], kk, r) for i, r in enumerate(radials)]

    def chunk(r0, r1):
        part = basis.rows(r0, r1)
        pref = _prefactor(ylm_conj(part, lmax), lmax, omega)
        for (fa, fb), (a, b) in zip(out, matching(part)):
            np.multiply(pref, a[:, ls], out=fa[r0:r1])
            np.multiply(pref, b[:, ls], out=fb[r0:r1])
    jobs = list(zip(edges[:-1], edges[1:]))
    threads = min(threads or available_cores(), available_cores(), MAX_THREADS, len(jobs))
    if threads <= 1:
        for r0, r1 in jobs:
            chunk(r0, r1)
    else:
        workers.map(lambda job: chunk(*job), jobs, threads)
    return out


def phases(basis, positions_frac, xp=np):
    """e^{iK·τ_a} as an (N_G, n_atoms) array: K·τ = 2π (n + k)·f for fractional τ = f. With ``xp`` cupy the
    (N_G, 3) n + k and the positions go to the GPU and the product is formed there: the (N_G, n_atoms) arguments
    uploaded from pageable memory (38 MB for TiO2 Kmax 3.0) took 1.6 s on one of two GPUs building k-points side by
    side (two H100s), against 3 ms this way."""
    kvec = basis.miller + basis.k
    pos = np.asarray(positions_frac, dtype=float).T
    if xp is np:
        arg = 2 * np.pi * (kvec @ pos)
    else:
        arg = (2 * np.pi) * (xp.asarray(kvec) @ xp.asarray(pos))
    return xp.exp(1j * arg)


def fill_coefficients(out, factors, phase, species_of, n_l, for_each=None):
    """out[:, j·N_L:(j+1)·N_L] = factors[species_of[j]] * phase[:, j] for each atom j of a batch.

    ``factors`` may be any per-atom-kind list (species, or species with U folded in: X = UB). Atoms next to
    each other with the same factor (hsdla orders a batch by atom class) are written as one run: one broadcast
    product (N_G, 1, N_L) · (N_G, run, 1) straight into the run's columns, no temporary (numpy and cupy alike),
    so a GPU gets a launch per run rather than per atom (TiO2: 2 instead of 384). ``for_each(jobs, fn)`` runs
    fn(job) for every job (default: a plain loop, queued in order on a GPU); hsdla passes one that spreads the
    jobs over the host's cores, for which the runs are cut into about _PIECES jobs."""
    xp = array_module(out)
    n_g = out.shape[0]
    if not out.flags.c_contiguous or out.shape[1] != len(species_of) * n_l:
        raise ValueError(f"out must be a C-ordered (N_G, {len(species_of)}·{n_l}) array, got shape {out.shape}, "
                         f"C-contiguous {out.flags.c_contiguous}")
    blocks = out.reshape(n_g, len(species_of), n_l)          # a view of out

    def one(job):
        j0, j1, f = job
        xp.multiply(factors[f][:, None, :], phase[:, j0:j1, None], out=blocks[:, j0:j1, :])
    jobs = atom_runs(species_of, 1 if for_each is None else _PIECES)
    (for_each or _loop)(jobs, one)
    return out


_PIECES = 64                 # host jobs a batch's runs are cut into at most (spread over the cores)


def atom_runs(kinds, pieces=1):
    """[(j0, j1, kind)]: the runs of equal consecutive ``kinds`` (atoms of one species, or of one T set), each
    cut so that there are about ``pieces`` jobs in all (at least one atom each; 1: every run whole)."""
    kinds = np.asarray(kinds)
    n = kinds.size
    if n == 0:
        return []
    edges = np.flatnonzero(kinds[1:] != kinds[:-1]) + 1
    bounds = [0] + edges.tolist() + [n]
    most = max(1, -(-n // pieces))
    return [(j, min(b, j + most), int(kinds[a])) for a, b in zip(bounds[:-1], bounds[1:]) for j in range(a, b, most)]


def _loop(jobs, fn):
    for j in jobs:
        fn(j)
