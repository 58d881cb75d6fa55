"""Where the shared interaction files live: $CISOLVER_DATA, else <repo>/../shared/data/interactions."""
import os
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def interactions_dir():
    """The interaction folder, or None when it cannot be found."""
    env = os.environ.get("CISOLVER_DATA")
    candidates = [Path(env)] if env else []
    candidates += [_REPO.parent / "shared" / "data" / "interactions", _REPO / "shared" / "data" / "interactions"]
    for c in candidates:
        if c.is_dir():
            return c
    return None


def resolve_interaction(name):
    """A path as given, or a bare name ('usdb', 'gxpf1a.snt') looked up in the interaction folder."""
    p = Path(name)
    if p.is_file():
        return p
    folder = interactions_dir()
    if folder is not None:
        for cand in (folder / name, folder / f"{name}.snt"):
            if cand.is_file():
                return cand
    where = f" or in {folder}" if folder else " (no interaction folder found; set CISOLVER_DATA)"
    raise FileNotFoundError(f"interaction {name!r} not found as a file{where}")
