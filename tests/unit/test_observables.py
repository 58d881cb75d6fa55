"""cisolver.observables: oscillator integrals, single-particle operators, occupations, parity, isospin, E2/M1.

Exact answers come from closed forms (oscillator integrals, Schmidt moments, single-j quadrupole moments, the
single-particle B(E2)), from symmetries (J as the M1 operator, mirror nuclei, M independence, detailed balance)
and from a sum rule over every eigenstate of 20Ne. The interaction files are those of the shared data folder.
"""
from math import pi, sqrt

import numpy as np
import pytest
import scipy.sparse.linalg as spla
from scipy.integrate import quad
from scipy.special import eval_genlaguerre

from cisolver.observables import PARITY_TOLERANCE, TransitionOptions, compute_observables, orbit_label
from cisolver.observables import oscillator, single_particle, states, transitions
from cisolver.data import resolve_interaction
from cisolver.observables.mscheme import (BlockVectors, OneBodyOperator, every_jump, ladder_operator, species_ladder,
                                          species_one_body)
from cisolver.shellmodel import angmom, basis, hamiltonian, nushellx, snt, species
from cisolver.shellmodel.clebsch import clebsch_gordan
from ci_data import DATA, needs_data



def _problem(name, z, n, twice_m=None):
    return hamiltonian.ShellModelProblem(snt.read_snt(DATA / name), z, n, twice_m)


def _eigen(problem, count=None, split_j=False):
    """The lowest ``count`` eigenpairs (Lanczos, tol 1e-12), or all of them (dense; split_j adds 1e-3 J², which
    commutes with H, so that accidentally degenerate levels of different J do not mix; the energies are H's)."""
    h = problem.build()[0]
    if count is not None and problem.dimension > 200:
        w, v = spla.eigsh(h, k=count, which="SA", tol=1e-12)
        order = np.argsort(w)
        return w[order], v[:, order]
    dense = h.toarray()
    if split_j:
        jp = angmom.j_plus(problem).toarray()
        m = problem.basis.twice_m / 2.0
        w, v = np.linalg.eigh(dense + 1e-3 * (jp.T @ jp + (m * m + m) * np.eye(len(dense))))
        w = np.einsum("ik,ij,jk->k", v, dense, v)
    else:
        w, v = np.linalg.eigh(dense)
    return (w, v) if count is None else (w[:count], v[:, :count])


def _single_j(n, l, twoj):
    """A model space of one orbit for each species, no interaction (the states are chosen by J below)."""
    orbits = [snt.Orbit(0, n, l, twoj, -1), snt.Orbit(1, n, l, twoj, 1)]
    return snt.Interaction("single-j", orbits, 0, 0, {0: 0.0, 1: 0.0})


def _j_eigenstate(problem, twoj):
    """The (unique) state of 2J = twoj in the problem's basis, as an eigenvector of J²."""
    jp = angmom.j_plus(problem).toarray()
    m = problem.basis.twice_m / 2.0
    w, v = np.linalg.eigh(jp.T @ jp + (m * m + m) * np.eye(problem.dimension))
    hit = np.nonzero(np.abs(w - twoj * (twoj + 2) / 4.0) < 1e-8)[0]
    assert len(hit) == 1
    return v[:, hit]


def _b(obs, name):
    return np.array(obs[name]["b"], dtype=float)


# ---- references: the operators applied straight, block by block, with scipy -------------------------------------
def _apply_product(source, target, a, b, dtwom_p, v, out):
    """out += (A ⊗ B) v from basis ``source`` to ``target``: for each block, the rows and columns of the species
    matrices A (protons, None for 1) and B (neutrons) that it reaches, sliced out and multiplied, A X Bᵀ."""
    for blk in source.blocks:
        ti = target.block_of_twom.get(blk.twom_p + dtwom_p)
        if ti is None:
            continue
        tb = target.blocks[ti]
        x = v[blk.offset:blk.offset + blk.size].reshape(blk.n_p, blk.n_n, -1)
        pa = np.eye(blk.n_p) if a is None else a[tb.p_start:tb.p_start + tb.n_p, blk.p_start:blk.p_start + blk.n_p]
        nb = np.eye(blk.n_n) if b is None else b[tb.n_start:tb.n_start + tb.n_n, blk.n_start:blk.n_start + blk.n_n]
        pa = pa.toarray() if hasattr(pa, "toarray") else pa
        nb = nb.toarray() if hasattr(nb, "toarray") else nb
        out[tb.offset:tb.offset + tb.size] += np.einsum("qp,pnk,mn->qmk", pa, x, nb).reshape(tb.size, -1)
    return out


def _one_body_reference(problem, proton, neutron, mu, v, source=None):
    """(O_p ⊗ 1 + 1 ⊗ O_n) v with the species matrices from the problem's own jump lists and every 2M group's."""
    source = source if source is not None else problem.basis
    target = basis.MSchemeBasis(problem.pdets, problem.ndets, source.twice_m + 2 * mu)
    out = np.zeros((target.dim, v.shape[1]))
    for dets, matrix, first in ((problem.pdets, proton, True), (problem.ndets, neutron, False)):
        if matrix is not None:
            m = species_one_body(dets, species.JumpList(dets), matrix)
            _apply_product(source, target, m if first else None, None if first else m, 2 * mu if first else 0, v, out)
    return out


def _ladders_reference(source, target, terms, v):
    """Σ (A ⊗ B) v over ladder terms, each by gathering and scattering a block's rows (np.ix_)."""
    out = np.zeros((target.dim, v.shape[1]))
    for (p_src, p_dst, p_sign), (n_src, n_dst, n_sign), dtwom_p in terms:
        for blk in source.blocks:
            ti = target.block_of_twom.get(blk.twom_p + dtwom_p)
            if ti is None:
                continue
            tb = target.blocks[ti]
            ip = (p_src >= blk.p_start) & (p_src < blk.p_start + blk.n_p)
            jn = (n_src >= blk.n_start) & (n_src < blk.n_start + blk.n_n)
            x = v[blk.offset:blk.offset + blk.size].reshape(blk.n_p, blk.n_n, -1)
            y = out[tb.offset:tb.offset + tb.size].reshape(tb.n_p, tb.n_n, -1)
            y[np.ix_(p_dst[ip] - tb.p_start, n_dst[jn] - tb.n_start)] += (
                np.multiply.outer(p_sign[ip], n_sign[jn])[:, :, None] * x[np.ix_(p_src[ip] - blk.p_start,
                                                                                  n_src[jn] - blk.n_start)])
    return out


def _packaged(name, z, n, twice_m=None):
    return hamiltonian.ShellModelProblem(nushellx.read_interaction(resolve_interaction(name)), z, n, twice_m)


def _random_one_body(space, mu, rng):
    """A random single-particle matrix of an operator raising 2m by 2 mu (zero elsewhere)."""
    o = rng.standard_normal((space.size, space.size))
    return np.where(space.twom[:, None] - space.twom[None, :] == 2 * mu, o, 0.0)


CASES = [("usdb", 2, 3, None), ("usdb", 2, 2, 2), ("usdb", 3, 0, None), ("usdb", 0, 2, None), ("ckpot", 3, 4, None),
         ("gxpf1a", 1, 2, 3), ("gxpf1a", 2, 2, None)]


@pytest.mark.parametrize("name,z,n,twice_m", CASES)
@pytest.mark.parametrize("mu", [0, 1, -1, 2])
def test_one_body_operator_equals_the_straight_products(rng, name, z, n, twice_m, mu):
    """apply and elements (per-block sparse products, the neutron side on the transposed blocks, no result vector
    for elements) against dense block products; float32 and Fortran-ordered input, the raised basis as source,
    a proton or neutron part alone, nuclei without valence protons or neutrons."""
    prob = _packaged(name, z, n, twice_m)
    op_p, op_n = _random_one_body(prob.pspace, mu, rng), _random_one_body(prob.nspace, mu, rng)
    v = rng.standard_normal((prob.dimension, 3))
    for proton, neutron in ((op_p, op_n), (op_p, None), (None, op_n)):
        op = OneBodyOperator(prob, proton, neutron, mu)
        ref = _one_body_reference(prob, proton, neutron, mu, v)
        scale = max(np.abs(ref).max(), 1.0)
        assert op.target.dim == ref.shape[0]
        assert np.abs(op.apply(v) - ref).max() <= 1e-13 * scale
        assert np.abs(op.apply(np.asfortranarray(v.astype(np.float32)))
                      - _one_body_reference(prob, proton, neutron, mu, v.astype(np.float32).astype(float))).max() \
            <= 1e-13 * scale
        w = rng.standard_normal((op.target.dim, 4))
        got = op.elements(v, BlockVectors(op.target, w))
        assert got.shape == (3, 4)
        np.testing.assert_allclose(got, ref.T @ w, rtol=1e-12, atol=1e-14 * scale * np.abs(w).max() * len(w))
    raised = basis.MSchemeBasis(prob.pdets, prob.ndets, prob.basis.twice_m + 2)
    if raised.dim:
        u = rng.standard_normal((raised.dim, 2))
        moved = OneBodyOperator(prob, op_p, op_n, mu).acting_on(raised)
        ref = _one_body_reference(prob, op_p, op_n, mu, u, source=raised)
        assert moved.target.dim == ref.shape[0]
        assert np.abs(moved.apply(u) - ref).max() <= 1e-13 * max(np.abs(ref).max(), 1.0)


def test_one_body_operator_refuses_what_it_cannot_apply(rng):
    prob = _packaged("usdb", 2, 2)
    q = single_particle.quadrupole(prob.pspace, 1)
    with pytest.raises(ValueError, match="2mu = 0 must change 2m by 0, got element"):
        OneBodyOperator(prob, q, None, 0)
    with pytest.raises(ValueError, match="must be 12 x 12, got shape \\(3, 3\\)"):
        OneBodyOperator(prob, np.eye(3), None, 0)
    op = OneBodyOperator(prob, q, None, 1)
    v = rng.standard_normal((prob.dimension, 2))
    with pytest.raises(ValueError, match=f"vectors must belong to the basis of 2M = 2 \\(dimension {op.target.dim}\\), "
                                         f"got 2M = 0"):
        op.elements(v, BlockVectors(prob.basis, v))
    with pytest.raises(ValueError, match=f"vectors must have {prob.dimension} rows"):
        op.elements(v[1:], np.ones((op.target.dim, 1)))


@pytest.mark.parametrize("name,z,n", [("usdb", 2, 2), ("usdb", 1, 3), ("usdb", 3, 1), ("ckpot", 3, 4),
                                      ("gxpf1a", 2, 3)])
def test_ladder_operator_equals_the_gathered_rows(rng, name, z, n):
    """The T₋ (T₊) of the isospin as one sparse matrix against the terms applied by gathers and scatters."""
    prob = _packaged(name, z, n)
    lower = n >= z
    zt, nt = (z + 1, n - 1) if lower else (z - 1, n + 1)
    tp, tn = basis.SpeciesDeterminants(prob.pspace, zt), basis.SpeciesDeterminants(prob.nspace, nt)
    target = basis.MSchemeBasis(tp, tn, prob.basis.twice_m)
    terms = [(species_ladder(prob.pdets, tp, a, create=lower), species_ladder(prob.ndets, tn, a, create=not lower),
              int(prob.pspace.twom[a]) * (1 if lower else -1)) for a in range(prob.pspace.size)]
    v = rng.standard_normal((prob.dimension, 3))
    ref = _ladders_reference(prob.basis, target, terms, v)
    m = ladder_operator(prob.basis, target, terms)
    assert m.shape == (target.dim, prob.dimension) and m.has_canonical_format
    np.testing.assert_allclose(m @ v, ref, rtol=0, atol=1e-14)
    assert np.abs(ref).max() > 0.1
    assert ladder_operator(prob.basis, target, []) is None


@pytest.mark.parametrize("name,z,n,twice_m", [("usdb", 2, 3, None), ("usdb", 2, 2, 2), ("gxpf1a", 2, 2, None)])
def test_compute_observables_leaves_the_vectors_and_takes_any_layout(rng, name, z, n, twice_m):
    """The caller's array is not written; float32, Fortran order and a strided column view give the results of
    the same numbers as a C-ordered float64 array."""
    prob = _packaged(name, z, n, twice_m)
    v = rng.standard_normal((prob.dimension, 4)).astype(np.float32)
    kept = v.copy()
    wide = np.full((prob.dimension, 9), np.nan, dtype=np.float32)
    wide[:, 1::2] = v
    ref = compute_observables(prob, v.astype(np.float64))
    for arg in (v, np.asfortranarray(v), wide[:, 1::2]):
        got = compute_observables(prob, arg)
        assert _flat(got) == pytest.approx(_flat(ref), rel=1e-12, abs=1e-12, nan_ok=True)
    assert np.array_equal(v, kept) and np.isnan(wide[:, ::2]).all()


def _flat(obs):
    """Every number of a compute_observables result, None as NaN, in a fixed order."""
    out = []
    def walk(x):
        if isinstance(x, dict):
            for key in sorted(x):
                walk(x[key])
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, (int, float)) or x is None:
            out.append(np.nan if x is None else float(x))
    walk(obs)
    return out


def test_every_jump_adds_the_groups_the_basis_does_not_use():
    """The problem's jump lists start in its basis' 2M groups; every_jump has those of every group, split by the
    change of 2m, each jump once."""
    prob = _packaged("usdb", 2, 3, 9)
    for dets, own, lists in ((prob.pdets, prob.jumps_p, every_jump(prob)[0]),
                             (prob.ndets, prob.jumps_n, every_jump(prob)[1])):
        full = species.JumpList(dets)
        assert sum(len(j.source) for j in lists.values()) == len(full.source) > len(own.source)
        for shift, j in lists.items():
            assert np.all(dets.space.twom[j.alpha] - dets.space.twom[j.gamma] == shift)
        key = lambda j: sorted(zip(j.source.tolist(), j.target.tolist(), j.alpha.tolist(), j.gamma.tolist(),
                                   j.sign.tolist()))
        assert key(species.JumpList(dets)) == sorted(x for j in lists.values() for x in key(j))
    assert every_jump(prob) is every_jump(prob)


# ---- oscillator ---------------------------------------------------------------------------------------------------
def _r_nl(n, l):
    """An oscillator radial function (b = 1), normalised here by quadrature: an independent reference."""
    raw = lambda r: r ** l * eval_genlaguerre(n, l + 0.5, r * r) * np.exp(-r * r / 2)
    norm = sqrt(quad(lambda r: raw(r) ** 2 * r * r, 0, np.inf)[0])
    return lambda r: raw(r) / norm


@pytest.mark.parametrize("n1,l1,n2,l2,k", [(0, 2, 1, 0, 2), (1, 0, 1, 0, 2), (0, 3, 1, 1, 2), (2, 1, 1, 1, 2),
                                           (0, 1, 0, 2, 1), (3, 4, 2, 4, 0), (1, 3, 2, 1, 2), (0, 0, 0, 0, 4)])
def test_radial_integrals_against_quadrature(n1, l1, n2, l2, k):
    ref = quad(lambda r: _r_nl(n1, l1)(r) * _r_nl(n2, l2)(r) * r ** (2 + k), 0, np.inf, epsabs=1e-13)[0]
    assert oscillator.radial_integral(n1, l1, n2, l2, k) == pytest.approx(ref, abs=1e-9)


def test_radial_integral_closed_forms_and_phase():
    for n in range(4):
        for l in range(5):
            assert oscillator.radial_integral(n, l, n, l, 2) == pytest.approx(2 * n + l + 1.5, abs=1e-12)
            assert oscillator.radial_integral(n, l, n, l, 0) == pytest.approx(1.0, abs=1e-12)
            if n:    # <n l | r² | n-1 l> = -sqrt(n (n + l + 1/2)) for functions positive at the origin
                assert oscillator.radial_integral(n, l, n - 1, l, 2) == pytest.approx(-sqrt(n * (n + l + 0.5)))
    assert oscillator.radial_integral(0, 2, 1, 0, 2) == pytest.approx(-sqrt(10.0))
    assert _r_nl(1, 0)(1e-3) > 0     # the reference has the same phase
    with pytest.raises(ValueError, match="l1 \\+ l2 \\+ k must be even"):
        oscillator.radial_integral(0, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="n1 must be a non-negative integer"):
        oscillator.radial_integral(-1, 0, 0, 0)


def test_oscillator_length_and_options():
    hw = oscillator.hbar_omega(20)
    assert hw == pytest.approx(45 * 20 ** (-1 / 3) - 25 * 20 ** (-2 / 3))
    b = oscillator.oscillator_length(hw)
    assert b == pytest.approx(197.327 / sqrt(938.9185 * hw), rel=1e-6)
    assert oscillator.hbar_omega_of_length(b) == pytest.approx(hw)
    assert TransitionOptions(b=1.9).oscillator(20) == pytest.approx((1.9, oscillator.hbar_omega_of_length(1.9)))
    assert TransitionOptions(hbar_omega=12.0).oscillator(20)[0] == pytest.approx(oscillator.oscillator_length(12.0))
    assert TransitionOptions().oscillator(20) == pytest.approx((b, hw))
    for kwargs, match in [({"b": -1.0}, "b must be a positive number, got -1.0"),
                          ({"hbar_omega": float("nan")}, "hbar_omega must be a positive number"),
                          ({"b": 2.0, "hbar_omega": 10.0}, "give b or hbar_omega, not both"),
                          ({"eff_charge": (1.5,)}, "eff_charge must be a pair"),
                          ({"gs": (5.586, float("inf"))}, "gs must be finite"),
                          ({"gl": "ab"}, "gl must be a pair"),
                          ({"b": 1e-300}, r"b must be between 0.01 and 100 \(fm\), got 1e-300"),
                          ({"hbar_omega": 1e6}, r"hbar_omega must be between 0.01 and 1000 \(MeV\)"),
                          ({"eff_charge": (1e308, 1e308)}, "eff_charge must be at most 1000 in size")]:
        with pytest.raises(ValueError, match=match):
            TransitionOptions(**kwargs)
    with pytest.raises(ValueError, match="mass must be a positive integer"):
        oscillator.hbar_omega(0)


# ---- single-particle operators ------------------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize("name", ["usdb.snt", "gxpf1a.snt", "ckpot.snt"])
def test_single_particle_operators(name):
    space = basis.SingleParticleSpace(snt.read_snt(DATA / name).proton_orbits)
    for mu in (-1, 0, 1):     # l + s = j, each from its own construction
        total = single_particle.total(space, mu)
        assert np.abs(single_particle.orbital(space, mu) + single_particle.spin(space, mu) - total).max() < 1e-13
        for op in (single_particle.orbital, single_particle.spin):      # V_(-mu) = (-1)^mu V_mu^T
            assert np.abs(op(space, -mu) - (-1) ** mu * op(space, mu).T).max() < 1e-13
    for mu in range(-2, 3):
        assert np.abs(single_particle.quadrupole(space, -mu) - (-1) ** mu * single_particle.quadrupole(space, mu).T).max() < 1e-13
    # Wigner–Eckart: <a m|r²Y_2mu|g m'> / <j_g m' 2 mu|j_a m> is one number per orbit pair, whose size is the closed
    # form |<j_a||Y_2||j_g>| = sqrt(5 (2j_a+1)(2j_g+1)/4π) |<j_g 1/2 2 0|j_a 1/2>| / sqrt(2j_a+1) times <r²>
    q = {mu: single_particle.quadrupole(space, mu) for mu in range(-2, 3)}
    for oa_i, oa in enumerate(space.orbits):
        for og_i, og in enumerate(space.orbits):
            ratios = []
            for a in np.nonzero(space.orbit == oa_i)[0]:
                for g in np.nonzero(space.orbit == og_i)[0]:
                    mu = (space.twom[a] - space.twom[g]) // 2
                    c = clebsch_gordan(og.twoj, int(space.twom[g]), 4, 2 * int(mu), oa.twoj, int(space.twom[a]))
                    if abs(mu) <= 2 and abs(c) > 1e-8:
                        ratios.append(q[int(mu)][a, g] / c * sqrt(oa.twoj + 1))
                    elif abs(mu) <= 2:
                        assert abs(q[int(mu)][a, g]) < 1e-13
            parity_ok = (oa.l + og.l) % 2 == 0 and abs(oa.l - og.l) <= 2
            expect = (sqrt(5 * (og.twoj + 1) / (4 * pi)) * abs(clebsch_gordan(og.twoj, 1, 4, 0, oa.twoj, 1))
                      * abs(oscillator.radial_integral(oa.n, oa.l, og.n, og.l)) if parity_ok else 0.0)
            if ratios:
                assert np.ptp(ratios) < 1e-12
                assert abs(ratios[0]) == pytest.approx(expect, abs=1e-12)
    assert [orbit_label(o) for o in space.orbits][:2] == [orbit_label(space.orbits[0]), orbit_label(space.orbits[1])]


@needs_data
def test_one_body_operator_is_j_plus_for_every_layout(rng):
    prob = _problem("usdb.snt", 2, 3)
    v = rng.standard_normal((prob.dimension, 4))
    op = OneBodyOperator(prob, -sqrt(2) * single_particle.total(prob.pspace, 1),
                         -sqrt(2) * single_particle.total(prob.nspace, 1), 1)
    ref = angmom.j_plus(prob) @ v
    assert np.abs(op.apply(v) - ref).max() < 1e-12
    assert np.abs(op.apply(np.asfortranarray(v)) - ref).max() < 1e-12
    wide = np.full((prob.dimension, 9), np.nan)
    wide[:, ::2][:, :4] = v
    assert np.abs(op.apply(wide[:, ::2][:, :4]) - ref).max() < 1e-12      # strided view
    assert op.apply(v[:, :0]).shape == (op.target.dim, 0)
    with pytest.raises(ValueError, match=f"vectors must have {prob.dimension} rows"):
        op.apply(v[:-1])


# ---- occupations, parity, isospin ---------------------------------------------------------------------------------
def _brute_force_per_state(problem, vectors, per_determinant_pair):
    """Σ_b |v_b|² f(p_b, n_b), walking the basis state by state (an independent reading of its layout)."""
    out = 0.0
    for blk in problem.basis.blocks:
        for ip in range(blk.n_p):
            for i_n in range(blk.n_n):
                row = blk.offset + ip * blk.n_n + i_n
                out = out + vectors[row] ** 2 * per_determinant_pair(blk.p_start + ip, blk.n_start + i_n)
    return out


@needs_data
def test_occupations_sum_rules_and_brute_force(rng):
    prob = _problem("usdb.snt", 2, 3)
    v = rng.standard_normal((prob.dimension, 3))
    v /= np.linalg.norm(v, axis=0)
    occ_p, occ_n = states.occupations(prob, v)
    np.testing.assert_allclose(occ_p.sum(axis=1), 2, atol=1e-12)
    np.testing.assert_allclose(occ_n.sum(axis=1), 3, atol=1e-12)
    for k, orbit in enumerate(prob.pspace.orbits):
        mask = prob.pspace.orbit == k
        ref = _brute_force_per_state(prob, v, lambda p, n: prob.pdets.occ[p, mask].sum())
        np.testing.assert_allclose(occ_p[:, k], ref, atol=1e-12)
    mask = prob.nspace.orbit == 2
    np.testing.assert_allclose(occ_n[:, 2], _brute_force_per_state(prob, v, lambda p, n: prob.ndets.occ[n, mask].sum()),
                               atol=1e-12)
    with pytest.raises(ValueError, match="vectors must be finite and nonzero"):
        poisoned = v.copy()
        poisoned[7, 1] = np.nan
        states.occupations(prob, poisoned)


@needs_data
def test_occupations_in_the_single_particle_limit():
    """One proton on a full neutron sd shell: the eigenstates are single-particle states d5/2, s1/2, d3/2."""
    prob = _problem("usdb.snt", 1, 12)
    w, v = _eigen(prob)
    obs = compute_observables(prob, v)
    occ_p = np.array(obs["occupations"]["proton"])
    assert np.abs(occ_p - np.round(occ_p)).max() < 1e-12
    np.testing.assert_array_equal(np.sort(np.round(occ_p), axis=0), np.sort(np.eye(3), axis=0))
    np.testing.assert_allclose(obs["occupations"]["neutron"], [[4, 6, 2]] * 3, atol=1e-12)
    assert obs["orbits"]["proton"] == ["0d3/2", "0d5/2", "1s1/2"]


@needs_data
@pytest.mark.parametrize("z,n,sign", [(4, 4, 1), (3, 4, -1), (1, 2, -1)])
def test_parity_of_p_shell_states(z, n, sign):
    prob = _problem("ckpot.snt", z, n)
    w, v = _eigen(prob, 6)
    obs = compute_observables(prob, v)
    assert obs["parity"] == [sign] * 6
    np.testing.assert_allclose(obs["parity_expectation"], sign, atol=1e-12)


def test_mixed_parity_is_reported(rng):
    orbits = [snt.Orbit(0, 0, 1, 1, -1), snt.Orbit(1, 1, 0, 1, -1), snt.Orbit(2, 0, 1, 1, 1), snt.Orbit(3, 1, 0, 1, 1)]
    prob = hamiltonian.ShellModelProblem(snt.Interaction("p1/2+s1/2", orbits, 0, 0, {}), 1, 1)
    v = rng.standard_normal((prob.dimension, 3))
    v /= np.linalg.norm(v, axis=0)
    pi_det = lambda dets, space, d: (-1) ** int(sum(space.orbits[space.orbit[s]].l for s in np.nonzero(dets.occ[d])[0]))
    ref = _brute_force_per_state(prob, v, lambda p, n: pi_det(prob.pdets, prob.pspace, p) * pi_det(prob.ndets, prob.nspace, n))
    np.testing.assert_allclose(states.parity_expectation(prob, v), ref, atol=1e-12)
    assert np.all(np.abs(ref) < 1 - PARITY_TOLERANCE)
    assert compute_observables(prob, v)["parity"] == [0, 0, 0]


@needs_data
def test_isospin_of_20ne_and_its_t1_analogs():
    """20Ne's lowest states have T = 0; its lowest T = 1 level is the analog of the 20F ground state (same energy:
    USDB conserves isospin and has no Coulomb term), and every 20F state has T = 1."""
    ne = _problem("usdb.snt", 2, 2)
    w, v = _eigen(ne, 12)
    t2 = states.isospin_squared(ne, v)
    assert np.abs(t2[:5]).max() < 1e-10
    assert np.abs(t2 - np.round(t2)).max() < 1e-10 and set(np.round(t2)) <= {0.0, 2.0}
    f = _problem("usdb.snt", 1, 3)
    wf, vf = _eigen(f, 6)
    np.testing.assert_allclose(states.isospin_squared(f, vf), 2.0, atol=1e-10)
    first_t1 = int(np.nonzero(np.round(t2) == 2.0)[0][0])
    assert w[first_t1] == pytest.approx(wf[0], abs=1e-9)
    obs = compute_observables(ne, v[:, :3])
    assert obs["t"] == [0.0, 0.0, 0.0] and obs["t2"] == pytest.approx([0, 0, 0], abs=1e-10)


def _t2_by_exchange(problem, v):
    """<T²> = N - <Σ_(αβ) (c†_(pβ) c_(pα)) (c†_(nα) c_(nβ))> + T_z² - T_z: the same-basis form of T₊T₋, a
    reference independent of the ladder operators and of the (Z ± 1, N ∓ 1) bases."""
    n_sp = problem.pspace.size
    ops = []
    for dets, jumps in ((problem.pdets, problem.jumps_p), (problem.ndets, problem.jumps_n)):
        table = {}
        for a in range(n_sp):
            for b in range(n_sp):
                o = np.zeros((n_sp, n_sp))
                o[a, b] = 1.0
                table[(a, b)] = species_one_body(dets, jumps, o)
        ops.append(table)
    twom = problem.pspace.twom
    x = np.zeros_like(v)
    for a in range(n_sp):
        for b in range(n_sp):
            _apply_product(problem.basis, problem.basis, ops[0][(b, a)], ops[1][(a, b)], int(twom[b] - twom[a]), v, x)
    tz = (problem.n_neutrons - problem.n_protons) / 2
    return problem.n_neutrons - np.sum(v * x, axis=0) + tz * tz - tz


@needs_data
@pytest.mark.parametrize("name,z,n", [("usdb.snt", 2, 2), ("usdb.snt", 1, 1), ("usdb.snt", 1, 3), ("usdb.snt", 3, 1),
                                      ("usdb.snt", 11, 12), ("ckpot.snt", 3, 4)])
def test_isospin_of_random_vectors_against_the_exchange_form(rng, name, z, n):
    """Both branches (T₋ for N >= Z, T₊ for Z > N) and a target with no neutrons (1 + 1 nucleons)."""
    prob = _problem(name, z, n)
    v = rng.standard_normal((prob.dimension, 3))
    v /= np.linalg.norm(v, axis=0)
    np.testing.assert_allclose(states.isospin_squared(prob, v), _t2_by_exchange(prob, v), atol=1e-12)


@needs_data
@pytest.mark.parametrize("name,z,n", [("usdb.snt", 2, 3), ("usdb.snt", 3, 2), ("ckpot.snt", 3, 2), ("gxpf1a.snt", 1, 2)])
def test_isospin_of_mirror_pairs_is_tz(name, z, n):
    """T_z = ±1/2 nuclei: the low states have T = 1/2 (<T²> = 3/4) on both sides of the mirror."""
    prob = _problem(name, z, n)
    w, v = _eigen(prob, 4)
    np.testing.assert_allclose(states.isospin_squared(prob, v), 0.75, atol=1e-10)


def test_isospin_unavailable_when_orbits_differ(rng):
    orbits = [snt.Orbit(0, 0, 2, 5, -1), snt.Orbit(1, 0, 2, 3, 1)]
    prob = hamiltonian.ShellModelProblem(snt.Interaction("d5/2 x d3/2", orbits, 0, 0, {}), 1, 1)
    v = rng.standard_normal((prob.dimension, 2))
    assert states.isospin_squared(prob, v) is None
    obs = compute_observables(prob, v)
    assert obs["t"] is None and obs["t2"] is None


# ---- E2 and M1 ----------------------------------------------------------------------------------------------------
@needs_data
def test_selection_rules_hold_in_the_m_scheme_elements():
    """Between states whose J differ by more than the rank (and 0 -> 0) every M-scheme element vanishes, and so do
    the reported B values; allowed ones do not all vanish."""
    prob = _problem("usdb.snt", 2, 2)
    w, v = _eigen(prob, 10)
    twoj = np.round(2 * angmom.j_from_j2(angmom.expectation_j2(prob, v))).astype(int)
    obs = compute_observables(prob, v)
    raised = OneBodyOperator(prob, -sqrt(2) * single_particle.total(prob.pspace, 1),
                             -sqrt(2) * single_particle.total(prob.nspace, 1), 1).apply(v)
    for rank, name, ops in ((2, "e2", single_particle.quadrupole), (1, "m1", single_particle.spin)):
        same_m = OneBodyOperator(prob, ops(prob.pspace, 0), ops(prob.nspace, 0), 0).apply(v).T @ v
        up = OneBodyOperator(prob, ops(prob.pspace, 1), ops(prob.nspace, 1), 1).apply(v).T @ raised
        forbidden = (np.abs(twoj[:, None] - twoj[None, :]) > 2 * rank) | ((twoj[:, None] == 0) & (twoj[None, :] == 0))
        assert forbidden.any() and (~forbidden).any()
        scale = max(np.abs(same_m).max(), np.abs(up).max())
        assert np.abs(same_m[forbidden]).max() < 1e-9 * scale and np.abs(up[forbidden]).max() < 1e-9 * scale
        b = _b(obs, name)
        assert np.all(b[forbidden] == 0)
        assert b[~forbidden].max() > 1e-3


@needs_data
@pytest.mark.parametrize("z,n,twice_m", [(2, 2, 0), (2, 3, 1), (2, 2, 2)])
def test_m1_operator_with_unit_g_factors_is_j(z, n, twice_m):
    """g_l = g_s = 1 for both species makes the M1 operator J itself: no transitions, mu(J) = J."""
    prob = _problem("usdb.snt", z, n, twice_m)
    w, v = _eigen(prob, 8)
    obs = compute_observables(prob, v, TransitionOptions(gl=(1, 1), gs=(1, 1)))
    b = _b(obs, "m1")
    off = ~np.eye(len(b), dtype=bool)
    assert np.abs(b[off]).max() < 1e-20
    j = angmom.j_from_j2(angmom.expectation_j2(prob, v))
    np.testing.assert_allclose(obs["m1"]["moment"], j, atol=1e-12)
    assert obs["m1"]["wigner_eckart_residual"] < 1e-10


@pytest.mark.parametrize("l,twoj,particles", [(2, 5, 1), (2, 5, 3), (2, 5, 5), (3, 7, 1), (3, 7, 3), (3, 7, 5),
                                              (3, 7, 7)])
def test_quadrupole_moment_in_one_j_shell(l, twoj, particles):
    """Seniority-one state J = j of n protons in one j shell (neutron shell full): Q = -(2j+1-2n)/(2j+2) e_p <r²>,
    and mu is the single-particle (Schmidt) value for any n."""
    prob = hamiltonian.ShellModelProblem(_single_j(0, l, twoj), particles, twoj + 1, 1)
    state = _j_eigenstate(prob, twoj)
    opts = TransitionOptions(eff_charge=(1.3, 0.7), b=1.9)
    obs = compute_observables(prob, state, opts)
    r2 = (l + 1.5) * 1.9 ** 2
    assert obs["e2"]["moment"][0] == pytest.approx(-(twoj + 1 - 2 * particles) / (twoj + 2) * 1.3 * r2, abs=1e-10)
    j = twoj / 2
    gl, gs = opts.gl[0], opts.gs[0]
    schmidt = gl * l + gs / 2 if twoj == 2 * l + 1 else j / (j + 1) * ((l + 1) * gl - gs / 2)
    assert obs["m1"]["moment"][0] == pytest.approx(schmidt, abs=1e-10)
    np.testing.assert_allclose(obs["occupations"]["proton"], [[particles]], atol=1e-12)


@needs_data
def test_single_particle_b_e2_and_schmidt_moments():
    """One proton on the full neutron sd shell: B(E2; j_i -> j_f) = (5/4π) e_p² <r²>² (2j_f+1)/(2j_i+1)
    <j_f -1/2 2 0 | j_i -1/2>², and the magnetic moments are the Schmidt values."""
    prob = _problem("usdb.snt", 1, 12)
    w, v = _eigen(prob)
    opts = TransitionOptions(b=1.7)
    obs = compute_observables(prob, v, opts)
    orbits = prob.pspace.orbits
    occ = np.array(obs["occupations"]["proton"])
    orbit_of_state = [orbits[int(np.argmax(row))] for row in occ]
    b_e2 = _b(obs, "e2")
    for i, oi in enumerate(orbit_of_state):
        for f, of in enumerate(orbit_of_state):
            r2 = oscillator.radial_integral(of.n, of.l, oi.n, oi.l) * 1.7 ** 2
            ref = (5 / (4 * pi) * (1.5 * r2) ** 2 * (of.twoj + 1) / (oi.twoj + 1)
                   * clebsch_gordan(of.twoj, -1, 4, 0, oi.twoj, -1) ** 2)
            assert b_e2[i, f] == pytest.approx(ref, rel=1e-10, abs=1e-12)
        l, j = oi.l, oi.twoj / 2
        schmidt = l + 5.586 / 2 if oi.twoj == 2 * l + 1 else j / (j + 1) * ((l + 1) - 5.586 / 2)
        assert obs["m1"]["moment"][i] == pytest.approx(schmidt, abs=1e-10)


@needs_data
@pytest.mark.parametrize("name,z,n", [("usdb.snt", 2, 3), ("ckpot.snt", 2, 3), ("usdb.snt", 2, 4)])
def test_mirror_nuclei_with_swapped_charges(name, z, n):
    """Isospin symmetry: B(E2), B(M1), Q and mu of a nucleus equal those of its mirror with proton and neutron
    charges and g-factors swapped."""
    opts = TransitionOptions(eff_charge=(1.45, 0.55), gl=(1.1, -0.05), gs=(5.0, -3.4))
    swapped = TransitionOptions(eff_charge=(0.55, 1.45), gl=(-0.05, 1.1), gs=(-3.4, 5.0))
    results = []
    for (zz, nn), o in (((z, n), opts), ((n, z), swapped)):
        prob = _problem(name, zz, nn)
        w, v = _eigen(prob, 6)
        results.append((w, compute_observables(prob, v, o)))
    (w1, o1), (w2, o2) = results
    np.testing.assert_allclose(w1, w2, atol=1e-9)
    for name_ in ("e2", "m1"):
        np.testing.assert_allclose(_b(o1, name_), _b(o2, name_), rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(o1[name_]["moment"], o2[name_]["moment"], rtol=1e-9, atol=1e-10)
    assert not np.allclose(_b(o1, "e2"), _b(_o_with(name, z, n, TransitionOptions()), "e2"))


def _o_with(name, z, n, opts):
    prob = _problem(name, z, n)
    return compute_observables(prob, _eigen(prob, 6)[1], opts)


@needs_data
def test_sum_rule_over_every_20ne_state():
    """Σ_f B(λ; i -> f) over all 640 eigenstates (every J multiplet once) = Σ_mu |T_(λ mu)|i, M>|², the latter by
    applying each component (2M shifted by 2mu) directly. M1 with g_l = 0 (the spin part)."""
    prob = _problem("usdb.snt", 2, 2)
    w, v = _eigen(prob, split_j=True)
    opts = TransitionOptions(gl=(0.0, 0.0))
    obs = transitions.electromagnetic(prob, v, opts)
    assert obs["labelled"].all()
    b = obs["b"]
    picks = [0, 1, 2, 5]
    for name, rank, ops, charges, factor in (
            ("e2", 2, lambda sp_, mu: b * b * single_particle.quadrupole(sp_, mu), opts.eff_charge, 1.0),
            ("m1", 1, single_particle.spin, opts.gs, 3 / (4 * pi))):
        direct = 0.0
        for mu in range(-rank, rank + 1):
            op = OneBodyOperator(prob, charges[0] * ops(prob.pspace, mu), charges[1] * ops(prob.nspace, mu), mu)
            direct = direct + factor * np.sum(op.apply(v[:, picks]) ** 2, axis=0)
        np.testing.assert_allclose(obs[name]["b"][picks].sum(axis=1), direct, rtol=1e-9)
        assert direct.min() > 0


@needs_data
def test_results_do_not_depend_on_m():
    """20Ne with 2M = 0 and 2M = 2: the states present in both give the same B, Q and mu."""
    runs = []
    for m in (0, 2):
        prob = _problem("usdb.snt", 2, 2, m)
        w, v = _eigen(prob, 12)
        runs.append((w, compute_observables(prob, v)))
    (w0, o0), (w2, o2) = runs
    pairs = [(i, int(np.argmin(np.abs(w2 - e)))) for i, e in enumerate(w0) if np.abs(w2 - e).min() < 1e-8]
    assert len(pairs) >= 8
    a, c = zip(*pairs)
    for name in ("e2", "m1"):
        np.testing.assert_allclose(_b(o0, name)[np.ix_(a, a)], _b(o2, name)[np.ix_(c, c)], rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(np.array(o0[name]["moment"])[list(a)], np.array(o2[name]["moment"])[list(c)],
                                   rtol=1e-9, atol=1e-10)


@needs_data
def test_detailed_balance_charges_and_length():
    """(2J_i+1) B(i->f) = (2J_f+1) B(f->i); the reduced E2 element is linear in the charges and goes as b²."""
    prob = _problem("usdb.snt", 2, 3)
    w, v = _eigen(prob, 8)
    j = angmom.j_from_j2(angmom.expectation_j2(prob, v))
    obs = {q: transitions.electromagnetic(prob, v, TransitionOptions(eff_charge=q, b=1.0))
           for q in ((1.0, 0.0), (0.0, 1.0), (1.5, 0.5))}
    full = obs[(1.5, 0.5)]
    for name in ("e2", "m1"):
        weighted = (2 * j + 1)[:, None] * full[name]["b"]
        np.testing.assert_allclose(weighted, weighted.T, rtol=1e-9, atol=1e-12)
        assert full[name]["wigner_eckart_residual"] < 1e-10
    np.testing.assert_allclose(full["e2"]["reduced"],
                               1.5 * obs[(1.0, 0.0)]["e2"]["reduced"] + 0.5 * obs[(0.0, 1.0)]["e2"]["reduced"],
                               atol=1e-12)
    wider = transitions.electromagnetic(prob, v, TransitionOptions(b=2.0))
    np.testing.assert_allclose(wider["e2"]["b"], 16 * full["e2"]["b"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(wider["m1"]["b"], full["m1"]["b"], rtol=1e-12, atol=1e-14)


@needs_data
def test_a_state_without_a_j_label(rng):
    """A mixture of two J values gets no B values (None in the JSON); the other states are unaffected."""
    prob = _problem("usdb.snt", 2, 2)
    w, v = _eigen(prob, 4)
    mixed = v.copy()
    mixed[:, 3] = (v[:, 1] + v[:, 2]) / sqrt(2)       # J = 2 and J = 4
    clean = compute_observables(prob, v)
    obs = compute_observables(prob, mixed)
    assert obs["e2"]["b"][3] == [None] * 4 and obs["e2"]["b"][0][3] is None and obs["m1"]["moment"][3] is None
    np.testing.assert_allclose(_b(obs, "e2")[:3, :3], _b(clean, "e2")[:3, :3], rtol=1e-12)
    with pytest.raises(ValueError, match="vectors must have 640 rows"):
        compute_observables(prob, v[:10])
    with pytest.raises(ValueError, match="vectors must be finite and nonzero"):
        compute_observables(prob, np.zeros((640, 1)))


class _ThreadRanks:
    """Ranks as threads for compute_observables' sharing: Get_rank, Get_size and an allgather of Python
    objects (a barrier on each side of the exchange)."""

    def __init__(self, size):
        import threading
        self.size, self.slots, self.barrier = size, [None] * size, threading.Barrier(size)

    def rank(self, r):
        ranks = self

        class Comm:
            def Get_rank(self):
                return r

            def Get_size(self):
                return ranks.size

            def allgather(self, obj):
                ranks.slots[r] = obj
                ranks.barrier.wait()
                out = list(ranks.slots)
                ranks.barrier.wait()
                return out
        return Comm()


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_share_the_observables_and_each_returns_them_all(rng, size):
    """Each rank computes its round-robin share of compute_observables.PARTS; every rank's dict equals the one
    a single process makes, also with more ranks than parts."""
    import threading
    from cisolver import observables
    prob = _packaged("usdb", 2, 3, None)
    v = rng.standard_normal((prob.dimension, 4))
    alone = compute_observables(prob, v)
    ranks, got, called = _ThreadRanks(size), [None] * size, []
    real = {name: getattr(observables, name) for name in ("electromagnetic", "isospin_squared")}

    def counted(name):
        def f(*a, **k):
            called.append(name)
            return real[name](*a, **k)
        return f
    for name in real:
        setattr(observables, name, counted(name))
    try:
        def one(r):
            got[r] = compute_observables(prob, v, comm=ranks.rank(r))
        threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for name, f in real.items():
            setattr(observables, name, f)
    assert all(g == alone for g in got)
    assert sorted(called) == ["electromagnetic", "isospin_squared"]     # each part once over the ranks
