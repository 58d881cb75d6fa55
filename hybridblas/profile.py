"""Per-node profiles: measured rates, block sizes, the CPU's static share and transfer rates.

A profile is a YAML file written by ``hybridblas-tune calibrate`` and named by the node's hardware
fingerprint (CPU model and cores, GPU names and count, driver/CUDA, BLAS library), never the hostname,
so one shared directory can hold the profiles of many node types. It is looked for in
``$HYBRIDBLAS_PROFILE_DIR``, then ``~/.config/hybridblas/profiles/``, then ``{sys.prefix}/etc/hybridblas/``
(``$HYBRIDBLAS_PROFILE`` names one file explicitly). Missing: defaults and one notice. Corrupt or made
on another node: one warning and defaults, never an exception.
"""
import bisect
import functools
import hashlib
import json
import logging
import math
import os
import platform
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import yaml

__all__ = ["Profile", "ProfileError", "ProfileWarning", "load_profile", "save_profile",
           "current_fingerprint", "fingerprint_id", "profile_filename", "search_dirs", "find_profile"]

FORMAT = "hybridblas-profile/1"
ENV_DIR = "HYBRIDBLAS_PROFILE_DIR"
ENV_FILE = "HYBRIDBLAS_PROFILE"
FINGERPRINT_KEYS = ("cpu_model", "cpu_cores", "gpus", "gpu_count", "driver", "cuda", "blas")
# A call of one routine may use the measured rate of a routine with the same kernel shape.
_KIND_FALLBACK = {"herk": ("syrk",), "syrk": ("herk",), "her2k": ("syr2k", "herk"),
                  "syr2k": ("her2k", "syrk"), "gemmt": ("gemm",), "gemm": ("gemmt",)}
TRANSFER_KEYS = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")

log = logging.getLogger("hybridblas")


class ProfileError(ValueError):
    """A profile file that cannot be used (unreadable, not YAML, wrong layout)."""


class ProfileWarning(UserWarning):
    """A profile was found but ignored; defaults are used."""


# ---------------------------------------------------------------- fingerprint

def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def gpu_inventory():
    """(names, driver version, CUDA runtime version) through CuPy; ([], None, None) without GPUs.

    CuPy is imported only here, lazily; querying properties creates no CUDA context on the devices.
    """
    try:
        import cupy
        if not cupy.is_available():
            return [], None, None
        rt = cupy.cuda.runtime
        names = []
        for i in range(rt.getDeviceCount()):
            name = rt.getDeviceProperties(i)["name"]
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names, _cuda_version(rt.driverGetVersion()), _cuda_version(rt.runtimeGetVersion())
    except Exception:  # no cupy, no driver, no device
        return [], None, None


def _cuda_version(v):
    return f"{v // 1000}.{(v % 1000) // 10}" if isinstance(v, int) and v > 0 else None


def blas_libraries():
    """'internal_api version' of the BLAS libraries threadpoolctl sees once hybridblas's own BLAS is loaded,
    keeping only the kind scipy was built with (the one host tiles run on) when it can be told: a library a
    program loads for itself (MKL for cisolver's sparse products) must not change the node's profile name."""
    from . import blas_threads, host_blas  # noqa: F401  (loads scipy's BLAS, the one tiles run on)
    libs = blas_threads.blas_info()
    own = _scipy_blas_api()
    if own and any(lib.get("internal_api") == own for lib in libs):
        libs = [lib for lib in libs if lib.get("internal_api") == own]
    return sorted({f"{lib.get('internal_api')} {lib.get('version')}" for lib in libs})


def _scipy_blas_api():
    """threadpoolctl's internal_api name of the BLAS scipy was built against, or None if unknown."""
    try:
        import scipy.__config__
        name = str(scipy.__config__.CONFIG["Build Dependencies"]["blas"]["name"]).lower()
    except (ImportError, AttributeError, KeyError, TypeError):
        return None
    return next((api for api in ("mkl", "openblas", "blis", "flexiblas") if api in name), None)


@functools.lru_cache(maxsize=None)
def current_fingerprint():
    """This node's hardware fingerprint (computed once per process)."""
    names, driver, cuda = gpu_inventory()
    return {"cpu_model": _cpu_model(), "cpu_cores": os.cpu_count() or 1, "gpus": names,
            "gpu_count": len(names), "driver": driver, "cuda": cuda, "blas": blas_libraries()}


def _slug(text, limit=32):
    s = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
    for noise in ("-r-", "-tm-", "-cpu-", "-processor"):
        s = s.replace(noise, "-")
    return s[:limit].strip("-") or "x"


def fingerprint_id(fp):
    """A readable, stable file stem: cpu-cores, GPUs, BLAS, then a hash of the whole fingerprint."""
    canon = json.dumps({k: fp.get(k) for k in FINGERPRINT_KEYS}, sort_keys=True)
    digest = hashlib.sha256(canon.encode()).hexdigest()[:10]
    parts = [f"{_slug(fp.get('cpu_model'))}-{fp.get('cpu_cores')}c"]
    if fp.get("gpu_count"):
        parts.append(f"{fp['gpu_count']}x{_slug(fp['gpus'][0], 24)}")
    if fp.get("blas"):
        parts.append(_slug(fp["blas"][0].split()[0], 12))
    return "_".join(parts + [digest])


def profile_filename(fp=None):
    return fingerprint_id(fp or current_fingerprint()) + ".yaml"


def _same_node(a, b):
    return all(a.get(k) == b.get(k) for k in FINGERPRINT_KEYS)


# ---------------------------------------------------------------- where profiles live

def search_dirs():
    """Directories searched, in order: $HYBRIDBLAS_PROFILE_DIR, ~/.config/hybridblas/profiles, {prefix}/etc."""
    dirs = []
    env = os.environ.get(ENV_DIR)
    if env:
        dirs.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)
    dirs.append(Path.home() / ".config" / "hybridblas" / "profiles")
    dirs.append(Path(sys.prefix) / "etc" / "hybridblas")
    return dirs


def default_output_dir():
    """Where calibrate writes by default: the first search directory."""
    return search_dirs()[0]


def find_profile():
    """Path of the profile this node would load, or None."""
    explicit = os.environ.get(ENV_FILE)
    if explicit:
        return Path(explicit).expanduser()
    name = profile_filename()
    for d in search_dirs():
        p = d / name
        if p.is_file():
            return p
    return None


# ---------------------------------------------------------------- the profile object

def _interp_log(table, size):
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
        return _same_node(self.fingerprint, fp or current_fingerprint())

    # -- devices
    def _device(self, name):
        devs = self.data["devices"]
        if name in devs:
            return devs[name]
        kind = name.split("#")[0].split(":")[0]     # 'cpu#1' -> 'cpu', 'cuda:3' -> 'cuda'
        for other, entry in devs.items():
            if entry.get("kind", other.split("#")[0].split(":")[0]) == kind:
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
                return _interp_log(table, max(int(size), 1))
        return None

    def block_size(self, name, kind, dtype):
        """Best tile edge measured for this device (routine and dtype, else the device's default)."""
        entry = self._device(name)
        if entry is None:
            return None
        blocks = entry.get("block_size", {})
        for k in (kind,) + _KIND_FALLBACK.get(kind, ()):
            v = blocks.get(k, {}).get(_dtype_name(dtype)) if isinstance(blocks.get(k), dict) else None
            if v:
                return int(v)
        v = blocks.get("default")
        return int(v) if v else None

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
                return per_size[best].get(key) if key != "cpu_share" else _interp_log(
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


def _positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _validate(data):
    """Check the layout; raise ProfileError naming the first thing that is wrong."""
    if not isinstance(data, dict):
        raise ProfileError(f"expected a YAML mapping at top level, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ProfileError(f"format must be {FORMAT!r}, got {data.get('format')!r}")
    fp = data.get("fingerprint")
    if not isinstance(fp, dict) or any(k not in fp for k in FINGERPRINT_KEYS):
        raise ProfileError(f"fingerprint must be a mapping with keys {FINGERPRINT_KEYS}")
    devs = data.get("devices")
    if not isinstance(devs, dict) or not devs:
        raise ProfileError("devices must be a non-empty mapping of device name -> measurements")
    for name, entry in devs.items():
        if not isinstance(entry, dict):
            raise ProfileError(f"devices[{name!r}] must be a mapping")
        for kind, per_dtype in (entry.get("rates") or {}).items():
            if not isinstance(per_dtype, dict):
                raise ProfileError(f"devices[{name!r}].rates[{kind!r}] must map dtype -> {{size: flop/s}}")
            for dt, table in per_dtype.items():
                if not isinstance(table, dict) or not table:
                    raise ProfileError(f"devices[{name!r}].rates[{kind!r}][{dt!r}] must map size -> flop/s")
                for size, r in table.items():
                    if not (isinstance(size, int) and size > 0 and _positive(r)):
                        raise ProfileError(f"devices[{name!r}].rates[{kind!r}][{dt!r}]: bad entry "
                                           f"{size!r}: {r!r} (want positive int: positive flop/s)")
        for key, v in (entry.get("transfer") or {}).items():
            if key not in TRANSFER_KEYS or not _positive(v):
                raise ProfileError(f"devices[{name!r}].transfer[{key!r}] = {v!r}: want one of "
                                   f"{TRANSFER_KEYS} with positive bytes/s")
    for kind, per_dtype in (data.get("static") or {}).items():
        for dt, per_size in (per_dtype or {}).items():
            for size, entry in (per_size or {}).items():
                share = entry.get("cpu_share") if isinstance(entry, dict) else None
                if not isinstance(size, int) or not isinstance(share, (int, float)) or not 0 <= share < 1:
                    raise ProfileError(f"static[{kind!r}][{dt!r}][{size!r}] needs cpu_share in [0, 1)")
    return data


# ---------------------------------------------------------------- loading and saving

_cache = {}
_told = set()


def _tell_once(key, message, as_warning):
    if key in _told:
        return
    _told.add(key)
    if as_warning:
        warnings.warn(message, ProfileWarning, stacklevel=4)
    else:
        log.warning(message)


def read_profile(path):
    """Parse and validate one file; raise ProfileError with a one-line reason."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return Profile(data, path)


def load_profile(path=None):
    """The profile of this node, or None (defaults are used; the reason is told once).

    ``path`` (or $HYBRIDBLAS_PROFILE) names a file; otherwise the search directories are tried for
    the file named by this node's fingerprint. A profile from another node is ignored with a warning.
    """
    path = Path(path).expanduser() if path is not None else find_profile()
    if path is None:
        where = ", ".join(str(d) for d in search_dirs())
        _tell_once("none", f"hybridblas: no profile for this node ({profile_filename()}) in {where}; "
                           f"using default device rates (run `hybridblas-tune calibrate` to measure it)",
                   as_warning=False)
        return None
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None
    key = (str(path), stamp)
    if key in _cache:
        return _cache[key]
    try:
        prof = read_profile(path)
    except ProfileError as exc:
        _tell_once(key, f"hybridblas: ignoring profile {path}: {exc}; using default device rates",
                   as_warning=True)
        return None
    if not prof.matches():
        here = current_fingerprint()
        diff = [k for k in FINGERPRINT_KEYS if prof.fingerprint.get(k) != here.get(k)]
        _tell_once(key, f"hybridblas: ignoring profile {path}: it was measured on another node "
                        f"({prof.id}; differs in {', '.join(diff)}); using default device rates",
                   as_warning=True)
        return None
    _cache[key] = prof
    return prof


def save_profile(data, directory=None):
    """Write a profile (dict) as YAML named by its fingerprint; return the path. Atomic replace."""
    Profile(data)     # refuse to write what could not be read back
    directory = Path(directory).expanduser() if directory is not None else default_output_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (fingerprint_id(data["fingerprint"]) + ".yaml")
    tmp = path.with_suffix(f".yaml.tmp{os.getpid()}")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


def reset_notices():
    """Forget which notices were given and which files were loaded (tests, long sessions)."""
    _told.clear()
    _cache.clear()
