"""Work queued beside the current stream of a GPU: LOBPCG's small dense steps that need not wait for the sparse
product run on a stream of their own while it runs (cisolver.gpu_ortho: H P's update; cisolver.iterations:
S^T S). ``beside`` queues work after what the current stream has queued so far; later ``beside`` calls queue
after it, in order; ``join`` makes the current stream wait (on the GPU: the host does not) for all of it.
"""

ENABLED = True           # False: ``beside`` runs the work in line (benchmarks compare the two)
_streams = {}            # device id -> the side stream
_pending = {}            # device id -> (event at the end of the side work so far, arrays it reads)


def beside(work, keep=()):
    """Queue ``work()`` (it queues GPU work on the current stream, which is the side stream meanwhile) after
    everything the current stream has queued so far. ``keep``: arrays the work reads, held until ``join``:
    freed earlier, CuPy's memory pool could hand them to the current stream's next allocations while the
    side work still reads them."""
    if not ENABLED:
        work()
        return
    import cupy
    dev = cupy.cuda.Device().id
    if dev not in _streams:
        _streams[dev] = cupy.cuda.Stream(non_blocking=True)
    side = _streams[dev]
    ready = cupy.cuda.Event(disable_timing=True)
    ready.record(cupy.cuda.get_current_stream())
    side.wait_event(ready)
    with side:
        work()
    done = cupy.cuda.Event(disable_timing=True)
    done.record(side)
    kept = _pending.pop(dev, (None, []))[1]
    _pending[dev] = (done, kept + [keep])


def join():
    """The current stream waits for the side work of its device, if any: call it before anything reads or
    writes what that work writes."""
    if not _pending:
        return
    import cupy
    item = _pending.pop(cupy.cuda.Device().id, None)
    if item is not None:
        cupy.cuda.get_current_stream().wait_event(item[0])
