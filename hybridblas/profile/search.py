"""Where profiles are looked for, in order, and which file this node would load.

``$HYBRIDBLAS_PROFILE`` names one file explicitly; otherwise the file named by this node's fingerprint is
looked for in ``$HYBRIDBLAS_PROFILE_DIR`` (``os.pathsep``-separated), then
``$XDG_CONFIG_HOME/hybridblas/profiles/`` (``~/.config/...`` by default), then ``{sys.prefix}/etc/hybridblas/``.
"""
import os
import sys
from pathlib import Path

from .node import profile_filename

ENV_DIR = "HYBRIDBLAS_PROFILE_DIR"
ENV_FILE = "HYBRIDBLAS_PROFILE"


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
