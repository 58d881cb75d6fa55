"""compute_spectrum with bad arguments, one parameter at a time: a ValueError or TypeError naming the parameter
and its value, raised before H is built (a stand-in for the Hamiltonian fails the test if it is reached). A run
too big for the memory is refused in seconds with the estimate, the limit and what to change. Good edges:
nev equal to the dimension, return_vectors, devices='all' on a node without GPUs."""
import time

import numpy as np
import pytest

import hybridblas as hb
from cisolver import compute_spectrum, spectrum
from cisolver.shellmodel import hamiltonian, snt
from ci_data import DATA, needs_data

NO_GPU = hb.gpu_count() == 0
NE20 = dict(interaction="usdb", n_protons=2, n_neutrons=2)       # dimension 640, 2M from -16 to 16


@pytest.fixture
def nothing_built(monkeypatch):
    """The Hamiltonian may not even be set up."""
    def refuse(*args, **kwargs):
        raise AssertionError("ShellModelProblem was reached")
    monkeypatch.setattr(spectrum.hamiltonian, "ShellModelProblem", refuse)


def _call(**changes):
    kwargs = dict(NE20, **changes)
    return compute_spectrum(kwargs.pop("interaction"), kwargs.pop("n_protons"), kwargs.pop("n_neutrons"), **kwargs)


BAD = [
    ("interaction", 5, TypeError, "interaction must be a file path or an interaction name like 'usdb', got int 5"),
    ("interaction", "no-such-interaction", FileNotFoundError, "interaction 'no-such-interaction' not found"),
    ("n_protons", -1, ValueError, r"n_protons must be an integer in 0\.\.12 .*usdb\.snt\), got -1"),
    ("n_protons", 13, ValueError, r"n_protons must be an integer in 0\.\.12 .* got 13"),
    ("n_protons", 2.0, TypeError, "n_protons must be an integer .* got float 2.0"),
    ("n_protons", True, TypeError, "n_protons must be an integer .* got bool True"),
    ("n_neutrons", 13, ValueError, r"n_neutrons must be an integer in 0\.\.12 .* got 13"),
    ("n_neutrons", "2", TypeError, "n_neutrons must be an integer .* got str '2'"),
    ("nev", 0, ValueError, "nev must be an integer >= 1, got 0"),
    ("nev", 641, ValueError, r"nev must be at most the M-scheme dimension 640 of Z=2 N=2 2M=0 in .*usdb\.snt, got 641"),
    ("nev", 2.5, TypeError, "nev must be an integer, got float 2.5"),
    ("twice_m", 1, ValueError, r"twice_m must be even for 4 valence nucleons .* got 1"),
    ("twice_m", 18, ValueError, r"twice_m must be an integer in -16\.\.16 .* got 18"),
    ("twice_m", -18, ValueError, r"twice_m must be an integer in -16\.\.16 .* got -18"),
    ("twice_m", "0", TypeError, "twice_m must be an integer .* got str '0'"),
    ("tol", 0, ValueError, "tol must be a finite number > 0, got 0"),
    ("tol", -1e-8, ValueError, "tol must be a finite number > 0, got -1e-08"),
    ("tol", float("nan"), ValueError, "tol must be a finite number > 0, got nan"),
    ("tol", float("inf"), ValueError, "tol must be a finite number > 0, got inf"),
    ("tol", "1e-8", ValueError, "tol must be a finite number > 0, got '1e-8'"),
    ("maxiter", -5, ValueError, "maxiter must be an integer >= 0, got -5"),
    ("maxiter", 1.5, TypeError, "maxiter must be an integer, got float 1.5"),
    ("devices", "tpu", ValueError, "devices: unknown device 'tpu' in 'tpu'"),
    ("devices", "0,0", ValueError, "devices: GPU 0 is named twice in '0,0'"),
    ("devices", 3.0, TypeError, "devices must be a string like 'cpu'"),
    ("devices", "cuda:99", ValueError, "devices='cuda:99'(: GPU 99 does not exist| asks for CUDA GPUs, but)"),
    ("dtype", "float16", TypeError, "dtype must be float32 or float64, got 'float16'"),
    ("dtype", "nope", TypeError, "dtype must be float32 or float64, got 'nope'"),
    ("dtype", np.complex128, TypeError, "dtype must be float32 or float64, got complex128"),
    ("storage", "lower", ValueError, "storage must be one of 'upper', 'full', got 'lower'"),
    ("precond", "jacobi", ValueError, "precond must be one of 'none', 'tiles', got 'jacobi'"),
    ("block_size", 3, ValueError, r"block_size must be an integer >= 5 \(at least nev = 5\), got 3"),
    ("block_size", 0, ValueError, r"block_size must be an integer >= 5 .* got 0"),
    ("block_size", 8.0, TypeError, r"block_size must be an integer \(at least nev = 5\), got float 8.0"),
    ("seed", -1, ValueError, "seed must be an integer >= 0, got -1"),
    ("seed", 1.5, TypeError, "seed must be an integer, got float 1.5"),
    ("n_threads", 0, ValueError, "n_threads must be an integer >= 1, got 0"),
    ("n_threads", -1, ValueError, "n_threads must be an integer >= 1, got -1"),
    ("layout", "cols", ValueError, "layout must be one of 'rows', 'triangular', got 'cols'"),
    ("comm", object(), TypeError, "comm must be an MPI communicator .* got object"),
    ("return_vectors", "yes", TypeError, "return_vectors must be True or False, got 'yes'"),
    ("progress", "yes", TypeError, "progress must be callable or None, got str"),
]


@needs_data
@pytest.mark.parametrize("param,value,exc,match", BAD, ids=[f"{p}={v!r}" for p, v, _, _ in BAD])
def test_bad_argument_refused_before_the_build(param, value, exc, match, nothing_built):
    with pytest.raises(exc, match=match):
        _call(**{param: value})


@needs_data
@pytest.mark.skipif(not NO_GPU, reason="checks the message on a node without usable GPUs")
@pytest.mark.parametrize("devices", ["0", "cuda:0", "gpu", [0], "cpu,cuda:1"], ids=lambda d: f"devices={d}")
def test_gpus_asked_for_where_there_are_none(devices, nothing_built):
    with pytest.raises(ValueError, match=r"devices=.* asks for CUDA GPUs, but (CuPy is not installed; install the "
                                         r"GPU extra: pip install|no CUDA GPU|CUDA is not usable)"):
        _call(devices=devices)


@needs_data
def test_malformed_interaction_file(tmp_path, nothing_built):
    bad = tmp_path / "broken.snt"
    bad.write_text("1 1 8 8\n1 0 2 3 -1\n")
    with pytest.raises(snt.InteractionFileError, match=r"broken\.snt: file ends before orbit 2"):
        _call(interaction=str(bad))


@needs_data
def test_precond_and_layout_checked_against_the_ranks(nothing_built):
    class TwoRanks:                                 # enough of a communicator for the checks before the work
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 2

        def allgather(self, x):
            return [x, x]
    with pytest.raises(ValueError, match="precond='tiles' is not available under MPI"):
        _call(comm=TwoRanks(), precond="tiles")
    with pytest.raises(ValueError, match=r"the triangular layout needs n_d \(n_d \+ 1\) / 2 ranks .* got 2"):
        _call(comm=TwoRanks(), layout="triangular")


# ---- memory --------------------------------------------------------------------------------------------
@needs_data
def test_56ni_refused_in_seconds(monkeypatch, nothing_built):
    """gxpf1a with 8 protons and 8 neutrons (dimension 1.09e9) once ran 53 s before dying for 239 GiB: now it is
    refused before anything is built, with the estimate, the limit and what to change."""
    monkeypatch.setattr(hb.memory, "host_available", lambda: 4 << 30)
    t0 = time.perf_counter()
    with pytest.raises(hb.InsufficientMemory) as info:
        compute_spectrum("gxpf1a", 8, 8, nev=5)
    assert time.perf_counter() - t0 < 5.0
    msg = str(info.value)
    assert "M-scheme dimension 1087455228" in msg and "TiB" in msg and "3.6 GiB of available host memory" in msg
    assert "dtype='float32'" in msg and "MPI ranks" in msg and "storage=" not in msg     # upper is already chosen
    assert info.value.need > 1000 * info.value.limit


@needs_data
def test_small_limit_refuses_and_names_the_storage(monkeypatch, nothing_built):
    monkeypatch.setattr(hb.memory, "host_available", lambda: 1 << 20)
    with pytest.raises(hb.InsufficientMemory, match=r"needs about .* more than the 921\.6 KiB of available host "
                                                     r"memory; try dtype='float32', storage='upper'"):
        _call(storage="full")
    with pytest.raises(hb.InsufficientMemory, match="try more MPI ranks"):
        _call(dtype="float32")        # float32 and upper storage chosen: neither is offered


@needs_data
def test_enough_memory_runs(monkeypatch):
    """The same 20Ne under a limit just above its estimate runs (the estimate is the only gate)."""
    need = spectrum.prepare("usdb", 2, 2).memory.host
    monkeypatch.setattr(hb.memory, "host_available", lambda: int(need / 0.9) + 1)
    assert _call(nev=2)["converged"]


@pytest.mark.gpu
@needs_data
@pytest.mark.parametrize("devices,ids", [("cuda:0", [0]), ("0", [0]), ([0], [0])])
def test_gpu_words_run_on_the_gpu(devices, ids):
    cpu = _call(nev=5, tol=1e-9)
    gpu = _call(nev=5, tol=1e-9, devices=devices)
    assert gpu["devices"] == ids
    np.testing.assert_allclose(gpu["energies"], cpu["energies"], atol=1e-7, rtol=0)


@pytest.mark.gpu
@needs_data
def test_gpu_memory_refused(monkeypatch):
    monkeypatch.setattr(hb.memory, "gpu_free", lambda index: 1 << 20)
    with pytest.raises(hb.InsufficientMemory, match="free memory of GPU 0"):
        _call(devices="0")


# ---- good edges ----------------------------------------------------------------------------------------
@needs_data
def test_nev_equal_to_the_dimension():
    """12C in ckpot has 51 states: all 51 come back (a dense solve), with honest residuals, ascending."""
    out = compute_spectrum("ckpot", 4, 4, nev=51)
    h, _ = hamiltonian.ShellModelProblem(snt.read_snt(DATA / "ckpot.snt"), 4, 4).build()
    np.testing.assert_allclose(out["energies"], np.linalg.eigvalsh(h.toarray()), atol=1e-10, rtol=0)
    assert len(out["j"]) == 51 and max(out["residuals"]) < 1e-12 and out["converged"]


@needs_data
@pytest.mark.parametrize("nucleus", [("ckpot", 4, 4), ("usdb", 2, 2)])      # dense and LOBPCG paths
def test_return_vectors(nucleus):
    name, z, n = nucleus
    out = compute_spectrum(name, z, n, nev=4, tol=1e-10, return_vectors=True)
    v = out["eigenvectors"]
    h, _ = hamiltonian.ShellModelProblem(snt.read_snt(DATA / f"{name}.snt"), z, n).build()
    assert isinstance(v, np.ndarray) and v.shape == (out["dimension"], 4)
    np.testing.assert_allclose(v.T @ v, np.eye(4), atol=1e-8)
    np.testing.assert_allclose(h @ v, v * np.array(out["energies"]), atol=1e-6)
    assert "eigenvectors" not in compute_spectrum(name, z, n, nev=4)


@needs_data
@pytest.mark.skipif(not NO_GPU, reason="'all' means the GPUs where there are some")
def test_all_devices_without_gpus_is_the_cpu():
    out = compute_spectrum("ckpot", 4, 4, nev=3, devices="all")
    assert out["devices"] == "cpu"


def test_a_bad_thread_count_in_the_environment_is_refused_before_the_build(monkeypatch):
    from cisolver import spectrum
    monkeypatch.setenv("CISOLVER_THREADS", "0")
    with pytest.raises(ValueError, match="CISOLVER_THREADS must be a positive integer, got '0'"):
        spectrum.prepare("usdb", 2, 2)
