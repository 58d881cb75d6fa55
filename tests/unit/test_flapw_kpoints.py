"""k-points side by side, one per worker: which k-point goes where, results identical to the sequential run
and in k-point order, errors, each job's preparation one job ahead on another thread, the CLI's choice between
splitting calls and k-points; and (two GPUs) the CLI run against the host build."""
import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import flapw
import hybridblas as hb
from flapw import cli
from flapw.kpoints import SPLIT_BELOW, ahead, assign, side_by_side


def test_round_robin_assignment():
    assert assign(8, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert assign(5, 3) == [[0, 3], [1, 4], [2]]
    assert assign(1, 4) == [[0], [], [], []]
    assert assign(0, 2) == [[], []]
    with pytest.raises(ValueError, match="n_workers must be at least 1, got 0"):
        assign(3, 0)


def test_side_by_side_builds_equal_the_sequential_ones():
    """Five k-points of NaCl on three fake 'devices' (numpy, one CPU context each): every k-point on the
    worker round robin gives it, each worker's k-points in order on its own thread, H and S those of the
    sequential run (to rounding: builds at once share the process's BLAS thread setting, and a product's
    rounding follows its thread count), results in k-point order."""
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))
    cell.tmats, cell.step_table
    kpts = cli._kpoints(5, cell.k)
    seen = []

    def start(worker):
        return SimpleNamespace(name=worker, thread=threading.get_ident(), context=hb.Context("cpu"))

    def run(state, k):
        assert threading.get_ident() == state.thread
        seen.append((state.name, kpts.index(k)))
        return flapw.build_hs(cell.with_k(k), interstitial=True, lower_only=True, context=state.context)
    got = side_by_side(kpts, ["dev0", "dev1", "dev2"], run, start)
    want = [flapw.build_hs(cell.with_k(k), interstitial=True, lower_only=True) for k in kpts]
    for (h, s), (hw, sw) in zip(got, want, strict=True):
        assert h.shape == hw.shape
        np.testing.assert_allclose(h, hw, rtol=0, atol=1e-14 * np.abs(hw).max())
        np.testing.assert_allclose(s, sw, rtol=0, atol=1e-14 * np.abs(sw).max())
    by_worker = {w: [j for name, j in seen if name == w] for w in ("dev0", "dev1", "dev2")}
    assert by_worker == {"dev0": [0, 3], "dev1": [1, 4], "dev2": [2]}


def test_first_error_stops_the_workers_and_is_raised():
    """Job 1 fails on worker b while worker a is in job 0 (or before a starts it): a starts no other job."""
    ran = []
    failing = threading.Event()

    def run(worker, j):
        ran.append(j)
        if j == 1:
            failing.set()
            raise RuntimeError("job 1 failed")
        if j == 0:
            assert failing.wait(timeout=10)
            for b in [t for t in threading.enumerate() if t.name == "flapw-worker-1"]:
                b.join(timeout=10)                # b has recorded its error and ended
        return j
    with pytest.raises(RuntimeError, match="job 1 failed"):
        side_by_side(range(8), ["a", "b"], run)
    assert 1 in ran and set(ran) <= {0, 1}

    def start(worker):
        raise OSError(f"no device {worker}")
    with pytest.raises(OSError, match="no device a"):
        side_by_side(range(3), ["a", "b"], lambda w, j: j, start)
    assert side_by_side([], ["a"], lambda w, j: j) == []


def test_ahead_prepares_the_next_item_while_the_caller_works():
    """Item i+1's prepare runs on another thread and starts before the caller is done with item i; values in
    order; prepare's error raised at its item; a caller that stops early leaves no preparation running."""
    started = {i: threading.Event() for i in range(4)}
    threads = {}

    def prepare(i):
        threads[i] = threading.get_ident()
        started[i].set()
        if i == 3:
            raise ValueError("item 3 cannot be prepared")
        return i * i
    got = []
    with pytest.raises(ValueError, match="item 3 cannot be prepared"):
        for item, value in ahead(range(4), prepare):
            if item + 1 < 4:
                assert started[item + 1].wait(timeout=10)     # the next one is under way beside this one
            got.append((item, value))
    assert got == [(0, 0), (1, 1), (2, 4)]
    assert threading.get_ident() not in threads.values()
    assert list(ahead([], prepare)) == []

    finished = []

    def prepare_slowly(i):
        if i == 1:
            time.sleep(0.2)
        finished.append(i)
        return i
    gen = ahead(range(5), prepare_slowly)
    assert next(gen) == (0, 0)
    gen.close()                                          # waits for item 1's preparation, starts no other
    assert finished == [0, 1]


def test_ahead_starts_the_second_preparation_once_the_first_is_done():
    """The first item's preparation runs alone (it is what the caller waits for); each later one starts when
    the one before it is done, before the caller has worked on that item."""
    log, lock = [], threading.Lock()

    def prepare(i):
        with lock:
            log.append(("start", i))
        time.sleep(0.05)
        with lock:
            log.append(("end", i))
        return i
    for item, _ in ahead(range(3), prepare):
        with lock:
            log.append(("caller", item))
        time.sleep(0.1)                          # the next preparation finishes meanwhile
    at = log.index
    assert log[:2] == [("start", 0), ("end", 0)]                      # the first one alone
    assert at(("end", 0)) < at(("start", 1)) < at(("end", 1)) < at(("caller", 1))       # under way beside item 0
    assert at(("end", 1)) < at(("start", 2)) < at(("caller", 2))


def test_ahead_raises_a_failed_preparation_without_starting_the_next():
    started = []

    def prepare(i):
        started.append(i)
        if i == 0:
            raise OSError("no basis for item 0")
        time.sleep(1.0)
        return i
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="no basis for item 0"):
        next(ahead(range(3), prepare))
    assert started == [0] and time.perf_counter() - t0 < 0.5


def test_cleanup_runs_on_every_worker_that_stops_early():
    """A job's error: cleanup(state) on the failing worker's thread and on each other worker that stops before its
    jobs are done (never finish there); workers that completed get finish, not cleanup."""
    log, lock = [], threading.Lock()

    ran_on = {}

    def start(worker):
        ran_on[worker] = threading.get_ident()
        return worker

    def run(worker, j):
        if j == 2:
            raise RuntimeError("job 2 failed")
        time.sleep(0.05)
        return j

    def note(what):
        def call(worker):
            with lock:
                log.append((what, worker, threading.get_ident()))
        return call
    with pytest.raises(RuntimeError, match="job 2 failed"):
        side_by_side(range(6), ["a", "b", "c"], run, start, finish=note("finish"), cleanup=note("cleanup"))
    assert ("cleanup", "c") in [e[:2] for e in log]                  # job 2's worker
    assert all(ident == ran_on[w] for _, w, ident in log)            # on the worker's own thread
    assert sorted(w for what, w, _ in log) == ["a", "b", "c"]         # each worker once, finish or cleanup
    log.clear()
    assert side_by_side(range(4), ["a", "b"], lambda w, j: j, finish=note("finish"), cleanup=note("cleanup")) == [
        0, 1, 2, 3]
    assert sorted(e[:2] for e in log) == [("finish", "a"), ("finish", "b")]


def test_side_by_side_hands_each_job_its_preparation():
    prepared_on = {}

    def prepare(j):
        prepared_on[j] = threading.get_ident()
        return f"prepared {j}"

    def run(worker, j, prepared):
        assert prepared == f"prepared {j}" and prepared_on[j] != threading.get_ident()
        return (worker, j)
    assert side_by_side(range(5), ["a", "b"], run, prepare=prepare) == [
        ("a", 0), ("b", 1), ("a", 2), ("b", 3), ("a", 4)]

    def broken(j):
        if j == 2:
            raise OSError("no basis for job 2")
        return j
    with pytest.raises(OSError, match="no basis for job 2"):
        side_by_side(range(5), ["a", "b"], lambda w, j, p: j, prepare=broken)


def _fake_gpus(monkeypatch, gpus, fits=True):
    """A CPU backend that claims ``gpus``; per-GPU backends made without touching CUDA."""
    monkeypatch.setattr(cli, "_context_gpus", lambda backend: list(gpus))
    monkeypatch.setattr(cli, "get_backend", lambda blas, context=None, gpus=None: SimpleNamespace(
        name="hybridblas", context=context))
    monkeypatch.setattr(hb, "Context", lambda devices, strategy, emulation=None: SimpleNamespace(devices=devices,
                                                                                               emulation=emulation))
    monkeypatch.setattr(cli, "auto_arrays", lambda backend, cell, method, nb, interstitial=False:
                        ("device", nb // 2) if fits else ("host", nb))


def _args(**kw):
    base = dict(blas="hybridblas", multi_gpu="auto", arrays="auto", devices="all", strategy="auto",
                method="refined", interstitial=True, solve=0, output=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_cli_chooses_kpoints_side_by_side(monkeypatch):
    small = SimpleNamespace(n_g=SPLIT_BELOW - 1)
    large = SimpleNamespace(n_g=SPLIT_BELOW)
    _fake_gpus(monkeypatch, [0, 1])
    workers, nb = cli._side_by_side(_args(), None, small, 8, n_kpoints=4)
    assert [g for g, _ in workers] == [0, 1] and nb == 4
    assert [b.context.devices for _, b in workers] == [["cuda:0"], ["cuda:1"]]
    for args, cell, n_k in [(_args(), large, 4), (_args(), small, 1), (_args(multi_gpu="split"), small, 4),
                            (_args(arrays="host"), small, 4)]:
        assert cli._side_by_side(args, None, cell, 8, n_kpoints=n_k) == (None, 8)
    # host arrays side by side when asked: each GPU's k-point in host arrays of its own, while two H and S pairs fit
    workers, nb = cli._side_by_side(_args(arrays="host", multi_gpu="kpoints"), None, small, 8, n_kpoints=4)
    assert [g for g, _ in workers] == [0, 1] and nb == 8
    pair = 2 * 16 * small.n_g ** 2
    monkeypatch.setattr(hb.memory, "host_available", lambda: 2 * pair / 0.9 * 0.99)
    with pytest.raises(ValueError, match=r"--multi-gpu kpoints with --arrays host: 2 k-points' H and S"):
        cli._side_by_side(_args(arrays="host", multi_gpu="kpoints"), None, small, 8, n_kpoints=4)
    monkeypatch.setattr(hb.memory, "host_available", lambda: 2 * pair / 0.9 * 1.01)
    assert cli._side_by_side(_args(arrays="host", multi_gpu="kpoints"), None, small, 8, n_kpoints=4)[0] is not None
    assert cli._side_by_side(_args(multi_gpu="kpoints"), None, large, 8, 1)[0] is not None
    _fake_gpus(monkeypatch, [0])
    assert cli._side_by_side(_args(), None, small, 8, 4) == (None, 8)
    with pytest.raises(ValueError, match="--multi-gpu kpoints needs two or more GPUs"):
        cli._side_by_side(_args(multi_gpu="kpoints"), None, small, 8, 4)
    _fake_gpus(monkeypatch, [0, 1], fits=False)
    assert cli._side_by_side(_args(), None, small, 8, 4) == (None, 8)


def test_host_arrays_side_by_side_count_the_other_gpus_h_and_s(monkeypatch):
    """_host_batch with two workers on host arrays: with the operands on the GPUs each worker's build fits beside the
    other's H and S (not a whole second build); too little for that halves the batch or refuses before any work;
    with host operands each worker gets half the memory."""
    from flapw.hsdla import build_bytes
    cell = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1))
    args = SimpleNamespace(method="refined", interstitial=True, solve=0, output=None, kmax=2.2, structure=None,
                           system="NaCl")
    one, pair = build_bytes(cell, "refined", 8, True), 2 * 16 * cell.n_g ** 2
    monkeypatch.setattr(hb.memory, "host_available", lambda: (one + pair) / 0.9 * 1.001)
    assert cli._host_batch(args, cell, 8, "host", None, workers=2, operands="device") == 8
    assert cli._host_batch(args, cell, 8, "host", None, workers=1) == 8
    assert cli._host_batch(args, cell, 8, "host", None, workers=2, operands="host") < 8
    monkeypatch.setattr(hb.memory, "host_available", lambda: (build_bytes(cell, "refined", 1, True) + pair) / 0.9 * 0.99)
    with pytest.raises(hb.InsufficientMemory, match="the other GPUs' k-points"):
        cli._host_batch(args, cell, 8, "host", None, workers=2, operands="device")


def test_cli_reports_stay_in_kpoint_order(monkeypatch, capsys):
    """The CLI's k-point loop with two fake workers (CPU contexts) behind --multi-gpu: reports in k-point
    order, each with the worker that built it, the file's H and S those of the plain run."""
    cpu = [hb.Context("cpu"), hb.Context("cpu")]
    plan = cli._plan

    def with_workers(args, comm):
        p = plan(args, comm)
        p.workers = [(g, flapw.backends.get_backend("hybridblas", cpu[g])) for g in (0, 1)]
        p.arrays = "host"
        return p
    monkeypatch.setattr(cli, "_plan", with_workers)
    monkeypatch.setattr(cli, "_use_gpu", lambda g: None)
    common = ["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "1.8", "--kpoints", "5",
              "--interstitial", "--solve", "2", "--json"]
    assert cli.main(common) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["multi_gpu"] == "kpoints"
    assert [r["k_index"] for r in doc["reports"]] == [0, 1, 2, 3, 4]
    assert [r["gpu"] for r in doc["reports"]] == [0, 1, 0, 1, 0]
    monkeypatch.undo()
    assert cli.main(common) == 0
    plain = json.loads(capsys.readouterr().out)
    for a, b in zip(doc["reports"], plain["reports"], strict=True):
        np.testing.assert_allclose(a["eigenvalues"], b["eigenvalues"], rtol=0, atol=1e-12)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("arrays", ["device", "host"])
def test_gpu_kpoints_side_by_side_equal_the_host_build(tmp_path, capsys, arrays):
    """k-points side by side on GPUs 0 and 1 (device arrays, or host arrays of each GPU's own, built on it and
    copied to the host): each k-point's H and S those of the CPU build."""
    out = tmp_path / "hs.npz"
    rc = cli.main(["build", "--system", "NaCl", "--kmax", "2.0", "--kpoints", "4", "--interstitial", "--devices",
                   "all", "--multi-gpu", "kpoints", "--solve", "4", "--output", str(out), "--json", "--arrays",
                   "auto" if arrays == "device" else "host"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert doc["multi_gpu"] == "kpoints" and doc["arrays"] == arrays
    assert [r["k_index"] for r in doc["reports"]] == [0, 1, 2, 3]
    assert [r["gpu"] for r in doc["reports"]] == [0, 1, 0, 1]
    data = flapw.read_hs(out)
    cell = flapw.System.preset("NaCl", kmax=2.0)
    for got, k in zip(data["kpoints"], cli._kpoints(4, cell.k), strict=True):
        h, s = flapw.build_hs(cell.with_k(k), interstitial=True, context=hb.Context("cpu"))
        assert np.abs(got["H"] - h).max() <= 1e-12 * np.abs(h).max()
        assert np.abs(got["S"] - s).max() <= 1e-12 * np.abs(s).max()


def test_finish_runs_on_each_workers_thread_after_its_last_job():
    """finish(state) once per worker with jobs, on that worker's thread, after its last job and before
    side_by_side returns; an error there is raised as that worker's last job's."""
    log, lock = [], threading.Lock()

    def run(worker, j):
        with lock:
            log.append(("run", worker, j, threading.get_ident()))
        return j

    def finish(worker):
        with lock:
            log.append(("finish", worker, None, threading.get_ident()))
    assert side_by_side(range(5), ["a", "b", "c"], run, finish=finish) == [0, 1, 2, 3, 4]
    for w in ("a", "b", "c"):
        mine = [e for e in log if e[1] == w]
        assert [e[0] for e in mine] == ["run"] * (len(mine) - 1) + ["finish"]
        assert len({e[3] for e in mine}) == 1                  # one thread: the worker's
    log.clear()
    assert side_by_side(range(1), ["a", "b"], run, finish=finish) == [0]
    assert [e[:2] for e in log if e[0] == "finish"] == [("finish", "a")]      # b had no job

    def broken(worker):
        if worker == "b":
            raise RuntimeError("GPU work of b's last job failed")
    with pytest.raises(RuntimeError, match="b's last job"):
        side_by_side(range(4), ["a", "b"], run, finish=broken)


def test_started_runs_once_every_worker_is_ready():
    events = []
    lock = threading.Lock()

    def start(worker):
        with lock:
            events.append(("start", worker))
        return worker

    def run(worker, j):
        with lock:
            events.append(("run", j))
        return j
    assert side_by_side(range(4), ["a", "b"], run, start, started=lambda: events.append(("started",))) == [0, 1, 2, 3]
    first_run = min(i for i, e in enumerate(events) if e[0] == "run")
    assert events.index(("started",)) < first_run
    assert {e for e in events[:first_run] if e[0] == "start"} == {("start", "a"), ("start", "b")}


@pytest.mark.parametrize("extra, words", [
    (["--multi-gpu", "kpoints", "--kpoints", "2"], ["--multi-gpu kpoints needs two or more GPUs", "'cpu'"]),
    (["--overlap", "on", "--method", "original"], ["--overlap on is for the refined method", "original"]),
    (["--vectors", "--solve", "2"], ["--vectors", "--output None"]),
])
def test_cli_refuses_before_any_work(tmp_path, capsys, monkeypatch, extra, words):
    def refuse(*a, **k):
        raise AssertionError("a build started")
    monkeypatch.setattr(cli, "build_hs_with_fallback", refuse)
    monkeypatch.setattr(cli, "prepare", refuse)
    rc = cli.main(["build", "--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "1.8", "--interstitial", *extra])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.multi_gpu
def test_cli_in_process_leaves_the_callers_gpu_current(capsys):
    """flapw's main() run in-process (k-points side by side on GPUs 0 and 1) gives the caller its current GPU
    back, whichever it was."""
    import cupy
    for mine in (0, 1):
        cupy.cuda.Device(mine).use()
        rc = cli.main(["build", "--system", "NaCl", "--kmax", "2.0", "--kpoints", "2", "--devices", "all",
                       "--multi-gpu", "kpoints", "--quiet"])
        assert rc == 0, capsys.readouterr().err
        assert cupy.cuda.runtime.getDevice() == mine
    cupy.cuda.Device(0).use()


def test_cli_in_process_with_cupy_but_no_driver_finishes(monkeypatch, capsys):
    """A program that imported CuPy on a machine without a usable GPU or driver: main() on the CPU ends with 0,
    not with the driver's error from asking which GPU is current."""
    import sys
    from types import SimpleNamespace

    def no_driver():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    fake = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=no_driver),
                                                driver=SimpleNamespace(ctxGetCurrent=no_driver)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    from hybridblas import console
    with console.gpu_kept() as kept:
        assert kept.before is None
    rc = cli.main(["build", "--system", "NaCl", "--kmax", "1.5", "--devices", "cpu", "--quiet"])
    assert rc == 0, capsys.readouterr().err


class _QueuedRun:
    """flapw build's k-point loop on stand-in 'device' builds (no GPU): each build's one stage timed by fake CUDA
    events; behaviour(ik) picks a k-point that falls back to host arrays or whose GPU work faults when waited for."""

    class DeviceArray:                       # not numpy: the CLI takes it for H and S on a GPU
        pass

    def __init__(self, monkeypatch, n_kpoints, behaviour):
        self.log, self.n = [], n_kpoints
        cell = flapw.System.preset("NaCl", kmax=1.5, supercell=(1, 1, 1))
        kpts = cli._kpoints(n_kpoints, cell.k)
        backend = flapw.backends.get_backend("hybridblas", hb.Context("cpu"))
        plan = SimpleNamespace(spec="cpu", cell=cell, kpoints=kpts, mine=list(enumerate(kpts)), backend=backend,
                               arrays="device", batch_atoms=2, path=None, workers=None, overlap=False, largest=cell,
                               operands="device")
        run = self

        def build(kc, **kw):
            ik = next(i for i, k in enumerate(kpts) if tuple(k) == tuple(kc.k))
            run.log.append(("build", ik, kw["wait"]))
            rep = flapw.BuildReport(n_g=kc.n_g, n_atoms=kc.n_atoms, n_l=kc.n_l, batch_atoms=2)
            if behaviour(ik) == "fallback" or kw["arrays"] == "host":
                with rep.stage("zherk S=AᴴA", 1e9, blas=True):
                    pass
                return np.zeros((2, 2)), np.zeros((2, 2)), rep

            class Event:
                def record(self):
                    self.at = time.perf_counter()

                def synchronize(self):
                    run.log.append(("wait", ik))
                    if behaviour(ik) == "fault":
                        raise RuntimeError(f"an illegal memory access in k-point {ik + 1}'s kernels")
            events = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: 1.0))
            with rep.stage("zherk S=AᴴA", 1e9, blas=True, sync=flapw.report.GpuTimeline(events)):
                pass
            if kw["wait"]:
                rep.settle()
            return run.DeviceArray(), run.DeviceArray(), rep
        monkeypatch.setattr(cli, "_plan", lambda args, comm: plan)
        monkeypatch.setattr(cli, "prepare", lambda *a, **kw: {})
        monkeypatch.setattr(cli, "build_hs_with_fallback", build)
        monkeypatch.setattr(cli, "print", lambda text, **kw: run.log.append(("print", text.split(":")[0])),
                            raising=False)

    def main(self):
        return cli.main(["build", "--system", "NaCl", "--kmax", "1.5", "--kpoints", str(self.n), "-q"])


def test_queued_kpoints_print_in_order_through_a_fall_back_to_host_arrays(monkeypatch):
    """k-points 1 and 2 queued (the second falls back to host arrays: built and settled on the host), the rest
    waited for: every line printed in order and none held back to the end (k-point 1's line before build 3)."""
    run = _QueuedRun(monkeypatch, 5, lambda ik: "fallback" if ik == 1 else "")
    assert run.main() == 0
    builds = [e for e in run.log if e[0] == "build"]
    assert [w for _, _, w in builds] == [False, False, True, True, True]
    prints = [e[1] for e in run.log if e[0] == "print"]
    assert prints == [f"k-point {i}" for i in range(1, 6)]
    assert run.log.index(("print", "k-point 2")) < run.log.index(("build", 2, True))


def test_a_gpu_fault_found_one_kpoint_later_is_reported_and_the_queue_waited_for(monkeypatch, capsys):
    """k-point 3's GPU work faults when k-point 4 (queued after it) waits for it: the run fails with that error,
    naming k-point 3; k-points 1 and 2 are printed, and k-point 4's queued work is waited for before the exit."""
    run = _QueuedRun(monkeypatch, 6, lambda ik: "fault" if ik == 2 else "")
    assert run.main() == 1
    err = capsys.readouterr().err
    assert "illegal memory access in k-point 3" in err
    assert "k-point 3: its GPU work failed" in err
    assert [e[1] for e in run.log if e[0] == "print"] == ["k-point 1", "k-point 2"]
    assert ("build", 4, False) not in run.log                     # stopped before k-point 5
    assert ("wait", 3) in run.log                                 # k-point 4's work waited for
