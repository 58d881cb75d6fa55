"""cisolver.gpu_angmom: <J²> of vectors on a GPU against the host's (angmom.expectation_j2: J₊ built in the
many-body basis) on 20Ne and 24Mg, float32 and float64 vectors, unnormalised columns, strided column ranges,
odd A and the highest 2M; the spectrum's J on a GPU."""

import numpy as np
import pytest

from cisolver import gpu_angmom
from cisolver.shellmodel import angmom, hamiltonian, snt
from ci_data import DATA, needs_data

pytestmark = pytest.mark.gpu


def _problem(z, n, m=None, name="usdb.snt"):
    return hamiltonian.ShellModelProblem(snt.read_snt(DATA / name), z, n, m)


@needs_data
@pytest.mark.parametrize("nucleus,z,n", [("20Ne", 2, 2), ("24Mg", 4, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 5])
def test_j2_of_random_vectors_equals_the_host(nucleus, z, n, dtype, k):
    """Random columns of unequal lengths inside a wider row-major buffer (offset 3, strided rows)."""
    import cupy
    problem = _problem(z, n)
    rng = np.random.default_rng(z + n + k)
    v = (rng.standard_normal((problem.dimension, k)) * rng.uniform(0.1, 30, k)).astype(dtype)
    host = angmom.expectation_j2(problem, v)                 # the same float32 values, in double
    buf = cupy.full((problem.dimension, k + 7), np.nan, dtype=dtype)
    buf[:, 3:3 + k] = cupy.asarray(v)
    got = gpu_angmom.expectation_j2(problem, buf[:, 3:3 + k])
    assert got.dtype == np.float64 and got.shape == (k,)
    np.testing.assert_allclose(got, host, rtol=1e-11, atol=0)
    assert np.isnan(cupy.asnumpy(buf[:, :3])).all()          # the buffer around the vectors untouched


@needs_data
def test_j2_of_20ne_eigenvectors_gives_the_reference_j():
    import cupy
    problem = _problem(2, 2)
    h, _ = problem.build()
    w, v = np.linalg.eigh(h.toarray())
    got = gpu_angmom.expectation_j2(problem, cupy.asarray(v[:, :5]))
    np.testing.assert_allclose(got, angmom.expectation_j2(problem, v[:, :5]), rtol=1e-12, atol=1e-12)
    assert list(angmom.j_from_j2(got)) == [0, 2, 4, 0, 2]


@needs_data
@pytest.mark.parametrize("z,n,m", [(1, 2, 1), (2, 2, 6), (2, 2, 16), (3, 4, 3)])
def test_odd_mass_higher_m_and_the_highest_m(z, n, m):
    """19F, 20Ne at 2M = 6 and at its highest 2M = 16 (no 2M + 2 states: <J²> = M(M + 1)), 23Na."""
    import cupy
    problem = _problem(z, n, m)
    v = np.random.default_rng(m).standard_normal((problem.dimension, 3))
    got = gpu_angmom.expectation_j2(problem, cupy.asarray(v))
    np.testing.assert_allclose(got, angmom.expectation_j2(problem, v), rtol=1e-11, atol=1e-12)


@needs_data
def test_bad_vectors_are_refused():
    import cupy
    problem = _problem(2, 2)
    with pytest.raises(TypeError, match="vectors must be a 2-D float32 or float64 CuPy array, got ndarray"):
        gpu_angmom.expectation_j2(problem, np.ones((problem.dimension, 2)))
    with pytest.raises(ValueError, match=f"vectors have 7 rows, the basis {problem.dimension} states"):
        gpu_angmom.expectation_j2(problem, cupy.ones((7, 2)))
    with pytest.raises(ValueError, match="1 to 256 columns, got 0"):
        gpu_angmom.expectation_j2(problem, cupy.ones((problem.dimension, 0)))


@needs_data
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_spectrum_on_a_gpu_takes_j2_there(dtype, monkeypatch):
    from cisolver.spectrum import compute_spectrum
    calls = []
    real = gpu_angmom.expectation_j2
    monkeypatch.setattr(gpu_angmom, "expectation_j2", lambda p, v: calls.append(v.shape) or real(p, v))
    cpu = compute_spectrum("usdb", 4, 4, nev=4, tol=1e-8)
    gpu = compute_spectrum("usdb", 4, 4, nev=4, tol=1e-5 if dtype == "float32" else 1e-8, devices="0", dtype=dtype)
    assert calls == [(28503, 4)]
    assert gpu["j"] == cpu["j"]
    np.testing.assert_allclose(gpu["j2"], cpu["j2"], atol=1e-4 if dtype == "float32" else 1e-8)
