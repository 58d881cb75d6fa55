"""cisolver.warmup without a GPU: which runs get the helper process (plan), what it is told, the stand-in's
nucleon numbers, and that a helper still running is ended when the run returns."""
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from cisolver import warmup
from cisolver.observables import TransitionOptions


def _request(**kw):
    base = dict(devices=[1, 0], comm=None, block_size=None, nev=5, dtype=np.dtype(np.float32), tol=1e-5,
                n_protons=4, n_neutrons=4, observables=TransitionOptions(),
                counts=SimpleNamespace(dimension=1_963_461), interaction=SimpleNamespace(path="/x/gxpf1a.snt"))
    base.update(kw)
    return SimpleNamespace(**base)


PLENTY = 64 << 30


def test_plan_for_a_gpu_run():
    task = warmup.plan(_request(), PLENTY)
    assert task == {"device": 1, "dtype": "float32", "nev": 5, "block_size": 8, "tol": 1e-5,
                    "rows": warmup.STAND_IN_ROWS, "interaction": "/x/gxpf1a.snt",
                    "observables": {"protons": 2, "neutrons": 2, "eff_charge": [1.5, 0.5], "gl": [1.0, 0.0],
                                    "gs": [5.586, -3.826], "b": None, "hbar_omega": None}}


@pytest.mark.parametrize("kw", [dict(devices="cpu"), dict(comm=object()),
                                dict(counts=SimpleNamespace(dimension=23)),      # fewer rows than 3 blocks
                                ])
def test_no_helper(kw):
    assert warmup.plan(_request(**kw), PLENTY) is None


def test_no_helper_without_memory_to_spare():
    need = warmup.HEADROOM * warmup.stand_in_bytes(warmup.STAND_IN_ROWS, 8, 4) + warmup.CONTEXT_BYTES
    assert warmup.plan(_request(), need) is not None
    assert warmup.plan(_request(), need - 1) is None


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(warmup.ENV, "0")
    assert warmup.plan(_request(), PLENTY) is None
    monkeypatch.setenv(warmup.ENV, "1")
    assert warmup.plan(_request(), PLENTY) is not None


def test_observables_part_follows_the_request():
    assert warmup.plan(_request(observables=None), PLENTY)["observables"] is None
    # the run is its own stand-in: nothing to warm for the observables
    assert warmup.plan(_request(n_protons=2, n_neutrons=1), PLENTY)["observables"] is None
    small = warmup.plan(_request(counts=SimpleNamespace(dimension=100), block_size=10, nev=4), PLENTY)
    assert small["rows"] == 100 and small["block_size"] == 10


def test_few_keeps_the_parity():
    assert [warmup.few(n) for n in range(8)] == [0, 1, 2, 1, 2, 1, 2, 1]
    assert all(warmup.few(n) % 2 == n % 2 for n in range(30))


def test_start_without_gpus_or_under_mpi_starts_nothing(monkeypatch):
    assert warmup.start(_request(devices="cpu")) is None
    assert warmup.start(_request(comm=object())) is None
    monkeypatch.setattr(sys, "executable", "")            # an embedding interpreter: no helper to start
    assert warmup.start(_request()) is None


def test_close_ends_a_helper_that_still_runs():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    w = warmup.Warmup(proc)
    assert w.close(timeout=10) != 0 and proc.poll() is not None
    done = warmup.Warmup(subprocess.Popen([sys.executable, "-c", "pass"]))
    done.process.wait()
    assert done.close() == 0


def test_run_closes_the_helper_when_the_run_fails(monkeypatch):
    from cisolver import spectrum
    closed = []

    class Fake:
        def close(self):
            closed.append(True)
    monkeypatch.setattr(spectrum.warmup, "start", lambda rq: Fake())
    used = []
    device = lambda i: SimpleNamespace(use=lambda: used.append(i))      # noqa: E731
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(Device=device)))
    monkeypatch.setattr(spectrum, "_run", lambda rq, progress: (_ for _ in ()).throw(RuntimeError("boom")))
    from cisolver import cuda_modules
    monkeypatch.setattr(cuda_modules, "prepare", lambda *a: None)
    monkeypatch.setattr(spectrum.hb.lowlevel, "prepare_kernels", lambda *a: None)
    with pytest.raises(RuntimeError, match="boom"):
        spectrum.run(_request())
    assert closed == [True]
    assert used == [1]              # one process: the run's first GPU is current during the run
