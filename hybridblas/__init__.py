"""hybridblas: one level-3 BLAS call on every CPU core and GPU of a node at once.

    import hybridblas as hb
    c = hb.herk(1.0, a)                                  # lower triangle of A A^H
    c = hb.gemmt(1.0, a, x, 0.0, c, transa="C", context=hb.Context(devices="all", strategy="dynamic"))

The routines follow the reference BLAS contract (scipy.linalg.blas argument order); ``context=``
chooses devices, strategy and block size. Importing this package touches no GPU and imports neither CuPy
nor mpi4py. Besides the routines: ``blas_threads`` (cores, BLAS thread limit), ``distributed`` (MPI
helpers), ``lowlevel`` (single BLAS calls for hot loops), ``peers`` (cuBLAS and cuBLASXt baselines),
``array_module`` and ``gpu_multiprocessors``; ``console``, ``devspec``, ``memory`` and ``testing`` for
the tools built on the library. Every name in ``__all__`` is public; other modules are internal.
"""
import hybridblas_launcher as _launcher

with _launcher.loading(__name__):   # `python -m hybridblas.tuning` only: Ctrl-C ends the tool (one line, 130)
    from . import blas_threads, console, devspec, distributed, lowlevel, memory, peers, testing, workers
    from ._version import __version__
    from .batched import gemm_batched
    from .context import Context, default_context, set_default_context
    from .devspec import DeviceSpec, gpu_count, gpu_multiprocessors, parse_devices
    from .faults import DeviceFailure, DeviceFailureWarning
    from .memory import InsufficientMemory
    from .problem import array_module
    from .profile.store import load_profile
    from .routines import gemm, gemmt, her2k, herk, herkx, syr2k, syrk
del _launcher

__all__ = ["herk", "her2k", "gemmt", "herkx", "syrk", "syr2k", "gemm", "gemm_batched",
           "Context", "default_context", "set_default_context", "load_profile",
           "DeviceSpec", "parse_devices", "gpu_count", "gpu_multiprocessors", "array_module", "InsufficientMemory",
           "DeviceFailure", "DeviceFailureWarning",
           "blas_threads", "console", "devspec", "distributed", "lowlevel", "memory", "peers", "testing",
           "workers", "__version__"]
