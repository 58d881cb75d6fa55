"""The host write-back of one call on one GPU: finished tiles of C go to the caller's host array on a worker
thread of their own, so the GPU's feeder never waits for a kernel to finish before it launches the next tile.

A tile is written only after its kernels have succeeded (its ``done_event``); it is marked ``touched`` as
its write begins (a failure after that leaves that tile of C torn, which the engine reports), and its
``written`` event is set when the write has ended, with ``error`` holding what went wrong, if anything.
A diagonal tile of a triangular call is written by its triangle only.
"""
import queue
import threading
import time

from .. import cuda_transfer, host_pinning, workers


class HostWriter:
    """Downloads tiles into ``problem.c`` (numpy) through a staging ring lent by the GPU for this call."""

    def __init__(self, device, problem, stream, stats):
        self.device, self.problem, self.stream, self.stats = device, problem, stream, stats
        self.pin = None                         # C's page-locking (host_pinning), once the run has asked for it
        self.ring = device.ring_pool("out").take()
        self.queue = queue.Queue()
        self.job = workers.start(self._loop, name="writer")

    def submit(self, rec):
        """Queue a tile record (its ``local`` GPU block and ``done_event``); sets ``rec.written`` when done."""
        rec.written = threading.Event()
        self.queue.put(rec)

    def stop(self):
        """Write what is queued, then give the ring back."""
        if self.job is not None:
            self.queue.put(None)
            self.job.wait()
            self.job = None
        self.device.ring_pool("out").give(self.ring)
        self.ring = None

    def _loop(self):
        import cupy
        p = self.problem
        with cupy.cuda.Device(self.device.index):
            while True:
                rec = self.queue.get()
                if rec is None:
                    return
                try:
                    t = rec.task
                    rec.done_event.synchronize()     # the tile's kernels succeeded: only now is C written
                    tri = ("lower" if p.lower else "upper") if t.diag else None
                    t0 = time.perf_counter()
                    rec.touched = True
                    cuda_transfer.download(p.c[t.i0:t.i1, t.j0:t.j1], rec.local, self.ring, self.stream, tri,
                                           direct=host_pinning.is_ready(self.pin))
                    self.stats["host_download_s"] += time.perf_counter() - t0
                    self.stats["bytes_to_host"] += rec.local.nbytes
                except BaseException as exc:   # handed to the feeder, which re-raises it
                    rec.error = exc
                finally:
                    rec.written.set()
