"""cisolver.observables on a GPU: CuPy vectors give the observables of the same numbers on the host (occupations,
parity, <T²> and T, <J²>, B(E2), B(M1), reduced elements, Q and mu) to 1e-10 relative, float32 and float64, for
20Ne, 24Mg (usdb), 44Ti and 45Ti (gxpf1a) and 21Na (Z > N: T₊); the operators one by one; the vectors left as they
were; vectors on a second GPU; the spectrum's observables on a GPU against its returned vectors on the host."""
import functools

import numpy as np
import pytest
import scipy.sparse.linalg as spla

from cisolver.data import resolve_interaction
from cisolver.observables import compute_observables, single_particle
from cisolver.observables.mscheme import BlockVectors, OneBodyOperator, ladder_operator, species_ladder
from cisolver.shellmodel import basis, hamiltonian, nushellx

pytestmark = pytest.mark.gpu

NUCLEI = {"20Ne": ("usdb", 2, 2), "24Mg": ("usdb", 4, 4), "21Na": ("usdb", 3, 2), "44Ti": ("gxpf1a", 2, 2),
          "45Ti": ("gxpf1a", 2, 3)}


def _problem(nucleus, twice_m=None):
    name, z, n = NUCLEI[nucleus]
    return hamiltonian.ShellModelProblem(nushellx.read_interaction(resolve_interaction(name)), z, n, twice_m)


@functools.lru_cache(maxsize=None)
def _eigenvectors(nucleus, count=6):
    problem = _problem(nucleus)
    w, v = spla.eigsh(problem.build()[0], k=count, which="SA", tol=1e-12)
    return problem, v[:, np.argsort(w)]


def _assert_same(got, ref, path="observables"):
    """Every number of two compute_observables results alike to 1e-10 relative, or to 1e-10 of the largest of its
    field (at least 1: a <T²> of 1e-16 for T = 0 is rounding), None alike."""
    if isinstance(ref, dict):
        assert sorted(got) == sorted(ref), path
        for key in ref:
            _assert_same(got[key], ref[key], f"{path}.{key}")
    elif isinstance(ref, list) and ref and all(isinstance(x, str) for x in ref):
        assert got == ref, path
    elif isinstance(ref, (list, float)) or ref is None:
        a = np.array(ref, dtype=float)
        b = np.array(got, dtype=float)
        assert a.shape == b.shape, path
        scale = max(np.nanmax(np.abs(a)), 1.0) if np.isfinite(a).any() else 0.0
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10 * scale, err_msg=path)
    else:
        assert got == ref, path


@pytest.mark.parametrize("nucleus", sorted(NUCLEI))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_observables_of_device_eigenvectors_equal_the_host(nucleus, dtype):
    import cupy
    problem, v = _eigenvectors(nucleus)
    v = v.astype(dtype)                                   # the same float32 numbers on both sides
    ref = compute_observables(problem, v)
    got = compute_observables(problem, cupy.asarray(v))
    _assert_same(got, ref)
    assert got["parity"] == ref["parity"] and got["t"] == ref["t"]
    assert np.isfinite(np.array(got["e2"]["b"], dtype=float)).any()     # J labels found: B values compared


@pytest.mark.parametrize("nucleus,twice_m", [("20Ne", 2), ("24Mg", 0), ("45Ti", 3), ("21Na", 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_vectors_in_a_strided_view(nucleus, twice_m, dtype):
    """Columns of unequal lengths inside a NaN-filled wider buffer (offset 3, strided rows), left untouched."""
    import cupy
    problem = _problem(nucleus, twice_m)
    rng = np.random.default_rng(problem.dimension)
    v = (rng.standard_normal((problem.dimension, 4)) * rng.uniform(0.1, 30, 4)).astype(dtype)
    buf = cupy.full((problem.dimension, 11), np.nan, dtype=dtype)
    buf[:, 3:7] = cupy.asarray(v)
    before = buf.copy()
    got = compute_observables(problem, buf[:, 3:7])
    _assert_same(got, compute_observables(problem, v))
    assert bool(cupy.array_equal(buf, before, equal_nan=True))


@pytest.mark.parametrize("nucleus", ["20Ne", "45Ti"])
@pytest.mark.parametrize("mu", [0, 1, -1])
def test_one_body_operator_on_the_device_equals_the_host(nucleus, mu):
    """apply and elements of E2 and M1 components, on the problem's basis and on the raised one."""
    import cupy
    problem = _problem(nucleus)
    raised = basis.MSchemeBasis(problem.pdets, problem.ndets, problem.basis.twice_m + 2)
    rng = np.random.default_rng(7 + mu)
    for make in (single_particle.quadrupole, single_particle.spin):
        op = OneBodyOperator(problem, make(problem.pspace, mu), 0.3 * make(problem.nspace, mu), mu)
        for o in (op, op.acting_on(raised)):
            v = rng.standard_normal((o.source.dim, 3))
            w = rng.standard_normal((o.target.dim, 2))
            ref = o.apply(v)
            got = o.apply(cupy.asarray(v))
            assert isinstance(got, cupy.ndarray)
            np.testing.assert_allclose(got.get(), ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
            ref_el = o.elements(v, w)
            got_el = o.elements(cupy.asarray(v), BlockVectors(o.target, cupy.asarray(w)))
            np.testing.assert_allclose(got_el.get(), ref_el, rtol=1e-11, atol=1e-11 * np.abs(ref_el).max())


@pytest.mark.parametrize("nucleus", ["24Mg", "21Na", "45Ti"])
def test_ladder_operator_on_the_device_equals_the_host(nucleus):
    import cupy
    problem = _problem(nucleus)
    z, n = problem.n_protons, problem.n_neutrons
    lower = n >= z
    zt, nt = (z + 1, n - 1) if lower else (z - 1, n + 1)
    tp, tn = basis.SpeciesDeterminants(problem.pspace, zt), basis.SpeciesDeterminants(problem.nspace, nt)
    target = basis.MSchemeBasis(tp, tn, problem.basis.twice_m)
    terms = [(species_ladder(problem.pdets, tp, a, create=lower), species_ladder(problem.ndets, tn, a, create=not lower),
              int(problem.pspace.twom[a]) * (1 if lower else -1)) for a in range(problem.pspace.size)]
    v = np.random.default_rng(3).standard_normal((problem.dimension, 5))
    ref = ladder_operator(problem.basis, target, terms) @ v
    got = ladder_operator(problem.basis, target, terms, cupy) @ cupy.asarray(v)
    np.testing.assert_allclose(got.get(), ref, rtol=0, atol=1e-13)


@pytest.mark.multi_gpu
def test_vectors_on_the_second_gpu():
    """The work runs on the vectors' device, whichever is current."""
    import cupy
    problem, v = _eigenvectors("20Ne")
    with cupy.cuda.Device(1):
        dev = cupy.asarray(v)
    with cupy.cuda.Device(0):
        got = compute_observables(problem, dev)
    _assert_same(got, compute_observables(problem, v))


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-8), ("float32", 1e-5)])
def test_spectrum_on_a_gpu_gives_the_observables_of_its_vectors(dtype, tol):
    """20Ne (LOBPCG on the GPU): the observables made there against the host's of the returned vectors."""
    from cisolver.spectrum import compute_spectrum
    out = compute_spectrum("usdb", 2, 2, nev=5, devices="gpu", dtype=dtype, return_vectors=True, tol=tol)
    assert out["converged"] and out["eigenvectors"].dtype == np.dtype(dtype)
    _assert_same(out["observables"], compute_observables(_problem("20Ne"), out["eigenvectors"]))
    assert out["seconds"]["observables"] > 0
