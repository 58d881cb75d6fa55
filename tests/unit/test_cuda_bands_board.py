"""cuda_bands._Board and _Call._harvest without a GPU: a piece's waiters pass once it is posted (every one of them,
with its event), not before, and a stopped call ends their wait; the writer reads the times of what has ended."""
import threading
import time

import pytest

from hybridblas.devices import cuda_bands


def test_every_waiter_of_a_piece_passes_once_it_is_posted(monkeypatch):
    monkeypatch.setattr(cuda_bands, "POLL", 0.01)
    board = cuda_bands._Board(3, threading.Event())
    got, threads = [], []
    for _ in range(4):
        threads.append(threading.Thread(target=lambda: got.append(board.wait(1))))
        threads[-1].start()
    time.sleep(0.05)
    assert got == []                                    # nothing posted yet: every waiter still waits
    board.post(1, "event-1")
    for t in threads:
        t.join(2.0)
    assert got == ["event-1"] * 4
    assert board.wait(1) == "event-1"                   # a later waiter passes at once
    board.post(0, "event-0")
    assert board.wait(0) == "event-0"


def test_a_stopped_call_ends_the_wait(monkeypatch):
    monkeypatch.setattr(cuda_bands, "POLL", 0.01)
    stop = threading.Event()
    board = cuda_bands._Board(2, stop)
    done = []

    def waiter():
        try:
            board.wait(0)
        except cuda_bands._Stop:
            done.append("stopped")
    t = threading.Thread(target=waiter)
    t.start()
    stop.set()
    t.join(2.0)
    assert done == ["stopped"]
    with pytest.raises(cuda_bands._Stop):
        board.wait(1)


class _Ev:
    def __init__(self, t, done):
        self.t, self.done = t, done


def test_the_writer_harvests_the_products_and_copies_that_have_ended():
    """_Call._harvest reads the times of the products and copies that have ended, in order, stopping at the first
    still running; ``everything`` takes the rest once the GPU is done."""
    from types import SimpleNamespace
    cp = SimpleNamespace(cuda=SimpleNamespace(get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3))
    call = SimpleNamespace(cp=cp)
    ends = [_Ev(1.0, True), _Ev(2.5, True), _Ev(3.0, False), _Ev(4.0, True)]
    gpu = SimpleNamespace(kernel_events=[(_Ev(0.0, True), ends[0], "x", 1.0, None),
                                         (_Ev(1.5, True), ends[1], "x", 1.0, None),
                                         (_Ev(2.5, True), ends[2], "x", 1.0, None),
                                         (_Ev(3.5, True), ends[3], "x", 1.0, None)],
                          copy_events=[(_Ev(1.0, True), _Ev(1.25, True), 0), (_Ev(2.5, True), _Ev(2.75, False), 1)],
                          times=[], copy_times=[])
    cuda_bands._Call._harvest(call, gpu)
    assert gpu.times == pytest.approx([1.0, 1.0]) and gpu.copy_times == pytest.approx([0.25])
    gpu.kernel_events.append((_Ev(4.0, True), _Ev(4.5, True), "x", 1.0, None))
    cuda_bands._Call._harvest(call, gpu)                # the third still runs: nothing after it is read either
    assert len(gpu.times) == 2
    cuda_bands._Call._harvest(call, gpu, everything=True)
    assert gpu.times == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.5]) and gpu.copy_times == pytest.approx([0.25, 0.25])
