"""Tools for testing code built on hybridblas: inject a device fault into a Context; see which GPUs a process
holds a CUDA context on.

    with hybridblas.testing.inject_fault(ctx, device_index=1, after_tiles=3) as fault:
        c = hb.herk(1.0, a, context=ctx)       # cuda:1 raises on its 4th tile; the others finish the call
    assert fault.fired
    ctx.reset_failed()                         # the failed device stays out until reset

The fault is raised in the device's worker just before it launches a tile (a task of the call's plan),
exactly as a CUDA error or an out-of-memory there would be: the call warns (DeviceFailureWarning), re-runs
that device's unfinished tiles on the others and leaves the device out of the Context. Tiles are counted
across every call made through the Context while the fault is armed; it fires once.
"""
import contextlib
import ctypes
import threading

__all__ = ["inject_fault", "FaultPlan", "gpus_with_contexts"]


class FaultPlan:
    """An armed fault: raise ``exc`` when the device launches its tile number ``after_tiles`` + 1."""

    def __init__(self, after_tiles, exc):
        self.after_tiles = after_tiles
        self.exc = exc
        self.tiles = 0
        self.fired = False
        self._lock = threading.Lock()

    def tick(self, device):
        with self._lock:
            if self.fired:
                return
            if self.tiles < self.after_tiles:
                self.tiles += 1
                return
            self.fired = True
        exc = self.exc
        if isinstance(exc, type):
            exc = exc(f"injected fault on {device.name} after {self.after_tiles} tile(s)")
        raise exc


@contextlib.contextmanager
def inject_fault(context, device_index, after_tiles=0, exc=RuntimeError):
    """Arm a fault on ``context.devices[device_index]``: it raises ``exc`` (an exception class, called
    with a message, or an instance) instead of launching its tile number ``after_tiles`` + 1.

    Yields the FaultPlan (``.fired`` says whether it went off). Leaving the block disarms it; a device
    that failed stays out of the Context until ``context.reset_failed()``.
    """
    from .context import Context
    if not isinstance(context, Context):
        raise TypeError(f"context must be a hybridblas.Context, got {type(context).__name__}")
    if isinstance(device_index, bool) or not isinstance(device_index, int) or \
            not 0 <= device_index < len(context.devices):
        raise ValueError(f"device_index must be an index into context.devices (0..{len(context.devices) - 1}), "
                         f"got {device_index!r}")
    if isinstance(after_tiles, bool) or not isinstance(after_tiles, int) or after_tiles < 0:
        raise ValueError(f"after_tiles must be an integer >= 0, got {after_tiles!r}")
    if not (isinstance(exc, Exception) or (isinstance(exc, type) and issubclass(exc, Exception))):
        raise TypeError(f"exc must be an Exception class or instance (a device fault; not an interrupt or "
                        f"SystemExit), got {exc!r}")
    name = context.devices[device_index].name
    plan = FaultPlan(after_tiles, exc)
    with context._fault_lock:
        if name in context._faults:
            raise ValueError(f"a fault is already armed on {name}")
        context._faults[name] = plan
    try:
        yield plan
    finally:
        with context._fault_lock:
            context._faults.pop(name, None)


def gpus_with_contexts():
    """The GPU ordinals on which this process's primary CUDA context is active, as the driver reports it (ctypes,
    libcuda): a run on GPU 1 that lists 0 as well made a context on GPU 0 (about 500 MiB held there until the
    process ends). [] where there is no driver or no GPU."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    active = []
    for ordinal in range(count.value):
        device, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if (cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                and cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(on)) == 0 and on.value):
            active.append(ordinal)
    return active
