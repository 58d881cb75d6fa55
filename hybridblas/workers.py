"""Long-lived worker threads for hybridblas's background jobs, and a parallel map over them.

Starting and joining a thread costs about 0.1-1 ms (1 ms each on a small VM), more than a small call's
work: a 28503 x 24 Gram split over two CPU workers saves 5.2 - 1.8 ms, which two thread starts per call
took back. Every background job of the library therefore runs here: the devices' workers of a call, a
GPU's host write-back, page-locking registrations, kernel compiles, the NCCL set-up, and the consumers'
row-parallel steps (``map``). A job takes an idle thread or starts one; a thread that has finished its
job waits for the next one, so calls from several caller threads never share a thread at the same time.

``start(fn, *args)`` runs one job and returns a ``Job``, whose ``wait()`` (or ``join()``) returns once it
has finished (its errors are kept for its ``result()``, which raises them). ``map(fn, items, threads)``
runs ``fn`` over ``items`` on up to ``threads`` threads, the caller's own thread among them, and returns
the results in order; after an exception (or an interrupt in the caller) no further item starts, and once
the running ones have ended the exception of the earliest item is raised. A ``Group`` is a fixed number
of threads that share one queue, for work whose concurrency must be bounded across all callers at once
(the host copies of every GPU of a node: more threads only add contention there); its ``map`` hands every
item to the group and waits.

``with short_switches(seconds):`` shortens Python's thread switch interval (``sys.setswitchinterval``) while
the block runs, for work whose threads each queue GPU work between short waits: a thread back from a call
that let the GIL go waits for the thread holding it to let it go in turn, by default up to 5 ms. The
interval is a setting of the whole process: it is set by the first of the blocks running at once, to the
shorter of ``seconds`` and what it was, and put back by the last of them to end (a change made meanwhile
by other code is then undone).

A job runs with its submitter's current CUDA device, where the submitter has a CUDA context current: a
``with cupy.cuda.Device(d)`` inside the job then returns the worker to that device, not to the runtime's
default device 0, whose context (half a GiB, and in exclusive-process mode a GPU another process holds)
a run on other GPUs must never make.
"""
import contextlib
import queue
import sys
import threading

import numpy as np

__all__ = ["Job", "Group", "start", "map", "idle_threads", "short_switches"]

_idle = queue.SimpleQueue()
_count_lock = threading.Lock()
_count = 0
_switch_lock = threading.Lock()
_switch_users = 0           # short_switches blocks running
_switch_before = None       # the interval they found


class Job:
    """One job handed to a worker: ``wait``/``join`` until it has finished, ``done()`` without waiting,
    ``result()`` its return value (or its exception, raised)."""
    __slots__ = ("_event", "_result", "_error")

    def __init__(self):
        self._event = threading.Event()
        self._result = self._error = None

    def result(self):
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._result

    def wait(self, timeout=None):
        """True once the job has finished (False when ``timeout`` seconds passed first)."""
        return self._event.wait(timeout)

    join = wait

    def done(self):
        return self._event.is_set()

    def is_alive(self):
        return not self._event.is_set()


class _Worker:
    def __init__(self, name):
        global _count
        self.jobs = queue.SimpleQueue()
        with _count_lock:
            _count += 1
            number = _count
        threading.Thread(target=self._loop, name=f"hybridblas-{name}-{number}", daemon=True).start()

    def _loop(self):
        while True:
            fn, args, done, device = self.jobs.get()
            try:
                _use(device)
                done._result = fn(*args)
            except BaseException as exc:      # kept for result(); nothing may kill the worker
                done._error = exc
            finally:
                fn = args = None      # a finished job's arguments must not live on until the next job
                _idle.put(self)
                done._event.set()


def start(fn, *args, name="worker"):
    """Run ``fn(*args)`` on an idle worker (or a new one named ``name``); returns its ``Job``."""
    try:
        worker = _idle.get_nowait()
    except queue.Empty:
        worker = _Worker(name)
    done = Job()
    worker.jobs.put((fn, args, done, current_device()))
    return done


def current_device():
    """The calling thread's current CUDA device when CuPy is loaded and a CUDA context is current on the thread,
    else None (no CUDA state to hand on: the thread has not used a GPU)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        if not cupy.cuda.driver.ctxGetCurrent():
            return None
        return cupy.cuda.runtime.getDevice()
    except Exception:         # a stand-in or a CuPy without a driver: nothing to hand on
        return None


def _use(device):
    """Make ``device`` (from current_device; None: leave it) current on this worker thread."""
    if device is not None:
        runtime = sys.modules["cupy"].cuda.runtime
        if runtime.getDevice() != device:
            runtime.setDevice(device)


@contextlib.contextmanager
def short_switches(seconds):
    """Python's thread switch interval at most ``seconds`` while the block runs (None: left as it is); see the
    module's docstring."""
    global _switch_users, _switch_before
    if seconds is None:
        yield
        return
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 1:
        raise ValueError(f"seconds must be None or in (0, 1], got {seconds!r}")
    with _switch_lock:
        if _switch_users == 0:
            _switch_before = sys.getswitchinterval()
        _switch_users += 1
        sys.setswitchinterval(min(seconds, _switch_before, sys.getswitchinterval()))
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_before)


def map(fn, items, threads, progress=None):    # noqa: A001  (the name says what it does, like the builtin)
    """[fn(x) for x in items] on up to ``threads`` threads (the caller's one of them), in order.
    ``progress(done, total)``, if given, is called (one call at a time) as items finish. An exception stops
    the handing out of items; the earliest item's exception is raised once the running items have ended."""
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        results = []
        for x in items:
            results.append(fn(x))
            if progress:
                progress(len(results), len(items))
        return results
    results = [None] * len(items)
    errors = []
    next_item = iter(range(len(items)))
    lock = threading.Lock()
    finished = [0]
    stop = threading.Event()

    def drain():
        while not stop.is_set():
            with lock:
                i = next(next_item, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
                if progress:
                    with lock:
                        finished[0] += 1
                        progress(finished[0], len(items))
            except BaseException as exc:     # also an interrupt or SystemExit on a worker: raised by the caller
                errors.append((i, exc))
                stop.set()
                return

    jobs = [start(drain, name="map") for _ in range(min(threads, len(items)) - 1)]
    try:
        drain()
    except BaseException:     # an interrupt in the caller: no item starts any more, the running ones end
        stop.set()
        for job in jobs:
            job.wait()
        raise
    for job in jobs:
        job.wait()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return results


class Group:
    """``threads`` long-lived threads sharing one job queue (named ``name``); ``close`` ends them."""

    def __init__(self, threads, name="group"):
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        self.threads = int(threads)
        self._closed = False
        self._jobs = queue.SimpleQueue()
        for i in range(self.threads):
            threading.Thread(target=self._loop, name=f"hybridblas-{name}-{i}", daemon=True).start()

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, x, done, slot, out, device = job
            try:
                _use(device)
                out[slot] = (True, fn(x))
            except BaseException as exc:
                out[slot] = (False, exc)
            finally:
                job = fn = x = None
                done.release()

    def map(self, fn, items):
        """[fn(x) for x in items] on the group's threads, in order; the first exception raised after all ran."""
        if self._closed:
            raise ValueError("this Group is closed: its threads have ended")
        items = list(items)
        out = [None] * len(items)
        done = threading.Semaphore(0)
        device = current_device()
        for i, x in enumerate(items):
            self._jobs.put((fn, x, done, i, out, device))
        waited = 0
        try:
            for _ in items:
                done.acquire()
                waited += 1
        except BaseException:          # an interrupt: the queued jobs still write into the caller's buffers
            for _ in range(len(items) - waited):
                done.acquire()
            raise
        for ok, value in out:
            if not ok:
                raise value
        return [value for _, value in out]

    def close(self):
        """End the threads once the queued jobs have run (a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        for _ in range(self.threads):
            self._jobs.put(None)


def idle_threads():
    """How many workers wait for a job now (tests and diagnostics)."""
    return _idle.qsize()
