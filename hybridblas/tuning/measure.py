"""Timing primitives: one routine call through a Context, its LAWN 41 flops, host<->device copies."""
import functools
import time

import numpy as np

import hybridblas as hb

ROUTINES = ("herk", "her2k", "gemmt", "syrk", "gemm")
HERMITIAN = ("herk", "her2k")     # complex only: for real data they are syrk/syr2k


def combos(routines, dtypes):
    """(routine, dtype name) pairs worth measuring: herk/her2k only for complex dtypes."""
    out = []
    for r in routines:
        for dt in dtypes:
            if r in HERMITIAN and np.dtype(dt).kind != "c":
                continue
            out.append((r, np.dtype(dt).name))
    return out


def flops(routine, n, dtype):
    """LAWN 41 count of an n x n result with inner dimension n (triangle only for the triangular ones)."""
    per = 8 if np.dtype(dtype).kind == "c" else 2
    terms = 2 if routine in ("her2k", "syr2k") else 1
    entries = n * n if routine == "gemm" else n * (n + 1) / 2
    return per * terms * entries * n


def _random(rng, n, dtype):
    dt = np.dtype(dtype)
    x = rng.standard_normal((n, n))
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal((n, n))
    return np.asfortranarray(x.astype(dt))


@functools.lru_cache(maxsize=6)     # a size ladder of both dtypes
def _operands(n, dtype, seed):
    """A and B of one size and dtype, made once and shared by every routine and device of a calibration:
    at n = 8192 making fresh random data for each call cost more than all the timed calls together."""
    rng = np.random.default_rng(seed)
    a, b = _random(rng, n, dtype), _random(rng, n, dtype)
    a.flags.writeable = b.flags.writeable = False
    return a, b


def host_bytes(n, dtype):
    """Host memory one Call of edge n holds at its peak: A, B and C, and the temporaries of drawing A and B."""
    return 6 * n * n * np.dtype(dtype).itemsize


class Call:
    """Operands of one square call, allocated once; ``run(ctx)`` performs it (beta = 0, C preallocated)."""

    def __init__(self, routine, n, dtype, seed=0):
        if routine not in ROUTINES:
            raise ValueError(f"routine must be one of {ROUTINES}, got {routine!r}")
        self.routine, self.n, self.dtype = routine, n, np.dtype(dtype)
        a, b = _operands(n, self.dtype.name, seed)
        self.a = a
        self.b = b if routine in ("her2k", "gemmt", "gemm") else None
        self.c = np.zeros((n, n), dtype=dtype, order="F")
        self.flops = flops(routine, n, dtype)

    def run(self, ctx):
        fn = getattr(hb, self.routine)
        if self.b is None:
            fn(1.0, self.a, 0.0, self.c, context=ctx)
        else:
            fn(1.0, self.a, self.b, 0.0, self.c, context=ctx)


def bench(fn, min_time, min_reps=2, max_reps=20, warmup=True):
    """Best and median wall time of fn() over repetitions filling ``min_time`` seconds."""
    if warmup:
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0], times[len(times) // 2], len(times)


def transfer_rates(index, nbytes, min_time):
    """bytes/s host->device and device->host, from pinned and from pageable host memory (CuPy)."""
    import cupy
    with cupy.cuda.Device(index):
        dev = cupy.empty(nbytes, dtype=cupy.uint8)
        pageable = np.ones(nbytes, dtype=np.uint8)
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        pinned = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
        pinned[:] = 1
        stream = cupy.cuda.Stream(non_blocking=True)

        def h2d(src):
            dev.set(src, stream=stream)
            stream.synchronize()

        def d2h(dst):
            dev.get(stream=stream, out=dst)
            stream.synchronize()

        out = {}
        for key, fn, buf in (("h2d_pinned", h2d, pinned), ("h2d_pageable", h2d, pageable),
                             ("d2h_pinned", d2h, pinned), ("d2h_pageable", d2h, pageable)):
            best, _, _ = bench(lambda: fn(buf), min_time, min_reps=3)
            out[key] = nbytes / best
        del dev, pinned, mem
        return out
