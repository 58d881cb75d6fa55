"""Per-node auto-tuning: measure this node with hybridblas itself and write its YAML profile.

    hybridblas-tune info | calibrate [--quick] | show      (also: python -m hybridblas.tuning)
"""
from .calibrate import Settings, calibrate, calibrate_to

__all__ = ["Settings", "calibrate", "calibrate_to"]
