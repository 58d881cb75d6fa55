"""GPU benchmark, side by side in one process on the same arrays: zherk, zher2k, zgemmt (FLAPW's herkx
H += A^H X) in complex128, n = k, host-resident (numpy) and device-resident (cupy) operands.

  (1) cuBLAS on device-resident data, each GPU alone: the ceiling (Σ over the GPUs used)
  (2) cuBLASXt on the host arrays, all GPUs (ctypes, size_t dimensions)
  (3) hybridblas static, (4) hybridblas dynamic: host arrays, and cupy arrays on GPU 0; with --compare-tiles
      also host arrays by the tiled run (hb-tiles), the path before host operands went by bands

    python3 -m benchmarks.blas gpu --sizes 4096 8192 16384 24576 32768 --out results/gpu

writes results/gpu/bench_blas_gpu.json (every timing, TFLOP/s, ratios) and bench_blas_gpu.png (TFLOP/s
against n, one panel per routine, like Fig. 4 of the FLAPW paper; with several GPU counts also
bench_blas_gpu_scaling.png, TFLOP/s against GPUs). Flops are LAWN 41 counts: zherk 4 n^2 k, zher2k 8 n^2 k,
zgemmt (triangle) 4 n^2 k. Each result is checked on sampled entries.
"""
import datetime
import json
import os
import platform
import time

import numpy as np

import hybridblas as hb
from hybridblas import host_pinning, peers
from hybridblas.devices import cuda_bands
from hybridblas.console import positive_int

from benchmarks.common import command_line, gpu_sync, refuse, write_json
from benchmarks.plotting import pyplot, save

ROUTINES = ("zherk", "zher2k", "zgemmt")
FLOPS = {"zherk": 4, "zher2k": 8, "zgemmt": 4}


def log(*args):
    print(*args, flush=True)


def make_host(cp, shape, seed):
    """Random complex128 Fortran array made on GPU 0 and copied to pageable host memory."""
    with cp.cuda.Device(0):
        rs = cp.random.RandomState(seed)
        out = np.empty(shape, dtype=np.complex128, order="F")
        cols = max(1, (1 << 28) // (16 * shape[0]))
        for j in range(0, shape[1], cols):
            j1 = min(shape[1], j + cols)
            blk = rs.standard_normal((shape[0], j1 - j)) + 1j * rs.standard_normal((shape[0], j1 - j))
            out[:, j:j1] = blk.get()
        return out


def operands(routine, a, b):
    """(args for hybridblas, kwargs) and the math each computes; a, b are n x k (zherk/zher2k) or k x n."""
    if routine == "zherk":
        return (1.0, a), dict(trans="N", lower=True)
    if routine == "zher2k":
        return (1.0 + 0.5j, a, b), dict(trans="N", lower=True)
    return (1.0, a, b), dict(transa="C", transb="N", lower=True)


def host_cases(cp, sizes, routines):
    """(n, routine, its host arguments and keywords, C) for each n = k of ``sizes`` and each routine: random n x n
    operands made once a size, C zeroed; the page-locks are dropped once a size is done."""
    for n in sizes:
        a, b = make_host(cp, (n, n), 1), make_host(cp, (n, n), 2)
        c = np.zeros((n, n), np.complex128, order="F")
        for routine in routines:
            host_args, kw = operands(routine, a, b)
            yield n, routine, host_args, kw, c
        host_pinning.clear()


def small_copies(args, edge=2048):
    """The routine's arguments with each array cut to its leading edge x edge block, copied (a warm-up call on a
    view of the big arrays would page-lock them)."""
    return tuple(x if np.isscalar(x) else x[:edge, :edge].copy(order="F") for x in args)


def call_hybrid(routine, args, kw, c, ctx):
    fn = {"zherk": hb.herk, "zher2k": hb.her2k, "zgemmt": hb.gemmt}[routine]
    return fn(*args, 0.0, c, context=ctx, **kw)


def call_device(routine, args, c):
    if routine == "zherk":
        return peers.cublas_device_herk(args[0], args[1], 0.0, c, trans="N", lower=True)
    if routine == "zher2k":
        return peers.cublas_device_her2k(args[0], args[1], args[2], 0.0, c, trans="N", lower=True)
    return peers.cublas_device_herkx(args[0], args[1], args[2], 0.0, c, trans="C", lower=True)


def call_xt(routine, args, c, devices, block_dim, pinning):
    kw = dict(lower=True, devices=devices, block_dim=block_dim, pinning=pinning)
    if routine == "zherk":
        return peers.cublasxt_herk(args[0], args[1], 0.0, c, trans="N", **kw)
    if routine == "zher2k":
        return peers.cublasxt_her2k(args[0], args[1], args[2], 0.0, c, trans="N", **kw)
    return peers.cublasxt_herkx(args[0], args[1], args[2], 0.0, c, trans="C", **kw)


def transfer_probe(cp, gib=1.0):
    """Host -> GPU 0 ways for pageable numpy data: direct, hybridblas's pinned ring, cudaHostRegister."""
    from hybridblas import cuda_transfer
    from hybridblas.devices.cuda import CUDADevice
    rt = cp.cuda.runtime
    n = int(gib * 2 ** 30) // 16
    cols = 4096
    x = np.asfortranarray(np.full((n // cols, cols), 1 + 1j))
    out = {"gib": gib}
    with cp.cuda.Device(0):
        d = cp.empty(x.shape, dtype=x.dtype, order="F")
        s = cp.cuda.Stream(non_blocking=True)
        ring = CUDADevice(0).ring_pool("in").take()
        for rep in range(2):
            t0 = time.perf_counter()
            d.set(x)
            cp.cuda.Device(0).synchronize()
            out["pageable_h2d_GBps"] = x.nbytes / (time.perf_counter() - t0) / 1e9
            t0 = time.perf_counter()
            cuda_transfer.upload(d, x, ring, s)
            s.synchronize()
            out["staged_h2d_GBps"] = x.nbytes / (time.perf_counter() - t0) / 1e9
            y = np.empty_like(x, order="F")
            t0 = time.perf_counter()
            cuda_transfer.download(y, d, ring, s)
            out["staged_d2h_GBps"] = x.nbytes / (time.perf_counter() - t0) / 1e9
        pinned = ring.view(0, (ring.slot_bytes // 16 // cols, cols), x.dtype)
        src = x[:pinned.shape[0]]
        for name, fn in (("host_to_pinned_1thread_GBps", np.copyto), ("host_to_pinned_pool_GBps", cuda_transfer.par_copy)):
            t0 = time.perf_counter()
            for _ in range(4):
                fn(pinned, src)
            out[name] = 4 * pinned.nbytes / (time.perf_counter() - t0) / 1e9
        t0 = time.perf_counter()
        rt.hostRegister(x.ctypes.data, x.nbytes, 0)
        t1 = time.perf_counter()
        rt.memcpyAsync(d.data.ptr, x.ctypes.data, x.nbytes, rt.memcpyHostToDevice, s.ptr)
        s.synchronize()
        t2 = time.perf_counter()
        rt.hostUnregister(x.ctypes.data)
        t3 = time.perf_counter()
        out.update(register_GBps=x.nbytes / (t1 - t0) / 1e9, registered_h2d_GBps=x.nbytes / (t2 - t1) / 1e9,
                   unregister_GBps=x.nbytes / (t3 - t2) / 1e9)
    assert np.array_equal(y, x)
    return out


def sample_error(routine, args, c, rng, count=48):
    """Max relative error of sampled lower-triangle entries against direct dot products on the host."""
    def host(x):
        return x if isinstance(x, np.ndarray) else x.get()
    n = c.shape[0]
    i = rng.integers(0, n, count)
    j = rng.integers(0, n, count)
    i, j = np.maximum(i, j), np.minimum(i, j)
    i[0], j[0] = n - 1, 0
    got = np.array([complex(c[x, y]) for x, y in zip(i, j)])
    if routine == "zherk":
        A = args[1]
        rows = {r: host(A[r]) for r in set(i) | set(j)}
        want = np.array([args[0] * np.vdot(rows[y], rows[x]) for x, y in zip(i, j)])
    elif routine == "zher2k":
        al, A, B = args
        ra = {r: host(A[r]) for r in set(i) | set(j)}
        rb = {r: host(B[r]) for r in set(i) | set(j)}
        want = np.array([al * np.vdot(rb[y], ra[x]) + np.conj(al) * np.vdot(ra[y], rb[x]) for x, y in zip(i, j)])
    else:
        al, A, X = args
        ca = {r: host(A[:, r]) for r in set(i)}
        cx = {r: host(X[:, r]) for r in set(j)}
        want = np.array([al * np.vdot(ca[x], cx[y]) for x, y in zip(i, j)])
    scale = np.abs(want).max() or 1.0
    return float(np.abs(got - want).max() / scale)


def timed(fn, sync, reps):
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def add_arguments(ap):
    ap.add_argument("--sizes", type=positive_int, nargs="+", default=[4096, 8192, 16384, 24576, 32768])
    ap.add_argument("--routines", nargs="+", default=list(ROUTINES), choices=ROUTINES)
    ap.add_argument("--gpus", type=positive_int, default=None, help="GPUs to use (default: all)")
    ap.add_argument("--gpu-counts", type=positive_int, nargs="+", default=None,
                    help="scaling run: cuBLASXt and hybridblas on the first 1, 2, 4 ... of the GPUs, same arrays "
                         "(default: all of --gpus)")
    ap.add_argument("--repeats", type=positive_int, default=2)
    ap.add_argument("--modes", nargs="+", default=["host", "device"], choices=["host", "device"])
    ap.add_argument("--skip", nargs="*", default=[], choices=["ceiling", "xt", "static", "dynamic"])
    ap.add_argument("--compare-tiles", action="store_true",
                    help="host operands also by the tiled run on the same arrays (hb-tiles: bands switched off)")
    ap.add_argument("--xt-block", type=int, nargs="+", default=[0],
                    help="cublasXtSetBlockDim values to try, each reported (0: cuBLASXt's default); "
                         "ratios use the best")
    ap.add_argument("--xt-pageable", action="store_true",
                    help="leave cuBLASXt's pinning mode off (it then reads pageable memory: far slower)")
    ap.add_argument("--xt-max-seconds", type=float, default=30.0,
                    help="skip cuBLASXt at sizes where its rate so far predicts a longer call")
    ap.add_argument("--out", default="results/gpu")
    ap.add_argument("--json", action="store_true", help="print the JSON document to stdout too")
    ap.add_argument("--plot-only", nargs="+", metavar="JSON",
                    help="merge these result files (e.g. two campaign commands) into --out and plot them")


def merge_and_plot(files, out):
    """Merge result files of several runs into out/bench_blas_gpu.json and draw their plots; a later file's result
    replaces an earlier one of the same routine, size, implementation, mode and GPUs (a newer run of a case)."""
    docs = []
    for f in files:
        with open(f) as fh:
            docs.append(json.load(fh))
    merged = {}
    for d in docs:
        for r in d["results"]:
            merged[(r["routine"], r["n"], r["impl"], r["mode"], tuple(r["gpus"]))] = r
    commands = [c for d in docs for c in d.get("commands", [d["command"]])]
    dates = [x for d in docs for x in d.get("dates", [d["date"]])]
    doc = dict(docs[0], results=list(merged.values()), commands=commands, dates=dates)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "bench_blas_gpu.json"), doc)
    plot(doc, os.path.join(out, "bench_blas_gpu.png"))
    return doc


def run(opts):
    if opts.plot_only:
        merge_and_plot(opts.plot_only, opts.out)
        return 0

    import cupy as cp
    n_gpu = opts.gpus or cp.cuda.runtime.getDeviceCount()
    gpus = list(range(n_gpu))
    names = [cp.cuda.runtime.getDeviceProperties(g)["name"].decode() for g in gpus]
    os.makedirs(opts.out, exist_ok=True)
    rng = np.random.default_rng(7)
    from hybridblas.devices.cuda import CUDADevice
    counts = sorted(set(opts.gpu_counts or [n_gpu]))
    if counts[0] < 1 or counts[-1] > n_gpu:
        refuse(f"--gpu-counts must lie in 1..{n_gpu}, got {opts.gpu_counts}")
    ctx = {(s, g): hb.Context(devices=[CUDADevice(i) for i in gpus[:g]], strategy=s)
           for s in ("static", "dynamic") for g in counts}
    doc = {"benchmark": "bench_blas_gpu", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(),
           "gpus": names, "cpu_cores": len(os.sched_getaffinity(0)), "cupy": cp.__version__,
           "cublas_library": __import__("hybridblas.cublas").cublas.library_path(), "results": []}
    log(f"# {len(gpus)} GPU(s): {names}; sizes {opts.sizes}; routines {opts.routines}")
    doc["transfers"] = transfer_probe(cp)
    log("# transfers (GB/s): " + ", ".join(f"{k} {v:.1f}" for k, v in doc["transfers"].items()))
    xt_rate = {}

    sync_all = gpu_sync(cp, gpus)

    def free_pools():
        for g in gpus:
            with cp.cuda.Device(g):
                cp.get_default_memory_pool().free_all_blocks()

    warmed = set()

    def measure_xt(routine, flops, host_args, c, used, record):
        """(2) cuBLASXt on the host arrays with the GPUs ``used``."""
        pin = not opts.xt_pageable
        reps = opts.repeats
        host_pinning.clear()     # cuBLASXt pins and unpins the arrays itself: leave none of ours locked
        for xb in opts.xt_block if ("xt" not in opts.skip and "host" in opts.modes) else []:
            label = "cublasxt" if not xb else f"cublasxt-b{xb}"
            predicted = flops / xt_rate.get((routine, xb, len(used)), float("inf"))
            if predicted > opts.xt_max_seconds:
                log(f"  {label} skipped: {predicted:.0f} s predicted from the last size (> --xt-max-seconds)")
                continue
            if ("xt", routine, xb, len(used)) not in warmed:
                small = tuple(x if np.isscalar(x) else np.asfortranarray(x[:1024, :1024]) for x in host_args)
                call_xt(routine, small, np.empty((1024, 1024), np.complex128, order="F"), used, xb or None, pin)
                warmed.add(("xt", routine, xb, len(used)))
            xreps = 1 if predicted * reps > opts.xt_max_seconds else reps
            times = timed(lambda: call_xt(routine, host_args, c, used, xb or None, pin), sync_all, xreps)
            row = record(label, "host", times, sample_error(routine, host_args, c, rng), used)
            row.update(xt_pinning=pin, xt_block=xb or "default")
            xt_rate[(routine, xb, len(used))] = row["tflops"] * 1e12
            free_pools()

    def measure_hybrid(routine, host_args, kw, c, used, record):
        """(3), (4) hybridblas on the GPUs ``used``, host-resident then device-resident operands."""
        from hybridblas.devices.cuda import last_stats
        for mode in opts.modes:
            if mode == "device":
                with cp.cuda.Device(0):
                    args = tuple(x if np.isscalar(x) else cp.asarray(x, order="F") for x in host_args)
                    out = cp.empty(c.shape, dtype=np.complex128, order="F")
            else:
                args, out = host_args, c
            runs = [(s, None) for s in ("static", "dynamic") if s not in opts.skip]
            if opts.compare_tiles and mode == "host" and "static" not in opts.skip:
                runs.append(("static", "tiles"))
            for strategy, path in runs:
                cuda_bands.ENABLED = path != "tiles"
                label = f"hb-{strategy}" if path is None else f"hb-{path}"
                context = ctx[(strategy, len(used))]
                if (label, mode, routine, len(used)) not in warmed:
                    # warm up on small copies: a view of the big arrays would page-lock them here
                    small = small_copies(args)
                    call_hybrid(routine, small, kw, None, context)
                    warmed.add((label, mode, routine, len(used)))
                # the default pin_host="auto": the first call stages the host operands through the ring,
                # the second page-locks them (in the background), later ones read them by DMA. Reported:
                # first call, second call, and the best of --repeats calls after that (the steady state)
                host_pinning.clear()
                last_stats.clear()          # a call that runs no tiles (cuda_direct) leaves it empty
                first = timed(lambda: call_hybrid(routine, args, kw, out, context), sync_all, 1)[0]
                second = timed(lambda: call_hybrid(routine, args, kw, out, context), sync_all, 1)[0]
                t_pin = time.perf_counter()
                host_pinning.wait_ready()
                t_pin = time.perf_counter() - t_pin
                times = timed(lambda: call_hybrid(routine, args, kw, out, context), sync_all, opts.repeats)
                row = record(label, mode, times, sample_error(routine, args, out, rng), used)
                row.update(first_call_s=first, second_call_s=second, pin_wait_after_second_s=t_pin)
                log(f"      first call {first:.3f} s ({flops / first / 1e12:.1f} TF/s), second (page-locking) "
                    f"{second:.3f} s, locking went on {t_pin:.3f} s after it")
                row["per_gpu"] = {k2: dict(v) for k2, v in last_stats.items()}
                if not last_stats:
                    log("      one cuBLAS routine on the caller's stream (no tiles)")
                for dev, st in sorted(last_stats.items()):
                    log(f"      {dev}: kernels {st.get('kernel_s', 0):.3f} s of {st.get('wall_s', 0):.3f} s, "
                        f"host staging in {st.get('host_upload_s', 0):.3f} s / out {st.get('host_download_s', 0):.3f} s, "
                        f"from host {st.get('bytes_from_host', 0) / 1e9:.1f} GB, from peer "
                        f"{st.get('bytes_from_peer', 0) / 1e9:.1f} GB, to host {st.get('bytes_to_host', 0) / 1e9:.1f} GB, "
                        f"nb={st.get('nb')} kc={st.get('kc')}; GPU idle: lead {st.get('lead_s', 0):.3f} s, "
                        f"gaps {st.get('gaps_s', 0):.3f} s, tail {st.get('tail_s', 0):.3f} s")
            args = out = None
            free_pools()

    for n in opts.sizes:
        k = n
        for routine in opts.routines:
            flops = FLOPS[routine] * n * n * k
            shape = (n, k) if routine != "zgemmt" else (k, n)
            t0 = time.perf_counter()
            a = make_host(cp, shape, 1)
            b = make_host(cp, shape, 2) if routine != "zherk" else None
            c = np.empty((n, n), dtype=np.complex128, order="F")
            log(f"## {routine} n=k={n}: {flops / 1e12:.1f} Tflop, host data made in {time.perf_counter() - t0:.1f} s")
            rows = []

            def record(impl, mode, times, err, used):
                best = min(times)
                row = dict(routine=routine, n=n, k=k, impl=impl, mode=mode, gpus=list(used), seconds=times,
                           best_s=best, tflops=flops / best / 1e12, rel_error=err)
                rows.append(row)
                log(f"  {impl:<9} {mode:<7} gpus={list(used)} best {best:8.3f} s  {row['tflops']:6.1f} TF/s  "
                    f"err {err:.1e}")
                return row

            host_args, kw = operands(routine, a, b)
            # (1) the ceiling: cuBLAS on device data, each GPU alone
            if "ceiling" not in opts.skip:
                for g in gpus:
                    with cp.cuda.Device(g):
                        dargs = tuple(x if np.isscalar(x) else cp.asarray(x, order="F") for x in host_args)
                        cd = cp.empty((n, n), dtype=np.complex128, order="F")
                        call_device(routine, dargs, cd)
                        times = timed(lambda: call_device(routine, dargs, cd), sync_all, opts.repeats)
                        record("cublas", "device", times, sample_error(routine, dargs, cd, rng), [g])
                        del dargs, cd
                    free_pools()
            for count in counts:
                measure_xt(routine, flops, host_args, c, gpus[:count], record)
                measure_hybrid(routine, host_args, kw, c, gpus[:count], record)
            for count in counts:
                used = gpus[:count]
                mine = [r for r in rows if r["gpus"] == used and r["impl"] != "cublas"]
                ceiling = sum(r["tflops"] for r in rows if r["impl"] == "cublas" and r["gpus"][0] in used)
                xt = max((r["tflops"] for r in mine if r["impl"].startswith("cublasxt")), default=None)
                for r in mine:
                    r["ratio_to_ceiling"] = r["tflops"] / ceiling if ceiling else None
                    r["ratio_to_cublasxt"] = r["tflops"] / xt if xt and r["impl"].startswith("hb") else None
                log(f"  {count} GPU(s): Σ ceiling {ceiling:.1f} TF/s" + (f", cuBLASXt {xt:.1f}" if xt else "")
                    + "".join(f"; {r['impl']}/{r['mode']} {r['ratio_to_ceiling']:.2f}x ceiling"
                              + (f", {r['ratio_to_cublasxt']:.2f}x XT" if r["ratio_to_cublasxt"] else "")
                              for r in mine if r["impl"].startswith("hb") and r["ratio_to_ceiling"]))
            doc["results"] += rows
            del a, b, c
            write_json(os.path.join(opts.out, "bench_blas_gpu.json"), doc)
    plot(doc, os.path.join(opts.out, "bench_blas_gpu.png"))
    if opts.json:
        print(json.dumps(doc))
    return 0


def plot(doc, path, required=False):
    """TF/s against n for the largest GPU count (and, with several counts, against GPUs) into ``path``."""
    plt = pyplot(required)
    if plt is None:
        return
    counts = sorted({len(x["gpus"]) for x in doc["results"] if x["impl"] != "cublas"})
    if len(counts) > 1:
        plot_scaling(doc, plt, path.replace(".png", "_scaling.png"))
    top = counts[-1] if counts else len(doc["gpus"])
    res = [x for x in doc["results"] if x["impl"] == "cublas" or len(x["gpus"]) == top]
    routines = [r for r in ROUTINES if any(x["routine"] == r for x in res)]
    fig, axes = plt.subplots(1, len(routines), figsize=(5 * len(routines), 4), squeeze=False)
    for ax, routine in zip(axes[0], routines):
        rows = [x for x in res if x["routine"] == routine]
        sizes = sorted({x["n"] for x in rows})
        ceil = [sum(x["tflops"] for x in rows if x["n"] == n and x["impl"] == "cublas" and x["gpus"][0] < top)
                for n in sizes]
        ax.plot(sizes, ceil, "k--", label="Σ cuBLAS, device data (ceiling)")
        best_xt = {}
        for x in rows:
            if x["impl"].startswith("cublasxt"):
                best_xt[x["n"]] = max(best_xt.get(x["n"], 0.0), x["tflops"])
        if best_xt:
            ax.plot(*zip(*sorted(best_xt.items())), "s-", label="cuBLASXt (host, best block)")
        for impl, mode, style in (("hb-static", "host", "o-"), ("hb-tiles", "host", "x--"),
                                  ("hb-dynamic", "host", "^-"), ("hb-static", "device", "o:"),
                                  ("hb-dynamic", "device", "^:")):
            pts = [(x["n"], x["tflops"]) for x in rows if x["impl"] == impl and x["mode"] == mode]
            if pts:
                ax.plot(*zip(*sorted(pts)), style, label=f"{impl.replace('hb-', 'hybridblas ')} ({mode})")
        ax.set_title(f"{routine}, {top}x {doc['gpus'][0]}")
        ax.set_xlabel("n = k")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    _save(fig, axes, path)


def plot_scaling(doc, plt, path):
    """TF/s against the number of GPUs (like the paper's Fig. 9), one panel per routine and size."""
    res = doc["results"]
    cases = sorted({(x["routine"], x["n"]) for x in res}, key=lambda rn: (ROUTINES.index(rn[0]), rn[1]))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 4), squeeze=False)
    for ax, (routine, n) in zip(axes[0], cases):
        rows = [x for x in res if x["routine"] == routine and x["n"] == n]
        counts = sorted({len(x["gpus"]) for x in rows if x["impl"] != "cublas"})
        per_gpu = {}
        for x in rows:     # merged runs may hold several ceilings of one GPU: take its best
            if x["impl"] == "cublas":
                per_gpu[x["gpus"][0]] = max(per_gpu.get(x["gpus"][0], 0.0), x["tflops"])
        ax.plot(counts, [sum(t for g, t in per_gpu.items() if g < c) for c in counts], "k--",
                label="Σ cuBLAS, device data")
        for impl, style in (("cublasxt", "s-"), ("hb-static", "o-"), ("hb-dynamic", "^-")):
            pts = [(c, max((x["tflops"] for x in rows if x["impl"].startswith(impl) and x["mode"] == "host"
                            and len(x["gpus"]) == c), default=None)) for c in counts]
            pts = [p for p in pts if p[1] is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=impl.replace("hb-", "hybridblas ") + " (host data)")
        # a call that meets host operands not yet page-locked (registration on the way): slower
        first = [(c, max((x["tflops"] * x["best_s"] / x["first_call_s"] for x in rows
                          if x["impl"].startswith("hb-") and "first_call_s" in x and len(x["gpus"]) == c),
                         default=None)) for c in counts]
        first = [p for p in first if p[1] is not None]
        if first:
            ax.plot(*zip(*first), "x:", color="gray", label="hybridblas, first call (operands being locked)")
        ax.set_title(f"{routine}, n = k = {n}")
        ax.set_xlabel("GPUs")
        ax.set_xticks(counts)
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    _save(fig, axes, path)


def _save(fig, axes, path):
    axes[0][0].legend(fontsize=7)
    save(fig, path, dpi=120)
