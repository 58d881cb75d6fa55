"""Several k-points side by side, one per worker (a GPU), in one process.

When one k-point's BLAS calls are too small to split well over several GPUs (N_G below ~16k: each GPU
gets tiles too small to run at its rate, and every call waits for the slowest), whole k-points go to the
GPUs instead: worker i builds k-points i, i + W, i + 2W, ... in order on a thread of its own, with its own
single-GPU hybridblas Context and its own device arrays. Results come back in k-point order.

A job's host-only preparation (a k-point's G+k basis: 1.3 ms of numpy at NaCl Kmax 3.0, 2-3 ms beside the
other GPU's worker, of a 25 ms k-point) runs one job ahead on a thread of its own (``ahead``), while the
worker queues the job before it on its GPU.
"""
import threading

from hybridblas import workers as background

__all__ = ["assign", "side_by_side", "ahead", "SPLIT_BELOW"]

SPLIT_BELOW = 16384       # N_G below which k-points go side by side rather than every call over every GPU


def assign(n_jobs, n_workers):
    """[jobs of worker 0, jobs of worker 1, ...]: job j goes to worker j mod n_workers (round robin, as
    k-points go to MPI ranks: k-points have near-equal N_G)."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers!r}")
    return [list(range(w, n_jobs, n_workers)) for w in range(n_workers)]


def ahead(items, prepare):
    """(item, prepare(item)) for each item in order, each item's prepare running on a background thread while
    the caller works on the item before it. The next preparation starts once the one the caller waits for is
    done, so that the first item's does not share the host with the second's (two workers' first and second G+k
    bases at once took 5 ms before either worker could queue its first k-point, against 1.5 ms alone). An error
    of prepare(item) is raised when that item is reached; a caller that stops early waits for the preparation
    under way."""
    items = list(items)
    if not items:
        return
    job = background.start(prepare, items[0], name="flapw-ahead")
    try:
        for i, item in enumerate(items):
            current, job = job, None
            value = current.result()           # its error: raised here, with no next preparation started
            if i + 1 < len(items):
                job = background.start(prepare, items[i + 1], name="flapw-ahead")
            yield item, value
    finally:
        if job is not None:
            job.wait()


def side_by_side(jobs, workers, run, start=None, started=None, prepare=None, finish=None, cleanup=None):
    """[run(state, job) for job in jobs], job j on workers[j mod W], each worker's jobs in order on a thread
    of its own. ``start(worker)`` runs first on that thread (e.g. make its GPU current, warm it up) and
    returns the state run gets (default: the worker itself); ``started()`` is called in the caller's thread
    once every worker has started, before any job runs (e.g. to start a clock). With ``prepare``, each job's
    prepare(job) runs one job ahead of its worker (``ahead``) and run is called as run(state, job, prepared).
    ``finish(state)`` runs on the worker's thread after its last job, before the call returns (e.g. to wait
    for the work its jobs left queued on its GPU); its error counts as the worker's last job's. When a worker stops
    early (its own error or another worker's), ``cleanup(state)`` runs on its thread instead (e.g. to wait for that
    work); it must not raise. The first error stops every worker before its next job; the error of the lowest job
    that failed is raised once all threads end."""
    jobs = list(jobs)
    results, errors = {}, {}
    failed = threading.Event()
    plan = assign(len(jobs), len(workers))
    ready = threading.Barrier(sum(1 for mine in plan if mine) + 1)
    go = threading.Event()                     # set by the caller once started() has run

    def work(w, mine):
        state, begun = None, False
        try:
            state = start(workers[w]) if start is not None else workers[w]
            begun = True
        except BaseException as exc:           # handed to the caller's thread below
            errors[mine[0]] = exc
            failed.set()
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            failed.set()
        go.wait()
        order = ahead(mine, lambda j: prepare(jobs[j])) if prepare is not None else None
        complete = False
        try:
            for j in mine:
                if failed.is_set():
                    return
                try:
                    if order is None:
                        results[j] = run(state, jobs[j])
                    else:
                        results[j] = run(state, jobs[j], next(order)[1])
                except BaseException as exc:
                    errors[j] = exc
                    failed.set()
                    return
            complete = True
            if finish is not None and mine:
                try:
                    finish(state)
                except BaseException as exc:
                    errors[mine[-1]] = exc
                    failed.set()
        finally:
            if not complete and begun and cleanup is not None:
                cleanup(state)
            if order is not None:
                order.close()
    threads = [background.start(work, w, mine, name="flapw-kpoints") for w, mine in enumerate(plan) if mine]
    try:
        ready.wait()
        if started is not None and not failed.is_set():
            started()
        go.set()
        for t in threads:
            t.join()
    except BaseException:                      # Ctrl-C in the caller: the workers stop after their k-point
        failed.set()
        ready.abort()
        go.set()
        raise
    if errors:
        raise errors[min(errors)]
    return [results[j] for j in range(len(jobs))]
