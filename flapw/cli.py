"""flapw build --system TiO2 --kmax 3.0 [--kpoints N] [--method refined|original] [--devices ...]
           [--interstitial] [--solve NEV] [--output FILE] [--json]"""
import argparse
import json
import sys
import time

import numpy as np

from .backends import BACKENDS, BackendUnavailable
from . import parallel
from .hsdla import METHODS, build_hs
from .structures import PRESETS
from .system import DEFAULT_K, System


def _kpoints(n, first):
    """``n`` generic k-points: the default one, then a fixed low-discrepancy sequence (reproducible)."""
    out = [tuple(float(x) for x in first)]
    golden = np.array([0.7548776662, 0.5698402910, 0.4301597090])   # R3 sequence offsets
    for i in range(1, n):
        out.append(tuple(float(x) for x in np.round((np.asarray(first) + i * golden) % 1.0 - 0.5, 6)))
    return out


def _parser():
    p = argparse.ArgumentParser(prog="flapw", description="LAPW Hamiltonian and Overlap matrices on hybridblas")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build H and S for a preset crystal and print a per-stage table")
    b.add_argument("--system", default="NaCl", choices=sorted(PRESETS))
    b.add_argument("--structure", metavar="FILE", default=None,
                   help="build this crystal instead of --system: any file ase.io.read reads (CIF, POSCAR, ...; "
                        "needs ase), default muffin-tin radii and lmax as System.from_ase")
    b.add_argument("--kmax", type=float, default=2.5, help="plane-wave cutoff |k+G| <= Kmax (1/bohr)")
    b.add_argument("--kpoints", type=int, default=1, help="number of generic k-points (radial functions and T reused)")
    b.add_argument("--k", type=float, nargs=3, default=DEFAULT_K, help="first k-point, supercell reciprocal units")
    b.add_argument("--method", default="refined", choices=METHODS)
    b.add_argument("--devices", default="cpu", help="hybridblas devices: cpu, all, gpu, or e.g. cpu,cuda:0")
    b.add_argument("--strategy", default="auto", choices=("static", "dynamic", "auto"))
    b.add_argument("--blas", default="hybridblas", choices=BACKENDS)
    b.add_argument("--arrays", default="auto", choices=("auto", "host", "device"),
                   help="where A, B, X, H, S live (device: cupy on this rank's first GPU; auto: there when "
                        "hybridblas runs on GPUs and they fit in its free memory, else host)")
    b.add_argument("--potential", default="model", choices=("model", "empty"))
    b.add_argument("--v0", type=float, default=0.0, help="interstitial potential (Ha)")
    b.add_argument("--supercell", type=int, nargs=3, default=None, help="override the preset's supercell")
    b.add_argument("--batch-atoms", type=int, default=None)
    b.add_argument("--max-temp-gib", type=float, default=None, help="bound the A/B/X buffers (GiB)")
    b.add_argument("--interstitial", action="store_true", help="add the interstitial part")
    b.add_argument("--solve", type=int, default=0, metavar="NEV", help="print the lowest NEV eigenvalues")
    b.add_argument("--output", default=None, help="write H and S (and k, N_G) to this .npz file")
    b.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    b.add_argument("--quiet", action="store_true")
    return p


def gpu_ids(devices):
    """GPU ids named by a --devices value ("all"/"gpu": every GPU; "cuda:0,cuda:1": those)."""
    if devices in ("all", "gpu", "cuda"):
        from hybridblas.context import cuda_device_count
        return list(range(cuda_device_count()))
    return [int(d.split(":")[1]) for d in devices.split(",") if d.startswith("cuda:")]


def auto_arrays(backend, cell, method, batch_atoms=None, max_temp_bytes=None):
    """'device' when hybridblas runs on GPUs and A, B, X (one batch) and H, S fit in 80 % of the first
    GPU's free memory (that GPU becomes current: cupy allocates there); else 'host'. On the host the
    per-atom products and copies between the BLAS calls cost more than the GPUs' BLAS part."""
    ctx = getattr(backend, "context", None)
    gpus = [d.index for d in getattr(ctx, "devices", []) if d.kind == "cuda"]
    if not gpus:
        return "host"
    import cupy
    from .hsdla import _batch_size, buffers_per_atom
    atoms = _batch_size(cell, method, batch_atoms, max_temp_bytes)
    need = 16 * (2 * cell.n_g ** 2 + buffers_per_atom(method) * atoms * cell.n_l * cell.n_g)
    with cupy.cuda.Device(gpus[0]):
        free = cupy.cuda.runtime.memGetInfo()[0]
    if need > 0.8 * free:
        return "host"
    cupy.cuda.Device(gpus[0]).use()
    return "device"


def make_backend(blas, devices, strategy, comm=None):
    from .backends import get_backend
    if blas == "hybridblas":
        return get_backend(blas, parallel.rank_context(comm, devices, strategy))
    gpus = gpu_ids(devices)
    if not gpus:
        raise ValueError(f"--blas {blas} needs GPUs; --devices {devices!r} names none")
    return get_backend(blas, gpus=gpus)


def _build(args):
    comm = parallel.world()
    rank = comm.Get_rank() if comm is not None else 0
    backend = make_backend(args.blas, args.devices, args.strategy, comm)
    crystal = dict(kmax=args.kmax, k=tuple(args.k), potential=args.potential, v0=args.v0, supercell=args.supercell)
    cell = System.from_file(args.structure, **crystal) if args.structure else System.preset(args.system, **crystal)
    quiet = args.quiet or args.json or rank != 0
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    ranks = f", {comm.Get_size()} MPI ranks" if comm is not None else ""
    log(f"flapw: {cell.name}: N_A={cell.n_atoms} N_L={cell.n_l} Kmax={cell.kmax} "
        f"({args.kpoints} k-point{'s' if args.kpoints > 1 else ''}, {args.method}, devices={args.devices}{ranks})")
    parallel.share_k_independent(cell, comm)
    reports, saved = [], {}
    max_bytes = None if args.max_temp_gib is None else int(args.max_temp_gib * 2 ** 30)
    arrays = args.arrays if args.arrays != "auto" else auto_arrays(backend, cell, args.method, args.batch_atoms,
                                                                   max_bytes)
    log(f"arrays: {arrays}")
    t_loop = time.perf_counter()
    for ik, k in parallel.my_kpoints(_kpoints(args.kpoints, args.k), comm):
        kc = cell.with_k(k)
        log(f"k-point {ik + 1}/{args.kpoints}: k={k} N_G={kc.n_g}")
        h, s, rep = build_hs(kc, method=args.method, interstitial=args.interstitial,
                             batch_atoms=args.batch_atoms, max_temp_bytes=max_bytes, blas=backend,
                             arrays=arrays, return_report=True,
                             progress=lambda i, n: log(f"  batch {i}/{n} done") if n > 1 else None)
        d = rep.as_dict()
        d["k"] = list(k)
        d["k_index"] = ik
        d["rank"] = rank
        if args.solve:
            from . import solve
            hh, ss = (h.get(), s.get()) if hasattr(h, "get") else (h, s)
            d["eigenvalues"] = solve(hh, ss, args.solve).tolist()
        if not args.json and comm is None:
            print(rep.table())
            if args.solve:
                print("lowest eigenvalues (Ha):", " ".join(f"{e:.6f}" for e in d["eigenvalues"]))
        reports.append(d)
        if args.output:
            saved[f"H_{ik}"] = h.get() if hasattr(h, "get") else h
            saved[f"S_{ik}"] = s.get() if hasattr(s, "get") else s
            saved[f"k_{ik}"] = np.asarray(k)
        del h, s
    if args.output:
        # under MPI each rank writes the k-points it built: FILE.rank<r>.npz
        path = args.output if comm is None else f"{args.output.removesuffix('.npz')}.rank{rank}.npz"
        np.savez(path, **saved)
        log(f"wrote H and S to {path}")
    # this rank's k-point loop (the throughput measure: setup and process start are paid once per run)
    loop = time.perf_counter() - t_loop
    loops = comm.gather(loop, root=0) if comm is not None else [loop]
    reports = parallel.gather_reports(reports, comm)
    if rank != 0:
        return 0
    if comm is not None and not args.json:
        for d in reports:
            print(f"k-point {d['k_index'] + 1} on rank {d['rank']}: " + _summary(d))
    if args.json:
        json.dump({"system": cell.name, "kmax": cell.kmax, "devices": args.devices, "arrays": arrays,
                   "ranks": comm.Get_size() if comm is not None else 1, "loop_seconds": loops,
                   "kpoints_per_second": args.kpoints / max(loops), "reports": reports},
                  sys.stdout, indent=1)
        print()
    return 0


def _summary(d):
    return (f"N_G={d['N_G']}, {d['total_seconds']:.2f} s, {d['total_tflops']:.3f} TFLOP/s "
            f"(BLAS part {d['blas_tflops']:.3f})")


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            return _build(args)
    except (ValueError, BackendUnavailable) as exc:
        print(f"flapw: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
