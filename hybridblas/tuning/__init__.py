"""Per-node auto-tuning: measure this node with hybridblas itself and write its YAML profile.

    hybridblas-tune info | calibrate [--quick] | show      (also: python -m hybridblas.tuning)
"""
import hybridblas_launcher as _launcher

with _launcher.loading(__name__):   # `python -m hybridblas.tuning` only: Ctrl-C ends the tool (one line, 130)
    from .calibrate import Settings, calibrate, calibrate_to
del _launcher

__all__ = ["Settings", "calibrate", "calibrate_to"]
