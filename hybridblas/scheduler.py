"""Run a planned call on the context's devices: static split, dynamic queues, or one thread (sync).

One coordinator (the caller's thread) owns all bookkeeping; each device has one worker thread that only
computes. Results and exceptions come back through one queue; an exception is re-raised in the caller
with the worker's traceback attached.
"""
import collections
import queue
import threading
import time

from . import blas_threads, plan
from .triangle import reduce_partials

_STOP = None


def execute(problem, ctx):
    devices = ctx.devices_for(problem)
    rates = [ctx.rate(d, problem) for d in devices]
    devices, rates = _without_idle_cpus(devices, rates, ctx.min_cpu_share(devices))
    devices, rates = _one_device_if_small(problem, devices, rates, ctx)
    problem.extra.setdefault("memory_limit", getattr(ctx, "memory_limit", None))
    problem.extra.setdefault("pin_host", getattr(ctx, "pin_host", False))
    if len(devices) == 1 and devices[0].kind == "cuda":
        from .devices import cuda_inline
        if cuda_inline.applies(problem, devices[0]):
            cuda_inline.run(problem, devices[0])
            return "inline"
    if problem.xp.__name__ == "cupy":
        problem.extra["caller_events"] = _caller_events(problem)
    strategy = ctx.resolve_strategy(devices)
    with blas_threads.limit(ctx.blas_threads(devices)):
        if strategy == "static":
            assignment = static_assignment(problem, devices, rates, ctx)
            partials = _run_static(problem, devices, assignment, ctx.sync)
        else:
            tasks = dynamic_tasks(problem, devices, ctx)
            partials = _run_dynamic(problem, devices, rates, tasks, ctx.sync)
    if partials:
        reduce_partials(problem, partials)
    return strategy


def _caller_events(problem):
    """An event on the caller's current stream of every GPU holding an operand: the device runs work on
    their own non-blocking streams, which must not start before the caller's queued work (e.g. the CuPy
    kernels that produced A, or the copies the normalisation made) has finished."""
    import cupy
    events = []
    for gpu in sorted({x.device.id for x in [problem.c] + [f.base for f in problem.factors]}):
        with cupy.cuda.Device(gpu):
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(cupy.cuda.get_current_stream())
            events.append(ev)
    return events


# ---------------------------------------------------------------- planning

def _without_idle_cpus(devices, rates, min_share):
    """Drop the CPU workers when beside accelerators their share of the rate is below ``min_share``:
    their tiles would arrive last, and their cores are better spent staging host data for the GPUs."""
    cpu = [i for i, d in enumerate(devices) if d.kind == "cpu"]
    if not cpu or len(cpu) == len(devices):
        return devices, rates
    if sum(rates[i] for i in cpu) >= min_share * sum(rates):
        return devices, rates
    keep = [i for i in range(len(devices)) if i not in cpu]
    return [devices[i] for i in keep], [rates[i] for i in keep]


TRANSFER_RATE = 25e9     # bytes/s to move operands to a device that does not hold them (pinned staging)
REMOTE_LATENCY = 1e-4    # s: streams, staging and the copy back on a device that does not hold the data


def _one_device_if_small(problem, devices, rates, ctx):
    """Calls too short to share run on one device: the one that finishes first once the operands'
    trip to a device that does not hold them is counted (tiny Gram matrices stay where their data is)."""
    if len(devices) == 1 or ctx.block_size or ctx.min_call_seconds <= 0:
        return devices, rates
    flops = problem.flops()
    if flops / max(rates) >= ctx.min_call_seconds:
        return devices, rates
    if problem.xp.__name__ == "numpy":
        home = {i for i, d in enumerate(devices) if d.kind == "cpu"}
    else:
        home = {i for i, d in enumerate(devices) if d.name == f"cuda:{problem.c.device.id}"}
    moved = problem.c.nbytes + sum({id(f.base): f.base.nbytes for f in problem.factors}.values())
    cost = [flops / r + (0.0 if i in home else REMOTE_LATENCY + moved / TRANSFER_RATE) for i, r in enumerate(rates)]
    i = min(range(len(devices)), key=cost.__getitem__)
    return [devices[i]], [rates[i]]


def static_assignment(problem, devices, rates, ctx):
    """Tasks per device: contiguous bands (or k ranges) whose flops follow the devices' rates."""
    nb = ctx.block_size
    if len(devices) == 1:
        tasks = [plan.whole(problem)]
        return [_retile(problem, tasks, nb)]
    if plan.wants_split_k(problem, len(devices)):
        bounds = plan.band_edges(problem.k, rates, triangular=False)
        out = []
        for k0, k1 in zip(bounds, bounds[1:]):
            t = plan.whole(problem)
            out.append([plan.Task(t.i0, t.i1, t.j0, t.j1, k0, k1,
                                  problem.tile_flops(t.i1, t.j1, k1 - k0, diag=t.diag), t.diag, True)]
                       if k1 > k0 else [])
        return out
    # GPUs take the leading bands (they need the fewest panels of the factors), the CPU the last one.
    order = sorted(range(len(devices)), key=lambda i: devices[i].kind == "cpu")
    size = problem.n
    edges = plan.band_edges(size, [rates[i] for i in order], problem.triangular)
    out = [[] for _ in devices]
    for pos, i in enumerate(order):
        out[i] = _retile(problem, plan.band(problem, edges[pos], edges[pos + 1]), nb)
    return out


def _retile(problem, tasks, nb):
    """Cut tasks into nb-sized tiles when the caller asked for a block size."""
    if not nb:
        return tasks
    out = []
    for t in tasks:
        for i0 in range(t.i0, t.i1, nb):
            for j0 in range(t.j0, t.j1, nb):
                i1, j1 = min(i0 + nb, t.i1), min(j0 + nb, t.j1)
                diag = t.diag and i0 == j0
                if t.diag and not diag and (i0 < j0 if problem.lower else i0 > j0):
                    continue
                out.append(plan.make_task(problem, i0, i1, j0, j1, t.k0, t.k1, diag=diag, split=t.split))
    return out


def dynamic_tasks(problem, devices, ctx):
    if plan.wants_split_k(problem, len(devices)):
        pieces = -(-problem.k // ctx.block_size) if ctx.block_size else 4 * len(devices)
        return plan.k_chunks(problem, max(1, pieces))
    nb = ctx.block_size_for(problem, devices) or min(d.preferred_block(problem) for d in devices)
    return plan.dynamic_order(problem, plan.tiles(problem, nb), ctx.tail_fraction)


# ---------------------------------------------------------------- running

def _run_inline(problem, device, tasks):
    run = device.open(problem)
    inflight = collections.deque()     # a GPU queues the next task while the last one still runs
    try:
        for t in tasks:
            if len(inflight) >= device.max_in_flight:
                run.wait(inflight.popleft())
            inflight.append(run.launch(t))
        while inflight:
            run.wait(inflight.popleft())
    finally:
        partial = run.close()
    return partial


def _run_static(problem, devices, assignment, sync):
    busy = [(d, tasks) for d, tasks in zip(devices, assignment) if tasks]
    if sync or len(busy) == 1:
        partials = [_run_inline(problem, d, tasks) for d, tasks in busy]
        return [p for p in partials if p is not None]
    pool = _WorkerPool(problem, [d for d, _ in busy])
    try:
        for w, (_, tasks) in enumerate(busy):
            for t in tasks:
                pool.submit(w, t)
        pool.drain()
    finally:
        partials = pool.shutdown()
    return partials


def _run_dynamic(problem, devices, rates, tasks, sync):
    if sync or len(devices) == 1:
        assignment = [[] for _ in devices]
        finish = [0.0] * len(devices)
        for t in tasks:   # the same earliest-finish rule, decided up front
            i = min(range(len(devices)), key=lambda d: finish[d] + t.flops / rates[d])
            finish[i] += t.flops / rates[i]
            assignment[i].append(t)
        return _run_static(problem, devices, assignment, sync=True)
    return _Coordinator(problem, devices, rates, tasks).run()


class _Runner:
    """A long-lived thread that runs one device worker at a time, then waits for the next: starting and
    joining a thread per device on every call cost 1 ms each on a small VM, more than a 28503 x 24 Gram
    split over two CPU workers saves (5.2 ms against 1.8 ms on one). Runners are not tied to a device:
    a call takes idle ones (or starts new ones), so calls from several caller threads never share one."""

    _idle = queue.SimpleQueue()

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="hybridblas-worker", daemon=True).start()

    @classmethod
    def take(cls):
        try:
            return cls._idle.get_nowait()
        except queue.Empty:
            return cls()

    def start(self, fn, *args):
        """Run fn(*args) on this runner; returns an event set when it has finished."""
        done = threading.Event()
        self.jobs.put((fn, args, done))
        return done

    def _loop(self):
        while True:
            fn, args, done = self.jobs.get()
            try:
                fn(*args)
            except BaseException:      # _worker reports its own errors; nothing may kill the runner
                pass
            finally:
                _Runner._idle.put(self)
                done.set()


class _WorkerPool:
    """One worker per device (on pooled runner threads); each pulls from its own queue and reports to one
    results queue."""

    def __init__(self, problem, devices):
        self.devices = devices
        self.results = queue.Queue()
        self.inboxes = [queue.Queue() for _ in devices]
        self.outstanding = [0] * len(devices)
        self.error = None
        self.finished = [_Runner.take().start(_worker, problem, d, i, self.inboxes[i], self.results)
                         for i, d in enumerate(devices)]

    def submit(self, w, task):
        self.outstanding[w] += 1
        self.inboxes[w].put(task)

    def next_event(self):
        """Block for one report; returns (kind, worker, payload) and re-raises nothing yet."""
        kind, w, payload = self.results.get()
        if kind == "done":
            self.outstanding[w] -= 1
        elif kind == "error" and self.error is None:
            self.error = payload
        return kind, w, payload

    def drain(self):
        while any(self.outstanding) and self.error is None:
            self.next_event()
        self._raise()

    def shutdown(self):
        """Stop every worker, collect their partial sums, join them; re-raise a worker's exception."""
        for box in self.inboxes:
            box.put(_STOP)
        partials, closed = [], 0
        while closed < len(self.finished):
            kind, w, payload = self.next_event()
            if kind == "closed":
                closed += 1
                if payload is not None:
                    partials.append(payload)
        for done in self.finished:
            done.wait()
        self._raise()
        return partials

    def _raise(self):
        if self.error is not None:
            err, self.error = self.error, None
            raise err


def _worker(problem, device, w, inbox, results):
    run, inflight = None, collections.deque()
    try:
        run = device.open(problem)
        while True:
            if inflight and (len(inflight) >= device.max_in_flight or inbox.empty()):
                task, handle = inflight.popleft()
                run.wait(handle)
                results.put(("done", w, task))
                continue
            task = inbox.get()
            if task is _STOP:
                break
            inflight.append((task, run.launch(task)))
    except BaseException as exc:   # reported, then this worker drains its inbox until told to stop
        results.put(("error", w, exc))
        while inbox.get() is not _STOP:
            pass
    partial = None
    try:
        partial = run.close() if run is not None else None
    except BaseException as exc:
        results.put(("error", w, exc))
    results.put(("closed", w, partial))


class _Coordinator:
    """Dynamic strategy: feed bounded per-device queues, biggest tasks first.

    A device is given the next task only if it would finish it before the other devices could finish
    everything still pending without it: so a slow CPU takes tiles early and none at the tail.
    Rates start from the profile and follow the measured throughput.
    """

    def __init__(self, problem, devices, rates, tasks):
        self.problem = problem
        self.devices = devices
        self.rates = list(rates)
        self.pending = collections.deque(tasks)
        self.pending_flops = sum(t.flops for t in tasks)
        self.depth = [d.max_in_flight + 1 for d in devices]
        self.queued_flops = [0.0] * len(devices)
        self.done_flops = [0.0] * len(devices)
        self.started = [None] * len(devices)

    def run(self):
        pool = _WorkerPool(self.problem, self.devices)
        try:
            while self.pending or any(pool.outstanding):
                self._feed(pool)
                if not any(pool.outstanding) and self.pending:
                    self._give(pool, self._fastest(), self.pending.popleft())   # never stall
                    continue
                kind, w, task = pool.next_event()
                if kind == "error":
                    break
                if kind == "done":
                    self._account(w, task)
        finally:
            partials = pool.shutdown()
        return partials

    def _fastest(self):
        return max(range(len(self.devices)), key=lambda i: self.rates[i])

    def _feed(self, pool):
        order = sorted(range(len(self.devices)), key=lambda i: -self.rates[i])
        progress = True
        while progress and self.pending:
            progress = False
            for i in order:
                if not self.pending:
                    break
                if pool.outstanding[i] < self.depth[i] and self._helps(i, self.pending[0]):
                    self._give(pool, i, self.pending.popleft())
                    progress = True

    def _helps(self, i, task):
        others = [j for j in range(len(self.devices)) if j != i]
        if not others:
            return True
        mine = (self.queued_flops[i] + task.flops) / self.rates[i]
        rest = (self.pending_flops + sum(self.queued_flops[j] for j in others)) / sum(self.rates[j] for j in others)
        return mine <= rest

    def _give(self, pool, i, task):
        if self.started[i] is None:
            self.started[i] = time.perf_counter()
        self.pending_flops -= task.flops
        self.queued_flops[i] += task.flops
        pool.submit(i, task)

    def _account(self, i, task):
        self.queued_flops[i] -= task.flops
        self.done_flops[i] += task.flops
        elapsed = time.perf_counter() - self.started[i]
        if elapsed > 0.05:       # trust measurements once they are long enough to mean something
            self.rates[i] = self.done_flops[i] / elapsed
