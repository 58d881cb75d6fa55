"""One process-wide BLAS thread limit around a whole hybrid call.

threadpoolctl's limits are process-wide and not thread-safe, so concurrent hybrid calls share one limit:
the first caller sets it, the last one out restores the original. Callers asking for a different limit
while one is active run under the active one (correct, possibly slower) rather than fighting over it.
"""
import contextlib
import os
import threading

_lock = threading.Lock()
_depth = 0
_limiter = None
_controller = None


def available_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _blas_controllers():
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        _controller = ThreadpoolController()
    return _controller.select(user_api="blas")


def current():
    """The thread count the loaded BLAS libraries use now (the smallest, if they differ)."""
    counts = [lc.num_threads for lc in _blas_controllers().lib_controllers]
    return min(counts) if counts else available_cores()


def blas_info():
    """threadpoolctl's description of the loaded BLAS libraries (for `hybridblas-tune info`)."""
    return _blas_controllers().info()


@contextlib.contextmanager
def limit(threads):
    """Run the block with every loaded BLAS library limited to ``threads`` threads (None: leave as is)."""
    global _depth, _limiter
    with _lock:
        if _depth == 0 and threads is not None:
            ctl = _blas_controllers()
            current = [lc.num_threads for lc in ctl.lib_controllers]
            if any(t != threads for t in current):
                _limiter = ctl.limit(limits=threads)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None
