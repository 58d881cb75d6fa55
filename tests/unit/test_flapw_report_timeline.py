"""BuildReport's stages timed by a GpuTimeline (GPU builds): an event where each stage starts and ends, the
seconds added only by settle() (after waiting for the last event), from the events' elapsed times, stages
met twice summed; host stages keep the wall clock. A stand-in for CuPy's events records the order of calls."""
import time
from types import SimpleNamespace

import pytest

from flapw.report import BuildReport, GpuTimeline


class _Events:
    """cupy.cuda's Event and get_elapsed_time, on a fake clock that moves 1.5 ms per event recorded."""

    def __init__(self):
        self.now, self.log = 0.0, []
        events = self

        class Event:
            def record(self):
                events.now += 1.5
                self.at = events.now
                events.log.append(("record", self.at))

            def synchronize(self):
                events.log.append(("wait", self.at))
        self.cuda = SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: b.at - a.at)


def test_stage_seconds_come_from_events_when_the_build_settles():
    fake = _Events()
    rep = BuildReport()
    timeline = GpuTimeline(fake)
    with rep.stage("zherk", flop_count=10.0, blas=True, sync=timeline):
        pass
    with rep.stage("X=UB", sync=timeline):
        pass
    with rep.stage("zherk", flop_count=10.0, blas=True, sync=timeline):
        fake.now += 3.0                          # the GPU took 3 ms longer on this one
    assert [s.seconds for s in rep.stages.values()] == [0.0, 0.0]      # nothing waited for yet
    assert not [e for e in fake.log if e[0] == "wait"]
    rep.settle()
    assert rep.stages["zherk"].seconds == pytest.approx((1.5 + 4.5) / 1e3)
    assert rep.stages["X=UB"].seconds == pytest.approx(1.5 / 1e3)
    assert rep.stages["zherk"].calls == 2 and rep.stages["zherk"].flops == 20.0
    assert rep.total_seconds == pytest.approx(7.5 / 1e3) and rep.blas_seconds == pytest.approx(6.0 / 1e3)
    assert ("wait", fake.now) in fake.log                                   # the last event waited for
    rep.settle()                                                            # once only
    assert rep.total_seconds == pytest.approx(7.5 / 1e3)


def test_host_stages_keep_the_wall_clock():
    rep = BuildReport()
    waited = []
    with rep.stage("interstitial", sync=lambda: waited.append(1)):
        time.sleep(0.01)
    with rep.stage("matching (k-only)"):
        pass
    assert waited == [1] and rep.stages["interstitial"].seconds >= 0.01
    rep.settle()
    assert rep.stages["interstitial"].seconds < 1.0


def test_reading_the_seconds_settles_the_report_first():
    """A build left queued on its GPU (build_hs(wait=False)): total_seconds, blas_seconds, as_dict and table
    wait for the events themselves, so no reader sees a stage's seconds before its GPU work is done."""
    for read in (lambda r: r.total_seconds, lambda r: r.blas_seconds, lambda r: r.as_dict()["total_seconds"],
                 lambda r: r.table()):
        fake = _Events()
        rep = BuildReport()
        with rep.stage("zher2k", flop_count=1.0, blas=True, sync=GpuTimeline(fake)):
            fake.now += 2.0
        assert not [e for e in fake.log if e[0] == "wait"]
        read(rep)
        assert ("wait", fake.now) in fake.log and not rep._marks
        assert rep.stages["zher2k"].seconds == pytest.approx(3.5 / 1e3)


def test_a_second_reader_waits_for_the_first_and_a_fault_leaves_the_stage_pending():
    """settle from two threads: the second reader gets the full seconds once the GPU is done, never a partial sum;
    a wait that raises (a GPU fault) leaves its stage unread, and the next reader raises again."""
    import threading
    gpu_done = threading.Event()
    fake = _Events()
    wait = fake.cuda.Event.synchronize

    def slow(self):
        gpu_done.wait(10)
        wait(self)
    fake.cuda.Event.synchronize = slow
    rep = BuildReport()
    timeline = GpuTimeline(fake)
    for name in ("zherk", "zher2k"):
        with rep.stage(name, flop_count=1.0, blas=True, sync=timeline):
            pass
    got = []
    readers = [threading.Thread(target=lambda: got.append(rep.total_seconds)) for _ in range(2)]
    for r in readers:
        r.start()
    time.sleep(0.05)
    assert got == []                                  # both wait for the GPU
    gpu_done.set()
    for r in readers:
        r.join(10)
    assert got == [pytest.approx(3.0 / 1e3)] * 2

    broken = BuildReport()
    calls = []

    def fault(start, end):
        calls.append(1)
        raise RuntimeError("an illegal memory access was encountered")
    with broken.stage("interstitial", sync=GpuTimeline(fake)):
        pass
    broken_timeline = broken._marks[0][1]
    broken_timeline.seconds = fault
    for _ in range(2):
        with pytest.raises(RuntimeError, match="illegal memory access"):
            broken.as_dict()
    assert len(calls) == 2 and len(broken._marks) == 1
