"""Where interaction files are found: an existing path as given, else a name ('usdb', 'gxpf1a.snt') looked up in
$CISOLVER_DATA, then among the files shipped in cisolver/data/interactions (provenance: that folder's README)."""
import os
from importlib import resources
from pathlib import Path

ENV = "CISOLVER_DATA"


def packaged_interactions():
    """The folder of interaction files installed with cisolver (usdb, ckpot, gxpf1a, kb3g)."""
    return Path(resources.files(__package__) / "data" / "interactions")


def interaction_folders():
    """The folders searched for a bare name, in order: $CISOLVER_DATA when set, then the packaged files."""
    env = os.environ.get(ENV)
    if not env:
        return [packaged_interactions()]
    if not Path(env).is_dir():
        raise ValueError(f"{ENV} must name a folder of .snt files, got {env!r}")
    return [Path(env), packaged_interactions()]


def resolve_interaction(name):
    """A path as given when it is an existing file, else ``name`` or ``name.snt`` in :func:`interaction_folders`."""
    p = Path(name)
    if p.is_file():
        return p
    folders = interaction_folders()
    for folder in folders:
        for cand in (folder / name, folder / f"{name}.snt"):
            if cand.is_file():
                return cand
    shipped = ", ".join(sorted(f.stem for f in packaged_interactions().glob("*.snt")))
    raise FileNotFoundError(f"interaction {str(name)!r} not found as a file or in {', '.join(map(str, folders))} "
                            f"(shipped: {shipped}; {ENV} adds a folder of .snt files)")
