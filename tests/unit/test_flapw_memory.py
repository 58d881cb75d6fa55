"""Memory: the estimate against traced peaks, a build that runs out of memory repeated with half the atoms
per batch and then on host arrays (same H and S, one note per retry), --arrays auto shrinking the batch to
fit a GPU, and (GPU) the same through a CuPy memory-pool limit."""
import gc
import logging
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

import flapw
import hybridblas as hb
from flapw import cli, hsdla
from flapw.hsdla import build_bytes


def _rel(x, ref):
    return np.abs(x - ref).max() / np.abs(ref).max()


@pytest.fixture(scope="module")
def nacl():
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))       # 8 atoms
    return cell, flapw.build_hs(cell, interstitial=True)


def _notes(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "flapw"]


@pytest.mark.parametrize("batch, interstitial", [(None, False), (2, True)])
def test_estimate_covers_the_traced_peak(batch, interstitial):
    cell = flapw.System.preset("NaCl", kmax=3.5, supercell=(1, 1, 1))       # N_G 880, 8 atoms
    cell.tmats                                                               # k-independent data first
    tracemalloc.start()
    try:
        flapw.build_hs(cell, batch_atoms=batch, interstitial=interstitial)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    est = build_bytes(cell, "refined", batch or cell.n_atoms, interstitial)
    assert 0.93 * peak <= est <= 1.5 * peak, (est, peak)


def test_first_attempt_out_of_memory_retries_with_half_the_atoms(nacl, monkeypatch, caplog):
    """The first attempt fails after one batch has been added to H and S; the repeat starts afresh."""
    cell, (h_ref, s_ref) = nacl
    real, calls = hsdla.build_hs, []

    def stand_in(*args, **kw):
        calls.append(kw["batch_atoms"])
        if len(calls) == 1:
            def fail(batch, batches):
                raise MemoryError("stand-in: out of memory after the first batch")
            kw["progress"] = fail
        return real(*args, **kw)
    monkeypatch.setattr(hsdla, "build_hs", stand_in)
    with caplog.at_level(logging.INFO, logger="flapw"):
        h, s, rep = flapw.build_hs_with_fallback(cell, interstitial=True, arrays="host", batch_atoms=4,
                                                 return_report=True)
    assert calls == [4, 2] and rep.batch_atoms == 2
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12
    notes = _notes(caplog)
    assert len(notes) == 1 and "out of memory with 4 atoms per batch" in notes[0] and "retrying with 2" in notes[0]


class _GpuOutOfMemory(Exception):
    """Stands in for cupy.cuda.memory.OutOfMemoryError on a machine without a GPU."""


class _FullGpu:
    """A 'device' array module whose every allocation of H and S fails (numpy otherwise; events on the host)."""

    class cuda:
        class Event:
            def record(self):
                pass

            def synchronize(self):
                pass

        @staticmethod
        def get_elapsed_time(start, end):
            return 0.0

    def __getattr__(self, name):
        return getattr(np, name)

    def zeros(self, *args, **kw):
        raise _GpuOutOfMemory("Out of memory allocating 14,495,514,624 bytes")


def _full_gpu_attempts(monkeypatch, module, keys):
    """The 'device' array module replaced by ``module`` (numpy that runs out of memory); returns the list that
    records each build_hs attempt's ``keys`` arguments."""
    real_module, real_build, seen = hsdla._array_module, hsdla.build_hs, []
    monkeypatch.setattr(hsdla, "_array_module", lambda arrays: module if arrays == "device" else real_module(arrays))
    monkeypatch.setattr(hsdla, "build_hs", lambda *a, **kw: seen.append(tuple(kw[k] for k in keys))
                        or real_build(*a, **kw))
    return seen


def test_device_out_of_memory_falls_back_to_host_arrays(nacl, monkeypatch, caplog):
    cell, (h_ref, s_ref) = nacl
    seen = _full_gpu_attempts(monkeypatch, _FullGpu(), ("arrays", "batch_atoms"))
    with caplog.at_level(logging.INFO, logger="flapw"):
        h, s = flapw.build_hs_with_fallback(cell, interstitial=True, arrays="device",
                                            out_of_memory=(_GpuOutOfMemory,))
    assert seen == [("device", 8), ("device", 4), ("device", 2), ("device", 1), ("host", 8)]
    assert isinstance(h, np.ndarray)
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12
    notes = _notes(caplog)
    assert len(notes) == 4 and all("GPU out of memory" in n for n in notes)
    assert "building on host arrays with 8 atoms per batch" in notes[-1]


class _FullGpuOperands(_FullGpu):
    """A 'device' module whose A, B, X buffers do not fit either."""

    def empty(self, *args, **kw):
        raise _GpuOutOfMemory("Out of memory allocating 2,097,152 bytes")


def test_gpu_operands_out_of_memory_fall_back_to_host_operands(nacl, monkeypatch, caplog):
    """Host arrays with their operands on a GPU: halved batches, then host operands; H and S on the host."""
    cell, (h_ref, s_ref) = nacl
    monkeypatch.setattr(hsdla, "operands_place", lambda arrays, operands, backend: operands or "device")
    monkeypatch.setattr(hsdla, "_device_batch", lambda cell, method, nb, workspace: nb)
    monkeypatch.setattr(hsdla, "_gpu_holds_build", lambda *args: None)        # H and S stay on the host
    seen = _full_gpu_attempts(monkeypatch, _FullGpuOperands(), ("arrays", "operands", "batch_atoms"))
    with caplog.at_level(logging.INFO, logger="flapw"):
        h, s, rep = flapw.build_hs_with_fallback(cell, interstitial=True, arrays="host", return_report=True,
                                                 out_of_memory=(_GpuOutOfMemory,))
    assert seen == [("host", "device", 8), ("host", "device", 4), ("host", "device", 2), ("host", "device", 1),
                    ("host", "host", 8)]
    assert isinstance(h, np.ndarray) and rep.operands == "host"
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12
    assert "building on host arrays with 8 atoms per batch" in _notes(caplog)[-1]


def test_operands_place_follows_the_backend_and_refuses_what_cannot_be(nacl):
    from flapw.backends import get_backend
    cpu = get_backend("hybridblas", hb.Context("cpu"))
    assert hsdla.operands_place("host", None, cpu) == "host"
    assert hsdla.operands_place("host", "auto", cpu) == "host"
    assert hsdla.operands_place("host", "host", cpu) == "host"
    with pytest.raises(ValueError, match="needs hybridblas on a GPU, but its context has no GPU"):
        hsdla.operands_place("host", "device", cpu)
    with pytest.raises(ValueError, match="operands must be 'auto', 'host' or 'device', got 'gpu'"):
        hsdla.operands_place("host", "gpu", cpu)
    with pytest.raises(ValueError, match="operands='host' needs arrays='host'"):
        hsdla.operands_place("device", "host", cpu)
    assert hsdla.operands_place("device", None, cpu) == "device"
    cell, _ = nacl
    with pytest.raises(ValueError, match="operands 'device' with host arrays"):
        flapw.build_hs(cell, operands="device", context=hb.Context("cpu"))


def test_workspace_for_gpu_operands_reserves_host_h_and_s_only(nacl):
    cell, _ = nacl
    ws = hsdla.Workspace()
    ws.reserve(cell, "refined", cell.n_atoms, operands="device")
    assert sorted(ws._buffers) == ["H", "S"]
    assert ws.held_bytes() == 2 * 16 * cell.n_g ** 2
    written = []
    real_fill = np.ndarray.fill

    class Spy(np.ndarray):                 # the pages of H and S are written once (no faults in the build)
        def fill(self, value):
            written.append(self.size)
            return real_fill(self, value)
    for name in ("H", "S"):
        ws._buffers[name] = ws._buffers[name].view(Spy)
    ws.reserve(cell, "refined", cell.n_atoms, operands="device")
    assert sum(written) == 2 * cell.n_g ** 2
    ws.reserve(cell, "refined", cell.n_atoms)
    assert {"A", "B", "X", "H", "S"} <= set(ws._buffers)


def test_cli_operands_device_without_a_gpu_is_refused(capsys):
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "1.8", "--devices", "cpu",
                   "--operands", "device"])
    err = capsys.readouterr().err
    assert rc == 2 and "operands 'device' with host arrays needs hybridblas on a GPU" in err
    assert "Traceback" not in err


def test_other_errors_and_refusals_are_not_retried(nacl, monkeypatch, caplog):
    cell, _ = nacl
    calls = []

    def broken(*a, **kw):
        calls.append(kw["batch_atoms"])
        raise RuntimeError("not a memory problem")
    monkeypatch.setattr(hsdla, "build_hs", broken)
    with pytest.raises(RuntimeError, match="not a memory problem"):
        flapw.build_hs_with_fallback(cell, arrays="host")
    assert calls == [8]
    monkeypatch.undo()
    monkeypatch.setattr(hb.memory, "host_available", lambda: 1 << 20)
    with caplog.at_level(logging.INFO, logger="flapw"):
        with pytest.raises(hb.InsufficientMemory, match="needs about"):
            flapw.build_hs_with_fallback(cell, arrays="host")
    assert _notes(caplog) == []


def test_host_out_of_memory_with_one_atom_gives_up(nacl, monkeypatch, caplog):
    cell, _ = nacl
    calls = []

    def always(*a, **kw):
        calls.append((kw["arrays"], kw["batch_atoms"]))
        raise MemoryError("stand-in: no memory at all")
    monkeypatch.setattr(hsdla, "build_hs", always)
    with caplog.at_level(logging.INFO, logger="flapw"):
        with pytest.raises(MemoryError, match="no memory at all"):
            flapw.build_hs_with_fallback(cell, arrays="host")
    assert calls == [("host", 8), ("host", 4), ("host", 2), ("host", 1)]
    assert len(_notes(caplog)) == 3


def _gpu_backend():
    return SimpleNamespace(context=SimpleNamespace(devices=[SimpleNamespace(kind="cuda", index=3)]))


def test_auto_arrays_shrinks_the_batch_to_fit_the_gpu(nacl, monkeypatch):
    cell, _ = nacl
    used = []
    monkeypatch.setattr(cli, "_use_gpu", used.append)
    for free, want in [(1 << 40, ("device", 8)),
                       (build_bytes(cell, "refined", 2, on_device=True) / 0.8 + 1, ("device", 2)),
                       (build_bytes(cell, "refined", 1, on_device=True) / 0.8 - 1, ("host", 8))]:
        monkeypatch.setattr(hb.memory, "gpu_free", lambda index, free=free: free if index == 3 else 0)
        assert cli.auto_arrays(_gpu_backend(), cell, "refined", 8) == want
    assert used == [3, 3]                                  # the GPU becomes current only for device arrays
    cpu = SimpleNamespace(context=hb.Context("cpu"))
    assert cli.auto_arrays(cpu, cell, "refined", 5) == ("host", 5)


@pytest.mark.gpu
def test_device_build_out_of_gpu_memory_matches_host(monkeypatch):
    """A CuPy pool limit below the full batch's device arrays forces the out-of-memory path: the first attempt
    (every atom, device arrays) fails, a later one completes, and H and S equal the host build's. The attempts
    are recorded at build_hs itself (not through log capture, which an in-process CLI run elsewhere in the
    same pytest run can redirect). The limit is a new pool's, the build's allocator: the default pool may keep
    free blocks inside chunks that earlier tests left partly in use, and serves them whatever its limit."""
    import cupy
    cell = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1))
    h_ref, s_ref = flapw.build_hs(cell, interstitial=True, context=hb.Context("cpu"))
    n_g, n_l = cell.n_g, cell.n_l
    fixed = 16 * n_g * (2 * n_g + 4 * n_l)                        # H, S and the two species' factors
    attempts, real = [], hsdla.build_hs

    def recording(*args, **kwargs):
        attempts.append((kwargs["batch_atoms"], kwargs["arrays"]))
        try:
            out = real(*args, **kwargs)
        except MemoryError:
            attempts[-1] += ("out of memory",)
            raise
        attempts[-1] += ("built",)
        return out
    monkeypatch.setattr(hsdla, "build_hs", recording)
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.Device(0):                  # the pool's limit is the current device's: GPU 0, whatever is current
        pool.set_limit(size=fixed + 16 * 3 * n_l * n_g * (cell.n_atoms // 2))     # half the atoms' A/B/X
        try:
            with cupy.cuda.using_allocator(pool.malloc):
                h, s = flapw.build_hs_with_fallback(cell, interstitial=True, arrays="device",
                                                    context=hb.Context(devices=["cuda:0"]))
                h, s = (cupy.asnumpy(x) if not isinstance(x, np.ndarray) else x for x in (h, s))
        finally:
            gc.collect()
            pool.free_all_blocks()
    assert attempts[0] == (cell.n_atoms, "device", "out of memory"), attempts
    assert attempts[-1][-1] == "built" and all(a[-1] == "out of memory" for a in attempts[:-1]), attempts
    assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12


@pytest.mark.gpu
def test_cli_device_arrays_write_the_host_build(tmp_path, capsys):
    path = tmp_path / "hs.h5"
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "2.0", "--interstitial",
                   "--devices", "cuda:0", "--arrays", "device", "--output", str(path), "--json"])
    assert rc == 0, capsys.readouterr().err
    got = flapw.read_hs(path)["kpoints"][0]
    cell = flapw.System.preset("NaCl", kmax=2.0, supercell=(1, 1, 1))
    h, s = flapw.build_hs(cell, interstitial=True, context=hb.Context("cpu"))
    assert _rel(got["H"], h) <= 1e-12 and _rel(got["S"], s) <= 1e-12


def test_gpu_operand_batch_takes_at_most_its_share_of_the_free_memory(nacl, monkeypatch):
    """_device_batch: the largest batch (at most the asked one, at least one atom) whose buffers and k-only
    factors fit in OPERAND_SHARE of the GPU's free memory."""
    import sys
    cell, _ = nacl
    fake = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=2)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    fixed = build_bytes(cell, "refined", 0) - 2 * 16 * cell.n_g ** 2
    per_atom = build_bytes(cell, "refined", 1) - build_bytes(cell, "refined", 0)
    for free, want in [((fixed + 3 * per_atom) / hsdla.OPERAND_SHARE + 1, 3), (1 << 50, 8), (0, 1)]:
        monkeypatch.setattr(hb.memory, "gpu_free", lambda index, free=free: free if index == 2 else 0)
        assert hsdla._device_batch(cell, "refined", 8, None) == want
