"""Block SpMM with a shell-model Hamiltonian on one and two GPUs: ours (cisolver.gpu_spmm: cuSPARSE on
row-major blocks, one stream per device) against cupyx's ``csr @ block`` run the way cisolver ran it
before (column-major copies, devices driven in turn), same matrix and same block, in one process.

    python3 -m benchmarks.cisolver spmm-gpu --cases 47V,48Cr --dtype float32 [--json out.json]

First cisolver.gpu_spmm.DeviceCsr's layouts and cuSPARSE algorithms on one GPU (whole H), then, per
storage and device set, ours against cupyx as before: milliseconds per product (median of --repeat, every
device synchronised after each) and the largest relative difference.
"""
import time

import numpy as np

from cisolver.operators import SymmetricOperator
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import CASES, case_list, problem, write_json


class CupyxBefore:
    """The GPU operator through cupyx, for comparison: cupyx CSR parts, ``m @ x`` device after device."""

    def __init__(self, h, storage, devices, dtype):
        import cupy
        import cupyx.scipy.sparse as csp
        n = h.shape[0]
        cuts = np.searchsorted(h.indptr, np.linspace(0, h.nnz, len(devices) + 1)[1:-1])
        bounds = [0, *map(int, cuts), n]
        self.parts, self.devices, self.storage, self.n = [], devices, storage, n
        for dev, r0, r1 in zip(devices, bounds[:-1], bounds[1:]):
            with cupy.cuda.Device(dev):
                sub = h[r0:r1].astype(dtype)
                m = csp.csr_matrix((cupy.asarray(sub.data), cupy.asarray(sub.indices), cupy.asarray(sub.indptr)),
                                   shape=sub.shape)
                m.sort_indices()
                self.parts.append((dev, r0, r1, m, m.T.tocsr() if storage == "upper" else None))
        with cupy.cuda.Device(devices[0]):
            self.diag = cupy.asarray(h.diagonal().astype(dtype))

    def matmat(self, x):
        import cupy
        first = self.devices[0]
        x = cupy.ascontiguousarray(x)
        outs = []
        for dev, r0, r1, m, mt in self.parts:
            with cupy.cuda.Device(dev):
                xd = x if dev == first else cupy.asarray(x)
                outs.append((dev, r0, r1, m @ xd, mt @ xd[r0:r1] if mt is not None else None))
        with cupy.cuda.Device(first):
            y = cupy.empty((self.n, x.shape[1]), dtype=x.dtype)
            for dev, r0, r1, yy, _ in outs:
                y[r0:r1] = yy if dev == first else cupy.asarray(yy)
            if self.storage == "upper":
                for dev, _, _, _, z in outs:
                    y += z if dev == first else cupy.asarray(z)
                y -= self.diag[:, None] * x
        return y


def _time(fn, devices, repeat):
    import cupy

    def sync():
        for d in devices:
            cupy.cuda.Device(d).synchronize()
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


VARIANTS = [("col", 0), ("col", 4), ("row", 0), ("row", 4), ("row", 6)]   # (layout, cusparseSpMMAlg_t)


def layouts_on_one_gpu(name, h, x, repeat, rows):
    """cisolver.gpu_spmm.DeviceCsr with each layout and algorithm, whole H on GPU 0."""
    import cupy
    from cisolver.gpu_spmm import DeviceCsr
    with cupy.cuda.Device(0):
        xd = cupy.asarray(x)
        ref = None
        for layout, alg in VARIANTS:
            a = DeviceCsr(h, 0, x.dtype, layout=layout, alg=alg)
            y = cupy.empty_like(xd)
            t = _time(lambda: a.multiply_into(y, xd), [0], repeat)
            ref = y.copy() if ref is None else ref
            diff = float(cupy.abs(y - ref).max() / cupy.abs(ref).max())
            rows.append({"case": name, "dtype": str(x.dtype), "variant": f"{layout}/alg{a.alg}", "ms": 1e3 * t,
                         "rel_diff_to_first": diff})
            print(f"  one GPU, {layout} alg {alg} (ran {a.alg}): {1e3 * t:8.2f} ms, rel diff {diff:.1e}", flush=True)
            del a, y
            cupy.get_default_memory_pool().free_all_blocks()


def add_arguments(ap):
    ap.add_argument("--cases", type=case_list, default="47V", help=f"comma list from {sorted(CASES)}")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--block", type=positive_int, default=8)
    ap.add_argument("--repeat", type=positive_int, default=10)
    ap.add_argument("--skip", default="", help="comma list: layouts, peers")
    ap.add_argument("--json", default=None)


def run(args):
    check_output_path(args.json, "--json")
    import cupy
    dtype = np.dtype(args.dtype)
    gpus = cupy.cuda.runtime.getDeviceCount()
    sets = [[0]] + ([[0, 1]] if gpus > 1 else [])
    rows = []
    for name in args.cases:
        prob = problem(name)
        hu, info = prob.build(storage="upper", dtype=dtype)
        hf, _ = prob.build(storage="full", dtype=dtype)
        x = np.random.default_rng(1).standard_normal((info.dimension, args.block)).astype(dtype)
        print(f"{name}: dim {info.dimension}, nnz full {hf.nnz}, {dtype}, block {args.block}", flush=True)
        if "layouts" not in args.skip:
            layouts_on_one_gpu(name, hf, x, args.repeat, rows)
        if "peers" in args.skip:
            continue
        for storage, h in (("full", hf), ("upper", hu)):
            for devs in sets:
                ours = SymmetricOperator(h, storage=storage, devices=devs, dtype=dtype)
                before = CupyxBefore(h, storage, devs, dtype)
                with cupy.cuda.Device(devs[0]):
                    xd = cupy.asarray(x)
                    diff = float(cupy.abs(ours.matmat(xd) - before.matmat(xd)).max())
                    scale = float(cupy.abs(before.matmat(xd)).max())
                    t_ours = _time(lambda: ours.matmat(xd), devs, args.repeat)
                    t_before = _time(lambda: before.matmat(xd), devs, args.repeat)
                row = {"case": name, "dtype": str(dtype), "storage": storage, "devices": devs,
                       "ours_ms": 1e3 * t_ours, "cupyx_before_ms": 1e3 * t_before,
                       "speedup": t_before / t_ours, "max_rel_diff": diff / max(scale, 1e-300)}
                rows.append(row)
                print(f"  {storage:5s} GPUs {devs}: ours {1e3 * t_ours:8.2f} ms, cupyx as before "
                      f"{1e3 * t_before:8.2f} ms, x{t_before / t_ours:.2f}, rel diff {row['max_rel_diff']:.1e}",
                      flush=True)
                del ours, before, xd
                cupy.get_default_memory_pool().free_all_blocks()
    write_json(args.json, rows)
