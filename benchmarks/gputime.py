"""GPU timers shared by the GPU measurements (CuPy imported when one is called)."""
import time

import numpy as np

_SPIN = r"""
extern "C" __global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def per_call(fn, reps):
    """Seconds per call of fn() on the current GPU: one warm-up call, then reps calls between syncs."""
    import cupy as cp
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / reps


def gpu_and_host_us(fn, reps=50):
    """Microseconds per call of fn(): the host's issue time, the GPU's time over reps calls in a row
    (pipelined), and the GPU's own time of one call alone between events (best of 5)."""
    import cupy as cp
    fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    host = (time.perf_counter() - t0) / reps
    stop.synchronize()
    gpu_total = cp.cuda.get_elapsed_time(start, stop) * 1e-3 / reps
    gpu_each = []                       # one call alone between events: the GPU's own time
    for _ in range(5):
        cp.cuda.Device().synchronize()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        gpu_each.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return {"host_us": host * 1e6, "pipelined_us": gpu_total * 1e6, "alone_us": min(gpu_each) * 1e6}


def spin(cycles):
    """Queue a one-thread kernel that holds the current stream for ``cycles`` GPU clock cycles, so that
    events around calls queued behind it see the GPU's own time, not the host's issue time."""
    import cupy as cp
    cp.RawKernel(_SPIN, "spin")((1,), (1,), (np.int64(cycles),))


def spin_seconds(seconds):
    """spin() for about ``seconds`` at the current GPU's clock rate."""
    import cupy as cp
    spin(int(seconds * cp.cuda.Device().attributes["ClockRate"] * 1e3))


def device_name(index=0):
    """The name of CUDA device ``index``."""
    import cupy as cp
    return cp.cuda.runtime.getDeviceProperties(index)["name"].decode()
