"""The cores this process may use and one process-wide BLAS thread limit (public: ``hybridblas.blas_threads``).

    with hb.blas_threads.limit(1):
        hb.workers.map(work, items, hb.blas_threads.available_cores())   # one BLAS thread per worker

threadpoolctl's limits are process-wide and not thread-safe, so concurrent hybrid calls (and callers of
``limit``) share one limit: the first caller sets it, the last one out restores the original. Callers asking
for a different limit while one is active run under the active one (correct, possibly slower) rather than
fighting over it.
"""
import contextlib
import os
import threading
from numbers import Integral

__all__ = ["available_cores", "limit", "current", "blas_info"]

_lock = threading.Lock()
_depth = 0
_limiter = None
_controller = None


def available_cores():
    """The cores this process may run on (its CPU affinity, e.g. under taskset or an MPI binding)."""
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
    """Run the block with every loaded BLAS library limited to ``threads`` threads (a positive int; None: leave
    as is); the original limits come back when the last block still open ends. TypeError / ValueError for
    another ``threads``, before anything changes."""
    global _depth, _limiter
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, Integral):
            raise TypeError(f"threads must be a positive integer or None, got {type(threads).__name__} {threads!r}")
        if threads < 1:
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        threads = int(threads)                  # threadpoolctl takes Python ints only
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
