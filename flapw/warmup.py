"""What the first k-point of a run would pay once, paid before the k-point loop (``flapw build``).

Found in the code (flapw, hybridblas, CuPy), on first use in a process:

* host arrays: the page faults of the first writes to A, B, X (Y) and H, S (H and S alone where the operands
  live on a GPU). The CLI keeps these buffers in one Workspace for every k-point; ``prepare`` allocates them for
  the largest k-point and writes each page once, on all cores (TiO2 Kmax 2.5 on 2 cores: 24 s of its
  'matching A, B' stage were such faults);
* the k-independent data (radial functions, T, the step-function table): computed before the loop;
* GPUs: the CUDA context of each GPU (on its first allocation), CuPy's cuBLAS and cuSOLVER handles,
  CuPy's elementwise kernels (compiled once per machine into its kernel cache, loaded once per process),
  hybridblas's per-GPU streams and pinned staging rings, and the device memory pool's first blocks.
  ``prepare`` builds the same crystal at a small Kmax through the same backend and arrays (every kernel
  and call of a build, and with ``nev`` a solve; on the CPU alone this is all it does, for hybridblas's
  and the thread pools' first calls) and runs one product large enough to be split over every device of
  the context; with the operands on a GPU also a her2k and a herkx of that size (cuBLAS loads a kernel on its
  first launch, and a size's kernels differ from the small build's: on two H100s the first NaCl Kmax 3.0
  k-point took 29–37 ms against 25 ms for the later ones without them, 25–28 ms with them);
* device arrays, or host arrays with the operands on a GPU, and a k-point whose products come to at most
  FULL_SIZE_FLOPS (about 0.1 s on one H100): the largest k-point built once whole, after the small build (host
  arrays: in the k-points' workspace). Its first build at its own size pays what a small one does not: CuPy's
  pinned staging buffers and memory-pool blocks at that size, kernels specialised for its index ranges, and with
  host arrays the tiled path of a product split over the GPUs. On two H100s, 8 k-points of NaCl Kmax 3.0: the
  first k-point's host time 9.8 ms against 6.3 ms for the later ones without it, and the k-point loop 1.77-1.88 x
  as fast on two GPUs as on one without it, 1.86-1.93 x with it (the one-GPU loop unchanged); the run's wall clock
  2.1-3.1 s either way. NaCl Kmax 3.5 with host arrays and an empty kernel cache, its calls then split over two
  GPUs: the first k-point compiled six kernels of the split product (0.44 s) before it;
* not paid here: kernels for arrays past 2 GiB (CuPy's 64-bit-index variants), compiled on a machine's first
  build of that size (TiO2 Kmax 3.0: 0.4 s of its first k-point), then read from CuPy's kernel cache;
* with a context that emulates FP64 on INT8 tensor cores (``flapw build --emulate``), the kernels of its
  emulated products, compiled for the build's inner dimension on every GPU of the context beside the warm-up;
* not paid here: hybridblas page-locks a host operand when a second call meets it (its pin policy), so the
  first k-point with host arrays on GPUs still moves its operands through the staging ring until its
  buffers are locked; they stay locked for the later k-points (the same workspace).
"""
import logging
import math
import time

import numpy as np

import hybridblas as hb

from .eigen import solve
from .hsdla import _array_module, _runs_on_gpu, build_hs, operands_place

__all__ = ["prepare"]

TINY_N_G = 200            # plane waves of the warm-up build
FULL_SIZE_FLOPS = 5e12    # device arrays: the largest k-point's products (refined count) up to which it is built whole
SPLIT_EDGE = 4608         # the warm-up product: 4 n³ = 3.9e11 flops, above hybridblas's one-device limit
log = logging.getLogger("flapw")


def prepare(cell, backend, arrays, method, batch_atoms, *, interstitial=False, nev=0, workspace=None,
            overlap=False, operands=None):
    """Pay the first-use costs of builds of ``cell`` (its largest k-point) before they run; returns
    {what: seconds}. A warm-up that runs out of memory is skipped with a note (the build itself then
    decides what fits)."""
    seconds = {}
    compiling = _emulation_kernels(cell, backend, batch_atoms)
    place = operands_place(arrays, operands, backend)
    if workspace is not None and arrays == "host":
        t0 = time.perf_counter()
        workspace.reserve(cell, method, batch_atoms, overlap, operands=place)
        seconds["workspace"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        tiny = cell.with_kmax(min(cell.kmax, (6 * math.pi ** 2 * TINY_N_G / cell.omega) ** (1 / 3)))
        h, s = build_hs(tiny, method, interstitial=interstitial, lower_only=True, blas=backend, arrays=arrays,
                        batch_atoms=batch_atoms, overlap=False, operands=place)
        if nev and interstitial and tiny.n_g:
            solve(h, s, min(nev, tiny.n_g))
        del h, s
        if arrays == "device" or _runs_on_gpu(backend):
            xp, hxp = _array_module(place), _array_module(arrays)        # the operands', H's and S's
            a = xp.ones((SPLIT_EDGE, SPLIT_EDGE), complex, order="F")
            c = hxp.zeros((SPLIT_EDGE, SPLIT_EDGE), complex, order="F")
            backend.herk(1.0, a, 0.0, c)
            if xp is not np:        # a build's other products, at the split size, on the operands' GPU
                c = c if hxp is xp else xp.zeros_like(a)
                backend.her2k(1.0, a, a, 0.0, c)
                backend.herkx(1.0, a, a, 1.0, c)
                xp.cuda.get_current_stream().synchronize()
            del a, c
        if (arrays == "device" or place == "device") and cell.n_g and build_flops(cell) <= FULL_SIZE_FLOPS:
            t1 = time.perf_counter()       # host arrays: in the k-points' own workspace (H and S page-locked there)
            h, s = build_hs(cell, method, interstitial=interstitial, lower_only=True, blas=backend, arrays=arrays,
                            batch_atoms=batch_atoms, overlap=False, operands=place,
                            workspace=workspace if arrays == "host" else None)
            del h, s
            _array_module(place).cuda.get_current_stream().synchronize()
            seconds["warm-up: full-size build"] = time.perf_counter() - t1
    except MemoryError as exc:
        log.info("warm-up skipped: out of memory (%s: %s)", type(exc).__name__, exc)
    if compiling is not None:
        compiling.join()
    seconds["warm-up"] = time.perf_counter() - t0
    return seconds


def build_flops(cell):
    """The products of one refined build of ``cell`` (zherk AᴴA and XᴴX, zher2k, zherkx: 20 N_G² N_A N_L)."""
    return 20.0 * cell.n_g ** 2 * cell.n_atoms * cell.n_l


def _emulation_kernels(cell, backend, batch_atoms):
    """With a hybridblas context that emulates FP64 (emulation="int8"), start compiling the kernels of its
    emulated products at this build's inner dimension (batch_atoms N_L) on its GPUs; the thread, or None."""
    ctx = getattr(backend, "context", None)
    if ctx is None and getattr(backend, "name", None) == "hybridblas":
        ctx = hb.default_context()
    if getattr(ctx, "emulation", None) is None:
        return None
    gpus = [d.index for d in ctx.devices if d.kind == "cuda"]
    if not gpus:
        return None
    return hb.lowlevel.prepare_kernels(complex, gpus, emulation_bits=ctx.emulation_bits,
                                       k=max(1, batch_atoms * cell.n_l))
