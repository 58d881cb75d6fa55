"""Keep large host operands page-locked (cudaHostRegister) while they live, so GPUs DMA straight from them.

Measured on a 4xH200 node (python3 -m benchmarks.blas staging, docs/performance.md): DMA from registered memory
runs at 55 GB/s per GPU and 175 GB/s with four GPUs at once, while staging pageable memory through pinned
buffers is bounded by the host's copies (18-43 GB/s for the whole node). Locking is dear, though: a call
that met 19-29 GB of unlocked operands at n = k = 24576 took 2.3-5.4 s instead of 0.4-2.5 s, whether the
registration ran in the caller or (as now) on a background thread beside the ring's staging. So an operand,
once locked, stays locked until numpy frees it (a weakref finalizer unregisters it first) or until its
bytes are needed for another operand under the cap ($HYBRIDBLAS_PIN_MAX_GB, default 3/4 of the host
memory), and under the default policy (Context(pin_host="auto")) it is locked only when a second call
meets it: a one-shot call never pays for locking memory it will not use again, a program that comes back
to the same arrays (repeated products, a FLAPW build's four calls on one A) gets DMA from then on. A lock
is undone only once the GPUs have done the work queued on them (quiesce): copies the caller queued from the
locked memory read it by DMA.

Until its registration has finished an operand goes through the staging ring. Only arrays whose memory
numpy owns are registered (not views of foreign buffers or memory maps), and a registration that fails
(too much locked memory, a foreign driver state) just leaves that operand on the staging path.
"""
import ctypes
import os
import threading
import time
import weakref

import numpy as np

from . import envvars, workers

PIN_MIN_BYTES = 256 << 20          # smaller operands go through the staging ring (cheap enough)
ENV_MAX_GB = "HYBRIDBLAS_PIN_MAX_GB"
_PORTABLE = 1                      # cudaHostRegisterPortable: pinned for every GPU's context
_ALREADY_REGISTERED = 712          # cudaErrorHostMemoryAlreadyRegistered: someone else pinned it

_lock = threading.RLock()          # re-entrant: a garbage collection that an allocation under the lock sets off
                                   # runs the finalizers of freed operands (_freed, _forget) in the thread that
                                   # holds it (a plain lock hung a band call in _pin); loops go over copies
_pins = {}                         # owner's data pointer -> _Pin
_seen = {}                         # owner's data pointer -> [nbytes, calls that met it, finalizer, last call]
_cudart = None


class _Pin:
    __slots__ = ("ptr", "nbytes", "users", "last", "finalizer", "ours", "ready", "done", "copied")

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes, self.ours = ptr, nbytes, True
        self.copied = False                # a call has copied the locked memory by DMA (first_direct_use)
        self.users, self.last, self.finalizer = 0, time.monotonic(), None
        self.ready = threading.Event()     # set once the memory is page-locked
        self.done = threading.Event()      # set when the registration has ended, locked or not

    @property
    def busy(self):                        # registration in flight: never evicted meanwhile
        return not self.done.is_set()


def is_ready(pin):
    """True when ``pin`` (from acquire) is page-locked: uploads from it may be plain DMA."""
    return pin is not None and pin.ready.is_set()


def first_direct_use(pin):
    """True for the first caller that asks this of ``pin`` once it is page-locked (a call that is about to copy the
    memory by DMA for the first time), False after that, before the lock and for None. On 2 x H100 nodes the first
    band call that wrote into a C locked just before wrote it back at 3-6 GB/s (32-51 later), on one of them with a
    GPU's kernels a third slower: its rates are not the links' nor the GPUs'."""
    if not is_ready(pin):
        return False
    with _lock:
        first, pin.copied = not pin.copied, True
    return first


def wait_ready(timeout=None):
    """Wait for every registration in flight (benchmarks and tests; calls never need to)."""
    with _lock:
        pending = [p for p in list(_pins.values()) if p.busy]
    for p in pending:
        p.done.wait(timeout)


def cudart():
    """libcudart (the copy CuPy loaded) through ctypes: register calls then release the GIL."""
    global _cudart
    if _cudart is None:
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()   # makes sure CuPy has loaded its runtime
        except Exception:                        # no cupy, no driver: nothing can be registered
            _cudart = False
            return None
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
            lib.cudaGetLastError.argtypes = []
            lib.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_uint]
            _cudart = lib
            break
        else:
            _cudart = False
    return _cudart or None


def _owner(arr):
    """The ndarray that owns ``arr``'s memory, or None (foreign buffer, memory map, not numpy)."""
    a = arr
    while isinstance(a, np.ndarray) and not a.flags.owndata:
        a = a.base
    return a if isinstance(a, np.ndarray) and a.flags.owndata else None


def max_bytes():
    gb = envvars.number(ENV_MAX_GB, float, minimum=0)
    if gb is not None:
        return int(gb * 1e9)
    try:
        return int(0.75 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 64 << 30


def pinned_bytes():
    with _lock:
        return sum(p.nbytes for p in list(_pins.values()) if p.ours)


def acquire(arr, min_bytes=None, after_uses=0, call=None):
    """Start page-locking ``arr``'s memory (its owner, once); a token for is_ready()/release(), or None.

    ``after_uses``: register only once this many earlier calls have met the same operand (1 for the
    "auto" policy); until then None, and the sighting is remembered while the array lives. ``call``
    identifies the call, so that the several GPUs of one call count as one sighting.
    Returns at once: the registration runs on a background thread, which holds the owner alive meanwhile.
    """
    owner = _owner(arr)
    if owner is None or owner.nbytes < (PIN_MIN_BYTES if min_bytes is None else min_bytes):
        return None
    ptr, nbytes = owner.ctypes.data, owner.nbytes
    with _lock:
        if ptr not in _pins and _sightings(owner, ptr, nbytes, call) <= after_uses:
            return None
    lib = cudart()
    if lib is None:
        return None
    with _lock:
        pin = _pins.get(ptr)
        if pin is not None and pin.nbytes != nbytes and not pin.busy:   # stale entry at the same address
            _drop(pin)
            pin = None
        if pin is None:
            if not _make_room(nbytes):
                return None
            pin = _Pin(ptr, nbytes)
            pin.finalizer = weakref.finalize(owner, _freed, ptr)
            _pins[ptr] = pin
            workers.start(_register, lib, pin, owner, name="pin")
        elif pin.nbytes != nbytes:
            return None
        pin.users += 1
        pin.last = time.monotonic()
        return pin


def _sightings(owner, ptr, nbytes, call):
    """Count the calls that met this owner (forgotten when it is freed); return the count so far."""
    entry = _seen.get(ptr)
    if entry is None or entry[0] != nbytes:
        if entry is not None:
            entry[2].detach()
        entry = _seen[ptr] = [nbytes, 0, weakref.finalize(owner, _forget, ptr), object()]
    if call is None or entry[3] is not call:
        entry[1] += 1
        entry[3] = call
    return entry[1]


def times_seen(arr):
    """How many calls have met ``arr``'s owner so far (for tests and diagnostics)."""
    owner = _owner(arr)
    with _lock:
        entry = _seen.get(owner.ctypes.data) if owner is not None else None
        return entry[1] if entry is not None and entry[0] == owner.nbytes else 0


def _forget(ptr):
    with _lock:
        _seen.pop(ptr, None)


def _register(lib, pin, owner):
    status = lib.cudaHostRegister(pin.ptr, pin.nbytes, _PORTABLE)
    if status != 0:
        lib.cudaGetLastError()                  # clear the error so later CUDA calls do not see it
    with _lock:
        if status in (0, _ALREADY_REGISTERED):
            pin.ours = status == 0              # someone else's registration: never undone by us
            pin.ready.set()
        else:                                   # e.g. locked-memory limit: this operand stays staged
            pin.ours = False
            _drop(pin)
        pin.done.set()
    del owner                                   # only now may numpy free it (its finalizer unregisters)


def release(pin):
    if pin is None:
        return
    with _lock:
        pin.users -= 1
        pin.last = time.monotonic()


def _make_room(nbytes):
    """Unregister idle pins, least recently used first, until ``nbytes`` more fit under the cap."""
    cap = max_bytes()
    pins = list(_pins.values())
    held = sum(p.nbytes for p in pins if p.ours)
    for pin in sorted((p for p in pins if p.users == 0 and not p.busy), key=lambda p: p.last):
        if held + nbytes <= cap:
            break
        held -= pin.nbytes if pin.ours else 0
        _drop(pin)
    return held + nbytes <= cap


def _drop(pin):
    if _pins.get(pin.ptr) is pin:
        del _pins[pin.ptr]
    if pin.finalizer is not None:
        pin.finalizer.detach()
    if pin.ours and pin.ready.is_set():
        pin.ready.clear()
        lib = cudart()
        if lib is None:
            return
        quiesce()
        if lib.cudaHostUnregister(pin.ptr) != 0:
            lib.cudaGetLastError()


def quiesce():
    """Wait until every GPU with a CUDA context in this process has done the work queued on it. Memory that is
    page-locked is copied by DMA straight from where it lies, also by copies the caller queues: cupy.asarray of a
    locked 1 GiB array returned after 0.8 ms on an H100, its copy landed 20 ms later. Unregistering the memory
    under such a copy makes it fault, and the fault ends the process's CUDA context (every later CUDA call fails
    with cudaErrorLaunchFailure), so locks this module made are undone only after this. GPUs without a context
    have nothing queued and get none; a GPU already in an error state is left as it is."""
    try:
        import cupy
    except ImportError:                         # no CuPy: nothing was queued through it
        return
    from .testing import gpus_with_contexts
    for index in gpus_with_contexts():
        try:
            with cupy.cuda.Device(index):
                cupy.cuda.runtime.deviceSynchronize()
        except Exception:                       # noqa: BLE001 - a GPU in an error state: nothing more to wait for
            pass


def _freed(ptr):
    """numpy is about to free the memory at ``ptr``: unregister it first (weakref finalizer)."""
    with _lock:
        pin = _pins.get(ptr)
        if pin is not None:
            pin.finalizer = None
            _drop(pin)


def clear():
    """Unregister every idle pin and forget every sighting (tests, benchmarks, or a caller who wants its
    memory unlocked now)."""
    wait_ready()
    with _lock:
        for entry in list(_seen.values()):
            entry[2].detach()
        _seen.clear()
        for pin in [p for p in list(_pins.values()) if p.users == 0 and not p.busy]:
            _drop(pin)
