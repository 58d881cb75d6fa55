"""The one version string of the distribution (hybridblas, flapw and cisolver ship together)."""
__version__ = "0.2.0"
