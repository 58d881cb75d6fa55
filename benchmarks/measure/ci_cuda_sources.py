"""Compile cisolver's CUDA units (cisolver.cuda_modules) with NVRTC for each architecture and dtype, as CuPy
would, and check that every kernel a unit lists is in its cubin. NVRTC needs no GPU when the architecture is given:

    python3 -m benchmarks.cisolver cuda-sources [--arch 80 90] [--repeat 1] [--together]

(a Python with CuPy; prints per (architecture, dtype) each unit's kernel count and compile wall and CPU time, one
unit after the other (one NVRTC call runs on one thread: the CPU time is what an idle core's wall time would be),
then the largest unit, which is the wall of ``cuda_modules.prepare`` when every unit has a core of its own;
--together also compiles all units at once on threads, as ``prepare`` does, and prints that wall; exits 1 when a
compilation fails or a kernel is missing).
"""
import os
import resource
import threading
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
    """[(unit, wall seconds, CPU seconds, kernel count, missing kernels)] for one architecture and dtype, the
    units compiled one after the other."""
    found = []
    for unit, code, names in cuda_modules.units(dtype):
        cubin, took, cpu = compile_module(code, arch)
        found.append((unit, took, cpu, len(names), sorted(set(names) - entry_points(cubin))))
    return found


def together(arch, dtype):
    """Wall seconds of every unit compiled at once, one thread each (NVRTC releases the GIL)."""
    threads = [threading.Thread(target=compile_module, args=(code, arch)) for _, code, _ in cuda_modules.units(dtype)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - t0


def add_arguments(ap):
    ap.add_argument("--arch", nargs="+", default=["80", "90"], help="compute capabilities, e.g. 80 90")
    ap.add_argument("--repeat", type=positive_int, default=1, help="compilations per case (the time is the least)")
    ap.add_argument("--together", action="store_true", help="also compile all units at once, one thread each")


def run(args):
    failed = False
    for arch in args.arch:
        for dtype in (np.float32, np.float64):
            case = f"sm_{arch} {np.dtype(dtype).name}"
            try:
                runs = [check(arch, dtype) for _ in range(args.repeat)]
            except RuntimeError as exc:
                print(f"{case}: {exc}")
                failed = True
                continue
            best = [min(unit, key=lambda r: r[1]) for unit in zip(*runs)]     # each unit's fastest compile
            for unit, took, cpu, count, missing in best:
                print(f"{case} {unit:>14}: {count:2d} kernels compiled in {took:.2f} s ({cpu:.2f} s CPU)"
                      + (f", MISSING {missing}" if missing else ""))
                failed |= bool(missing)
            largest = max(best, key=lambda r: r[1])
            print(f"{case}: {len(best)} units, {sum(r[3] for r in best)} kernels; largest unit {largest[0]} "
                  f"{largest[1]:.2f} s, all {sum(r[1] for r in best):.2f} s one after the other")
            if args.together:
                print(f"{case}: all units at once on {len(best)} threads ({os.cpu_count()} cores): "
                      f"{min(together(arch, dtype) for _ in range(args.repeat)):.2f} s wall")
    return 1 if failed else 0
