"""How a build runs: the lower triangle only, the host work beside the BLAS calls (overlap), a workspace
reused across k-points, the T products batched per run of one class (the GPU path, run here with numpy),
and the whole device path on numpy standing in for cupy."""
import time

import numpy as np
import pytest

import flapw
import hybridblas as hb
from flapw import hsdla
from flapw.reference import direct_hs


def _rel(x, ref):
    return np.abs(x - ref).max() / np.abs(ref).max()


def _lower(m):
    return np.tril(m)


class _NumpyAsDevice:
    """numpy under another name, with a stream to synchronise and events that read the host clock: build_hs's
    device path on the host."""

    class cuda:
        @staticmethod
        def get_current_stream():
            return type("Stream", (), {"synchronize": staticmethod(lambda: None)})()

        class Event:
            def __init__(self, disable_timing=False):
                pass

            def record(self, stream=None):
                self.at = time.perf_counter()

            def synchronize(self):
                pass

        @staticmethod
        def get_elapsed_time(start, end):
            return (end.at - start.at) * 1e3

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def wait_event(self, event):
                pass

            def synchronize(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.fixture(scope="module")
def tio2():
    cell = flapw.System.preset("TiO2", kmax=2.2, supercell=(1, 1, 1))       # 6 atoms in 3+ classes
    return cell, flapw.build_hs(cell, interstitial=True)


@pytest.mark.parametrize("method", flapw.METHODS)
def test_lower_only_is_the_lower_triangle_of_the_full_build(tio2, method):
    cell, (h_full, s_full) = tio2
    if method == "original":
        h_full, s_full = flapw.build_hs(cell, method=method, interstitial=True)
    h, s, rep = flapw.build_hs(cell, method=method, interstitial=True, lower_only=True, return_report=True)
    assert _rel(_lower(h), _lower(h_full)) <= 1e-13 and _rel(_lower(s), _lower(s_full)) <= 1e-13
    assert not np.triu(s, 1).any()
    if method == "refined":
        assert not np.triu(h, 1).any()
    assert "hermitian fill" not in rep.stages
    np.testing.assert_array_equal(flapw.hermitian_fill(h.copy()) if method == "refined" else h_full, h_full)


def test_batches_follow_the_classes_and_equal_the_entrywise_sums(tio2):
    cell, _ = tio2
    h_ref, s_ref = direct_hs(cell)
    for nb in (1, 2, 4, 6):
        h, s = flapw.build_hs(cell, batch_atoms=nb)
        assert _rel(h, h_ref) <= 1e-12 and _rel(s, s_ref) <= 1e-12, nb


def test_overlap_gives_the_same_matrices_and_an_honest_total(tio2):
    """The host work beside the BLAS calls (forced on here, on the CPU): same H and S, the host stages
    reported as overlapped and left out of the total, their waits counted instead."""
    cell, (h_ref, s_ref) = tio2
    h, s, rep = flapw.build_hs(cell, interstitial=True, overlap=True, batch_atoms=4, return_report=True)
    assert _rel(h, h_ref) <= 1e-13 and _rel(s, s_ref) <= 1e-13
    side = {n for n, st in rep.stages.items() if st.overlapped}
    assert side == {"matching B, X=UB", "T·A, T·B (zgemm)", "T^AA·A (zgemm)"}
    assert rep.stages["waiting for the host"].calls == 3 * 2                 # three joins per batch, 2 batches
    assert rep.total_seconds == pytest.approx(sum(st.seconds for n, st in rep.stages.items() if n not in side))
    assert rep.peak_temp_bytes == 4 * 16 * cell.n_g * 4 * cell.n_l                 # A, B, X, Y
    d = rep.as_dict()
    assert {s["name"] for s in d["stages"] if s["overlapped"]} == side
    assert "beside the BLAS calls" in rep.table()


def test_overlap_only_when_asked_and_automatic_only_beside_gpus(tio2, monkeypatch):
    """overlap=None (the default) never runs the host work beside the BLAS calls (measured slower on a GPU
    node); overlap="auto" does it beside GPUs when four buffers fit."""
    cell, _ = tio2
    monkeypatch.setattr(hsdla, "_runs_on_gpu", lambda backend: True)
    _, _, rep = flapw.build_hs(cell, context=hb.Context("cpu"), return_report=True)
    assert "waiting for the host" not in rep.stages
    _, _, rep = flapw.build_hs(cell, context=hb.Context("cpu"), return_report=True, overlap="auto")
    assert "waiting for the host" in rep.stages
    monkeypatch.setattr(hsdla, "_runs_on_gpu", lambda backend: False)
    _, _, rep = flapw.build_hs(cell, context=hb.Context("cpu"), return_report=True, overlap="auto")
    assert "waiting for the host" not in rep.stages
    monkeypatch.setattr(hsdla, "_runs_on_gpu", lambda backend: True)
    monkeypatch.setattr(hb.memory, "host_available", lambda: hsdla.build_bytes(cell, "refined", 6) / 0.9 + 1)
    _, _, rep = flapw.build_hs(cell, context=hb.Context("cpu"), return_report=True, overlap="auto")  # no 4th buffer
    assert "waiting for the host" not in rep.stages


def test_workspace_is_reused_and_poison_is_overwritten(tio2):
    """k-points through one workspace: the same matrices as fresh builds, H and S are the workspace's, the
    third build (no larger than the first two) allocates nothing; NaN left in every buffer beforehand
    does not reach the lower triangles."""
    cell, _ = tio2
    ws = flapw.Workspace()

    def build(kc):
        for buf in ws._buffers.values():
            buf[...] = np.nan
        h, s = flapw.build_hs(kc, interstitial=True, lower_only=True, workspace=ws)
        h_ref, s_ref = flapw.build_hs(kc, interstitial=True, lower_only=True)
        np.testing.assert_allclose(_lower(h), h_ref, rtol=0, atol=1e-13 * np.abs(h_ref).max())
        np.testing.assert_allclose(_lower(s), s_ref, rtol=0, atol=1e-13 * np.abs(s_ref).max())
        assert np.shares_memory(h, ws._buffers["H"]) and np.shares_memory(s, ws._buffers["S"])
    build(cell)
    build(cell.with_k((0.31, -0.12, 0.27)))
    ids = {k: id(v) for k, v in ws._buffers.items()}
    assert set(ids) == {"A", "B", "X", "H", "S", "k-only A O", "k-only B O", "k-only A Ti", "k-only B Ti",
                        "k-only UB 0", "k-only UB 1"}          # the k-only factors of each species and U·B group
    build(cell)
    assert ids == {k: id(v) for k, v in ws._buffers.items()}
    h, s = flapw.build_hs(cell, interstitial=True, workspace=ws)              # full: the fill covers the poison
    assert np.isfinite(h).all() and np.array_equal(h, h.conj().T)
    ws.release()
    assert ws.held_bytes() == 0


def test_workspace_counts_against_the_memory_check(tio2, monkeypatch):
    cell, _ = tio2
    ws = flapw.Workspace()
    flapw.build_hs(cell, workspace=ws)
    need = hsdla.build_bytes(cell, "refined", cell.n_atoms)
    monkeypatch.setattr(hb.memory, "host_available", lambda: (need - ws.held_bytes()) / 0.9 + 1e6)
    flapw.build_hs(cell, workspace=ws)                                      # what it holds is reused
    with pytest.raises(hb.InsufficientMemory):
        flapw.build_hs(cell)


@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_batched_products_per_run_equal_the_per_atom_ones(order, rng):
    """The GPU path of the T products (one batched product per run of atoms with one T set and term,
    hybridblas.gemm_batched on strided views) equals the host path (per atom, in tiles), for runs of
    several lengths and any layout of the inputs."""
    n_g, n_l = 37, 5
    t_index = np.array([2, 2, 0, 0, 0, 1, 2])
    n = len(t_index)
    dev_t = {c: {k: rng.standard_normal((n_l, n_l)) + 1j * rng.standard_normal((n_l, n_l))
                 for k in ("tba_t", "half_tbb_t")} for c in range(3)}

    def operand():
        x = rng.standard_normal((n_g, 2 * n * n_l)) + 1j * rng.standard_normal((n_g, 2 * n * n_l))
        return {"C": np.ascontiguousarray(x[:, :n * n_l]), "F": np.asfortranarray(x[:, :n * n_l]),
                "strided": x[:, ::2]}[order]
    a, b = operand(), operand()
    blocks = [slice(j * n_l, (j + 1) * n_l) for j in range(n)]
    want = np.hstack([a[:, sl] @ dev_t[c]["tba_t"] + b[:, sl] @ dev_t[c]["half_tbb_t"] for sl, c in zip(blocks, t_index)])
    runs = hsdla.atom_runs(t_index)
    assert runs == [(0, 2, 2), (2, 5, 0), (5, 6, 1), (6, 7, 2)]
    for xp in (np, _NumpyAsDevice()):
        out = np.full((n_g, n * n_l), np.nan, complex)
        hsdla._products(xp, out, [(a, "tba_t"), (b, "half_tbb_t")], runs, dev_t, n_l)
        np.testing.assert_allclose(out, want, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("method", flapw.METHODS)
def test_device_path_on_numpy_equals_the_host_path(tio2, method, monkeypatch):
    """build_hs with arrays='device' and numpy standing in for cupy: matching, X = UB, the batched T
    products and the interstitial blocks as queued on a GPU give the host build's lower triangles."""
    cell, _ = tio2
    h_ref, s_ref = flapw.build_hs(cell, method=method, interstitial=True, lower_only=True, batch_atoms=4)
    real = hsdla._array_module
    monkeypatch.setattr(hsdla, "_array_module", lambda arrays: _NumpyAsDevice() if arrays == "device"
                        else real(arrays))
    h, s = flapw.build_hs(cell, method=method, interstitial=True, lower_only=True, batch_atoms=4, arrays="device")
    assert _rel(_lower(h), _lower(h_ref)) <= 1e-13 and _rel(_lower(s), _lower(s_ref)) <= 1e-13


@pytest.mark.gpu
@pytest.mark.parametrize("method", flapw.METHODS)
def test_gpu_device_lower_build_equals_host(tio2, method):
    import cupy
    cell, _ = tio2
    h_ref, s_ref = flapw.build_hs(cell, method=method, interstitial=True, lower_only=True,
                                  context=hb.Context("cpu"))
    h, s, rep = flapw.build_hs(cell, method=method, interstitial=True, lower_only=True, arrays="device",
                               context=hb.Context(devices=["cuda:0"]), batch_atoms=4, return_report=True)
    assert isinstance(h, cupy.ndarray)
    assert _rel(np.tril(h.get()), np.tril(h_ref)) <= 1e-12 and _rel(np.tril(s.get()), np.tril(s_ref)) <= 1e-12


@pytest.mark.gpu
def test_gpu_batched_products_equal_host(rng):
    import cupy
    n_g, n_l, t_index = 301, 9, np.array([1, 1, 1, 0, 0, 2])
    n = len(t_index)
    dev_t = {c: {"taa_t": rng.standard_normal((n_l, n_l)) + 1j * rng.standard_normal((n_l, n_l))} for c in range(3)}
    a = rng.standard_normal((n_g, n * n_l)) + 1j * rng.standard_normal((n_g, n * n_l))
    want = np.empty_like(a)
    runs = hsdla.atom_runs(t_index)
    hsdla._products(np, want, [(a, "taa_t")], runs, dev_t, n_l)
    out = cupy.full(a.shape, cupy.nan, complex)
    hsdla._products(cupy, out, [(cupy.asarray(a), "taa_t")], runs,
                    {c: {k: cupy.asarray(v) for k, v in t.items()} for c, t in dev_t.items()}, n_l)
    np.testing.assert_allclose(out.get(), want, rtol=1e-13, atol=1e-13)


@pytest.mark.gpu
def test_gpu_interstitial_equals_host(rng):
    import cupy
    from flapw.interstitial import add_interstitial
    cell = flapw.System.preset("NaCl", kmax=2.5)
    n = cell.n_g
    start = np.asfortranarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    want = [start.copy(order="F"), start.copy(order="F")]
    add_interstitial(*want, cell)
    got = [cupy.asarray(start, order="F"), cupy.asarray(start, order="F")]
    add_interstitial(*got, cell, xp=cupy)
    np.testing.assert_allclose(got[0].get(), want[0], rtol=0, atol=1e-13 * np.abs(want[0]).max())
    np.testing.assert_allclose(got[1].get(), want[1], rtol=0, atol=1e-13 * np.abs(want[1]).max())
    np.testing.assert_array_equal(np.triu(got[0].get(), 1), np.triu(start, 1))


@pytest.mark.gpu
def test_gpu_overlap_beside_the_gpu_blas_equals_plain(tio2):
    cell, _ = tio2
    ctx = hb.Context(devices=["cuda:0"])
    h0, s0 = flapw.build_hs(cell, interstitial=True, context=ctx, overlap=False, operands="host")
    h1, s1, rep = flapw.build_hs(cell, interstitial=True, context=ctx, return_report=True, overlap="auto",
                                 operands="host")
    assert "waiting for the host" in rep.stages             # "auto": on, the BLAS runs on a GPU and it fits
    assert _rel(h1, h0) <= 1e-13 and _rel(s1, s0) <= 1e-13
    h2, s2, rep = flapw.build_hs(cell, interstitial=True, context=ctx, return_report=True, overlap="auto")
    assert rep.operands == "device" and "waiting for the host" not in rep.stages   # nothing on the host to overlap
    assert _rel(h2, h0) <= 1e-12 and _rel(s2, s0) <= 1e-12


def test_workspace_reserve_takes_what_the_build_uses(tio2):
    cell, _ = tio2
    ws = flapw.Workspace()
    ws.reserve(cell, "refined", 4, overlap=True)
    n_g, width = cell.n_g, 4 * cell.n_l
    k_only = {f"k-only {f} {sp}": n_g * cell.n_l for sp in ("O", "Ti") for f in "AB"}
    assert {k: v.size for k, v in ws._buffers.items()} == dict(A=n_g * width, B=n_g * width, X=n_g * width,
                                                                Y=n_g * width, H=n_g * n_g, S=n_g * n_g, **k_only)
    ids = {k: id(v) for k, v in ws._buffers.items()}
    flapw.build_hs(cell, batch_atoms=4, overlap=True, workspace=ws)
    assert ids == {k: id(ws._buffers[k]) for k in ids}          # the build used them (and added U·B's)


def test_with_kmax_shares_the_k_independent_data(tio2):
    cell, _ = tio2
    small = cell.with_kmax(1.5)
    assert small.kmax == 1.5 and small.n_g < cell.n_g and small.k == cell.k
    assert small.tmats is cell.tmats and small.step_table is cell.step_table
    h, s = flapw.build_hs(small, interstitial=True)
    h_ref, s_ref = flapw.build_hs(flapw.System.preset("TiO2", kmax=1.5, supercell=(1, 1, 1)), interstitial=True)
    assert _rel(h, h_ref) <= 1e-13 and _rel(s, s_ref) <= 1e-13
    with pytest.raises(ValueError, match="kmax must not exceed this system's 2.2, got 3.0"):
        cell.with_kmax(3.0)


def test_a_smaller_cutoff_asking_first_makes_the_step_table_for_the_larger_one():
    """The step-function table is shared by with_kmax copies: made first by the smaller-cutoff copy (the warm-up's
    build), it still spans the larger basis's Miller index differences, and the larger build equals a plain one."""
    cell = flapw.System.preset("TiO2", kmax=3.6, supercell=(1, 1, 1))
    small = cell.with_kmax(2.0)
    flapw.build_hs(small, interstitial=True)                     # the small copy makes the table
    h, s = flapw.build_hs(cell, interstitial=True)
    h_ref, s_ref = flapw.build_hs(flapw.System.preset("TiO2", kmax=3.6, supercell=(1, 1, 1)), interstitial=True)
    assert small.step_table is cell.step_table
    assert _rel(h, h_ref) <= 1e-13 and _rel(s, s_ref) <= 1e-13


def test_warm_up_pays_the_first_calls(tio2, monkeypatch, caplog):
    """prepare: the workspace for host arrays, a small build through the backend; beside GPUs (faked) one
    product of SPLIT_EDGE through the backend; out of memory only skips it, with a note."""
    from flapw import warmup
    cell, _ = tio2
    calls = []

    class Spy:
        name = "hybridblas"
        context = hb.Context("cpu")

        def __getattr__(self, routine):
            def call(*args, **kw):
                calls.append((routine, args[1].shape))
                return getattr(flapw.backends.get_backend("hybridblas", self.context), routine)(*args, **kw)
            return call
    ws = flapw.Workspace()
    spent = warmup.prepare(cell, Spy(), "host", "refined", 6, interstitial=True, nev=3, workspace=ws)
    assert set(spent) == {"workspace", "warm-up"} and ws.held_bytes() >= 2 * 16 * cell.n_g ** 2
    assert {r for r, _ in calls} == {"herk", "her2k", "herkx"}
    calls.clear()
    monkeypatch.setattr(warmup, "_runs_on_gpu", lambda backend: True)
    monkeypatch.setattr(warmup, "SPLIT_EDGE", 64)
    warmup.prepare(cell, Spy(), "host", "refined", 6)
    assert calls[-1] == ("herk", (64, 64))

    def full(*a, **kw):
        raise MemoryError("stand-in: GPU full")
    monkeypatch.setattr(warmup, "build_hs", full)
    with caplog.at_level("INFO", logger="flapw"):
        assert "warm-up" in warmup.prepare(cell, Spy(), "host", "refined", 6)
    assert any("warm-up skipped: out of memory" in r.getMessage() for r in caplog.records)


def test_warm_up_builds_a_small_enough_largest_kpoint_whole_on_device_arrays(tio2, monkeypatch):
    """Device arrays, and host arrays with the operands on a GPU: after the small build, the largest k-point built
    once at its own size (host arrays: in the k-points' workspace) when its products come to at most
    FULL_SIZE_FLOPS; above that, and with host operands, the small build alone (numpy standing in for cupy, the
    SPLIT_EDGE products left out)."""
    from flapw import warmup
    cell = flapw.System.preset("TiO2", kmax=3.6, supercell=(1, 1, 1))      # above the small build's TINY_N_G
    built = []
    real_build, real_module = warmup.build_hs, hsdla._array_module
    monkeypatch.setattr(hsdla, "_array_module", lambda arrays: _NumpyAsDevice() if arrays == "device"
                        else real_module(arrays))
    monkeypatch.setattr(warmup, "_array_module", hsdla._array_module)
    monkeypatch.setattr(warmup, "SPLIT_EDGE", 0)
    monkeypatch.setattr(warmup, "build_hs", lambda c, *a, **kw: built.append((c.n_g, kw["arrays"]))
                        or real_build(c, *a, **kw))
    backend = flapw.backends.get_backend("hybridblas", hb.Context("cpu"))
    assert warmup.build_flops(cell) == 20.0 * cell.n_g ** 2 * cell.n_atoms * cell.n_l
    monkeypatch.setattr(warmup, "FULL_SIZE_FLOPS", warmup.build_flops(cell))
    spent = warmup.prepare(cell, backend, "device", "refined", 6, interstitial=True)
    assert len(built) == 2 and built[0][0] < cell.n_g and built[1] == (cell.n_g, "device")
    assert 0 < spent["warm-up: full-size build"] <= spent["warm-up"]
    built.clear()
    monkeypatch.setattr(warmup, "FULL_SIZE_FLOPS", warmup.build_flops(cell) * 0.99)
    assert "warm-up: full-size build" not in warmup.prepare(cell, backend, "device", "refined", 6)
    assert len(built) == 1 and built[0][0] < cell.n_g
    built.clear()
    monkeypatch.setattr(warmup, "FULL_SIZE_FLOPS", float("inf"))
    warmup.prepare(cell, backend, "host", "refined", 6)
    assert len(built) == 1
    built.clear()                      # host arrays with the operands on the "GPU": whole, in the k-points' workspace
    monkeypatch.setattr(hsdla, "_hybridblas_on_gpu", lambda backend: True)
    monkeypatch.setattr(hsdla, "_gpu_holds_build", lambda cell, method, nb, interstitial, workspace: nb)
    monkeypatch.setattr(hb.lowlevel, "to_host", lambda dst, src, lower=None, wait=True: np.copyto(dst, src) if wait
                        else type("Pending", (), {"wait": staticmethod(lambda: np.copyto(dst, src))})())
    ws = flapw.Workspace()
    spent = warmup.prepare(cell, backend, "host", "refined", 6, interstitial=True, workspace=ws, operands="device")
    assert len(built) == 2 and built[1] == (cell.n_g, "host") and "warm-up: full-size build" in spent
    assert ws.held_bytes() >= 2 * 16 * cell.n_g ** 2 and "H on the GPU" in ws._buffers


def test_warm_up_compiles_an_emulating_contexts_kernels_for_the_builds_k(tio2, monkeypatch):
    """With a context that emulates FP64 (emulation="int8") on GPUs, prepare compiles the emulation's kernels
    for k = batch_atoms N_L on those GPUs (hybridblas.lowlevel.prepare_kernels) and waits for them."""
    from types import SimpleNamespace
    from flapw import warmup
    cell, _ = tio2
    seen = []

    class Thread:
        def join(self):
            seen.append("joined")
    monkeypatch.setattr(hb.lowlevel, "prepare_kernels",
                        lambda dtype, devices, **kw: seen.append((np.dtype(dtype), devices, kw)) or Thread())
    gpus = [SimpleNamespace(kind="cuda", index=i) for i in (0, 1)]
    ctx = SimpleNamespace(emulation="int8", emulation_bits=50, devices=[SimpleNamespace(kind="cpu")] + gpus)
    backend = SimpleNamespace(name="hybridblas", context=ctx)
    assert isinstance(warmup._emulation_kernels(cell, backend, 6), Thread)
    assert seen == [(np.dtype(complex), [0, 1], {"emulation_bits": 50, "k": 6 * cell.n_l})]
    ctx.devices = ctx.devices[:1]
    assert warmup._emulation_kernels(cell, backend, 6) is None                   # no GPU
    ctx.devices, ctx.emulation = [SimpleNamespace(kind="cpu")] + gpus, None
    assert warmup._emulation_kernels(cell, backend, 6) is None                   # native
    assert len(seen) == 1
    monkeypatch.setattr(warmup, "_emulation_kernels", lambda *a: Thread())
    warmup.prepare(cell, flapw.backends.get_backend("hybridblas", hb.Context("cpu")), "host", "refined", 6)
    assert seen[-1] == "joined"


@pytest.mark.parametrize("lower_only", [True, False])
def test_host_arrays_built_on_the_gpu_equal_the_host_build(tio2, lower_only, monkeypatch):
    """Host H and S with the operands on a GPU that holds the whole build: built there (numpy standing in for
    cupy) and copied into the host arrays (the lower triangles only with lower_only, the upper ones untouched),
    equal to the host build; a workspace's host H and S are the arrays returned."""
    cell, _ = tio2
    h_ref, s_ref = flapw.build_hs(cell, interstitial=True, lower_only=lower_only, batch_atoms=4)
    real = hsdla._array_module
    monkeypatch.setattr(hsdla, "_array_module", lambda arrays: _NumpyAsDevice() if arrays == "device"
                        else real(arrays))
    monkeypatch.setattr(hsdla, "_hybridblas_on_gpu", lambda backend: True)
    monkeypatch.setattr(hsdla, "_gpu_holds_build", lambda cell, method, nb, interstitial, workspace: nb)
    copies, seen = [], {}
    ws = flapw.Workspace()
    ws.reserve(cell, "refined", 4, operands="device")
    host_h, host_s = ws.get("H", cell.n_g ** 2), ws.get("S", cell.n_g ** 2)

    def gpu(name):
        return ws._buffers[f"{name} on the GPU"].reshape((cell.n_g, cell.n_g), order="F")

    def to_host(dst, src, lower=None, wait=True):
        name = "S" if np.shares_memory(dst, host_s) else "H"
        copies.append((name, lower, wait))
        seen[name] = src.copy(), gpu("H").copy()                 # the GPU's H when the copy starts
        keep = np.ones(dst.shape, bool) if lower is None else np.tril(np.ones(dst.shape, bool))
        np.copyto(dst, src, where=keep)
        return dst if wait else type("Pending", (), {"wait": staticmethod(lambda: None)})()
    monkeypatch.setattr(hb.lowlevel, "to_host", to_host)
    host_h[:] = 7.0                                              # what an earlier build left there
    h, s, rep = flapw.build_hs(cell, interstitial=True, lower_only=lower_only, batch_atoms=4, operands="device",
                               workspace=ws, return_report=True)
    assert rep.hs_built_on_gpu and "H, S to the host" in rep.stages
    tri = True if lower_only else None
    assert copies == [("S", tri, False), ("H", tri, True)]      # S queued first, H once complete
    assert not np.array_equal(seen["S"][1], gpu("H"))            # S's copy started while H was still being built
    assert np.array_equal(seen["S"][0], gpu("S"))                # ... and S was complete
    assert np.shares_memory(h, host_h)
    if lower_only:
        assert _rel(_lower(h), _lower(h_ref)) <= 1e-13 and _rel(_lower(s), _lower(s_ref)) <= 1e-13
        assert (np.triu(h, 1)[np.triu(np.ones(h.shape, bool), 1)] == 7.0).all()
    else:
        assert _rel(h, h_ref) <= 1e-13 and _rel(s, s_ref) <= 1e-13


def test_a_failure_after_s_left_for_the_host_waits_for_its_copy(tio2, monkeypatch):
    """Host H and S built on the "GPU": a product of H that fails after S's copy was queued raises its own
    error, and S's copy has been waited for (nothing left in flight into the host's S)."""
    cell, _ = tio2
    real = hsdla._array_module
    monkeypatch.setattr(hsdla, "_array_module", lambda arrays: _NumpyAsDevice() if arrays == "device"
                        else real(arrays))
    monkeypatch.setattr(hsdla, "_hybridblas_on_gpu", lambda backend: True)
    monkeypatch.setattr(hsdla, "_gpu_holds_build", lambda cell, method, nb, interstitial, workspace: nb)
    events = []

    def to_host(dst, src, lower=None, wait=True):
        events.append("queued")
        return type("Pending", (), {"wait": staticmethod(lambda: events.append("waited"))})()
    monkeypatch.setattr(hb.lowlevel, "to_host", to_host)
    backend = flapw.backends.get_backend("hybridblas", hb.Context("cpu"))

    def broken(*args, **kw):
        raise RuntimeError("zherkx failed")
    monkeypatch.setattr(backend, "herkx", broken)
    with pytest.raises(RuntimeError, match="zherkx failed"):
        flapw.build_hs(cell, interstitial=True, batch_atoms=6, operands="device", blas=backend,
                       workspace=flapw.Workspace())
    assert events == ["queued", "waited"]


@pytest.mark.gpu
@pytest.mark.parametrize("lower_only", [True, False])
@pytest.mark.parametrize("fits", [True, False, "locked"])
def test_gpu_host_arrays_built_there_or_streamed_equal_the_host_build(tio2, fits, lower_only, monkeypatch):
    """Host H and S, operands on the GPU: built on the GPU and copied (the whole build fits) or kept in host
    memory with their tiles streamed (DEVICE_SHARE 0: nothing fits), both equal to the CPU build. "locked": built
    there in batches of two atoms and copied by DMA into page-locked H and S (S on its second stream)."""
    from hybridblas import host_pinning
    cell, _ = tio2
    h_ref, s_ref = flapw.build_hs(cell, interstitial=True, lower_only=lower_only, context=hb.Context("cpu"))
    if not fits:
        monkeypatch.setattr(hsdla, "DEVICE_SHARE", 0.0)
    if fits == "locked":
        monkeypatch.setattr(host_pinning, "PIN_MIN_BYTES", 0)
    ws = flapw.Workspace()
    for _ in range(2):                                           # the second build reuses the workspace
        h, s, rep = flapw.build_hs(cell, interstitial=True, lower_only=lower_only, return_report=True,
                                   context=hb.Context(devices=["cuda:0"]), workspace=ws,
                                   batch_atoms=2 if fits == "locked" else None)
        assert isinstance(h, np.ndarray) and rep.operands == "device" and rep.hs_built_on_gpu == bool(fits)
        pick = _lower if lower_only else (lambda m: m)
        assert _rel(pick(h), pick(h_ref)) <= 1e-12 and _rel(pick(s), pick(s_ref)) <= 1e-12


def test_hs_on_gpu_retry_streams_and_frees_the_gpu_copies(tio2, monkeypatch):
    """A build of host H and S on the GPU that runs out of memory is repeated with the same batch and H and S in
    host memory (hs_on_gpu=False), equal to the host build; that build frees the workspace's GPU copies of H and
    S. hs_on_gpu takes 'auto' or False only, refused before any work."""
    cell, _ = tio2
    h_ref, s_ref = flapw.build_hs(cell, interstitial=True, batch_atoms=4)
    with pytest.raises(ValueError, match=r"hs_on_gpu must be 'auto' or False, got bool True"):
        flapw.build_hs(cell, hs_on_gpu=True)
    real = hsdla._array_module
    monkeypatch.setattr(hsdla, "_array_module", lambda arrays: _NumpyAsDevice() if arrays == "device"
                        else real(arrays))
    monkeypatch.setattr(hsdla, "_hybridblas_on_gpu", lambda backend: True)
    monkeypatch.setattr(hsdla, "_gpu_holds_build", lambda cell, method, nb, interstitial, workspace: nb)
    monkeypatch.setattr(hsdla, "_device_batch", lambda cell, method, nb, workspace: nb)
    monkeypatch.setattr(hb.lowlevel, "to_host", lambda dst, src, lower=None, wait=True: np.copyto(dst, src) if wait
                        else type("Pending", (), {"wait": staticmethod(lambda: np.copyto(dst, src))})())
    attempts, build = [], hsdla.build_hs

    def once_out_of_memory(*args, **kw):
        attempts.append((kw["batch_atoms"], kw["hs_on_gpu"]))
        if len(attempts) == 1:
            raise MemoryError("GPU memory exhausted")
        return build(*args, **kw)
    monkeypatch.setattr(hsdla, "build_hs", once_out_of_memory)
    ws = flapw.Workspace()
    h, s = flapw.build_hs_with_fallback(cell, interstitial=True, batch_atoms=4, operands="device", workspace=ws)
    assert attempts == [(4, "auto"), (4, False)]
    assert _rel(h, h_ref) <= 1e-13 and _rel(s, s_ref) <= 1e-13
    monkeypatch.setattr(hsdla, "build_hs", build)
    build(cell, interstitial=True, batch_atoms=4, operands="device", workspace=ws)        # built on the "GPU"
    assert "H on the GPU" in ws._buffers
    build(cell, interstitial=True, batch_atoms=4, operands="device", workspace=ws, hs_on_gpu=False)
    assert "H on the GPU" not in ws._buffers and "S on the GPU" not in ws._buffers
