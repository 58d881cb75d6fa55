"""Refined and original HSDLA against per-entry sums, the addition theorem, batching, memory, CLI."""
import json

import numpy as np
import pytest

import flapw
import hybridblas as hb
from flapw.backends import BackendUnavailable
from flapw.reference import direct_hs, overlap_legendre


def _rel(x, ref):
    return np.abs(x - ref).max() / np.abs(ref).max()


CELLS = {
    "NaCl": dict(name="NaCl", kmax=2.0, supercell=(1, 1, 1)),
    "TiO2": dict(name="TiO2", kmax=2.2, supercell=(1, 1, 1)),
    "AuAg": dict(name="AuAg", kmax=2.0, supercell=(1, 1, 1)),
}


@pytest.fixture(scope="module", params=sorted(CELLS))
def cell_and_ref(request):
    kw = dict(CELLS[request.param])
    cell = flapw.System.preset(kw.pop("name"), **kw)
    return cell, direct_hs(cell)


def test_refined_original_direct_agree(cell_and_ref):
    cell, (h_ref, s_ref) = cell_and_ref
    for method in flapw.METHODS:
        h, s = flapw.build_hs(cell, method=method)
        assert _rel(h, h_ref) <= 1e-12, method
        assert _rel(s, s_ref) <= 1e-12, method


def test_overlap_addition_theorem(cell_and_ref):
    cell, (_, s_ref) = cell_and_ref
    assert _rel(overlap_legendre(cell), s_ref) <= 1e-12


def test_hermitian_and_s_mt_positive_semidefinite(cell_and_ref):
    cell, _ = cell_and_ref
    h, s = flapw.build_hs(cell)
    assert np.array_equal(h, h.conj().T) and np.array_equal(s, s.conj().T)
    assert np.all(np.diag(h).imag == 0)
    ev = np.linalg.eigvalsh(s)
    assert ev.min() >= -1e-12 * ev.max()


@pytest.mark.parametrize("method", flapw.METHODS)
def test_batches_give_the_same_matrices(method):
    cell = flapw.System.preset("TiO2", kmax=2.0, supercell=(1, 1, 1))
    h0, s0, r0 = flapw.build_hs(cell, method=method, return_report=True)
    h1, s1, r1 = flapw.build_hs(cell, method=method, batch_atoms=4, return_report=True)   # 4 + 2 atoms
    assert _rel(h1, h0) <= 1e-13 and _rel(s1, s0) <= 1e-13
    assert r1.batch_atoms == 4
    assert r1.blas_flops == pytest.approx(r0.blas_flops, rel=0.01)
    n_buf = 3 if method == "refined" else 4
    assert r0.peak_temp_bytes == n_buf * 16 * cell.n_g * cell.n_atoms * cell.n_l
    assert r1.peak_temp_bytes == n_buf * 16 * cell.n_g * 4 * cell.n_l


def test_max_temp_bytes_bounds_the_buffers():
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    limit = 3 * 16 * cell.n_g * cell.n_l * 3 + 100         # room for three atoms
    _, _, rep = flapw.build_hs(cell, max_temp_bytes=limit, return_report=True)
    assert rep.batch_atoms == 3 and rep.peak_temp_bytes <= limit
    with pytest.raises(ValueError, match="max_temp_bytes"):
        flapw.build_hs(cell, max_temp_bytes=10)


def test_original_cholesky_and_fallback_branches():
    """E_l > 0 on Na makes its T^AA positive definite (Cholesky, zherk); Cl keeps the zgemm fallback."""
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1), e_l={"Na": 1.0, "Cl": 0.0})
    h_ref, s_ref = direct_hs(cell)
    h, s, rep = flapw.build_hs(cell, method="original", return_report=True)
    names = set(rep.stages)
    assert "zherk H+=B_TᴴB_T" in names and "zgemm H+=AᴴB_B" in names
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12
    h2, _ = flapw.build_hs(cell, method="refined")
    assert _rel(h2, h_ref) <= 1e-12


def test_flops_and_memory_original_vs_refined():
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    _, _, ref = flapw.build_hs(cell, method="refined", return_report=True)
    _, _, orig = flapw.build_hs(cell, method="original", return_report=True)
    k, n = cell.n_atoms * cell.n_l, cell.n_g
    assert ref.blas_flops == pytest.approx(20 * k * n * (n + 1))           # zherk + zherk + zher2k + zherkx
    assert orig.blas_flops > ref.blas_flops                                # full zgemm for non-HPD T^AA
    assert orig.peak_temp_bytes == 4 * ref.peak_temp_bytes // 3


def test_context_reaches_every_blas_call(monkeypatch):
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))
    ctx = hb.Context(devices="cpu", strategy="dynamic", block_size=48)
    seen = []
    for name in ("herk", "her2k", "herkx", "gemm"):
        real = getattr(hb, name)

        def spy(*a, _real=real, _name=name, **kw):
            seen.append((_name, kw.get("context")))
            return _real(*a, **kw)
        monkeypatch.setattr(hb, name, spy)
    h, s = flapw.build_hs(cell, context=ctx)
    assert {n for n, _ in seen} == {"herk", "her2k", "herkx"}
    assert all(c is ctx for _, c in seen)
    h_ref, s_ref = direct_hs(cell)
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12


def test_lower_only_and_interstitial_hermitian():
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))
    h, s = flapw.build_hs(cell, lower_only=True)
    assert np.all(np.triu(h, 1) == 0) and np.all(np.triu(s, 1) == 0)
    h, s = flapw.build_hs(cell, interstitial=True)
    assert np.array_equal(h, h.conj().T) and np.linalg.eigvalsh(s).min() > 0


def test_bad_arguments():
    cell = flapw.System.preset("NaCl", kmax=1.5, supercell=(1, 1, 1))
    with pytest.raises(ValueError, match="method must be one of"):
        flapw.build_hs(cell, method="fast")
    with pytest.raises(ValueError, match="batch_atoms"):
        flapw.build_hs(cell, batch_atoms=0)
    with pytest.raises(ValueError, match="arrays"):
        flapw.build_hs(cell, arrays="disk")
    with pytest.raises(ValueError, match="blas must be one of"):
        flapw.build_hs(cell, blas="mkl")
    with pytest.raises(TypeError, match="context"):
        flapw.build_hs(cell, context="cpu")
    with pytest.raises(ValueError, match="nev"):
        flapw.solve(np.eye(3), np.eye(3), 0)


def test_cublasxt_hook_calls_the_peers(monkeypatch):
    """blas='cublasxt' sends every large product to hybridblas.peers.cublasxt_* (faked here on the CPU)."""
    import hybridblas.peers as peers
    from flapw.backends import get_backend
    calls = []

    def fake(name):
        def run(*args, devices=(0,), **kw):
            arrays = [x for x in args if isinstance(x, np.ndarray)]
            assert all(x.flags.f_contiguous for x in arrays), name     # cuBLASXt needs Fortran order
            calls.append((name, devices))
            return getattr(hb, name)(*args, **kw)
        return run
    for name in ("herk", "her2k", "herkx", "gemm"):
        monkeypatch.setattr(peers, f"cublasxt_{name}", fake(name), raising=False)
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1), e_l={"Na": 1.0})
    h_ref, s_ref = direct_hs(cell)
    for method in flapw.METHODS:
        h, s = flapw.build_hs(cell, method=method, blas=get_backend("cublasxt", gpus=[0, 1]), batch_atoms=3)
        assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12
    assert {n for n, _ in calls} == {"herk", "her2k", "herkx", "gemm"}
    assert all(d == (0, 1) for _, d in calls)
    monkeypatch.delattr(peers, "cublasxt_herkx")
    with pytest.raises(BackendUnavailable, match="cublasxt_herkx"):
        flapw.build_hs(cell, blas="cublasxt")


def test_cli_json_output_and_solve(tmp_path, capsys):
    from flapw.cli import main
    out = tmp_path / "hs.npz"
    rc = main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "2.0", "--kpoints", "2",
               "--interstitial", "--solve", "3", "--json", "--output", str(out)])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["reports"]) == 2 and len(doc["reports"][0]["eigenvalues"]) == 3
    rep = doc["reports"][0]
    assert rep["N_A"] == 8 and rep["blas_flops"] > 0 and rep["peak_temp_bytes"] > 0
    data = np.load(out)
    assert data["H_1"].shape[0] == doc["reports"][1]["N_G"]
    assert np.allclose(data["S_0"], data["S_0"].conj().T)
    # --arrays auto on a CPU context keeps host arrays; the k-point loop is timed for the throughput
    assert doc["arrays"] == "host"
    assert len(doc["loop_seconds"]) == 1 and doc["loop_seconds"][0] > 0
    assert doc["kpoints_per_second"] == pytest.approx(2 / doc["loop_seconds"][0])


def test_cli_table_and_errors(capsys):
    from flapw.cli import main
    assert main(["build", "--system", "TiO2", "--supercell", "1", "1", "1", "--kmax", "1.8",
                 "--method", "original"]) == 0
    text = capsys.readouterr().out
    assert "original HSDLA build" in text and "peak temporary bytes" in text and "TFLOP/s" in text
    assert main(["build", "--system", "NaCl", "--kmax", "-2"]) == 2
    assert "kmax" in capsys.readouterr().err


@pytest.mark.parametrize("n", [0, 1, 5, 130, 257])
@pytest.mark.parametrize("block", [None, 16, 64, 2048])
@pytest.mark.parametrize("order", ["F", "C"])
def test_hermitian_fill_tiles(n, block, order, rng, monkeypatch):
    from flapw.hsdla import hermitian_fill
    from hybridblas import blas_threads
    monkeypatch.setattr(blas_threads, "available_cores", lambda: 4)      # panels on 4 threads at once
    x = np.array(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)), order=order)
    want = np.tril(x) + np.tril(x, -1).conj().T
    want[np.diag_indices(n)] = want.diagonal().real
    np.testing.assert_array_equal(hermitian_fill(x, block=block), want)


def test_threaded_coefficient_fill_equals_the_plain_one(rng):
    """A, B columns written by atom on several threads are the same as one product per atom."""
    from flapw.hsdla import _on_host_cores
    from flapw.matching import fill_coefficients
    n_g, n_l, n_atoms = 301, 9, 7
    factors = [rng.standard_normal((n_g, n_l)) + 1j * rng.standard_normal((n_g, n_l)) for _ in range(2)]
    phase = np.exp(1j * rng.uniform(0, 6.3, (n_g, n_atoms)))
    for species in (np.array([0, 1, 1, 0, 1, 0, 0]), np.array([0, 0, 0, 0, 1, 1, 1]), np.array([1] * 7)):
        want = np.hstack([factors[s] * phase[:, [j]] for j, s in enumerate(species)])
        for each in (None, _on_host_cores):
            out = np.full((n_g, n_atoms * n_l), np.nan, complex)
            np.testing.assert_array_equal(fill_coefficients(out, factors, phase, species, n_l, each), want)


def test_coefficient_runs_cover_every_atom_once():
    """The jobs of a fill: runs of one factor, cut into about the asked number of pieces, every atom once."""
    from flapw.matching import atom_runs
    kinds = [0, 0, 0, 1, 1, 0, 2, 2, 2, 2, 2]
    for pieces in (1, 2, 3, 64):
        jobs = atom_runs(kinds, pieces)
        covered = [j for j0, j1, _ in jobs for j in range(j0, j1)]
        assert covered == list(range(len(kinds)))
        assert all(kinds[j] == k for j0, j1, k in jobs for j in range(j0, j1))
    assert atom_runs(kinds, 1) == atom_runs(kinds) == [(0, 3, 0), (3, 5, 1), (5, 6, 0), (6, 11, 2)]
    assert atom_runs([], 4) == []


def test_coefficient_fill_refuses_an_out_it_cannot_write_in_place():
    from flapw.matching import fill_coefficients
    factors = [np.ones((5, 4), complex)]
    phase = np.ones((5, 2), complex)
    with pytest.raises(ValueError, match="out must be"):
        fill_coefficients(np.zeros((5, 16), complex)[:, ::2], factors, phase, [0, 0], 4)


def test_cli_emulate_reaches_the_context_and_needs_gpus(capsys, monkeypatch):
    """--emulate gives the build's Context emulation="int8" on the GPUs named; without a GPU in --devices (the
    default is the CPU) or with cuBLASXt it is refused before any work."""
    from flapw import cli, parallel
    small = ["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "1.8", "--json"]
    assert cli.main(small + ["--emulate"]) == 2
    err = capsys.readouterr().err
    assert "--emulate runs the FP64 products on GPUs; --devices 'cpu' names none (--devices gpu or all)" in err
    assert "Traceback" not in err
    asked = []

    def context(comm, spec, strategy, emulation=None):
        asked.append((spec.gpus, emulation))
        return hb.Context("cpu")
    monkeypatch.setattr(parallel, "rank_context", context)
    cli.make_backend("hybridblas", hb.DeviceSpec(cpu=True, gpus=(0, 1)), "auto", None, "int8")
    cli.make_backend("hybridblas", hb.DeviceSpec(cpu=True, gpus=()), "auto", None, None)
    assert asked == [((0, 1), "int8"), ((), None)]
    with pytest.raises(ValueError, match="--emulate needs --blas hybridblas, got --blas cublasxt"):
        cli.make_backend("cublasxt", hb.DeviceSpec(cpu=False, gpus=(0,)), "auto", None, "int8")


def test_crystal_numbers_outside_their_range_are_refused_with_their_name():
    """k beyond [-1, 1] (k + G is the same k-point; the basis search grows with |k|), v0 and ns_strength that
    make the radial solutions overflow, NaN, supercells beyond 1000 cells, a cell too large to search: ValueError
    naming the argument, before any work."""
    for kw, match in [(dict(k=(1e20, 0, 0)), r"k must be three finite fractional coordinates in \[-100, 100\]"),
                      (dict(k=(0, float("nan"), 0)), "k must be three finite"),
                      (dict(k=(0, 0)), "k must be three finite"),
                      (dict(v0=1e5), r"v0 must be a finite number of Ha in \[-100, 100\], got 100000.0"),
                      (dict(v0=float("nan")), "v0 must be a finite number"),
                      (dict(ns_strength=float("inf")), "ns_strength must be a finite number"),
                      (dict(supercell=(10 ** 20, 1, 1)), "supercell must hold at most 1000 cells"),
                      (dict(supercell=(11, 10, 10)), "supercell must hold at most 1000 cells")]:
        with pytest.raises(ValueError, match=match):
            flapw.System.preset("NaCl", kmax=1.5, **kw)
    cell = flapw.System.preset("NaCl", kmax=1.5, supercell=(1, 1, 1))
    with pytest.raises(ValueError, match=r"k must be three finite"):
        cell.with_k((200.0, 0, 0))
    from flapw.basis import GkBasis
    with pytest.raises(ValueError, match="plane waves to look through"):
        GkBasis(np.eye(3) * 1e6, (0, 0, 0), 3.0)


def test_build_arguments_checked_before_work(monkeypatch):
    cell = flapw.System.preset("NaCl", kmax=1.5, supercell=(1, 1, 1))
    monkeypatch.setattr(hb, "gpu_count", lambda: 0)
    with pytest.raises(ValueError, match="blas='cublasxt' runs on GPUs, and none is visible"):
        flapw.build_hs(cell, blas="cublasxt")
    for bound in (-5, "x", float("nan")):
        with pytest.raises(ValueError, match="max_temp_bytes must be a positive number of bytes"):
            flapw.build_hs(cell, batch_atoms=2, max_temp_bytes=bound)
    h, s = flapw.build_hs(cell, max_temp_bytes=10 ** 400, lower_only=True)     # beyond a float: no bound
    assert h.shape == (cell.n_g, cell.n_g) and np.isfinite(h).all()
