"""Array-module helpers: numpy on the CPU, cupy on a GPU (imported lazily, only when used)."""
import time

import numpy as np


def module_of(a):
    """numpy or cupy, whichever owns ``a``."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def is_device(a):
    return type(a).__module__.startswith("cupy")


def to_host(a):
    return a.get() if is_device(a) else np.asarray(a)


def synchronize(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


class Timer:
    """Accumulates wall seconds per named phase; syncs the device so GPU time is charged correctly."""

    def __init__(self, xp=np):
        self.xp = xp
        self.seconds = {}

    def phase(self, name):
        timer = self

        class _Phase:
            def __enter__(self):
                synchronize(timer.xp)
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                synchronize(timer.xp)
                timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.t0
        return _Phase()
