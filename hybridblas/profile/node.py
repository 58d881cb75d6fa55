"""This node's fingerprint and the file name of its profile.

The fingerprint says which hardware and BLAS this is (CPU model and cores, GPU names and count, driver and
CUDA runtime, BLAS libraries), never the hostname, so one shared directory can hold the profiles of many node
types. ``profile_filename`` turns it into a readable, stable file name; ``differences`` says in which fields
two fingerprints differ (a profile made on another node).
"""
import functools
import hashlib
import json
import os
import platform
import re

FINGERPRINT_KEYS = ("cpu_model", "cpu_cores", "gpus", "gpu_count", "driver", "cuda", "blas")


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
    from .. import blas_threads, host_blas  # noqa: F401  (loads scipy's BLAS, the one tiles run on)
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
    """The profile's file name for fingerprint ``fp`` (this node's by default)."""
    return fingerprint_id(fp or current_fingerprint()) + ".yaml"


def differences(a, b):
    """The fingerprint fields in which ``a`` and ``b`` differ; empty for the same node."""
    return [k for k in FINGERPRINT_KEYS if a.get(k) != b.get(k)]
