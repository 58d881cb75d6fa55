"""Ctrl-C during a long call stops it within a tile's time, whatever the strategy, and C is left with
each tile either finished or untouched (never half-written)."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import hybridblas as hb
from hybridblas.devices import cpu as cpu_device

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")


def _interrupt_after(seconds):
    timer = threading.Timer(seconds, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.parametrize("devices,strategy", [("cpu", "static"), (["cpu", "cpu"], "static"),
                                              (["cpu", "cpu"], "dynamic")])
def test_interrupt_stops_within_a_tile(devices, strategy, rng, monkeypatch):
    """A call of ~10 s on this machine's cores, interrupted after 0.3 s: KeyboardInterrupt comes within
    about a tile's time (tiles of ~0.1 s here), and every finished tile of C is exact."""
    monkeypatch.setattr(cpu_device, "TILE_SECONDS", 0.1)
    n, k = 2400, 1200
    a = rng.standard_normal((n, k))
    # time one tile's worth of work to know this machine's rate
    t0 = time.perf_counter()
    a[:600] @ a[:600].T
    rate = 2 * 600 * 600 * k / (time.perf_counter() - t0)
    ctx = hb.Context(devices=devices, strategy=strategy, rates={"cpu": rate, "cpu#1": rate},
                     block_size=256 if strategy == "dynamic" else None)
    c = np.full((n, n), np.nan, order="F")
    timer = _interrupt_after(0.3)
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(50):                 # long enough whatever the machine's speed
                hb.syrk(1.0, a, 0.0, c, context=ctx)
    finally:
        timer.cancel()
    stopped = time.perf_counter() - start - 0.3
    assert stopped < 2.0, f"took {stopped:.2f} s to stop"
    low = np.tril(np.ones((n, n), bool))
    want = a @ a.T
    done = ~np.isnan(c) & low
    np.testing.assert_allclose(c[done], want[done], rtol=1e-12, atol=1e-9)
    assert np.isnan(c[~low]).all()
    # the workers are free again: the next call runs normally
    out = hb.syrk(1.0, a[:300], context=ctx)
    np.testing.assert_allclose(out[np.tril(np.ones((300, 300), bool))],
                               (a[:300] @ a[:300].T)[np.tril(np.ones((300, 300), bool))], rtol=1e-12, atol=1e-9)


def test_host_tiles_follow_the_rate():
    """The host tile edge gives about TILE_SECONDS of work at the device's rate, never below MIN_TILE."""
    from hybridblas import problem as p
    a = np.ones((4000, 2000))
    prob = p.build_problem("syrk", 1.0, [a], 0.0, None, [p.N], True, None)
    edge = cpu_device.tile_edge(prob, 2000, 1e12)
    flops = prob.tile_flops(edge, edge, 2000)
    assert 0.3 * cpu_device.TILE_SECONDS * 1e12 < flops <= cpu_device.TILE_SECONDS * 1e12
    assert cpu_device.tile_edge(prob, 2000, 1.0) == cpu_device.MIN_TILE


@pytest.mark.parametrize("lost", ["closed", "done"])
def test_interrupt_while_the_workers_close_does_not_hang(lost, rng, monkeypatch):
    """A Ctrl-C that lands in the coordinator while it collects the workers' last messages (one of them taken
    from the queue and then lost with the interrupt): the call raises KeyboardInterrupt at once instead of
    waiting for a message that never comes again, and the next call runs normally."""
    from hybridblas import engine as engine_mod
    n, k = 300, 40
    a = rng.standard_normal((n, k))
    ctx = hb.Context(devices=["cpu", "cpu"], strategy="static", min_call_seconds=0, rates={"cpu": 1.0, "cpu#1": 1.0})
    real_init = engine_mod.Engine.__init__

    class LosingQueue(engine_mod.queue.Queue):
        """Raises KeyboardInterrupt in place of returning the first message of kind ``lost``."""
        armed = True

        def get(self, *args, **kw):
            item = super().get(*args, **kw)
            if LosingQueue.armed and item[0] == lost:
                LosingQueue.armed = False
                raise KeyboardInterrupt
            return item

    def init(self, *args, **kw):
        real_init(self, *args, **kw)
        self.results = LosingQueue()
    monkeypatch.setattr(engine_mod.Engine, "__init__", init)
    result = {}

    def call():
        try:
            hb.syrk(1.0, a, context=ctx)
        except BaseException as exc:          # KeyboardInterrupt raised in this thread, handed to the test
            result["exc"] = exc
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the call hung after the interrupt"
    assert isinstance(result.get("exc"), KeyboardInterrupt)
    monkeypatch.setattr(engine_mod.Engine, "__init__", real_init)
    out = hb.syrk(1.0, a, context=ctx)
    low = np.tril(np.ones((n, n), bool))
    np.testing.assert_allclose(out[low], (a @ a.T)[low], rtol=1e-12, atol=1e-12)
