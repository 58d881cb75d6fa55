"""hybridblas.workers (the library's one mechanism for background threads) and Context.close()."""
import threading
import time
import weakref

import numpy as np
import pytest

import hybridblas as hb
from hybridblas import cuda_transfer, workers


def _probe(fn, pause):
    """fn wrapped to sleep ``pause`` s inside; the second value holds the most calls seen inside at once."""
    inside, most = [0], [0]
    lock = threading.Lock()

    def call(x):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(pause)
        with lock:
            inside[0] -= 1
        return fn(x)
    return call, most


def test_map_keeps_the_order_and_runs_at_once():
    slow_square, most = _probe(lambda x: x * x, 0.02)
    assert workers.map(slow_square, range(12), 4) == [x * x for x in range(12)]
    assert 2 <= most[0] <= 4                  # parallel, never more than the threads asked for
    assert workers.map(slow_square, [], 4) == []
    assert workers.map(slow_square, [3], 4) == [9]
    assert workers.map(slow_square, range(3), 1) == [0, 1, 4]


def test_an_error_stops_the_map_and_the_earliest_is_raised():
    ran = []

    def maybe(x):
        ran.append(x)
        time.sleep(0.002)
        if x in (3, 7):
            raise ValueError(f"item {x}")
        return x
    with pytest.raises(ValueError, match="item 3"):
        workers.map(maybe, range(200), 3)
    assert 3 in ran and len(ran) < 200                  # no item starts after the error
    with pytest.raises(ValueError, match="item 3"):
        workers.map(maybe, range(10), 1)                # one thread: at once


def test_an_interrupt_in_the_caller_stops_the_map_once_the_running_items_end():
    caller = threading.get_ident()
    running, ended = [0], []
    lock = threading.Lock()

    def item(x):
        if threading.get_ident() == caller and x >= 4:
            raise KeyboardInterrupt
        with lock:
            running[0] += 1
        time.sleep(0.01)
        ended.append(x)
        return x
    with pytest.raises(KeyboardInterrupt):
        workers.map(item, range(400), 4)
    count = len(ended)
    time.sleep(0.05)
    assert len(ended) == count == running[0] and count < 400    # nothing ran on after map returned


def test_map_reports_progress_one_call_at_a_time():
    seen = []
    workers.map(lambda x: x, range(20), 4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, 20) for i in range(1, 21)]
    seen.clear()
    workers.map(lambda x: x, range(3), 1, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_start_returns_a_job_with_its_result_or_error():
    job = workers.start(lambda a, b: a + b, 2, 3)
    assert job.result() == 5 and job.done() and not job.is_alive() and job.wait(1) and job.join(1)

    def fails():
        raise RuntimeError("job failed")
    bad = workers.start(fails)
    with pytest.raises(RuntimeError, match="job failed"):
        bad.result()
    assert workers.start(lambda: 1).result() == 1        # the worker survived the error


def test_short_switches_shortens_the_interval_while_any_block_runs_and_puts_it_back():
    import sys
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        with workers.short_switches(None):
            assert sys.getswitchinterval() == pytest.approx(0.004, rel=0.01)
        first = threading.Event()
        inner_done = threading.Event()
        seen = {}

        def other():
            with workers.short_switches(5e-4):              # overlaps the caller's block, ends first
                first.wait(5)
                seen["inside"] = sys.getswitchinterval()
            inner_done.set()
        with workers.short_switches(2e-4):
            assert sys.getswitchinterval() == pytest.approx(2e-4, rel=0.01)
            job = workers.start(other)
            first.set()
            inner_done.wait(5)
            assert sys.getswitchinterval() == pytest.approx(2e-4, rel=0.01)   # the longer request never lengthens it
            job.result()
        assert seen["inside"] == pytest.approx(2e-4, rel=0.01)
        assert sys.getswitchinterval() == pytest.approx(0.004, rel=0.01)       # put back by the last block to end
        with pytest.raises(RuntimeError, match="inside"):
            with workers.short_switches(1e-3):
                raise RuntimeError("inside")
        assert sys.getswitchinterval() == pytest.approx(0.004, rel=0.01)       # also after an error
        with workers.short_switches(0.01):                           # longer than now: left as it is
            assert sys.getswitchinterval() == pytest.approx(0.004, rel=0.01)
        for bad in (0, -1e-3, 2.0, True, "1e-3"):
            with pytest.raises(ValueError, match="seconds must be None or in"):
                with workers.short_switches(bad):
                    pass
        assert sys.getswitchinterval() == pytest.approx(0.004, rel=0.01)
    finally:
        sys.setswitchinterval(before)


def test_threads_are_reused_and_arguments_not_kept():
    workers.start(lambda: None).wait()
    before = {t.ident for t in threading.enumerate() if t.name.startswith("hybridblas-")}
    for _ in range(20):
        workers.start(lambda: None).wait()
        time.sleep(0.001)
    after = {t.ident for t in threading.enumerate() if t.name.startswith("hybridblas-")}
    assert len(after - before) <= 1                     # no new thread per job
    assert workers.idle_threads() >= 1

    class Owner:
        pass
    owner = Owner()
    gone = weakref.ref(owner)
    workers.start(lambda o: None, owner).wait()
    del owner
    assert gone() is None                               # the idle worker holds no finished job's arguments


def test_a_closed_context_refuses_calls_and_the_with_form_closes(rng):
    a = rng.standard_normal((40, 7))
    with hb.Context("cpu", profile=False) as ctx:
        c = hb.syrk(1.0, a, context=ctx)
        np.testing.assert_allclose(np.tril(c), np.tril(a @ a.T), rtol=1e-12, atol=1e-12)
    assert ctx.closed
    with pytest.raises(ValueError, match=r"context: Context\(devices=\['cpu'\].* is closed"):
        hb.syrk(1.0, a, context=ctx)
    c = np.ones((40, 40))
    for alpha, k in ((0.0, 7), (1.0, 0)):               # calls that read no operand are refused too, C untouched
        with pytest.raises(ValueError, match="is closed"):
            hb.syrk(alpha, a[:, :k], 2.0, c, context=ctx)
    np.testing.assert_array_equal(c, 1.0)
    ctx.close()                                          # twice: harmless
    other = hb.Context("cpu", profile=False)
    np.testing.assert_allclose(np.tril(hb.syrk(1.0, a, context=other)), np.tril(a @ a.T), rtol=1e-12, atol=1e-12)


def test_a_closed_default_context_is_made_again(monkeypatch):
    from hybridblas import context
    monkeypatch.setattr(context, "_default", None)
    first = hb.default_context()
    first.close()
    second = hb.default_context()
    assert second is not first and not second.closed


def test_ring_pool_clear_drops_idle_rings_and_keeps_lent_ones(monkeypatch):
    made = []

    class FakeRing:
        def __init__(self, slot_bytes, slots):
            made.append(self)
    monkeypatch.setattr(cuda_transfer, "PinnedRing", FakeRing)
    pool = cuda_transfer.RingPool(1 << 10, 2, 3)
    lent, idle = pool.take(), pool.take()
    pool.give(idle)
    assert pool.made == 2
    pool.clear()
    assert pool.made == 1                                # the lent ring is still counted
    pool.give(lent)
    assert pool.take() is lent                           # given back after the clear: lent again
    assert pool.take() is not lent and pool.made == 2


def test_calls_holding_each_others_ring_get_rings_of_their_own_after_the_patience(monkeypatch):
    """Two GPUs with one ring each: a call holding GPU 0's ring waits for GPU 1's while another holds GPU 1's
    and waits for GPU 0's (tiled calls whose work is queued on both GPUs). After the pools' patience each gets
    a ring past the limit, both finish, and those rings are freed when given back; a take with a timeout still
    gives up instead."""
    made = []

    class FakeRing:
        def __init__(self, slot_bytes, slots):
            made.append(self)
    monkeypatch.setattr(cuda_transfer, "PinnedRing", FakeRing)
    pools = [cuda_transfer.RingPool(1 << 10, 2, 1, patience=0.05) for _ in range(2)]
    held = [pools[0].take(), pools[1].take()]
    assert pools[0].take(timeout=0.01) is None                  # explicit timeout: no ring past the limit
    both_waiting = threading.Barrier(2)
    done = []

    def call(mine):
        both_waiting.wait()
        other = pools[1 - mine].take()                           # the ring the other call holds
        done.append(mine)
        pools[1 - mine].give(other)
        pools[mine].give(held[mine])
    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads) and sorted(done) == [0, 1]
    assert len(made) > 2                                        # a ring past the limit broke the wait
    assert [p.made for p in pools] == [1, 1]                    # the extra rings are gone, the kept ones idle
    assert [p.take(timeout=0) for p in pools] == held


def test_a_group_bounds_its_concurrency_and_keeps_the_order():
    group = workers.Group(3, name="test")

    def negate(x):
        if x == 5:
            raise KeyError("five")
        return -x
    slow, most = _probe(negate, 0.01)
    assert group.map(slow, [1, 2, 3, 4]) == [-1, -2, -3, -4]
    results = []
    callers = [threading.Thread(target=lambda: results.append(group.map(slow, range(6, 12)))) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert results == [[-x for x in range(6, 12)]] * 3
    assert most[0] == 3                       # three callers at once, never more than the group's threads
    with pytest.raises(KeyError, match="five"):
        group.map(slow, range(8))
    group.close()
