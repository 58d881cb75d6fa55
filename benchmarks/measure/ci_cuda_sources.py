"""Compile cisolver's CUDA module (cisolver.cuda_modules) with NVRTC for each architecture and dtype, as CuPy
would, and check that every kernel it lists is in the cubin. NVRTC needs no GPU when the architecture is given:

    python3 -m benchmarks.cisolver cuda-sources [--arch 80 90] [--repeat 1]

(a Python with CuPy; prints one line per (architecture, dtype) with the kernel count and the compile's wall and
CPU time (NVRTC runs on one thread: the CPU time is what an idle machine's wall time would be); exits 1 when a
compilation fails or a kernel is missing).
"""
import resource
import time

import numpy as np

from cisolver import cuda_modules
from hybridblas.console import positive_int

# what CuPy adds to a RawModule's options when it compiles with NVRTC for a device (cupy.cuda.compiler)
CUPY_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")


def _cpu_seconds():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def compile_module(code, arch, options=cuda_modules.OPTIONS):
    """(cubin bytes, wall seconds, CPU seconds) of ``code`` compiled by NVRTC for sm_<arch>."""
    from cupy.cuda import nvrtc
    opts = [*options, *CUPY_OPTIONS, f"-arch=sm_{arch}"]
    prog = nvrtc.createProgram(code, "cisolver.cu", [], [])
    try:
        t0, c0 = time.perf_counter(), _cpu_seconds()
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC failed for sm_{arch}: {exc}\n{nvrtc.getProgramLog(prog)}") from None
        took, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
        return nvrtc.getCUBIN(prog), took, cpu
    finally:
        nvrtc.destroyProgram(prog)


def entry_points(cubin):
    """Names of the kernels in a cubin (its .text.<name> sections)."""
    import re
    return {m.decode() for m in re.findall(rb"\.text\.([A-Za-z_][A-Za-z0-9_]*)\x00", cubin)}


def check(arch, dtype):
    """(wall seconds, CPU seconds, kernel count, missing kernels) for one architecture and dtype."""
    code, names = cuda_modules.source(dtype)
    cubin, took, cpu = compile_module(code, arch)
    found = entry_points(cubin)
    return took, cpu, len(names), sorted(set(names) - found)


def add_arguments(ap):
    ap.add_argument("--arch", nargs="+", default=["80", "90"], help="compute capabilities, e.g. 80 90")
    ap.add_argument("--repeat", type=positive_int, default=1, help="compilations per case (the time is the least)")


def run(args):
    failed = False
    for arch in args.arch:
        for dtype in (np.float32, np.float64):
            try:
                runs = [check(arch, dtype) for _ in range(args.repeat)]
            except RuntimeError as exc:
                print(f"sm_{arch} {np.dtype(dtype).name}: {exc}")
                failed = True
                continue
            took, cpu, count, missing = min(runs)
            print(f"sm_{arch} {np.dtype(dtype).name}: {count} kernels compiled in {took:.2f} s ({cpu:.2f} s CPU)"
                  + (f", MISSING {missing}" if missing else ""))
            failed |= bool(missing)
    return 1 if failed else 0
