"""A profile's data and its validation: device rates, block sizes, the CPU's static share, transfer rates.

``Profile`` wraps the dict read from a profile file (see docs/tuning.md for its layout) after checking all of
it, so every lookup can trust it; each lookup returns None where the profile has nothing to say. A bad value
anywhere raises ``ProfileError`` naming its place (``devices['cpu'].rates['herk']['complex128'][512] = -1.0:
want ...``).
"""
import bisect
import math
import re
from pathlib import Path

import numpy as np

from .node import FINGERPRINT_KEYS, current_fingerprint, differences, fingerprint_id

FORMAT = "hybridblas-profile/1"
# A call of one routine may use the measured rate of a routine with the same kernel shape.
_KIND_FALLBACK = {"herk": ("syrk",), "syrk": ("herk",), "her2k": ("syr2k", "herk"),
                  "syr2k": ("her2k", "syrk"), "gemmt": ("gemm",), "gemm": ("gemmt",)}
ROUTINE_KINDS = tuple(_KIND_FALLBACK)
DTYPES = ("float32", "float64", "complex64", "complex128")
TRANSFER_KEYS = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")
BLOCK_SIZE_RANGE = (32, 65536)      # tile edges a profile may give; outside it a call would be all overhead


class ProfileError(ValueError):
    """A profile file that cannot be used (unreadable, not YAML, wrong layout)."""


def interp_log(table, size):
    """Value at ``size`` from {size: value}: log-log interpolation inside, clamped outside."""
    sizes = sorted(table)
    if size <= sizes[0]:
        return float(table[sizes[0]])
    if size >= sizes[-1]:
        return float(table[sizes[-1]])
    j = bisect.bisect_left(sizes, size)
    s0, s1 = sizes[j - 1], sizes[j]
    if s1 == size:
        return float(table[s1])
    v0, v1 = float(table[s0]), float(table[s1])
    t = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
    if v0 > 0 and v1 > 0:
        return math.exp(math.log(v0) + t * (math.log(v1) - math.log(v0)))
    return v0 + t * (v1 - v0)


def _device_kind(name):
    """'cpu#1' -> 'cpu', 'cuda:3' -> 'cuda'."""
    return name.split("#")[0].split(":")[0]


def _dtype_name(dtype):
    return np.dtype(dtype).name


class Profile:
    """A loaded node profile. Every lookup returns None where the profile has nothing to say."""

    def __init__(self, data, path=None):
        self.data = _validate(data)
        self.path = Path(path) if path is not None else None

    # -- identity
    @property
    def fingerprint(self):
        return self.data["fingerprint"]

    @property
    def id(self):
        return fingerprint_id(self.fingerprint)

    @property
    def device_names(self):
        return list(self.data["devices"])

    def matches(self, fp=None):
        return not differences(self.fingerprint, fp or current_fingerprint())

    # -- devices
    def _device(self, name):
        devs = self.data["devices"]
        if name in devs:
            return devs[name]
        kind = _device_kind(name)
        for other, entry in devs.items():
            if entry.get("kind", _device_kind(other)) == kind:
                return entry
        return None

    def has_device(self, name):
        """Whether the profile measured this very device (not a sibling of the same kind)."""
        return name in self.data["devices"]

    def covers(self, name):
        return self._device(name) is not None

    def rate(self, name, kind, dtype, size):
        """flop/s of device ``name`` on routine ``kind``, ``dtype``, problem edge ``size``; or None."""
        entry = self._device(name)
        if entry is None:
            return None
        dt = _dtype_name(dtype)
        rates = entry.get("rates", {})
        for k in (kind,) + _KIND_FALLBACK.get(kind, ()):
            table = rates.get(k, {}).get(dt)
            if table:
                return interp_log(table, max(int(size), 1))
        return None

    def block_size(self, name, kind, dtype):
        """Best tile edge measured for this device (routine and dtype, else the device's default)."""
        entry = self._device(name)
        if entry is None:
            return None
        blocks = entry.get("block_size", {})
        for k in (kind,) + _KIND_FALLBACK.get(kind, ()):
            v = blocks.get(k, {}).get(_dtype_name(dtype))
            if v:
                return v
        return blocks.get("default")

    def transfer(self, name):
        """{h2d_pinned, h2d_pageable, d2h_pinned, d2h_pageable} in bytes/s for a GPU, or None."""
        entry = self._device(name)
        return dict(entry["transfer"]) if entry and entry.get("transfer") else None

    def cpu_threads(self):
        entry = self._device("cpu")
        return entry.get("threads") if entry else None

    # -- the CPU next to the GPUs (static splitter)
    def _static(self, kind, dtype, size, key):
        table = self.data.get("static", {})
        for k in (kind,) + _KIND_FALLBACK.get(kind, ()):
            per_size = table.get(k, {}).get(_dtype_name(dtype))
            if per_size:
                sizes = sorted(per_size)
                best = min(sizes, key=lambda s: abs(math.log(max(size, 1)) - math.log(s)))
                return per_size[best].get(key) if key != "cpu_share" else interp_log(
                    {s: per_size[s]["cpu_share"] for s in sizes}, max(size, 1))
        return None

    def cpu_share(self, kind, dtype, size):
        """The CPU's share of the flops in a static CPU+GPU call (0 when it does not help), or None."""
        return self._static(kind, dtype, size, "cpu_share")

    def cpu_helps(self, kind, dtype, size):
        """True/False as measured (hybrid static vs GPU-only), None when not measured."""
        v = self._static(kind, dtype, size, "cpu_helps")
        return None if v is None else bool(v)

    def cpu_hybrid_rate(self, kind, dtype, size):
        """The whole CPU's rate next to the node's GPUs, such that the static split gives it cpu_share."""
        share = self.cpu_share(kind, dtype, size)
        if share is None or not 0 < share < 1:
            return None
        gpus = [n for n, e in self.data["devices"].items() if e.get("kind") != "cpu"]
        rates = [self.rate(n, kind, dtype, size) for n in gpus]
        if not rates or not all(rates):
            return None
        return share / (1.0 - share) * sum(rates)

    def to_dict(self):
        return self.data

    def __repr__(self):
        where = f" from {self.path}" if self.path else ""
        return f"<Profile {self.id} devices={self.device_names}{where}>"


_DEVICE_NAME = re.compile(r"cpu(#\d+)?|cuda:\d+")


def _show(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _mapping(value, where, nonempty=False):
    if not isinstance(value, dict) or (nonempty and not value):
        raise ProfileError(f"{where} must be a {'non-empty ' if nonempty else ''}mapping, got {_show(value)}")
    return value


def _integer(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x):
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:           # an integer beyond a float: no rate a profile can hold
        return False


def _positive(x):
    return _number(x) and x > 0


def _want(ok, where, value, want):
    if not ok:
        raise ProfileError(f"{where} = {_show(value)}: want {want}")


def _per_routine_dtype(table, where, check):
    """``table`` maps a routine to {dtype: value}; ``check(value, place)`` judges each value."""
    for kind, per_dtype in _mapping(table, where).items():
        _want(kind in ROUTINE_KINDS, f"{where} key", kind, f"one of {ROUTINE_KINDS}")
        for dt, value in _mapping(per_dtype, f"{where}[{kind!r}]").items():
            _want(dt in DTYPES, f"{where}[{kind!r}] key", dt, f"one of {DTYPES}")
            check(value, f"{where}[{kind!r}][{dt!r}]")


def _sizes(table, where, check):
    """``table`` maps a problem edge (integer >= 1) to a value that ``check(value, place)`` judges."""
    for size, value in _mapping(table, where, nonempty=True).items():
        _want(_integer(size) and size >= 1, f"{where} key", size, "a problem edge, an integer >= 1")
        check(value, f"{where}[{size!r}]")


def _rate(value, where):
    _want(_positive(value), where, value, "a finite flop/s > 0")


def _block(value, where):
    lo, hi = BLOCK_SIZE_RANGE
    _want(_integer(value) and lo <= value <= hi, where, value, f"an integer tile edge in [{lo}, {hi}]")


def _share(entry, where):
    _mapping(entry, where)
    share = entry.get("cpu_share")
    _want(_number(share) and 0 <= share <= 1, f"{where}['cpu_share']", share, "a number in [0, 1]")
    helps = entry.get("cpu_helps", False)
    _want(isinstance(helps, bool), f"{where}['cpu_helps']", helps, "true or false")


def _texts(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_FINGERPRINT_CHECKS = {
    "cpu_model": (lambda v: isinstance(v, str), "text"),
    "cpu_cores": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "gpus": (_texts, "a list of GPU names"),
    "gpu_count": (lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    "driver": (lambda v: v is None or isinstance(v, str), "text or null"),
    "cuda": (lambda v: v is None or isinstance(v, str), "text or null"),
    "blas": (_texts, "a list of BLAS libraries"),
}


def _validate_fingerprint(fp):
    _mapping(fp, "fingerprint")
    missing = [k for k in FINGERPRINT_KEYS if k not in fp]
    if missing:
        raise ProfileError(f"fingerprint lacks {missing}; it needs {FINGERPRINT_KEYS}")
    for key, (ok, want) in _FINGERPRINT_CHECKS.items():
        _want(ok(fp[key]), f"fingerprint[{key!r}]", fp[key], want)
    _want(fp["gpu_count"] == len(fp["gpus"]), "fingerprint['gpu_count']", fp["gpu_count"],
          f"the number of GPUs listed ({len(fp['gpus'])})")


def _validate_device(name, entry):
    where = f"devices[{name!r}]"
    _want(isinstance(name, str) and _DEVICE_NAME.fullmatch(name), "devices key", name, "cpu, cpu#<i> or cuda:<i>")
    _mapping(entry, where)
    kind = _device_kind(name)
    _want(entry.get("kind") == kind, f"{where}['kind']", entry.get("kind"), repr(kind))
    if "model" in entry:
        _want(isinstance(entry["model"], str), f"{where}['model']", entry["model"], "text")
    if "threads" in entry:
        _want(_integer(entry["threads"]) and entry["threads"] >= 1, f"{where}['threads']", entry["threads"],
              "an integer >= 1")
    if "rates" in entry:
        _per_routine_dtype(entry["rates"], f"{where}.rates", lambda t, at: _sizes(t, at, _rate))
    if "block_size" in entry:
        blocks = _mapping(entry["block_size"], f"{where}.block_size")
        if "default" in blocks:
            _block(blocks["default"], f"{where}.block_size['default']")
        _per_routine_dtype({k: v for k, v in blocks.items() if k != "default"}, f"{where}.block_size", _block)
    for key, rate in _mapping(entry.get("transfer", {}), f"{where}.transfer").items():
        _want(key in TRANSFER_KEYS, f"{where}.transfer key", key, f"one of {TRANSFER_KEYS}")
        _want(_positive(rate), f"{where}.transfer[{key!r}]", rate, "a finite bytes/s > 0")


def _validate(data):
    """Check the whole profile, so that every lookup can trust it; raise ProfileError naming the first place
    that is wrong (``devices['cpu'].rates['herk']['complex128'][512] = -1.0: want ...``)."""
    if not isinstance(data, dict):
        raise ProfileError(f"expected a YAML mapping at top level, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ProfileError(f"format must be {FORMAT!r}, got {_show(data.get('format'))}")
    _validate_fingerprint(data.get("fingerprint"))
    for name, entry in _mapping(data.get("devices"), "devices", nonempty=True).items():
        _validate_device(name, entry)
    if "static" in data:
        _per_routine_dtype(data["static"], "static", lambda t, at: _sizes(t, at, _share))
    return data
