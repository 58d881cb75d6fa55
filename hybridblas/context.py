"""Context: which devices a call runs on, which strategy, which block size, which rates."""
import math
import os
import threading
from numbers import Integral, Real
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Union

import numpy as np

from . import blas_threads
from .devices import CPUDevice, Device, registered
from .devspec import device_words, gpu_count

if TYPE_CHECKING:
    from .profile.model import Profile

STRATEGIES = ("static", "dynamic", "auto")

# Rates (flop/s) used when no profile covers a device: conservative, so the CPU is never overloaded.
DEFAULT_CPU_RATE_PER_CORE = {4: 40e9, 8: 20e9}      # by real itemsize: single, double
DEFAULT_GPU_RATE = {4: 40e12, 8: 40e12}


def _cuda_devices(spec):
    """The CUDA devices a device string names ('gpu', '0,1', 'cpu,cuda:1': its GPUs only), from the
    registered device factory, which says clearly when CuPy or a GPU is missing."""
    factory = registered("cuda")
    if factory is None:
        try:
            from .devices import cuda  # noqa: F401  (registers itself)
        except ImportError as exc:
            raise ValueError(f"devices: {spec!r} needs CUDA support, which is not available ({exc})") from None
        factory = registered("cuda")
    return factory(spec)


PIN_ENV = "HYBRIDBLAS_PIN_HOST"
_PIN_WORDS = {"auto": "auto", "on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def _pin_policy(value):
    if value is None:
        word = os.environ.get(PIN_ENV, "auto").strip().lower()
        if word not in _PIN_WORDS:
            raise ValueError(f"${PIN_ENV} must be auto, on or off, got {os.environ[PIN_ENV]!r}")
        return _PIN_WORDS[word]
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, str) and value == "auto"):
        return value if isinstance(value, str) else bool(value)
    raise ValueError(f"pin_host must be True, False, 'auto' or None, got {value!r}")


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


def _integer(value, name, what="a positive integer"):
    """None or an int >= 1; a bool or float is refused (ValueError), a non-number too (TypeError)."""
    if value is None:
        return None
    if not isinstance(value, Real) and not _is_bool(value):
        raise TypeError(f"{name} must be {what} or None, got {value!r} ({type(value).__name__})")
    if _is_bool(value) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be {what} or None, got {value!r}")
    return int(value)


def _real(value, name, what, low, high=math.inf, optional=False):
    """A finite float in [low, high) (None when ``optional``): a bool, NaN or infinity is refused
    (ValueError), a non-number too (TypeError)."""
    if value is None and optional:
        return None
    tail = " or None" if optional else ""
    if not isinstance(value, Real) and not _is_bool(value):
        raise TypeError(f"{name} must be {what}{tail}, got {value!r} ({type(value).__name__})")
    if _is_bool(value) or not math.isfinite(value) or not low <= value < high:
        raise ValueError(f"{name} must be {what}{tail}, got {value!r}")
    return float(value)


def _rates(rates):
    """{device name: positive finite flop/s}, or {} for None."""
    if rates is None:
        return {}
    if not isinstance(rates, dict):
        raise TypeError(f"rates must be a dict of device name -> flop/s, got {rates!r} ({type(rates).__name__})")
    out = {}
    for name, value in rates.items():
        if not isinstance(name, str):
            raise TypeError(f"rates: device names must be strings like 'cpu' or 'cuda:0', got {name!r}")
        out[name] = _real(value, f"rates[{name!r}]", "a positive number (finite)", 0.0)
        if out[name] == 0:
            raise ValueError(f"rates[{name!r}] must be a positive number (finite), got {value!r}")
    return out


EMULATIONS = (None, "int8")
EMULATION_BITS = 54


def _emulation(emulation, bits):
    """(emulation, bits) checked: emulation one of EMULATIONS, bits an int in 8..62."""
    if emulation is not None and not isinstance(emulation, str):
        raise TypeError(f"emulation must be one of {EMULATIONS}, got {emulation!r} ({type(emulation).__name__})")
    if emulation not in EMULATIONS:
        raise ValueError(f"emulation must be one of {EMULATIONS}, got {emulation!r}")
    if _is_bool(bits) or not isinstance(bits, Integral):
        raise TypeError(f"emulation_bits must be an integer in 8..62, got {bits!r} ({type(bits).__name__})")
    if not 8 <= bits <= 62:
        raise ValueError(f"emulation_bits must be an integer in 8..62, got {bits!r}")
    return emulation, int(bits)


def _profile_arg(profile):
    from .profile.model import Profile
    if profile is None or profile is False or isinstance(profile, Profile):
        return profile
    raise TypeError(f"profile must be a loaded profile (hybridblas.load_profile()), None or False, "
                    f"got {profile!r} ({type(profile).__name__})")


class Context:
    """Where and how hybrid calls run.

    devices:    "cpu", "all" (CPU and every GPU), "gpu" (every GPU), or a list of "cpu", "cuda:i" and
                Device objects. Repeating "cpu" makes several CPU workers that share the cores.
    strategy:   "static" (ratio split from the rates), "dynamic" (block queues), "auto".
    block_size: tile edge; None lets the strategy choose (static runs each band as a few big calls).
    cpu_threads: cores the CPU workers use in all (default: every core, less one per GPU feeder thread).
    rates:      {device name: flop/s} overriding the profile, e.g. {"cpu": 1.0, "cuda:0": 60.0}.
    profile:    a loaded profile, None to load the node's own (hybridblas.load_profile()), False for none.
    sync:       run every task in the caller's thread (the same plan; for debugging and tests).
    min_call_seconds: a call the fastest device would finish in less than this runs on one device,
                the one that finishes first counting the operands' trip to a device that does not hold
                them; splitting it would cost more in threads, transfers and reductions than it saves.
                0 always splits; an explicit block_size also splits.
    memory_limit: bytes a call may use on each GPU (default: what is free); smaller forces out-of-core.
    cpu_min_share: beside GPUs, the CPU works only if its rate share reaches this (0 keeps it always;
                None: the calibrated profile decides when it covers the call, else 0.05).
    pin_host:   "auto": a host operand of >= 256 MiB that numpy owns is page-locked when a second call
                meets it, and stays so while it lives (hybridblas.host_pinning): GPUs then read it by DMA
                at full PCIe speed. True: from the first call. False: always the pinned staging ring.
                None (default): $HYBRIDBLAS_PIN_HOST (auto, on, off), else "auto".
    emulation:  None (default): FP64 products on the FP64 units. "int8": float64 and complex128 tiles on a GPU
                run as exact INT8 products of residues on its tensor cores (the Ozaki scheme II,
                hybridblas.devices.cuda_ozaki) where that wins: m and n of at least 2048 and k of at least
                cuda_ozaki.MIN_K (6144 to 16384 by dtype and shape); other tiles, other dtypes and the CPU's
                tiles stay native.
    emulation_bits: bits kept of every row of op(A) and column of op(B), relative to its largest entry
                (default 54: a float64 mantissa and one more); the number of moduli follows from it and k.
    """

    def __init__(self, devices: Union[str, Sequence[Union[str, int, Device]]] = "all", strategy: str = "auto",
                 block_size: Optional[int] = None, *, cpu_threads: Optional[int] = None,
                 rates: Optional[Dict[str, float]] = None, profile: Union["Profile", None, bool] = None,
                 sync: bool = False, tail_fraction: float = 0.15, memory_limit: Optional[int] = None,
                 cpu_min_share: Optional[float] = None, min_call_seconds: float = 0.005,
                 pin_host: Union[bool, str, None] = None, emulation: Optional[str] = None,
                 emulation_bits: int = EMULATION_BITS) -> None:
        if not isinstance(strategy, str):
            raise TypeError(f"strategy must be one of {STRATEGIES}, got {strategy!r} ({type(strategy).__name__})")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        block_size = _integer(block_size, "block_size")
        cpu_threads = _integer(cpu_threads, "cpu_threads")
        rates = _rates(rates)
        tail_fraction = _real(tail_fraction, "tail_fraction", "a number in [0, 1)", 0.0, 1.0)
        memory_limit = _integer(memory_limit, "memory_limit", "a positive number of bytes (an integer)")
        cpu_min_share = _real(cpu_min_share, "cpu_min_share", "a number in [0, 1)", 0.0, 1.0, optional=True)
        min_call_seconds = _real(min_call_seconds, "min_call_seconds", "a number >= 0 (finite)", 0.0)
        if not _is_bool(sync):
            raise TypeError(f"sync must be True or False, got {sync!r} ({type(sync).__name__})")
        self.emulation, self.emulation_bits = _emulation(emulation, emulation_bits)
        self._profile = _profile_arg(profile)
        self.pin_host = _pin_policy(pin_host)
        self.devices = self._resolve_devices(devices)
        self.strategy = strategy
        self.block_size = block_size
        self.cpu_threads = cpu_threads
        self.rates = rates
        self.sync = bool(sync)
        self.tail_fraction = tail_fraction
        self.memory_limit = memory_limit
        self.min_call_seconds = min_call_seconds
        self.cpu_min_share = cpu_min_share
        self._closed = False
        self._failed = {}            # device name -> the exception that put it out
        self._faults = {}            # device name -> testing.FaultPlan (hybridblas.testing.inject_fault)
        self._fault_lock = threading.Lock()

    @staticmethod
    def _resolve_devices(devices):
        if isinstance(devices, str):
            cpu, every_gpu, optional, ids = device_words(devices)
            if every_gpu and optional and not gpu_count():
                return [CPUDevice(0)]                  # 'all' on a node without GPUs: the cores
            gpus = _cuda_devices(devices) if every_gpu or ids else []
            return ([CPUDevice(0)] if cpu else []) + gpus
        if not isinstance(devices, (list, tuple)) or not devices:
            raise ValueError(f"devices must be 'cpu', 'all', 'gpu', GPU ids like '0,1', or a non-empty list, "
                             f"got {devices!r}")
        out, n_cpu = [], 0
        for spec in devices:
            if isinstance(spec, Device):
                out.append(spec)
                continue
            if not isinstance(spec, (str, int)) or isinstance(spec, bool):
                raise ValueError(f"devices: unknown device {spec!r}; use 'cpu', 'cuda:<i>' or a Device")
            cpu, every_gpu, optional, ids = device_words([spec])   # one word, spelled as the string form takes it
            if cpu:
                out.append(CPUDevice(n_cpu))                      # each 'cpu' of the list: one more CPU worker
                n_cpu += 1
            if (every_gpu or ids) and not (optional and not gpu_count()):   # 'all' without GPUs: the cores
                out.extend(_cuda_devices(str(spec)))
        names = [d.name for d in out]
        if len(set(names)) != len(names):
            raise ValueError(f"devices: a device is listed twice in {names}")
        return out

    # ------------------------------------------------------------ used by the scheduler
    @property
    def profile(self):
        if self._profile is None:
            from .profile.store import load_profile
            # the notice of a missing profile matters only where several devices could share a call
            self._profile = load_profile(tell_missing=len(self.devices) > 1) or False
        return self._profile or None

    def check_open(self):
        """ValueError once the context is closed (every call checks, also one that reads no operand)."""
        if self._closed:
            raise ValueError(f"context: {self!r} is closed (Context.close()); make a new Context")

    def devices_for(self, problem):
        self.check_open()
        usable = [d for d in self.devices if d.accepts(problem)]
        if not usable:
            where = "host (numpy)" if problem.fxp.__name__ == "numpy" else "GPU (cupy)"
            raise ValueError(f"no device in {[d.name for d in self.devices]} can work on {where} operands")
        live = [d for d in usable if d.name not in self._failed]
        if not live:
            from .faults import DeviceFailure
            raise DeviceFailure(list(self._failed.items()), message_tail=(
                f"every device of this Context that can take the call has failed earlier "
                f"({', '.join(d.name for d in usable)}); Context.reset_failed() puts them back"))
        return self._drop_unhelpful_cpu(live, problem)

    # ------------------------------------------------------------ faults
    @property
    def failed(self):
        """{device name: exception} of the devices left out after they raised during a call."""
        with self._fault_lock:
            return dict(self._failed)

    def mark_failed(self, device, exc):
        """Leave ``device`` out of this Context's later calls (the scheduler calls it when one raises)."""
        with self._fault_lock:
            self._failed.setdefault(device.name, exc)

    def is_failed(self, device):
        return device.name in self._failed

    def reset_failed(self, device=None):
        """Put failed devices back into use: all of them, or the one named (a name or a Device)."""
        name = getattr(device, "name", device)
        with self._fault_lock:
            if name is None:
                self._failed.clear()
            else:
                self._failed.pop(name, None)

    def fault_check(self, device):
        """Called before each task a device launches: raises an injected fault when one is due."""
        plan = self._faults.get(device.name)
        if plan is not None:
            plan.tick(device)

    def _drop_unhelpful_cpu(self, usable, problem):
        """Leave the CPU out of a CPU+GPU call when the profile measured that it only slows GPUs down."""
        cpus = [d for d in usable if d.kind == "cpu"]
        if not cpus or len(cpus) == len(usable) or any(d.name in self.rates for d in cpus):
            return usable
        prof = self.profile
        size = max(problem.m, problem.n, problem.k)
        if prof is not None and prof.cpu_helps(problem.kind, problem.dtype, size) is False:
            return [d for d in usable if d.kind != "cpu"]
        return usable

    def rate(self, device, problem):
        """flop/s this device is expected to reach on this problem: explicit rates, profile, defaults."""
        if device.name in self.rates:
            return float(self.rates[device.name])
        measured = self._profile_rate(device, problem)
        if measured is not None:
            return measured
        item = problem.dtype.itemsize // (2 if problem.complex else 1)
        if device.kind == "cpu":
            n_cpu = sum(d.kind == "cpu" for d in self.devices)
            return DEFAULT_CPU_RATE_PER_CORE[item] * self._cpu_cores() / max(n_cpu, 1)
        return DEFAULT_GPU_RATE[item]

    def _profile_rate(self, device, problem):
        """The profile's rate, used only when it covers every device of the call (no mixing with guesses).

        Next to GPUs the whole CPU gets the rate that gives it the calibrated static share.
        """
        prof = self.profile
        if prof is None:
            return None
        size = max(problem.m, problem.n, problem.k)
        peers = [d for d in self.devices if d.accepts(problem)] or [device]
        if not all(prof.rate(d.name, problem.kind, problem.dtype, size) for d in peers):
            return None
        if device.kind != "cpu":
            return prof.rate(device.name, problem.kind, problem.dtype, size)
        n_cpu = max(1, sum(d.kind == "cpu" for d in peers))
        if any(d.kind != "cpu" for d in peers):
            hybrid = prof.cpu_hybrid_rate(problem.kind, problem.dtype, size)
            if hybrid:
                return hybrid / n_cpu
        r = prof.rate(device.name, problem.kind, problem.dtype, size)
        return r if prof.has_device(device.name) else r / n_cpu   # siblings share the measured cores

    def min_cpu_share(self, devices):
        """The share below which the CPU sits out beside GPUs; a covering profile has decided already."""
        if self.cpu_min_share is not None:
            return self.cpu_min_share
        prof = self.profile
        if prof is not None and all(prof.covers(d.name) for d in devices):
            return 0.0
        return 0.05

    def block_size_for(self, problem, devices):
        """Tile edge for the dynamic strategy: the context's own, else the profile's best, else None."""
        if self.block_size:
            return self.block_size
        prof = self.profile
        if prof is None:
            return None
        sizes = [prof.block_size(d.name, problem.kind, problem.dtype) for d in devices]
        return min(sizes) if sizes and all(sizes) else None

    def resolve_strategy(self, devices):
        if self.strategy != "auto":
            return self.strategy
        prof = self.profile
        covered = prof is not None and all(prof.covers(d.name) for d in devices)
        if len(devices) == 1 or len({d.kind for d in devices}) == 1 or covered:
            return "static"
        return "dynamic"

    def _cpu_cores(self):
        if self.cpu_threads:
            return self.cpu_threads
        n_gpu = sum(d.kind != "cpu" for d in self.devices)
        return max(1, blas_threads.available_cores() - n_gpu)

    def blas_threads(self, devices):
        """The one BLAS thread limit for a call: the cores shared out among the CPU workers.

        A lone CPU worker keeps the caller's BLAS setting (OPENBLAS_NUM_THREADS, threadpoolctl) unless
        ``cpu_threads`` was given; beside GPUs it leaves one core per GPU feeder thread.
        """
        n_cpu = sum(d.kind == "cpu" for d in devices)
        if n_cpu == 0:
            return None
        n_gpu = len(devices) - n_cpu
        if self.cpu_threads is None and n_cpu == 1 and n_gpu == 0:
            return None
        cores = self.cpu_threads or min(blas_threads.current(), self._cpu_cores())
        return max(1, cores // n_cpu)

    # ------------------------------------------------------------ life
    @property
    def closed(self):
        return self._closed

    def close(self):
        """Give back what this Context keeps between calls: its GPUs' page-locked staging rings, and the
        page-locking of host operands that no call is using. Later calls on it raise ValueError; a call
        running now in another thread finishes first and keeps what it holds until then. Closing twice is
        harmless. ``with Context(...) as ctx:`` closes it at the end of the block."""
        self._closed = True
        for device in self.devices:
            device.release()
        from . import host_pinning
        host_pinning.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"Context(devices={[d.name for d in self.devices]}, strategy={self.strategy!r}, "
                f"block_size={self.block_size})")


_default = None
_default_lock = threading.Lock()


def default_context():
    """The context used when a call passes none: every device of the node, strategy 'auto'."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Context("all")
        return _default


def set_default_context(ctx):
    global _default
    if ctx is not None and not isinstance(ctx, Context):
        raise TypeError(f"expected a Context or None, got {type(ctx).__name__}")
    with _default_lock:
        _default = ctx
