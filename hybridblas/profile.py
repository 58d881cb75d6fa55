"""Per-node profiles (rates, block sizes, CPU share). Placeholder loader until the tuning issue lands:
it finds no profile, says so once, and the library uses its defaults."""
from .context import warn_once

__all__ = ["load_profile"]


def load_profile():
    """The profile of this node, or None (defaults are used and a notice is given once)."""
    warn_once("hybridblas: no node profile found; using default device rates "
              "(run `hybridblas-tune calibrate` to measure this node)")
    return None
