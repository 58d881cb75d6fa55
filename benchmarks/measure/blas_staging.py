"""How fast can host (numpy, pageable) data reach the GPUs of this node?  Three ways, side by side.

1. copy into pinned buffers with T host threads (the staging ring's way), then DMA;
2. cudaHostRegister the caller's memory in chunks (from T threads), DMA straight from it, unregister;
3. both GPUs (all GPUs) pulling at once, from registered memory and through the staging ring.

The answer decides how hybridblas feeds the GPUs; see docs/performance.md.

    python3 -m benchmarks.blas staging --gib 4 --json out.json
"""
import concurrent.futures
import os
import time

import numpy as np

from hybridblas.console import check_output_path, positive_float

from benchmarks.common import write_json


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} returned cudaError {status}")


def gbps(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 2)


def timed(fn):
    """Wall seconds of fn()."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def copy_rates(src, pinned, threads):
    """pageable -> pinned copy GB/s with each thread count (column blocks, one memcpy each)."""
    out = {}
    cols = src.shape[1]
    for t in threads:
        edges = [cols * p // t for p in range(t + 1)]
        with concurrent.futures.ThreadPoolExecutor(t) as pool:
            def run():
                list(pool.map(lambda ab: np.copyto(pinned[:, ab[0]:ab[1]], src[:, ab[0]:ab[1]]),
                              zip(edges, edges[1:])))
            run()
            out[t] = gbps(2 * src.nbytes, min(timed(run), timed(run))) / 2   # one-way bytes per second
    return out


def register_rates(x, lib, threads, chunk):
    """cudaHostRegister / Unregister GB/s of x in chunks spread over T threads."""
    out = {}
    base = x.ctypes.data
    spans = [(base + o, min(chunk, x.nbytes - o)) for o in range(0, x.nbytes, chunk)]
    for t in threads:
        with concurrent.futures.ThreadPoolExecutor(t) as pool:
            t_reg = timed(lambda: [check(st, "cudaHostRegister")
                                   for st in pool.map(lambda s: lib.cudaHostRegister(s[0], s[1], 0), spans)])
            t_unreg = timed(lambda: [check(st, "cudaHostUnregister")
                                     for st in pool.map(lambda s: lib.cudaHostUnregister(s[0]), spans)])
        out[t] = {"register": gbps(x.nbytes, t_reg), "unregister": gbps(x.nbytes, t_unreg)}
    return out


def dma_rates(x, lib, gpus, chunk):
    """H2D GB/s from registered memory: each GPU alone, then all at once on distinct parts."""
    import cupy
    rt = cupy.cuda.runtime
    base = x.ctypes.data
    spans = [(base + o, min(chunk, x.nbytes - o)) for o in range(0, x.nbytes, chunk)]
    for p, n in spans:
        check(lib.cudaHostRegister(p, n, 0), "cudaHostRegister")
    out = {}
    try:
        bufs, streams = [], []
        for g in gpus:
            with cupy.cuda.Device(g):
                bufs.append(cupy.empty(x.nbytes, dtype=np.uint8))
                streams.append(cupy.cuda.Stream(non_blocking=True))

        def pull(i, lo, hi):
            # one copy may not span two registrations (cudaErrorInvalidValue): cut at their edges
            with cupy.cuda.Device(gpus[i]):
                for c0 in range(lo - lo % chunk, hi, chunk):
                    a, b = max(lo, c0), min(hi, c0 + chunk)
                    rt.memcpyAsync(bufs[i].data.ptr + a, base + a, b - a, rt.memcpyHostToDevice, streams[i].ptr)
                streams[i].synchronize()
        for i, g in enumerate(gpus):
            pull(i, 0, x.nbytes)
            out[f"gpu{g}_alone"] = gbps(x.nbytes, timed(lambda: pull(i, 0, x.nbytes)))
        part = x.nbytes // len(gpus)
        with concurrent.futures.ThreadPoolExecutor(len(gpus)) as pool:
            t = timed(lambda: list(pool.map(lambda i: pull(i, i * part, (i + 1) * part), range(len(gpus)))))
            out["all_at_once_distinct_parts"] = gbps(part * len(gpus), t)
            t = timed(lambda: list(pool.map(lambda i: pull(i, 0, x.nbytes), range(len(gpus)))))
            out["all_at_once_same_bytes_each"] = gbps(x.nbytes * len(gpus), t)
    finally:
        for p, n in spans:
            lib.cudaHostUnregister(p)
    return out


def ring_rates(x, gpus, threads):
    """H2D GB/s through hybridblas's pinned staging ring: one GPU, then all at once on distinct parts."""
    import cupy
    from hybridblas import cuda_transfer
    from hybridblas.devices.cuda import CUDADevice
    rows = x.shape[0]
    cols = x.shape[1]
    out = {}
    devs = [CUDADevice(g) for g in gpus]
    rings = [d.ring_pool("in").take() for d in devs]
    dsts, streams = [], []
    for g in gpus:
        with cupy.cuda.Device(g):
            dsts.append(cupy.empty((rows, cols), dtype=x.dtype, order="F"))
            streams.append(cupy.cuda.Stream(non_blocking=True))

    def up(i, c0, c1):
        with cupy.cuda.Device(gpus[i]):
            cuda_transfer.upload(dsts[i][:, c0:c1], x[:, c0:c1], rings[i], streams[i])
            streams[i].synchronize()
    edges = [cols * p // len(gpus) for p in range(len(gpus) + 1)]
    for n in threads:
        cuda_transfer.set_copy_threads(n)
        up(0, 0, cols)
        row = {"one_gpu": gbps(x.nbytes, timed(lambda: up(0, 0, cols)))}
        with concurrent.futures.ThreadPoolExecutor(len(gpus)) as pool:
            t = timed(lambda: list(pool.map(lambda i: up(i, edges[i], edges[i + 1]), range(len(gpus)))))
        row["all_at_once_distinct_parts"] = gbps(x.nbytes, t)
        out[n] = row
        print(f"  ring, {n} copy threads:", row, flush=True)
    cuda_transfer.set_copy_threads(None)
    out["ring_slot_MiB"] = rings[0].slot_bytes >> 20
    return out


def add_arguments(ap):
    ap.add_argument("--gib", type=positive_float, default=4.0, help="size of the host operand")
    ap.add_argument("--chunk-mib", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--big-gib", type=float, default=0.0,
                    help="also register one operand this large whole and in 1 GiB chunks (the first calls at "
                         "n = 24576 locked 10-30 GB at only ~11 GB/s: is it the size, or the 2nd pass?)")
    ap.add_argument("--json", default=None)


def run(args):
    check_output_path(args.json, "--json")
    import cupy
    cores = len(os.sched_getaffinity(0))
    threads = sorted({t for t in (1, 2, 4, 8, 16, 32, 64) if t <= cores})
    gpus = list(range(cupy.cuda.runtime.getDeviceCount()))
    rows = 8192
    cols = int(args.gib * 2**30) // (16 * rows)
    x = np.asfortranarray(np.random.default_rng(0).standard_normal((rows, 2 * cols)).view(np.complex128))
    res = {"benchmark": "bench_staging", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "cores": cores, "gpus": len(gpus), "bytes": x.nbytes}
    pinned_mem = cupy.cuda.alloc_pinned_memory(min(x.nbytes, 1 << 30))
    pc = (1 << 30) // (16 * rows)
    pinned = np.frombuffer(pinned_mem, dtype=np.complex128, count=rows * pc).reshape((rows, pc), order="F")
    res["copy_to_pinned_GBps"] = copy_rates(x[:, :pc], pinned, threads)
    print("copy pageable->pinned GB/s by threads:", res["copy_to_pinned_GBps"], flush=True)
    from hybridblas.host_pinning import cudart
    lib = cudart()
    if lib is not None:
        res["register_GBps"] = {}
        for mib in args.chunk_mib:
            res["register_GBps"][mib] = register_rates(x, lib, [t for t in threads if t <= 16], mib << 20)
            print(f"register/unregister GB/s, {mib} MiB chunks, by threads:", res["register_GBps"][mib], flush=True)
        res["registered_h2d_GBps"] = {}
        for mib in (x.nbytes >> 20, 256):     # one registration, and many that one copy spans
            res["registered_h2d_GBps"][mib] = dma_rates(x, lib, gpus, mib << 20)
            print(f"H2D from registered memory GB/s ({mib} MiB registrations):",
                  res["registered_h2d_GBps"][mib], flush=True)
    if lib is not None and args.big_gib:
        big = np.empty(int(args.big_gib * 2**30) // 16, dtype=np.complex128)
        t0 = time.perf_counter()
        big.fill(1.0)
        res["big_first_touch_GBps"] = gbps(big.nbytes, time.perf_counter() - t0)
        res["big_register_GBps"] = {}
        for label, chunk in (("whole", big.nbytes), ("1GiB", 1 << 30)):
            for attempt in ("first", "again"):
                res["big_register_GBps"][f"{label}-{attempt}"] = register_rates(big, lib, [1], chunk)[1]
        print("big operand: first touch", res["big_first_touch_GBps"], "GB/s; register/unregister:",
              res["big_register_GBps"], flush=True)
        del big
    res["ring_h2d_GBps"] = ring_rates(x, gpus, [t for t in threads if t >= 8])
    print("H2D through the staging ring GB/s:", res["ring_h2d_GBps"], flush=True)
    write_json(args.json, res)
