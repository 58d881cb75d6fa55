"""Reading and writing profile files, and what a process is told about them.

``load_profile`` finds this node's file (``search``), reads and validates it once per file version, and never
raises for what a file holds. Missing: defaults and one INFO notice (rank 0, calls that several devices could
share). Unreadable, invalid or made on another node: one ProfileWarning and defaults. ``save_profile`` writes a
validated profile under its fingerprint's file name, atomically.
"""
import logging
import os
import threading
import warnings
from pathlib import Path

import yaml

from .model import Profile, ProfileError
from .node import current_fingerprint, differences, profile_filename
from .search import default_output_dir, find_profile, search_dirs

MAX_FILE_BYTES = 4 << 20            # profiles are a few kB; a larger file is not one
# Launchers' rank variables (Open MPI, MPICH/Intel MPI, PMIx, MVAPICH2, Slurm), read without importing MPI.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")

log = logging.getLogger("hybridblas")


class ProfileWarning(UserWarning):
    """A profile was found but ignored; defaults are used."""


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
        why = " ".join(str(getattr(exc, "problem", None) or exc).split())     # one line (a reader error spans two)
        raise ProfileError(f"not valid YAML{where}: {why}") from None
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
    diff = differences(prof.fingerprint, current_fingerprint())
    if diff:
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
    path = directory / profile_filename(data["fingerprint"])
    tmp = path.with_suffix(f".yaml.tmp{os.getpid()}")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


def reset_notices():
    """Forget which notices were given and which files were loaded (tests, long-running processes)."""
    _told.clear()
    _cache.clear()
