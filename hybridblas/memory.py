"""Memory the devices of this node have, and a check that refuses a job that cannot fit, before it starts.

    hb.memory.require(nbytes, where="host", what="H (2.1e9 nonzeros)", advice="use --dtype float32")

raises ``InsufficientMemory`` (a MemoryError) with the estimate, the limit and the advice when the bytes
exceed what the place has: the host's available memory (from the OS) or a GPU's free memory.
"""
import math
import numbers
import os

__all__ = ["InsufficientMemory", "host_available", "host_total", "gpu_free", "gpu_total", "require",
           "format_bytes", "page_lock"]


class InsufficientMemory(MemoryError):
    """A job refused before it started: its estimated memory exceeds what the chosen devices have."""

    def __init__(self, message, need=None, limit=None, where=None):
        super().__init__(message)
        self.need, self.limit, self.where = need, limit, where


def format_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _meminfo(key):
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_limit():
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def host_total():
    """Bytes of host memory this process may use (the smaller of RAM and a cgroup limit)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = _meminfo("MemTotal") or (64 << 30)
    limit = _cgroup_limit()
    return min(total, limit) if limit else total


def host_available():
    """Bytes of host memory available for new allocations now (MemAvailable, within a cgroup limit)."""
    avail = _meminfo("MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = host_total()
    return min(avail, host_total())


def gpu_free(index):
    """Free bytes on GPU ``index`` (what the driver reports plus CuPy's pool's idle blocks there)."""
    import cupy
    with cupy.cuda.Device(index):
        free, _total = cupy.cuda.runtime.memGetInfo()
        return free + cupy.get_default_memory_pool().free_bytes()


def gpu_total(index):
    import cupy
    with cupy.cuda.Device(index):
        return cupy.cuda.runtime.memGetInfo()[1]


def page_lock(arr):
    """Page-lock the memory of the numpy array ``arr`` (its owner's whole buffer) now, as hybridblas locks host
    operands it meets twice: GPUs then read and write it by DMA. The lock stays while the memory lives, under
    hybridblas's cap on locked memory ($HYBRIDBLAS_PIN_MAX_GB), and is shared with the calls that meet it.
    Returns True when the memory is locked, False when it is not (no CUDA runtime, a view of memory numpy does
    not own, an array under 256 MiB, the cap reached, $HYBRIDBLAS_PIN_HOST=off). TypeError for anything but a numpy
    array."""
    import numpy as np
    from . import host_pinning
    from .context import _pin_policy
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"arr must be a numpy array, got {type(arr).__name__} {arr!r:.60}")
    if _pin_policy(None) is False:
        return False
    pin = host_pinning.acquire(arr, after_uses=0)
    if pin is None:
        return False
    try:
        pin.done.wait()
        return host_pinning.is_ready(pin)
    finally:
        host_pinning.release(pin)


def require(nbytes, *, where="host", what="this job", advice="", fraction=0.9):
    """Raise InsufficientMemory when ``nbytes`` exceed ``fraction`` of what ``where`` has free.

    ``where``: "host", or an int GPU id. ``what`` names the estimate in the message, ``advice`` says
    what to change. Returns the limit it compared against.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes must be a number of bytes >= 0, got {nbytes!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    if where != "host" and (isinstance(where, bool) or not isinstance(where, numbers.Integral) or where < 0):
        raise ValueError(f"where must be 'host' or a GPU id (an integer >= 0), got {where!r}")
    if where == "host":
        limit, place = int(fraction * host_available()), "available host memory"
    else:
        limit, place = int(fraction * gpu_free(int(where))), f"free memory of GPU {int(where)}"
    if nbytes > limit:
        hint = f"; {advice}" if advice else ""
        raise InsufficientMemory(f"{what} needs about {format_bytes(nbytes)}, more than the "
                                 f"{format_bytes(limit)} of {place}{hint}", need=nbytes, limit=limit, where=where)
    return limit
