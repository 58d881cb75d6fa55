"""Per-state labels from M-scheme vectors: orbit occupations, parity and isospin.

Isospin uses the files' convention t_z = +1/2 for a neutron: T_z = (N - Z)/2 of the valence nucleons, T₊ = Σ_α c†_(nα)
c_(pα) (a proton turned into the neutron of the same n l j m), T₋ = T₊†, and
    <T²> = |T₋ψ|² + T_z(T_z - 1)   (N >= Z)   or   |T₊ψ|² + T_z(T_z + 1)   (N < Z),
T∓ψ living in the basis of (Z ± 1, N ∓ 1) valence nucleons with the same 2M. It is defined when the proton and
neutron orbits are the same n l j (in any order); otherwise it is reported as unavailable (None).
"""
import numpy as np

from ..arrays import column_sumsq, module_of, to_host
from ..shellmodel.basis import MSchemeBasis, SpeciesDeterminants
from .mscheme import BlockVectors, ladder_operator, species_ladder


def normalised(problem, vectors):
    """The states as BlockVectors of ``problem.basis``: float64 columns of unit norm where ``vectors`` are (numpy,
    or CuPy on the current device; float32 cast there to float64 first), checked: one row per basis state, finite,
    nonzero. BlockVectors (this function's result) are returned as they are."""
    if isinstance(vectors, BlockVectors):
        return vectors
    xp = module_of(vectors)
    v = xp.asarray(vectors)
    if v.ndim != 2 or v.shape[0] != problem.basis.dim:
        raise ValueError(f"vectors must have {problem.basis.dim} rows (one column per state), got shape {v.shape}")
    norm2 = column_sumsq(v)                          # accumulated in float64
    if not np.all(np.isfinite(norm2)) or np.any(norm2 == 0):
        raise ValueError("vectors must be finite and nonzero")
    return BlockVectors(problem.basis, xp.ascontiguousarray(v / xp.asarray(np.sqrt(norm2))))     # float64: a copy


def _squares(states):
    """Per block, the squares of the states' amplitudes as n_p x n_n x k."""
    v, k = states.v, states.k
    for blk in states.basis.blocks:
        x = v[blk.offset:blk.offset + blk.size]
        yield blk, (x * x).reshape(blk.n_p, blk.n_n, k)


def occupations(problem, vectors):
    """<n_k> of every proton orbit and every neutron orbit: two arrays (states x orbits), in the interaction's
    orbit order within each species. Each row sums to the valence proton (neutron) number."""
    st = normalised(problem, vectors)
    xp = st.xp
    per_det = []
    for dets, space in ((problem.pdets, problem.pspace), (problem.ndets, problem.nspace)):
        orbit_of = np.zeros((space.size, len(space.orbits)))
        orbit_of[np.arange(space.size), space.orbit] = 1.0
        per_det.append(xp.asarray(dets.occ @ orbit_of))
    occ_p = xp.zeros((st.k, per_det[0].shape[1]))
    occ_n = xp.zeros((st.k, per_det[1].shape[1]))
    for blk, x2 in _squares(st):
        occ_p += x2.sum(axis=1).T @ per_det[0][blk.p_start:blk.p_start + blk.n_p]
        occ_n += x2.sum(axis=0).T @ per_det[1][blk.n_start:blk.n_start + blk.n_n]
    return to_host(occ_p), to_host(occ_n)


def parity_expectation(problem, vectors):
    """<π> of each state, π = Π (-1)^l over the occupied orbits: ±1 for a state of one parity."""
    st = normalised(problem, vectors)
    xp = st.xp
    signs = []
    for dets, space in ((problem.pdets, problem.pspace), (problem.ndets, problem.nspace)):
        l_state = np.array([space.orbits[o].l for o in space.orbit], dtype=np.int64)
        signs.append(xp.asarray(1.0 - 2.0 * ((dets.occ @ l_state).round().astype(np.int64) % 2)))
    out = xp.zeros(st.k)
    for blk, x2 in _squares(st):
        by_proton = xp.tensordot(x2, signs[1][blk.n_start:blk.n_start + blk.n_n], axes=([1], [0]))    # n_p x k
        out += signs[0][blk.p_start:blk.p_start + blk.n_p] @ by_proton
    return to_host(out)


def _partner_states(problem):
    """For each proton m-state, the neutron m-state with the same n l j m; None unless the orbits pair up."""
    key = lambda o: (o.n, o.l, o.twoj)
    p_orbits, n_orbits = problem.pspace.orbits, problem.nspace.orbits
    n_index = {key(o): i for i, o in enumerate(n_orbits)}
    if len(p_orbits) != len(n_orbits) or len(n_index) != len(n_orbits) or \
            any(key(o) not in n_index for o in p_orbits):
        return None
    first_n = np.concatenate([[0], np.cumsum([o.twoj + 1 for o in n_orbits])])
    first_p = np.concatenate([[0], np.cumsum([o.twoj + 1 for o in p_orbits])])
    partner = np.empty(problem.pspace.size, dtype=np.int64)
    for i, o in enumerate(p_orbits):
        j = n_index[key(o)]
        partner[first_p[i]:first_p[i] + o.twoj + 1] = np.arange(first_n[j], first_n[j] + o.twoj + 1)
    return partner


class _Vacuum:
    """The one determinant of a species with no particles (2M = 0), as a target of ``species_ladder`` and a
    factor of ``MSchemeBasis``."""
    group_start = {0: 0}

    def __init__(self, space):
        self.space = space

    def group(self, twom):
        return (0, 1) if int(twom) == 0 else (0, 0)

    def lookup(self, states, twom):
        return np.zeros(len(states), dtype=np.int64)

    def __len__(self):
        return 1


def _determinants(space, count):
    return SpeciesDeterminants(space, count) if count else _Vacuum(space)


def isospin_squared(problem, vectors):
    """<T²> of each state (see the module docstring), or None when the proton and neutron orbits differ."""
    partner = _partner_states(problem)
    if partner is None:
        return None
    st = normalised(problem, vectors)
    z, n = problem.n_protons, problem.n_neutrons
    tz = (n - z) / 2.0
    lower = n >= z                   # T₋ (n -> p) when N >= Z, else T₊: the target stays inside the space
    zt, nt = (z + 1, n - 1) if lower else (z - 1, n + 1)
    base = tz * (tz - 1) if lower else tz * (tz + 1)
    if not (0 <= zt <= problem.pspace.size and 0 <= nt <= problem.nspace.size):
        return np.full(st.k, base)
    tp, tn = _determinants(problem.pspace, zt), _determinants(problem.nspace, nt)
    target = MSchemeBasis(tp, tn, problem.basis.twice_m)
    terms = []
    for alpha in range(problem.pspace.size):
        shift = int(problem.pspace.twom[alpha])
        terms.append((species_ladder(problem.pdets, tp, alpha, create=lower),
                      species_ladder(problem.ndets, tn, int(partner[alpha]), create=not lower),
                      shift if lower else -shift))
    ladder = ladder_operator(problem.basis, target, terms, st.xp)
    return (np.zeros(st.k) if ladder is None else column_sumsq(ladder @ st.v)) + base
