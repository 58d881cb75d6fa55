"""Per-node profiles: measured rates, block sizes, the CPU's static share and transfer rates.

A profile is a YAML file written by ``hybridblas-tune calibrate`` and named by the node's hardware
fingerprint (CPU model and cores, GPU names and count, driver/CUDA, BLAS library), never the hostname,
so one shared directory can hold the profiles of many node types. It is looked for in
``$HYBRIDBLAS_PROFILE_DIR``, then ``$XDG_CONFIG_HOME/hybridblas/profiles/`` (``~/.config/...`` by default),
then ``{sys.prefix}/etc/hybridblas/`` (``$HYBRIDBLAS_PROFILE`` names one file explicitly). The whole file
is validated when it is loaded, so lookups can trust it. Missing: defaults and one INFO notice (rank 0,
calls that several devices could share). Unreadable, invalid or made on another node: one ProfileWarning
and defaults, never an exception.
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
import threading
import warnings
from pathlib import Path

import numpy as np
import yaml

__all__ = ["Profile", "ProfileError", "ProfileWarning", "load_profile", "read_profile", "save_profile",
           "current_fingerprint", "fingerprint_id", "profile_filename", "search_dirs", "user_config_dir",
           "find_profile", "launcher_rank"]

FORMAT = "hybridblas-profile/1"
ENV_DIR = "HYBRIDBLAS_PROFILE_DIR"
ENV_FILE = "HYBRIDBLAS_PROFILE"
FINGERPRINT_KEYS = ("cpu_model", "cpu_cores", "gpus", "gpu_count", "driver", "cuda", "blas")
# A call of one routine may use the measured rate of a routine with the same kernel shape.
_KIND_FALLBACK = {"herk": ("syrk",), "syrk": ("herk",), "her2k": ("syr2k", "herk"),
                  "syr2k": ("her2k", "syrk"), "gemmt": ("gemm",), "gemm": ("gemmt",)}
ROUTINE_KINDS = tuple(_KIND_FALLBACK)
DTYPES = ("float32", "float64", "complex64", "complex128")
TRANSFER_KEYS = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")
BLOCK_SIZE_RANGE = (32, 65536)      # tile edges a profile may give; outside it a call would be all overhead
MAX_FILE_BYTES = 4 << 20            # profiles are a few kB; a larger file is not one
# Launchers' rank variables (Open MPI, MPICH/Intel MPI, PMIx, MVAPICH2, Slurm), read without importing MPI.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")

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

def user_config_dir():
    """$XDG_CONFIG_HOME/hybridblas/profiles, or ~/.config/hybridblas/profiles where it is unset, empty or
    relative (the XDG base directory rules)."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "hybridblas" / "profiles"


def search_dirs():
    """Directories searched, in order: $HYBRIDBLAS_PROFILE_DIR, user_config_dir(), {sys.prefix}/etc/hybridblas."""
    dirs = []
    env = os.environ.get(ENV_DIR)
    if env:
        dirs.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)
    dirs.append(user_config_dir())
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
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
    kind = name.split("#")[0].split(":")[0]
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


# ---------------------------------------------------------------- loading and saving

_cache = {}         # (path, mtime) -> the Profile, or None for a file judged unusable
_told = set()
_lock = threading.Lock()


def launcher_rank():
    """This process's rank as an MPI launcher or Slurm sets it in the environment (RANK_VARIABLES); 0 when
    none does. Nothing is imported: a program that does not use MPI must not start it."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def _notice_missing():
    """The one 'no profile' notice of the process, on rank 0 only, at INFO level (CLIs show it)."""
    if "none" in _told or launcher_rank() != 0:
        return
    _told.add("none")
    where = ", ".join(str(d) for d in search_dirs())
    log.info(f"hybridblas: no profile for this node ({profile_filename()}) in {where}; using default device "
             f"rates (run `hybridblas-tune calibrate` to measure it)")


def _warn_once(key, message):
    if key not in _told:
        _told.add(key)
        warnings.warn(message, ProfileWarning, stacklevel=4)


def read_profile(path):
    """Parse and validate one file; raise ProfileError with a one-line reason (and nothing else)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ProfileError(f"larger than {MAX_FILE_BYTES >> 20} MiB, which no profile is")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ProfileError("not a profile: nested too deeply") from None
    return Profile(data, path)


def _judge(path, key):
    """The profile in ``path`` if it is valid and this node's; else None after one ProfileWarning."""
    try:
        prof = read_profile(path)
    except ProfileError as exc:
        _warn_once(key, f"hybridblas: ignoring profile {path}: {exc}; using default device rates")
        return None
    if not prof.matches():
        here = current_fingerprint()
        diff = [k for k in FINGERPRINT_KEYS if prof.fingerprint.get(k) != here.get(k)]
        _warn_once(key, f"hybridblas: ignoring profile {path}: it was measured on another node "
                        f"({prof.id}; differs in {', '.join(diff)}); using default device rates")
        return None
    return prof


def load_profile(path=None, *, tell_missing=True):
    """The profile of this node, or None: defaults are used. Never raises for what a file holds.

    ``path`` (or $HYBRIDBLAS_PROFILE) names a file; otherwise the search directories are tried for
    the file named by this node's fingerprint. A file that cannot be read, is not valid YAML, has the
    wrong layout or a bad value anywhere, or was measured on another node, gives one ProfileWarning per
    process (until the file changes) and None. No file at all gives one INFO notice through the
    'hybridblas' logger, on MPI rank 0 only, unless ``tell_missing`` is False (a Context of one device,
    which has nothing to split).
    """
    with _lock:
        path = Path(path).expanduser() if path is not None else find_profile()
        if path is None:
            if tell_missing:
                _notice_missing()
            return None
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None
        key = (str(path), stamp)
        if key not in _cache:
            _cache[key] = _judge(path, key)
        return _cache[key]


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
    """Forget which notices were given and which files were loaded (tests, long-running processes)."""
    _told.clear()
    _cache.clear()
