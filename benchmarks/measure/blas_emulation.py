"""FP64 products emulated on INT8 tensor cores (Context(emulation="int8")) against cuBLAS's FP64 routines on one
GPU, device-resident operands, side by side in one process: time, TF/s (FP64 flops), ratio, accuracy.

Accuracy: sampled entries against their exactly rounded values (hybridblas.reference.exact_entries), the
largest relative error of the emulated product beside cuBLAS's on the same inputs; on random normal data and
on FLAPW's own operands (the A of S = AᴴA and the A, X of H += AᴴX of one atom batch of a crystal, entries
spanning many orders of magnitude; emulated there although their k is below cuda_ozaki.MIN_K). Also what
cuBLAS's own FP64 emulation (math mode CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH, eager strategy) does with zgemm
where the installed cuBLAS has it. And what a user of FLAPW sees: the lowest generalised eigenvalues of a build
with the interstitial part (--eigen), every product emulated against none.

    python3 -m benchmarks.blas emulation --sizes 4096 8192 12288 16384 --routines zgemm zherk dgemm --out DIR
    python3 -m benchmarks.blas emulation --plot-only DIR/bench_blas_emulation.json --out DIR
"""
import ctypes
import json
import os

import numpy as np

import hybridblas as hb
from hybridblas import reference
from hybridblas.console import positive_int

from benchmarks.common import command_line, write_json

ROUTINES = ("zgemm", "zherk", "dgemm", "dsyrk")


def add_arguments(ap):
    ap.add_argument("--sizes", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--routines", nargs="+", default=["zgemm", "zherk"], choices=ROUTINES)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--samples", type=positive_int, default=100, help="entries checked against exact sums")
    ap.add_argument("--flapw", default="TiO2:3.0", help="SYSTEM:KMAX whose operands are checked too ('none': skip)")
    ap.add_argument("--eigen", default="NaCl:3.5",
                    help="SYSTEM:KMAX whose lowest 20 generalised eigenvalues (interstitial included) are compared, "
                         "every product emulated against none ('none': skip)")
    ap.add_argument("--cublas-emulation", action="store_true", help="time cuBLAS's own FP64 emulation too")
    ap.add_argument("--out", default=None, help="folder for bench_blas_emulation.json and the plot")
    ap.add_argument("--plot-only", metavar="JSON", default=None, help="plot a result file into --out, measure nothing")


def _timed(cp, fn, repeats):
    """Best seconds of ``repeats`` calls after one warm-up, between events on the current stream."""
    fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def _native(cp, routine, a, b, c):
    """cuBLAS's own FP64 routine on the current stream (no hybridblas in between)."""
    from hybridblas import cublas
    from hybridblas.problem import C, N, T, Operand
    handle, stream = cp.cuda.device.get_cublas_handle(), cp.cuda.get_current_stream().ptr
    if routine.endswith("gemm"):
        return lambda: cublas.gemm(handle, stream, c, 1.0, Operand(a, N), Operand(b, N), 0.0)
    kind = "herk" if routine == "zherk" else "syrk"
    op = C if routine == "zherk" else T
    return lambda: cublas.rank_k(handle, stream, kind, c, True, 1.0, [Operand(a, op)], 0.0)


def _ours(routine, a, b, c, ctx):
    if routine.endswith("gemm"):
        return lambda: hb.gemm(1.0, a, b, 0.0, c, context=ctx)
    if routine == "zherk":
        return lambda: hb.herk(1.0, a, 0.0, c, trans="C", lower=True, context=ctx)
    return lambda: hb.syrk(1.0, a, 0.0, c, trans="T", lower=True, context=ctx)


def _errors(exact, values, scale):
    """(largest relative error, largest error relative to sum |l| |r| of the entry: the componentwise measure,
    meaningful also where the sum cancels)."""
    err = np.abs(values - exact)
    keep = exact != 0
    return {"relative": float(np.max(err[keep] / np.abs(exact[keep]))), "componentwise": float(np.max(err / scale))}


def _scale(left, right, rows, cols):
    return np.einsum("ik,ki->i", np.abs(left[rows]), np.abs(right[:, cols]))


def _sample(rng, n, samples, lower):
    rows, cols = rng.integers(0, n, samples), rng.integers(0, n, samples)
    if lower:
        rows, cols = np.maximum(rows, cols), np.minimum(rows, cols)
    return rows, cols


def _accuracy(cp, routine, a, b, rows, cols, results):
    """Largest relative errors of each result at the sampled entries against exact sums."""
    ah = a.get()
    left = ah.conj().T if routine == "zherk" else (ah.T if routine == "dsyrk" else ah)
    right = ah if routine in ("zherk", "dsyrk") else b.get()
    exact = reference.exact_entries(left, right, rows, cols)
    scale = _scale(left, right, rows, cols)
    return {name: _errors(exact, r[rows, cols], scale) for name, r in results.items()}


def _one(cp, routine, n, args, rng, emulated, plain, memory):
    complex_ = routine[0] == "z"
    dtype = np.complex128 if complex_ else np.float64
    def rand(shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if complex_ else x
    a = cp.asarray(rand((n, n)), order="F")
    b = cp.asarray(rand((n, n)), order="F") if routine.endswith("gemm") else None
    c = cp.zeros((n, n), dtype=dtype, order="F")
    flops = (8 if complex_ else 2) * n ** 3 / (1 if routine.endswith("gemm") else 2)
    row = {"routine": routine, "n": n, "k": n}
    results = {}
    row["cublas_s"] = _timed(cp, _native(cp, routine, a, b, c), args.repeats)
    results["cublas"] = c.get()
    row["hybridblas_native_s"] = _timed(cp, _ours(routine, a, b, c, plain), args.repeats)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.total_bytes()
    _ours(routine, a, b, c, emulated)()           # one call: what CuPy's pool holds after it is its working set
    cp.cuda.Device().synchronize()
    row["emulated_working_bytes"] = int(pool.total_bytes() - before)
    pool.free_all_blocks()
    _counted()
    row["emulated_s"] = _timed(cp, _ours(routine, a, b, c, emulated), args.repeats)
    row["emulated_products"] = _counted()
    results["emulated"] = c.get()
    for key in ("cublas", "hybridblas_native", "emulated"):
        row[key.replace("_s", "") + "_tflops"] = flops / row[key + "_s"] / 1e12
    row["speedup_vs_cublas"] = row["cublas_s"] / row["emulated_s"]
    rows, cols = _sample(rng, n, args.samples, not routine.endswith("gemm"))
    row["errors"] = _accuracy(cp, routine, a, b, rows, cols, results)
    if memory is not None and routine == "zgemm":
        row["cublas_emulation"] = memory(a, b, c, flops, args.repeats, rows, cols, routine)
    del a, b, c
    pool.free_all_blocks()
    return row


def _cublas_emulation(cp):
    """zgemm under cuBLAS's own FP64 emulation (math mode 8, eager), or None where this cuBLAS lacks it."""
    from hybridblas import cublas
    lib = cublas.lib()
    setter = getattr(lib, "cublasSetEmulationStrategy", None)
    if setter is None:
        return None

    def run(a, b, c, flops, repeats, rows, cols, routine):
        handle = ctypes.c_void_p(cp.cuda.device.get_cublas_handle())
        mode = ctypes.c_int()
        cublas.check(lib.cublasGetMathMode(handle, ctypes.byref(mode)), "cublasGetMathMode")
        try:
            cublas.check(lib.cublasSetMathMode(handle, ctypes.c_int(8)), "cublasSetMathMode")
            cublas.check(setter(handle, ctypes.c_int(2)), "cublasSetEmulationStrategy")
            seconds = _timed(cp, _native(cp, routine, a, b, c), repeats)
        except cublas.CublasError as exc:
            return {"error": str(exc)}
        finally:
            lib.cublasSetMathMode(handle, mode)
            setter(handle, ctypes.c_int(0))
        err = _accuracy(cp, routine, a, b, rows, cols, {"cublas_emulated": c.get()})
        return {"seconds": seconds, "tflops": flops / seconds / 1e12, "errors": err["cublas_emulated"]}
    return run


class _Captured(Exception):
    pass


def _flapw_operands(spec, batch_atoms=32):
    """(A, X) as the build of SYSTEM:KMAX hands them to S = AᴴA and H += AᴴX for its first batch of
    ``batch_atoms`` atoms at its first k-point (w x N_G host copies, w = atoms x (lmax + 1)^2); the build stops
    there."""
    from flapw import System, build_hs
    from flapw.backends import HybridBackend
    system, kmax = spec.split(":")
    cell = System.preset(system, kmax=float(kmax))
    seen = {}

    class Recording(HybridBackend):
        def herk(self, alpha, a, beta, c, trans="C"):
            seen.setdefault("A", np.array(a))
            return super().herk(alpha, a, beta, c, trans)

        def herkx(self, alpha, a, b, beta, c, trans="C"):
            seen["X"] = np.array(b)
            raise _Captured
    try:
        build_hs(cell, blas=Recording(hb.Context("cpu")), lower_only=True, batch_atoms=batch_atoms)
    except _Captured:
        pass
    return seen["A"], seen["X"]


def _flapw_accuracy(cp, spec, emulated, rng, samples):
    """Largest relative errors of C = AᴴA and C = AᴴX (N_G x N_G, k = w) at sampled entries, emulated and cuBLAS."""
    from hybridblas import cublas
    from hybridblas.problem import C, N, Operand
    from hybridblas.devices import cuda_ozaki
    a, x = _flapw_operands(spec)
    out = {"system": spec, "n_g": int(a.shape[1]), "k": int(a.shape[0]),
           "abs_range": [float(np.abs(a[a != 0]).min()), float(np.abs(a).max())]}
    ad, xd = cp.asarray(a, order="F"), cp.asarray(x, order="F")
    n = a.shape[1]
    handle, stream = cp.cuda.device.get_cublas_handle(), cp.cuda.get_current_stream().ptr
    least = cuda_ozaki.MIN_K          # FLAPW's k (a batch of atoms' channels) is below MIN_K: emulated here anyway
    cuda_ozaki.MIN_K = dict.fromkeys(least, 1)
    try:
        for label, left, right in (("S=AᴴA", ad, ad), ("H+=AᴴX", ad, xd)):
            c = cp.zeros((n, n), dtype=np.complex128, order="F")
            cublas.gemm(handle, stream, c, 1.0, Operand(left, C), Operand(right, N), 0.0)
            native = c.get()
            hb.gemm(1.0, left, right, 0.0, c, transa="C", context=emulated)
            ours = c.get()
            rows, cols = _sample(rng, n, samples, False)
            lh, rh = left.get().conj().T, right.get()
            exact = reference.exact_entries(lh, rh, rows, cols)
            scale = _scale(lh, rh, rows, cols)
            out[label] = {"cublas": _errors(exact, native[rows, cols], scale),
                          "emulated": _errors(exact, ours[rows, cols], scale), "emulated_products": _counted()}
    finally:
        cuda_ozaki.MIN_K = least
    return out


def _flapw_eigenvalues(cp, spec, nev=20):
    """The lowest ``nev`` generalised eigenvalues (Ha) of the SYSTEM:KMAX build with the interstitial part, H and
    S built and solved on GPU 0 natively and with every product emulated (FLAPW's k, a batch of atoms' channels,
    is below MIN_K: emulated here anyway), and their largest difference."""
    from flapw import System, build_hs, solve
    from hybridblas.devices import cuda_ozaki
    system, kmax = spec.split(":")
    cell = System.preset(system, kmax=float(kmax))
    out = {"system": spec, "n_g": int(cell.n_g), "k": int(cell.n_atoms * cell.n_l), "nev": nev}
    least, edge = cuda_ozaki.MIN_K, cuda_ozaki.MIN_EDGE
    _counted()
    for label, emulation in (("native", None), ("emulated", "int8")):
        ctx = hb.Context(devices=["cuda:0"], emulation=emulation)
        if emulation:
            cuda_ozaki.MIN_K, cuda_ozaki.MIN_EDGE = dict.fromkeys(least, 1), 1
        try:
            with cp.cuda.Device(0):
                h, s = build_hs(cell, context=ctx, interstitial=True, lower_only=True, arrays="device")
                values = solve(h, s, nev)
                out[label] = [float(v) for v in cp.asnumpy(values)]
                del h, s
        finally:
            cuda_ozaki.MIN_K, cuda_ozaki.MIN_EDGE = least, edge
        out[label + "_products"] = _counted()
    out["max_abs_difference_ha"] = float(np.max(np.abs(np.subtract(out["emulated"], out["native"]))))
    return out


_calls = []


def _counted():
    """Emulated products (cuda_ozaki.product calls) since the last look."""
    count = len(_calls)
    _calls.clear()
    return count


def _count_products():
    from hybridblas.devices import cuda_ozaki
    real = cuda_ozaki.product

    def counted(*args, **kw):
        _calls.append(1)
        return real(*args, **kw)
    cuda_ozaki.product = counted


def plot(doc, out):
    """TF/s (FP64 flops) against n for each routine: cuBLAS, the emulation, cuBLAS's own emulation (zgemm)."""
    from benchmarks.plotting import pyplot, save
    plt = pyplot(required=False)
    if plt is None:
        return None
    routines = list(dict.fromkeys(r["routine"] for r in doc["rows"]))
    fig, axes = plt.subplots(1, len(routines), figsize=(4.2 * len(routines), 3.6), squeeze=False)
    for ax, routine in zip(axes[0], routines):
        rows = [r for r in doc["rows"] if r["routine"] == routine]
        n = [r["n"] for r in rows]
        ax.plot(n, [r["cublas_tflops"] for r in rows], "o-", label="cuBLAS FP64")
        line, = ax.plot(n, [r["emulated_tflops"] for r in rows], "-", label='hybridblas, emulation="int8"')
        for r in rows:       # filled: INT8 products ran; hollow: below the threshold, native
            ax.plot(r["n"], r["emulated_tflops"], "s", color=line.get_color(),
                    fillstyle="full" if r.get("emulated_products", 1) else "none")
        own = [(r["n"], r["cublas_emulation"]["tflops"]) for r in rows if "tflops" in r.get("cublas_emulation", {})]
        if own:
            ax.plot(*zip(*own), "^--", label="cuBLAS's own emulation")
        ax.set_title(f"{routine}, n = k, one GPU (hollow: native)")
        ax.set_xlabel("n")
        ax.set_ylabel("TF/s (FP64 flops)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{doc['device']}, cuBLAS {doc['cublas_version']}", fontsize=9)
    return save(fig, os.path.join(out, "blas_emulation.png"))


def run(args):
    if args.plot_only:
        with open(args.plot_only) as fh:
            plot(json.load(fh), args.out or ".")
        return
    import cupy as cp
    _count_products()
    rng = np.random.default_rng(7)
    emulated = hb.Context(devices=["cuda:0"], emulation="int8")
    plain = hb.Context(devices=["cuda:0"])
    memory = _cublas_emulation(cp) if args.cublas_emulation else None
    doc = {"command": command_line(), "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "cublas_version": _cublas_version(cp), "rows": []}
    for routine in args.routines:
        for n in args.sizes:
            row = _one(cp, routine, n, args, rng, emulated, plain, memory)
            doc["rows"].append(row)
            err = row["errors"]
            print(f"{routine} n=k={n}: cuBLAS {row['cublas_tflops']:.1f} TF/s, emulated {row['emulated_tflops']:.1f} "
                  f"TF/s ({row['speedup_vs_cublas']:.2f}x, {row['emulated_products']} products), max rel. error "
                  f"emulated {err['emulated']['relative']:.2e} cuBLAS {err['cublas']['relative']:.2e}, working "
                  f"memory {row['emulated_working_bytes'] / 2**30:.2f} GiB"
                  + (f"; cuBLAS emulation {json.dumps(row['cublas_emulation'])}" if "cublas_emulation" in row else ""),
                  flush=True)
    if args.flapw != "none":
        doc["flapw"] = _flapw_accuracy(cp, args.flapw, emulated, rng, args.samples)
        print("FLAPW operands:", json.dumps(doc["flapw"]), flush=True)
    if args.eigen != "none":
        doc["eigenvalues"] = _flapw_eigenvalues(cp, args.eigen)
        ev = doc["eigenvalues"]
        print(f"{ev['system']} (N_G {ev['n_g']}, k {ev['k']}): lowest {ev['nev']} eigenvalues, every product "
              f"emulated ({ev['emulated_products']} products) against native ({ev['native_products']}): largest "
              f"difference {ev['max_abs_difference_ha']:.2e} Ha", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "bench_blas_emulation.json"), doc)
        plot(doc, args.out)


def _cublas_version(cp):
    from hybridblas import cublas
    v = ctypes.c_int()
    cublas.lib().cublasGetVersion_v2(ctypes.c_void_p(cp.cuda.device.get_cublas_handle()), ctypes.byref(v))
    return v.value
