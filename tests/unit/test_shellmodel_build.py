"""The shell-model H build: every particle number, every element against a determinant-by-determinant H from
the README rules, closed forms for one and two valence nucleons, CSR layout, identical arrays for any grouping
of rows and thread count, and the sizes callable before a build."""
import itertools
import json
from math import sqrt

import numpy as np
import pytest
import scipy.sparse as sp

from cisolver.shellmodel import angmom, hamiltonian, snt
from cisolver.shellmodel.clebsch import clebsch_gordan
from ci_data import DATA

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"interaction data folder absent: {DATA} (set CISOLVER_DATA)")


def _inter(name):
    return snt.read_snt(DATA / f"{name}.snt")


def _random_interaction(tmp_path, name, seed, scaled=True):
    """The model space and TBME list of ``name`` with random SPEs and TBMEs (pp, nn and pn all different):
    no isospin symmetry for a wrong proton/neutron pairing to hide behind."""
    real = _inter(name)
    rng = np.random.default_rng(seed)
    lines = [f"{sum(o.is_proton for o in real.orbits)} {sum(not o.is_proton for o in real.orbits)} "
             f"{real.core_z} {real.core_n}"]
    lines += [f"{o.index + 1} {o.n} {o.l} {o.twoj} {o.twotz}" for o in real.orbits]
    lines += [f"{len(real.orbits)} 0"] + [f"{o.index + 1} {o.index + 1} {rng.uniform(-5, 5):.6f}" for o in real.orbits]
    keys = sorted(k for k in real.tbme if k[:2] <= k[2:4])
    lines += [f"{len(keys)} 1 {real.core_z + real.core_n + 2} -0.3" if scaled else f"{len(keys)} 0"]
    lines += [f"{a + 1} {b + 1} {c + 1} {d + 1} {jj} {rng.uniform(-3, 3):.6f}" for a, b, c, d, jj in keys]
    path = tmp_path / f"random_{name}_{seed}.snt"
    path.write_text("\n".join(lines) + "\n")
    return snt.read_snt(path)


# ---- H determinant by determinant, from the README's rules (no code shared with the build) --------------------
def _states(inter):
    """(orbit, 2j, 2m) of every single-particle state: protons first, orbit by orbit, m ascending."""
    return [(o.index, o.twoj, tm) for o in inter.orbits for tm in range(-o.twoj, o.twoj + 1, 2)]


def _vbar_row(inter, states, factor, g, d, cache={}):
    """[(α, β, v̄(αβ, γδ))] over α < β with v̄ != 0, for the pair γ < δ (cached per file, factor and pair)."""
    key = (inter.path, factor, g, d)
    if key not in cache:
        c, jc, mc = states[g]
        dd, jd, md = states[d]
        out = []
        for a_, b_ in itertools.combinations(range(len(states)), 2):
            a, ja, ma = states[a_]
            b, jb, mb = states[b_]
            if ma + mb != mc + md:
                continue
            total = sum(clebsch_gordan(ja, ma, jb, mb, 2 * jj, ma + mb)
                        * clebsch_gordan(jc, mc, jd, md, 2 * jj, ma + mb)
                        * inter.tbme.get((a, b, c, dd, jj), 0.0) for jj in range((ja + jb) // 2 + 1))
            v = (sqrt(2.0) if a == b else 1.0) * (sqrt(2.0) if c == dd else 1.0) * total * factor
            if v != 0.0:
                out.append((a_, b_, v))
        cache[key] = out
    return cache[key]


def _apply(state, op, create):
    """c†_op or c_op on a bit-string determinant: (sign, new state), or None."""
    if bool(state >> op & 1) == create:
        return None
    return (-1) ** bin(state & ((1 << op) - 1)).count("1"), state ^ (1 << op)


def _determinant_h(problem):
    """Dense H in the build's basis order: H|j> = Σ e_α n_α |j> + Σ_{α<β,γ<δ} v̄ c†_α c†_β c_δ c_γ |j>."""
    inter = problem.interaction
    states = _states(inter)
    n_p = sum(o.twoj + 1 for o in inter.proton_orbits)
    basis = [int(p) | int(n) << n_p for b in problem.basis.blocks
             for p in problem.pdets.states[b.p_start:b.p_start + b.n_p]
             for n in problem.ndets.states[b.n_start:b.n_start + b.n_n]]
    where = {s: i for i, s in enumerate(basis)}
    factor = inter.tbme_factor(problem.mass)
    h = np.zeros((len(basis), len(basis)))
    for j, det in enumerate(basis):
        occ = [s for s in range(len(states)) if det >> s & 1]
        h[j, j] += sum(inter.spe[states[s][0]] for s in occ)
        for g, d in itertools.combinations(occ, 2):
            s1, st = _apply(det, g, False)
            s2, st = _apply(st, d, False)
            for a, b, v in _vbar_row(inter, states, factor, g, d):
                r3 = _apply(st, b, True)
                r4 = r3 and _apply(r3[1], a, True)
                if r4:
                    h[where[r4[1]], j] += s1 * s2 * r3[0] * r4[0] * v
    return h


@pytest.mark.parametrize("name,z,n,twice_m", [
    ("usdb", 2, 2, 0), ("usdb", 2, 2, 4), ("usdb", 0, 2, 0), ("usdb", 2, 0, 2), ("usdb", 0, 3, 1), ("usdb", 1, 0, 1),
    ("usdb", 0, 0, 0), ("usdb", 12, 12, 0), ("usdb", 11, 1, 0), ("usdb", 12, 3, 3), ("ckpot", 4, 4, 0),
    ("ckpot", 3, 2, 1), ("ckpot", 6, 1, 1), ("gxpf1a", 1, 2, 1), ("kb3g", 0, 4, 2)])
def test_every_element_equals_the_determinant_rules(name, z, n, twice_m, tmp_path):
    """Real and random interactions (random: pp, nn, pn and the SPEs all different, TBMEs scaled): the full H,
    element by element, in both storages."""
    for inter in (_inter(name), _random_interaction(tmp_path, name, seed=z * 100 + n * 10 + twice_m)):
        problem = hamiltonian.ShellModelProblem(inter, z, n, twice_m)      # dimensions 1..640
        ref = _determinant_h(problem)
        assert np.abs(ref - ref.T).max() < 1e-12
        full, info = problem.build("full")
        upper, _ = problem.build("upper")
        np.testing.assert_allclose(full.toarray(), ref, rtol=0, atol=1e-12)
        np.testing.assert_allclose(upper.toarray(), np.triu(ref), rtol=0, atol=1e-12)
        assert info.dimension == problem.dimension == len(ref)


def _two_body_spectrum(inter, orbits_1, orbits_2, like):
    """Energies of two valence nucleons in closed form: for every J the matrix e_a + e_b + factor V_J over the
    coupled pairs (a <= b; like particles in one orbit: even J only), each eigenvalue once for M = 0."""
    factor = inter.tbme_factor(inter.core_z + inter.core_n + 2)
    energies = []
    for jj in range(20):
        pairs = [(a, b) for a in orbits_1 for b in orbits_2 if (not like or a.index <= b.index)
                 and abs(a.twoj - b.twoj) <= 2 * jj <= a.twoj + b.twoj and not (like and a is b and jj % 2)]
        if pairs:
            m = np.array([[factor * inter.tbme.get((a.index, b.index, c.index, d.index, jj), 0.0)
                           for c, d in pairs] for a, b in pairs])
            m += np.diag([inter.spe[a.index] + inter.spe[b.index] for a, b in pairs])
            energies += list(np.linalg.eigvalsh(m))
    return np.sort(energies)


@pytest.mark.parametrize("name", ["usdb", "gxpf1a", "ckpot"])
def test_two_valence_nucleons_equal_the_coupled_two_body_matrices(name):
    """18O / 18Ne / 18F (and the pf and p shells): 0p 2n, 2p 0n and 1p 1n against the J-coupled matrices."""
    inter = _inter(name)
    cases = {(0, 2): (inter.neutron_orbits, inter.neutron_orbits, True),
             (2, 0): (inter.proton_orbits, inter.proton_orbits, True),
             (1, 1): (inter.proton_orbits, inter.neutron_orbits, False)}
    for (z, n), (o1, o2, like) in cases.items():
        problem = hamiltonian.ShellModelProblem(inter, z, n)
        w = np.linalg.eigvalsh(problem.build("full")[0].toarray())
        np.testing.assert_allclose(w, _two_body_spectrum(inter, o1, o2, like), rtol=0, atol=1e-10)


def test_18o_lowest_states_and_its_mirror():
    """18O (usdb, 0p 2n): 0+, 2+, 4+ lowest; 18Ne (2p 0n) has the same energies (no Coulomb, pp = nn)."""
    inter = _inter("usdb")
    o18 = hamiltonian.ShellModelProblem(inter, 0, 2)
    w, v = np.linalg.eigh(o18.build("full")[0].toarray())
    assert list(angmom.j_from_j2(angmom.expectation_j2(o18, v[:, :3]))) == [0, 2, 4]
    ne18 = np.linalg.eigvalsh(hamiltonian.ShellModelProblem(inter, 2, 0).build("full")[0].toarray())
    np.testing.assert_allclose(ne18, w, rtol=0, atol=1e-12)
    assert o18.dimension == 14


@pytest.mark.parametrize("z,n", [(0, 1), (1, 0)])
def test_one_valence_nucleon_sits_at_the_single_particle_energies(z, n):
    """17O / 17F: 2M = 1 holds one m = 1/2 state per orbit, at its (unscaled) SPE, with J = j."""
    inter = _inter("usdb")
    problem = hamiltonian.ShellModelProblem(inter, z, n)
    w, v = np.linalg.eigh(problem.build("upper")[0].toarray())
    orbits = inter.neutron_orbits if n else inter.proton_orbits
    spe = sorted((inter.spe[o.index], o.twoj / 2) for o in orbits)
    np.testing.assert_allclose(w, [e for e, _ in spe], rtol=0, atol=1e-12)
    np.testing.assert_allclose(angmom.j_from_j2(angmom.expectation_j2(problem, v)), [j for _, j in spe])


def test_every_particle_number_of_a_species_builds(tmp_path):
    """0 .. capacity protons with 0 neutrons (and the mirror): the dimension counted by brute force, the
    build symmetric, the spectrum that of the mirror; no valence nucleons: dimension 1, energy 0."""
    inter = _random_interaction(tmp_path, "ckpot", seed=5)
    space = [tm for o in inter.proton_orbits for tm in range(-o.twoj, o.twoj + 1, 2)]
    for k in range(len(space) + 1):
        twice_m = k % 2
        count = sum(sum(c) == twice_m for c in itertools.combinations(space, k))
        problem = hamiltonian.ShellModelProblem(inter, k, 0, twice_m)
        assert problem.dimension == count == hamiltonian.m_scheme_dimension(inter, k, 0, twice_m)
        h = problem.build("full")[0]
        assert abs(h - h.T).max() < 1e-12
    empty = hamiltonian.ShellModelProblem(_inter("usdb"), 0, 0)
    h, info = empty.build("upper")
    assert info.dimension == 1 and h.shape == (1, 1) and h.toarray()[0, 0] == 0.0


def test_cli_no_valence_protons(capsys):
    from cisolver.cli import main
    assert main(["spectrum", "--interaction", str(DATA / "usdb.snt"), "--protons", "0", "--neutrons", "2",
                 "--nev", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dimension"] == 14 and out["j"] == [0, 2, 4]
    assert main(["spectrum", "--interaction", str(DATA / "usdb.snt"), "--protons", "0", "--neutrons", "0",
                 "--nev", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dimension"] == 1 and out["energies"] == [0.0]


# ---- CSR layout and identical arrays ------------------------------------------------------------------------
def _same_arrays(a, b):
    return (a.shape == b.shape and a.indptr.dtype == b.indptr.dtype and a.indices.dtype == b.indices.dtype
            and a.data.dtype == b.data.dtype and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and a.data.tobytes() == b.data.tobytes())


def _check_csr(h, n_cols):
    assert isinstance(h, sp.csr_matrix) and h.shape[1] == n_cols
    assert h.indptr.dtype == h.indices.dtype == np.int32
    assert h.indptr[0] == 0 and h.indptr[-1] == len(h.indices) == len(h.data)
    rows = np.repeat(np.arange(h.shape[0]), np.diff(h.indptr))
    step = np.diff(h.indices.astype(np.int64))
    assert np.all((step > 0) | (np.diff(rows) > 0)), "column indices must rise strictly inside each row"
    assert h.indices.min(initial=0) >= 0 and h.indices.max(initial=0) < n_cols


@pytest.fixture(scope="module")
def na22(tmp_path_factory):
    """22Na (usdb 3p 3n) with a random interaction; its full and upper H."""
    problem = hamiltonian.ShellModelProblem(_random_interaction(tmp_path_factory.mktemp("snt"), "usdb", 7), 3, 3)
    return problem, problem.build("full")[0], problem.build("upper")[0]


def test_layout_and_upper_is_the_triangle_of_full(na22):
    problem, full, upper = na22
    _check_csr(full, problem.dimension)
    _check_csr(upper, problem.dimension)
    assert _same_arrays(sp.triu(full, format="csr"), upper)
    assert abs(full - full.T).max() < 1e-13 * abs(full).max()     # the triangles sum their spectators apart


@pytest.mark.parametrize("storage", ["full", "upper"])
def test_threads_groups_rows_and_dtype_give_the_same_arrays(na22, storage, monkeypatch):
    problem, full, upper = na22
    h = full if storage == "full" else upper
    for threads in (1, 3):
        assert _same_arrays(problem.build(storage, n_threads=threads)[0], h)
    h32 = problem.build(storage, dtype=np.float32)[0]
    assert h32.data.dtype == np.float32 and h32.data.tobytes() == h.data.astype(np.float32).tobytes()
    blocks = problem.basis.blocks
    mid = max(range(len(blocks)), key=lambda i: blocks[i].size)
    b = blocks[mid]
    for lo, hi in [(b.offset + b.n_n, b.offset + 3 * b.n_n), (0, problem.dimension), (b.offset, b.offset),
                   (blocks[1].offset + blocks[1].n_n, b.offset + 2 * b.n_n)]:
        part = problem.build(storage, rows=(lo, hi))[0]
        assert _same_arrays(part, h[lo:hi]), (lo, hi)
    part = problem.build(storage, blocks=range(mid, mid + 2))[0]
    assert _same_arrays(part, h[b.offset:blocks[mid + 1].offset + blocks[mid + 1].size])
    # tiny groups: runs of proton determinants and one determinant's neutron rows cut into parts
    monkeypatch.setattr(hamiltonian, "_GROUP_MIN", 300)
    monkeypatch.setattr(hamiltonian, "_GROUP_MAX", 700)
    calls = []
    assert _same_arrays(problem.build(storage, n_threads=2, progress=lambda d, t: calls.append((d, t)))[0], h)
    assert len(calls) > len(blocks) and calls[-1][0] == calls[-1][1] == len(calls)


def test_sizes_before_building(na22, tmp_path):
    problem, full, upper = na22
    inter = problem.interaction
    for storage, h in (("full", full), ("upper", upper)):
        per_block = problem.stored_nonzeros(storage)
        edges = [b.offset for b in problem.basis.blocks] + [problem.dimension]
        np.testing.assert_array_equal(per_block, np.diff(h.indptr[edges]))
        for dtype in (np.float64, np.float32):
            hh = h if dtype == np.float64 else h.astype(dtype)
            assert problem.csr_nbytes(storage, dtype) == hh.data.nbytes + hh.indices.nbytes + hh.indptr.nbytes
        b = problem.basis.blocks[2]
        rows = (b.offset + b.n_n, b.offset + 2 * b.n_n)
        assert problem.stored_nonzeros(storage, rows=rows).sum() == h[rows[0]:rows[1]].nnz
    for name, z, n, twice_m in (("usdb", 3, 4, 1), ("usdb", 3, 4, 5), ("gxpf1a", 2, 3, 3), ("ckpot", 0, 0, 0),
                                ("usdb", 12, 5, 1), ("kb3g", 0, 3, 7), ("usdb", 6, 6, 12)):
        i = _inter(name)
        expected = hamiltonian.ShellModelProblem(i, z, n, twice_m).dimension
        assert hamiltonian.m_scheme_dimension(i, z, n, twice_m) == expected
    assert hamiltonian.m_scheme_dimension(_inter("gxpf1a"), 4, 4) == 1963461
    assert hamiltonian.m_scheme_dimension(_inter("gxpf1a"), 2, 4) == 86810
    assert hamiltonian.m_scheme_dimension(inter, 1, 0, 99) == 0


def test_bad_arguments_are_named():
    inter = _inter("usdb")
    with pytest.raises(ValueError, match="n_neutrons must be an integer in 0..12 .*got 13"):
        hamiltonian.m_scheme_dimension(inter, 0, 13)
    with pytest.raises(ValueError, match="n_protons .*got -1"):
        hamiltonian.ShellModelProblem(inter, -1, 2)
    with pytest.raises(ValueError, match="twice_m .*got 1"):
        hamiltonian.m_scheme_dimension(inter, 0, 2, 1)
    problem = hamiltonian.ShellModelProblem(inter, 1, 1)
    with pytest.raises(ValueError, match="n_threads must be a positive integer, got 0"):
        problem.build(n_threads=0)
    with pytest.raises(ValueError, match="storage must be 'full' or 'upper', got 'lower'"):
        problem.build("lower")
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        problem.build(dtype=np.int32)
    with pytest.raises(ValueError, match="blocks must name row blocks"):
        problem.build(blocks=[99])
