"""N = Z in one space (48Cr, 24Mg): the neutrons' like-particle matrix and jump list are the protons' (one
object), and H is bit for bit the one built with both species computed apart. Any difference between the
species (a single-particle energy, the TBMEs, the particle number) computes them apart."""
import numpy as np
import pytest

from cisolver.shellmodel import hamiltonian, snt, species
from ci_data import DATA, needs_data

pytestmark = needs_data


def _inter(name):
    return snt.read_snt(DATA / f"{name}.snt")


def _apart(monkeypatch):
    monkeypatch.setattr(species, "same_determinants", lambda a, b: False)


def _same_csr(a, b):
    return (a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


@pytest.mark.parametrize("name,z,n,twice_m", [("usdb", 4, 4, 0), ("gxpf1a", 2, 2, 0), ("usdb", 3, 3, 2)])
def test_n_equals_z_shares_the_species_and_builds_the_same_h(monkeypatch, name, z, n, twice_m):
    shared = hamiltonian.ShellModelProblem(_inter(name), z, n, twice_m)
    assert shared.h_n is shared.h_p and shared.jumps_n is shared.jumps_p
    with monkeypatch.context() as m:
        _apart(m)
        apart = hamiltonian.ShellModelProblem(_inter(name), z, n, twice_m)
    assert apart.h_n is not apart.h_p
    assert _same_csr(apart.h_n, shared.h_n)
    for attr in ("source", "target", "alpha", "gamma", "sign"):
        assert np.array_equal(getattr(apart.jumps_n, attr), getattr(shared.jumps_n, attr)), attr
    for storage in ("full", "upper"):
        h_shared, _ = shared.build(storage=storage)
        h_apart, _ = apart.build(storage=storage)
        assert h_shared.nnz > shared.dimension
        assert _same_csr(h_shared, h_apart), storage


def test_a_neutron_energy_of_its_own_computes_the_neutrons_apart():
    inter = _inter("usdb")
    first_neutron = min(o.index for o in inter.neutron_orbits)
    inter.spe[first_neutron] = inter.spe.get(first_neutron, 0.0) + 0.25
    prob = hamiltonian.ShellModelProblem(inter, 2, 2, 0)
    assert prob.h_n is not prob.h_p
    assert not np.array_equal(prob.h_n_diagonal, prob.h_p_diagonal)


@pytest.mark.parametrize("z,n", [(2, 4), (4, 2)])
def test_unequal_particle_numbers_compute_both_species(z, n):
    prob = hamiltonian.ShellModelProblem(_inter("usdb"), z, n, 0)
    assert prob.h_n is not prob.h_p and prob.jumps_n is not prob.jumps_p


def test_same_determinants_compares_the_lists():
    inter = _inter("usdb")
    prob = hamiltonian.ShellModelProblem(inter, 2, 3, 1)
    assert species.same_determinants(prob.pdets, prob.pdets)
    assert not species.same_determinants(prob.pdets, prob.ndets)          # 2 against 3 particles
