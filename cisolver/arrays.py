"""Array-module functions: numpy on the CPU, cupy on a GPU (imported lazily, only when used)."""
import threading
import time

import numpy as np

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))     # the precisions of the solver's blocks


def precision(value, name="dtype"):
    """``value`` as float32 or float64 (a numpy dtype), else a TypeError naming ``name`` and the value."""
    try:
        dt = np.dtype(value)
    except TypeError:
        dt = None
    if dt is None or dt not in FLOATS:      # (a dtype equals None: numpy reads None as float64)
        shown = repr(value) if isinstance(value, str) or dt is None else str(dt)
        raise TypeError(f"{name} must be float32 or float64, got {shown}")
    return dt


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


def column_sumsq(block):
    """Sum of squares of each column of a tall real block, as a float64 host array.

    On a GPU, cupy's reduction over axis 0 of a C-ordered n x 8 block gives one thread block per column
    and took 11 ms at n = 1.96e6 (48Cr, H200); a product with a vector of ones runs at bandwidth."""
    if not is_device(block):
        return np.einsum("ij,ij->j", block, block, dtype=np.float64)
    if block.shape[0] == 0:
        return np.zeros(block.shape[1])
    import cupy
    sq = block.astype(np.float64)
    sq *= sq
    return (cupy.ones(block.shape[0], dtype=np.float64) @ sq).get()


class Ready:
    """A host value, with the ``result()`` of a Later (the CPU path has nothing to wait for)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


_in_flight = []      # (event, pinned buffer, device array) of copies not known to have landed
_in_flight_lock = threading.Lock()


def _keep_until_landed(event, *buffers):
    """Hold the buffers of a queued copy until its event has passed, also when nobody reads the copy: a
    pinned buffer back in CuPy's pool too early is handed to the next small host-to-device copy, and the
    late copy then writes into that one (as the last flag of a run, which nobody reads, would). Locked: a
    thread's entry appended while another one prunes the list would otherwise be dropped."""
    with _in_flight_lock:
        _in_flight[:] = [entry for entry in _in_flight if not _passed(entry[0])]
        _in_flight.append((event,) + buffers)


def _passed(event):
    done = event.done                # a property in CuPy (a method in some versions)
    return done() if callable(done) else bool(done)


class Later:
    """A device array's copy to the host, queued on the current stream into pinned memory without waiting:
    ``result()`` waits for that copy only, not for the work queued after it, and returns ``finish`` of the
    host copy (its own array; the pinned buffer goes back to CuPy's pool once the copy has landed)."""
    __slots__ = ("_host", "_event", "_finish", "_value")

    def __init__(self, device_array, finish=None):
        import cupy
        import cupyx
        order = "F" if device_array.flags.f_contiguous and not device_array.flags.c_contiguous else "C"
        self._host = cupyx.empty_pinned(device_array.shape, device_array.dtype, order=order)
        device_array.get(out=self._host, blocking=False)
        self._event = cupy.cuda.Event(disable_timing=True)
        self._event.record()
        _keep_until_landed(self._event, self._host, device_array)
        self._finish = finish

    def result(self):
        if self._event is not None:
            self._event.synchronize()
            host = np.array(self._host)
            self._value = self._finish(host) if self._finish else host
            self._event = self._host = None
        return self._value


def column_totals(partials, later=False):
    """The column sums of a small device array of per-block partial sums, added on the host in a fixed
    order (reproducible); with ``later`` a Later of them."""
    if later:
        return Later(partials, lambda host: host.sum(axis=0))
    return partials.get().sum(axis=0)


def small_on_device(m, dtype):
    """A small matrix as a C-ordered GPU array of ``dtype`` for a kernel to read: a host one is copied over,
    a GPU one (e.g. written there by cisolver.gpu_ortho) is used where it is when it fits already."""
    import cupy
    if is_device(m):
        return cupy.ascontiguousarray(m, dtype=dtype)
    return cupy.asarray(np.ascontiguousarray(m), dtype=dtype)


def row_major(x):
    """Rows at a leading dimension, unit stride along a row (e.g. a column range of a row-major buffer):
    the layout BLAS, cuBLAS and cisolver's row kernels read in place."""
    return (x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == x.itemsize) and x.strides[0] >= 0
            and x.strides[0] % x.itemsize == 0 and (x.shape[0] <= 1 or x.strides[0] >= x.shape[1] * x.itemsize))


def row_stride(x):
    """Elements between the starts of consecutive rows of a row-major block (its leading dimension)."""
    return max(x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1], 1)


def aligned_rows(x):
    """Every row of the GPU block x starts on a 16-byte boundary (16-byte loads and stores are aligned)."""
    return x.data.ptr % 16 == 0 and (row_stride(x) * x.itemsize) % 16 == 0


class Timer:
    """Accumulates seconds per named phase. ``phase("dense", "rayleigh_ritz")`` charges both "dense" and
    "dense:rayleigh_ritz".

    On the CPU a phase is wall time. On a GPU a phase is the time the caller's stream took from the
    phase's start to its end, from CUDA events recorded there (read when ``seconds`` is): the host time of a
    phase counts where the GPU waited on it, GPU time counts where the host waited on it, and the phases
    of an iteration add up to its time on the stream. Events, unlike a synchronisation at every phase
    boundary, let the host queue the next phase while the GPU finishes the last (twelve syncs per
    iteration before)."""

    def __init__(self, xp=np):
        self.xp = xp
        self._seconds = {}
        self._pending = []       # (names, start event, end event)

    def phase(self, name, part=None):
        return _Phase(self, [name] if part is None else [name, f"{name}:{part}"])

    @property
    def seconds(self):
        self._resolve()
        return self._seconds

    def _add(self, names, took):
        for key in names:
            self._seconds[key] = self._seconds.get(key, 0.0) + took

    def _resolve(self):
        if self._pending:
            self._pending[-1][2].synchronize()
            for names, start, end in self._pending:
                self._add(names, self.xp.cuda.get_elapsed_time(start, end) / 1e3)
            self._pending = []


class _Phase:
    __slots__ = ("timer", "names", "t0", "start")

    def __init__(self, timer, names):
        self.timer, self.names = timer, names

    def __enter__(self):
        xp = self.timer.xp
        if xp is np:
            self.t0 = time.perf_counter()
        else:
            self.start = xp.cuda.Event()
            self.start.record()
        return self

    def __exit__(self, *exc):
        timer = self.timer
        if timer.xp is np:
            timer._add(self.names, time.perf_counter() - self.t0)
            return
        end = timer.xp.cuda.Event()
        end.record()
        timer._pending.append((self.names, self.start, end))
        if len(timer._pending) >= 1024:          # bound the events held
            timer._resolve()
