"""Per-node profiles: measured rates, block sizes, the CPU's static share and transfer rates.

A profile is a YAML file written by ``hybridblas-tune calibrate``. Its parts, one job each:

* ``node``: this node's hardware fingerprint and the file name of its profile;
* ``search``: where profiles are looked for, in order, and which file this node would load;
* ``model``: ``Profile``, the validated data and its lookups, and ``ProfileError``;
* ``store``: reading and writing the files, ``load_profile`` and its notices and ``ProfileWarning``.

The names below keep their ``hybridblas.profile.<name>`` import path (``hybridblas.profile.ProfileWarning``
for warning filters); ``hybridblas.load_profile`` is the entry point a program uses.
"""
from .model import Profile, ProfileError
from .node import current_fingerprint, fingerprint_id, profile_filename
from .search import find_profile, search_dirs, user_config_dir
from .store import ProfileWarning, launcher_rank, load_profile, read_profile, save_profile

__all__ = ["Profile", "ProfileError", "ProfileWarning", "load_profile", "read_profile", "save_profile",
           "current_fingerprint", "fingerprint_id", "profile_filename", "search_dirs", "user_config_dir",
           "find_profile", "launcher_rank"]
