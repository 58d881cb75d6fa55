"""Run a planned call's tasks on its devices: one coordinator, one worker per device, faults survived.

The coordinator (the caller's thread) owns all bookkeeping; each device's worker (a pooled runner thread,
or the caller's own thread in sync mode) only computes. Tasks reach a worker through a bounded inbox:
with the static strategy from that device's own queue, with the dynamic one from the shared queue, a
task going to a device only if it would finish it before the others could finish everything pending.

A device that raises (a CUDA error, out of memory it could not work around, an injected fault) is left
out: its unfinished tiles are re-run on the devices that remain, a ``DeviceFailureWarning`` names it and
the error, and the Context keeps it out of later calls until ``Context.reset_failed()``. A tile whose
write into C had begun when the fault struck cannot be re-run when C is read (beta != 0): the call then
raises ``DeviceFailure`` at once. With no device left, ``DeviceFailure`` too. Either way C is partly
updated: each tile of C holds either its new value or its old one, except tiles the error names as torn.

An interrupt (KeyboardInterrupt in the caller) stops the feeding; each device finishes the tile it is on
(and, on a GPU, the tiles already queued) and the interrupt is re-raised: C is then partly updated the
same way, with no torn tiles.
"""
import collections
import queue
import threading
import time
import warnings

from . import workers
from .faults import Cancelled, DeviceFailure, DeviceFailureWarning

_STOP = None
SHUTDOWN_POLL = 0.05     # s: how often a closing call looks for workers that ended without a word


class _Slot:
    """What the coordinator knows of one device in this call."""

    def __init__(self, device, rate, tasks=()):
        self.device = device
        self.rate = rate
        self.queue = collections.deque(tasks)     # static: this device's own tasks, not yet given
        self.given = {}                           # id(task) -> task: given, not reported done
        self.split_given = []                     # split-K tasks given (all redone if the device fails)
        self.queued_flops = 0.0
        self.done_flops = 0.0
        self.started = None
        self.failed = False
        self.inbox = None
        self.finished = None                      # threading.Event of its runner
        self.closed = False                       # its worker has closed its run
        self.stopped = False                      # _STOP sent to its worker

    @property
    def outstanding(self):
        return len(self.given)


class Engine:
    """One call's run. ``queues``: per-device task lists (static), or None with ``pending`` (dynamic).

    ``reserves`` are further devices of the Context that may take over when every device of the call
    has failed (a small call placed on one device, a CPU left out beside GPUs).
    """

    def __init__(self, problem, ctx, devices, rates, queues=None, pending=None, reserves=()):
        self.problem = problem
        self.ctx = ctx
        queues = queues if queues is not None else [[] for _ in devices]
        self.slots = [_Slot(d, r, q) for d, r, q in zip(devices, rates, queues)]
        self.shared = collections.deque(pending) if pending is not None else None
        self.pending_flops = sum(t.flops for t in self.shared) if self.shared else 0.0
        self.reserves = list(reserves)
        self.cancel = threading.Event()
        problem.run.cancel = self.cancel
        self.results = queue.Queue()
        self.partials = []
        self.errors = []

    # ------------------------------------------------------------------ choosing tasks
    def _live(self):
        return [i for i, s in enumerate(self.slots) if not s.failed]

    def _helps(self, i, task):
        """Dynamic rule: give ``task`` to device i only if it would finish it before the other devices
        could finish everything still pending without it (a slow CPU takes tiles early, none at the end)."""
        others = [j for j in self._live() if j != i]
        if not others:
            return True
        s = self.slots[i]
        mine = (s.queued_flops + task.flops) / s.rate
        rest = (self.pending_flops + sum(self.slots[j].queued_flops for j in others)) / \
            sum(self.slots[j].rate for j in others)
        return mine <= rest

    def _next_for(self, i):
        s = self.slots[i]
        if s.queue:
            return s.queue.popleft()
        if self.shared and self._helps(i, self.shared[0]):
            task = self.shared.popleft()
            self.pending_flops -= task.flops
            return task
        return None

    def _has_work(self):
        return bool(self.shared) or any(s.queue for s in self.slots if not s.failed)

    def _mark_given(self, i, task):
        s = self.slots[i]
        if s.started is None:
            s.started = time.perf_counter()
        s.given[id(task)] = task
        s.queued_flops += task.flops
        if task.split:
            s.split_given.append(task)

    def _mark_done(self, i, task):
        s = self.slots[i]
        if s.given.pop(id(task), None) is None:
            return
        s.queued_flops -= task.flops
        s.done_flops += task.flops
        elapsed = time.perf_counter() - s.started
        if self.shared is not None and elapsed > 0.05:     # dynamic: follow the measured throughput
            s.rate = s.done_flops / elapsed

    # ------------------------------------------------------------------ faults
    def _fail(self, i, exc, leftovers):
        """Device i raised: keep it out, put its unfinished work back, or raise DeviceFailure."""
        s = self.slots[i]
        s.failed = True
        self.errors.append((s.device.name, exc))
        self.ctx.mark_failed(s.device, exc)
        redo, torn = list(s.split_given), []       # its split-K partial sum is lost with it
        for task in s.given.values():
            if task.split:
                continue
            clean, broken = leftovers.get(id(task), ([task], []))
            redo += clean
            torn += broken
        redo += list(s.queue)
        s.queue.clear()
        s.given.clear()
        s.split_given = []
        s.queued_flops = 0.0
        if torn and self.problem.beta != 0:
            raise DeviceFailure(self.errors, torn=torn, message_tail=(
                f"{len(torn)} tile(s) of C were being written when {s.device.name} failed and C is read "
                f"(beta != 0), so they cannot be recomputed"))
        redo += torn                               # beta = 0: C is not read, rewriting a torn tile is exact
        live = self._live()
        if not live:
            live = self._bring_reserve()
        if not live:
            raise DeviceFailure(self.errors)
        warnings.warn(f"hybridblas: {s.device.name} failed ({type(exc).__name__}: {exc}); its "
                      f"{len(redo)} unfinished task(s) run on {', '.join(self.slots[j].device.name for j in live)}; "
                      f"it stays out of this Context until Context.reset_failed()",
                      DeviceFailureWarning, stacklevel=2)
        self._give_back(redo, live)

    def _bring_reserve(self):
        while self.reserves:
            device = self.reserves.pop(0)
            if self.ctx.is_failed(device):
                continue
            self.slots.append(_Slot(device, self.ctx.rate(device, self.problem)))
            return [len(self.slots) - 1]
        return []

    def _give_back(self, tasks, live):
        tasks = sorted(tasks, key=lambda t: -t.flops)
        if self.shared is not None:
            self.shared.extendleft(reversed(tasks))
            self.pending_flops += sum(t.flops for t in tasks)
            return
        finish = {j: (self.slots[j].queued_flops + sum(t.flops for t in self.slots[j].queue)) / self.slots[j].rate
                  for j in live}
        for t in tasks:          # earliest finish, decided now
            j = min(live, key=lambda d: finish[d] + t.flops / self.slots[d].rate)
            finish[j] += t.flops / self.slots[j].rate
            self.slots[j].queue.append(t)

    # ------------------------------------------------------------------ running
    def run(self, sync=False):
        if sync or len(self.slots) == 1:
            self._run_here()
        else:
            self._run_threads()
        return self.partials

    def _run_here(self):
        """Every task in the caller's thread, device after device (the sync mode, and one-device calls)."""
        if self.shared is not None:      # decide the dynamic order up front, by earliest finish
            tasks = list(self.shared)
            self.shared = None
            self._give_back(tasks, self._live())
        while self._has_work():
            for i in self._live():
                if self.slots[i].queue:
                    self._drive(i, _LocalInbox(self, i))

    def _run_threads(self):
        try:
            while True:          # a device failing while it closes can hand back work: run another round
                self._round()
                if not self._has_work():
                    break
        except BaseException:
            self.cancel.set()
            raise
        finally:
            self._shutdown()

    def _round(self):
        while True:
            self._feed()
            if not any(s.outstanding for s in self.slots if not s.failed):
                if not self._has_work():
                    break
                i = max(self._live(), key=lambda j: self.slots[j].rate)      # never stall
                self._give(i, self._take_any(i))
                continue
            kind, i, payload = self.results.get()
            self._handle(kind, i, payload)
        self._shutdown()

    def _take_any(self, i):
        s = self.slots[i]
        if s.queue:
            return s.queue.popleft()
        task = self.shared.popleft()
        self.pending_flops -= task.flops
        return task

    def _feed(self):
        order = sorted(self._live(), key=lambda j: -self.slots[j].rate)
        progress = True
        while progress and self._has_work():
            progress = False
            for i in order:
                s = self.slots[i]
                if s.failed or s.outstanding >= s.device.max_in_flight + 1:
                    continue
                task = self._next_for(i)
                if task is not None:
                    self._give(i, task)
                    progress = True

    def _give(self, i, task):
        s = self.slots[i]
        if s.inbox is None:
            s.inbox = queue.Queue()
            s.closed = s.stopped = False
            s.finished = workers.start(_work, self, i, s.device, s.inbox, name="device")
        self._mark_given(i, task)
        s.inbox.put(task)

    def _handle(self, kind, i, payload):
        if kind == "done":
            self._mark_done(i, payload)
        elif kind == "failed":
            exc, leftovers = payload
            self._fail(i, exc, leftovers)
        elif kind == "closed":
            self.slots[i].closed = True
            if payload is not None and not self.slots[i].failed:
                self.partials.append(payload)

    def _shutdown(self):
        """Stop every started worker, wait for each to close its run; keep partial sums of live ones.

        Called again after an interrupt cut a call short (even one taken between reading a message and
        handling it): each worker is stopped once, and a worker whose thread has ended counts as closed once
        the queue holds nothing more from it, so that no wait outlives the workers."""
        started = [i for i, s in enumerate(self.slots) if s.inbox is not None]
        for i in started:
            if not self.slots[i].stopped:
                self.slots[i].inbox.put(_STOP)
                self.slots[i].stopped = True
        first = None
        while not all(self.slots[i].closed for i in started):
            try:
                kind, i, payload = self.results.get(timeout=SHUTDOWN_POLL)
            except queue.Empty:
                for i in started:             # its last message went to a call that was interrupted
                    s = self.slots[i]
                    if not s.closed and s.finished.done() and self.results.empty():
                        s.closed = True
                        if not self.cancel.is_set():      # never a partial sum dropped without a word
                            first = first or RuntimeError(f"{s.device.name}: its worker ended without closing "
                                                          f"its run")
                continue
            try:
                self._handle(kind, i, payload)
            except BaseException as exc:      # a failure reported while stopping: raised after the join
                first = first or exc
        for i in started:
            self.slots[i].finished.wait()
            self.slots[i].inbox = None
        if first is not None and not self.cancel.is_set():
            raise first

    def _drive(self, i, inbox):
        """Run device i's queue in this thread, reporting through ``_handle`` as the threads do."""
        _work(self, i, self.slots[i].device, inbox)
        while not self.results.empty():
            kind, j, payload = self.results.get_nowait()
            self._handle(kind, j, payload)


class _LocalInbox:
    """The sync mode's inbox: hands out the device's queue, then stops."""

    def __init__(self, engine, i):
        self.engine, self.i = engine, i

    def get(self):
        s = self.engine.slots[self.i]
        if s.failed or not s.queue:
            return _STOP
        task = s.queue.popleft()
        self.engine._mark_given(self.i, task)
        return task

    def empty(self):
        s = self.engine.slots[self.i]
        return s.failed or not s.queue


def _work(engine, i, device, inbox):
    """A device worker: open a run, launch what arrives (keeping up to max_in_flight in flight), report
    each finished task; on an error report what is left of the unfinished ones; always close the run."""
    results, problem = engine.results, engine.problem
    run, inflight, current = None, collections.deque(), None
    try:
        run = device.open(problem)
        while True:
            if inflight and (len(inflight) >= device.max_in_flight or inbox.empty()):
                task, handle = inflight[0]
                run.wait(handle)
                inflight.popleft()
                results.put(("done", i, task))
                continue
            task = inbox.get()
            if task is _STOP:
                break
            if engine.cancel.is_set():
                continue
            current = task
            engine.ctx.fault_check(device)
            inflight.append((task, run.launch(task)))
            current = None
    except Cancelled:
        pass
    except Exception as exc:
        leftovers = _salvage(run, inflight, current, results, i)
        results.put(("failed", i, (exc, leftovers)))
        _close_quietly(run)
        results.put(("closed", i, None))
        if not isinstance(inbox, _LocalInbox):
            while inbox.get() is not _STOP:    # tasks sent before the coordinator heard: it re-plans them
                pass
        return
    except BaseException:                      # an interrupt in the caller's thread (sync mode)
        _close_quietly(run)
        raise
    try:
        partial = run.close() if run is not None else None
    except Exception as exc:       # the run's last tiles failed: the run knows what is left of them
        results.put(("failed", i, (exc, {id(t): run.remainder(t) for t, _ in inflight})))
        results.put(("closed", i, None))
        return
    results.put(("closed", i, partial))


def _salvage(run, inflight, current, results, i):
    """After an error: finish the launched tasks that still can be, and for the others ask the run what
    is left of them, {id(task): (clean tiles, torn tiles)}."""
    leftovers = {}
    if run is None:
        return leftovers
    for task, handle in inflight:
        try:
            run.wait(handle)
            results.put(("done", i, task))
        except Exception:
            leftovers[id(task)] = run.remainder(task)
    if current is not None:
        leftovers[id(current)] = run.remainder(current)
    return leftovers


def _close_quietly(run):
    if run is None:
        return
    try:
        run.close()
    except Exception:
        pass
