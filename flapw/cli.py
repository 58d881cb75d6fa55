"""flapw build --system TiO2 --kmax 3.0 [--kpoints N] [--method refined|original] [--devices ...]
           [--interstitial] [--solve NEV [--vectors]] [--full] [--output FILE.npz|FILE.h5] [--json] [-q] [-v]

H and S are built as their lower triangles (what the eigensolvers read); ``--full`` fills the upper ones
too. Files always get both triangles. ``--solve`` runs where H and S live (a GPU for device arrays).

Everything is checked before any work: each option's value, the devices, the output path and format, the
basis at every k-point this rank builds, and the memory the build needs. A bad choice ends with exit 2 and
a one-line message naming the option and its value; nothing is written.
"""
import argparse
import json
import logging
import math
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np

import hybridblas as hb
from hybridblas import console

from . import kpoints as side, parallel
from .backends import BACKENDS, BackendUnavailable, get_backend
from .eigen import solve
from .hsdla import (DEVICE_SHARE, METHODS, Workspace, _batch_size, _runs_on_gpu, build_bytes,
                    build_hs_with_fallback, buffers_per_atom, fitting_batch, memory_breakdown, operands_place)
from .output import HSWriter, check_writable, file_format, rank_path
from .structures import PRESETS
from .system import DEFAULT_K, System
from .warmup import prepare

PROG = "flapw"
log = logging.getLogger(PROG)
_C16 = 16


MAX_KPOINTS = 100_000


# Builds a worker leaves queued on its GPU while its host goes on to the next k-point (device H and S that the host
# does not read): the GPU then runs one k-point while the host queues the next.
QUEUED_KPOINTS = 1


def _kpoints(n, first):
    """``n`` generic k-points: the default one, then a fixed low-discrepancy sequence (reproducible)."""
    out = [tuple(float(x) for x in first)]
    golden = np.array([0.7548776662, 0.5698402910, 0.4301597090])   # R3 sequence offsets
    for i in range(1, n):
        out.append(tuple(float(x) for x in np.round((np.asarray(first) + i * golden) % 1.0 - 0.5, 6)))
    return out


def _finite(text):
    """argparse type: a finite float (nan and inf refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _parser():
    # -q/-v belong to the subcommand: argparse lets a subparser's defaults overwrite the parent's values
    p, sub = console.tool_parser(PROG, "LAPW Hamiltonian and Overlap matrices on hybridblas")
    b = sub.add_parser("build", help="build H and S for a preset crystal and print a per-stage table")
    console.add_common_options(b)
    b.add_argument("--system", default="NaCl", choices=sorted(PRESETS))
    b.add_argument("--structure", metavar="FILE", default=None,
                   help="build this crystal instead of --system: any file ase.io.read reads (CIF, POSCAR, ...; "
                        "needs ase), default muffin-tin radii and lmax as System.from_ase")
    b.add_argument("--kmax", type=console.positive_float, default=2.5,
                   help="plane-wave cutoff |k+G| <= Kmax (1/bohr)")
    b.add_argument("--kpoints", type=console.positive_int, default=1,
                   help="number of generic k-points (radial functions and T reused)")
    b.add_argument("--k", type=_finite, nargs=3, default=DEFAULT_K, help="first k-point, supercell reciprocal units")
    b.add_argument("--method", default="refined", choices=METHODS)
    b.add_argument("--devices", default="cpu", help="cpu, gpu, all, GPU ids like 0,1, or cuda:0,cuda:1 "
                                                    "(under MPI: all, gpu or cpu)")
    b.add_argument("--strategy", default="auto", choices=("static", "dynamic", "auto"))
    b.add_argument("--blas", default="hybridblas", choices=BACKENDS)
    b.add_argument("--arrays", default="auto", choices=("auto", "host", "device"),
                   help="where A, B, X, H, S live (device: cupy on this rank's first GPU; auto: there when "
                        "hybridblas runs on GPUs and they fit in its free memory, else host). A device build "
                        "that runs out of GPU memory is repeated with fewer atoms per batch, then on the host")
    b.add_argument("--operands", default="auto", choices=("auto", "host", "device"),
                   help="with host arrays: where A, B, X and the T products live (device: the first GPU of "
                        "--devices; H and S are built there too and copied to host memory when the whole build fits "
                        "there, else they stay in host memory and only their tiles cross PCIe; auto: there when "
                        "hybridblas runs on GPUs, else host)")
    b.add_argument("--potential", default="model", choices=("model", "empty"))
    b.add_argument("--v0", type=_finite, default=0.0, help="interstitial potential (Ha)")
    b.add_argument("--supercell", type=console.positive_int, nargs=3, default=None,
                   help="override the preset's supercell")
    b.add_argument("--batch-atoms", type=console.positive_int, default=None, help="atoms per batch (A/B/X memory)")
    b.add_argument("--max-temp-gib", type=console.positive_float, default=None,
                   help="bound the A/B/X buffers (GiB)")
    b.add_argument("--interstitial", action="store_true", help="add the interstitial part")
    b.add_argument("--solve", type=console.nonnegative_int, default=0, metavar="NEV",
                   help="print the lowest NEV eigenvalues (solved where H and S live: a GPU for device arrays)")
    b.add_argument("--vectors", action="store_true",
                   help="with --solve and --output: write the NEV eigenvectors (and eigenvalues) per k-point")
    b.add_argument("--full", action="store_true",
                   help="fill the upper triangles of H and S too (default: the lower ones only, what eigensolvers "
                        "read; files always get both)")
    b.add_argument("--overlap", default="off", choices=("auto", "on", "off"),
                   help="host arrays: run the per-atom host work beside the BLAS calls in a fourth buffer "
                        "(auto: when the BLAS runs on GPUs and the fourth buffer fits; off by default: on two H100s "
                        "it made TiO2 Kmax 3.0 4.5x slower a k-point)")
    b.add_argument("--multi-gpu", default="auto", choices=("auto", "split", "kpoints"),
                   help="several GPUs: split every BLAS call over them, or build k-points side by side, one per "
                        f"GPU (auto: side by side on device arrays when N_G < {side.SPLIT_BELOW} and there are "
                        "several k-points; with --arrays host only when asked: more k-points a second, each slower)")
    b.add_argument("--emulate", action="store_true",
                   help="FP64 products on the GPUs' INT8 tensor cores where that wins (k of at least 6144 for "
                        "complex products, 12288 for H's and S's diagonal blocks: batches of 152 atoms or more at "
                        "N_L = 81; hybridblas Context "
                        "emulation='int8', the Ozaki scheme II), as accurate as FP64 cuBLAS on FLAPW's operands "
                        "(docs/performance.md); CPU work and smaller products stay native")
    b.add_argument("--output", default=None,
                   help="write H and S (both triangles) with k, N_G, the basis's Miller indices, the crystal, "
                        "Kmax and units per k-point to FILE.npz or FILE.h5 (docs/flapw.md: the layout)")
    b.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return p


def gpu_ids(devices):
    """GPU ids a --devices value names ("all"/"gpu": every visible GPU; "cuda:0,cuda:1": those)."""
    return list(hb.parse_devices(devices, name="--devices").gpus)


def _emulation(args):
    return "int8" if getattr(args, "emulate", False) else None


def make_backend(blas, devices, strategy, comm=None, emulation=None):
    """The BLAS backend for ``devices`` (a --devices string or a DeviceSpec): hybridblas on this rank's
    Context (``emulation`` as hybridblas.Context takes it), or cuBLASXt on the GPUs named."""
    spec = devices if isinstance(devices, hb.DeviceSpec) else parallel.check_devices(devices, comm)
    if emulation and blas == "hybridblas" and not spec.gpus:
        raise ValueError(f"--emulate runs the FP64 products on GPUs; --devices {str(spec)!r} names none "
                         f"(--devices gpu or all)")
    if blas == "hybridblas":
        return get_backend(blas, parallel.rank_context(comm, spec, strategy, emulation))
    if emulation:
        raise ValueError(f"--emulate needs --blas hybridblas, got --blas {blas}")
    if not spec.gpus:
        raise ValueError(f"--blas {blas} needs GPUs; --devices {str(spec)!r} names none")
    try:
        return get_backend(blas, gpus=list(spec.gpus))
    except BackendUnavailable as exc:
        raise console.CLIError(f"--blas {blas}: {exc}") from None


def _context_gpus(backend):
    ctx = getattr(backend, "context", None)
    return [d.index for d in getattr(ctx, "devices", []) if d.kind == "cuda"]


def _use_gpu(index):
    """Make GPU ``index`` current: cupy allocates device arrays there."""
    import cupy
    cupy.cuda.Device(index).use()


def auto_arrays(backend, cell, method, batch_atoms, interstitial=False):
    """('device', nb) when hybridblas runs on GPUs and a build with nb atoms per batch, the first of
    batch_atoms, batch_atoms // 2, ..., 1 that fits, takes at most DEVICE_SHARE of the first GPU's free memory
    (that GPU becomes current: cupy allocates there); else ('host', batch_atoms). On the host the per-atom
    products and copies between the BLAS calls cost more than the GPUs' BLAS part."""
    gpus = _context_gpus(backend)
    if not gpus:
        return "host", batch_atoms
    nb = fitting_batch(cell, method, batch_atoms, DEVICE_SHARE * hb.memory.gpu_free(gpus[0]), interstitial,
                       on_device=True)
    if nb is None:
        return "host", batch_atoms
    _use_gpu(gpus[0])
    return "device", nb


def _host_copies(args, arrays, n_g):
    """Bytes beside the build on the host: eigh's copies of H and S for --solve on host arrays, and the host
    copies of device H and S for --output (a device solve stays on the GPU)."""
    pair = 2 * _C16 * n_g * n_g
    return (pair if args.solve and arrays == "host" else 0) + (pair if arrays == "device" and args.output else 0)


def _host_kpoint_bytes(args, n_g):
    """Host bytes one k-point of host arrays holds beside its GPU build: H and S, and eigh's copies for --solve."""
    return 2 * _C16 * n_g * n_g + _host_copies(args, "host", n_g)


def _host_batch(args, cell, nb, arrays, comm, workers=1, overlap=False, operands="host"):
    """Atoms per batch (nb, or for host arrays the first halving of it that fits) for which what the host
    holds (the build's estimate with host arrays, and the copies of H and S for --solve/--output, for each
    of ``workers`` k-points built at once) fits in this rank's share of the host's memory; else
    hybridblas.InsufficientMemory, before any work. Host arrays side by side hold the other workers' H and S
    (and copies) beside this estimate where the operands live on the GPUs, else their whole builds."""
    ranks = parallel.ranks_on_node(comm)
    fraction = 0.9 / ranks
    copies = _host_copies(args, arrays, cell.n_g)
    extra = copies if arrays == "host" else workers * copies
    if arrays == "host" and workers > 1:
        if operands == "device":
            extra += (workers - 1) * _host_kpoint_bytes(args, cell.n_g)
        else:
            fraction /= workers
    if arrays == "host":
        fits = fitting_batch(cell, args.method, nb, fraction * hb.memory.host_available() - extra,
                             args.interstitial, overlap=overlap)
        if fits is not None:
            if fits < nb:
                log.info("host memory: %d atoms per batch instead of %d", fits, nb)
            return fits
        need = build_bytes(cell, args.method, 1, args.interstitial, overlap=overlap) + extra
        beside = [what for what, held in (("copies of H and S for --solve", copies),
                                           ("the other GPUs' k-points", extra - copies)) if held]
        parts = memory_breakdown(cell, args.method, 1, overlap) + (
            f", {' and '.join(beside)} {hb.memory.format_bytes(extra)}" if extra else "")
    elif extra:
        need, parts = extra, "host copies of H and S for --output"
    else:
        return nb
    share = f" per rank ({ranks} ranks on this node)" if ranks > 1 else ""
    hb.memory.require(
        need, where="host", fraction=fraction,
        what=f"{_crystal_option(args)} --kmax {args.kmax} (N_G = {cell.n_g}: {parts}){share}",
        advice="use a smaller --kmax (N_G grows as Kmax³, H and S as N_G²), bound the A/B/X buffers with "
               "--max-temp-gib or --batch-atoms, or run fewer MPI ranks per node")
    return nb


def _crystal_option(args):
    return f"--structure {args.structure}" if args.structure is not None else f"--system {args.system}"


def _side_by_side(args, backend, largest, nb, n_kpoints, ranks=1):
    """[(GPU id, its own single-GPU backend), ...] and the atoms per batch when k-points go side by side,
    one per GPU: on device arrays (--multi-gpu kpoints, or auto with N_G < SPLIT_BELOW and several k-points),
    and with --arrays host and --multi-gpu kpoints on host arrays of each GPU's own (built on that GPU where
    they fit, and copied to the host); (None, nb) when every call goes to the context's GPUs instead (calls
    too short to gain from a split stay on one GPU: hybridblas.policy). Measured on two H100s, NaCl Kmax 3.5,
    host arrays, 8 k-points: 18.6-18.7 k-points/s side by side against 12.3-12.4 one call after the other, but
    a k-point took 0.079-0.115 s side by side against 0.077-0.080 s (device arrays: 0.063-0.070 s), so host
    arrays go side by side only when asked."""
    gpus = _context_gpus(backend) if args.blas == "hybridblas" else []
    asked = args.multi_gpu == "kpoints"
    if asked and len(gpus) < 2:
        raise ValueError(f"--multi-gpu kpoints needs two or more GPUs in --devices and --blas hybridblas, got "
                         f"--devices {args.devices!r}, --blas {args.blas}")
    if not asked and (args.multi_gpu == "split" or len(gpus) < 2 or n_kpoints < 2 or args.arrays == "host"
                      or largest.n_g >= side.SPLIT_BELOW):
        return None, nb
    if args.arrays == "host":       # each GPU's k-point in host arrays of its own, beside the others
        held = len(gpus) * _host_kpoint_bytes(args, largest.n_g)
        if held > 0.9 / ranks * hb.memory.host_available():
            if asked:
                raise ValueError(f"--multi-gpu kpoints with --arrays host: {len(gpus)} k-points' H and S "
                                 f"({hb.memory.format_bytes(held)}) do not fit in host memory; use --multi-gpu split")
            return None, nb
    workers, fits = [], []
    for g in gpus:
        one = get_backend("hybridblas", hb.Context(devices=[f"cuda:{g}"], strategy=args.strategy,
                                                   emulation=_emulation(args)))
        if args.arrays == "host":
            workers.append((g, one))
            fits.append(nb)
            continue
        arrays, fit = auto_arrays(one, largest, args.method, nb, args.interstitial)
        if arrays != "device":
            if asked:
                raise ValueError(f"--multi-gpu kpoints: the build at N_G = {largest.n_g} does not fit on GPU {g} "
                                 f"({memory_breakdown(largest, args.method, 1)}); use --multi-gpu split")
            return None, nb
        workers.append((g, one))
        fits.append(fit)
    return workers, min(fits)


def _plan(args, comm):
    """Every check before the build; returns what the build needs. Raises on a bad option (exit 2)."""
    spec = parallel.check_devices(args.devices, comm)
    if args.arrays == "device" and args.blas != "hybridblas":
        raise ValueError(f"--arrays device needs --blas hybridblas (cuBLASXt takes host arrays), "
                         f"got --blas {args.blas}")
    if args.arrays == "device" and not spec.gpus:
        raise ValueError(f"--arrays device needs a GPU in --devices, got --devices {args.devices!r}")
    if args.vectors and not (args.solve and args.output):
        raise ValueError(f"--vectors writes the eigenvectors to the --output file: it needs --solve NEV and --output "
                         f"FILE, got --solve {args.solve} and --output {args.output!r}")
    path = None
    if args.output is not None:
        console.check_output_path(args.output, "--output")
        file_format(args.output, "--output")
        path = args.output if comm is None else rank_path(args.output, comm.Get_rank())
        check_writable(path, "--output")
    crystal = dict(kmax=args.kmax, k=tuple(args.k), potential=args.potential, v0=args.v0, supercell=args.supercell)
    if args.kpoints > MAX_KPOINTS:
        raise ValueError(f"--kpoints must be at most {MAX_KPOINTS} (a build each), got {args.kpoints}")
    if args.structure is not None:
        cell = System.from_file(args.structure, **crystal)
    else:
        cell = System.preset(args.system, **crystal)
    kpoints = _kpoints(args.kpoints, args.k)
    mine = parallel.my_kpoints(kpoints, comm)
    sizes = {ik: cell.with_k(k).n_g for ik, k in mine}
    for ik, n_g in sizes.items():
        if n_g == 0:
            raise ValueError(f"--kmax {args.kmax}: no plane wave has |k+G| <= Kmax at k-point {ik + 1} "
                             f"(N_G = 0); raise --kmax")
        if args.solve > n_g:
            raise ValueError(f"--solve {args.solve} asks for more eigenvalues than N_G = {n_g}, the basis size "
                             f"at k-point {ik + 1}")
        if args.solve and not args.interstitial and n_g > 2 * cell.n_atoms * cell.n_l:
            raise ValueError(f"--solve {args.solve} needs --interstitial here: without it S (muffin-tin part "
                             f"only) has rank at most 2 N_A N_L = {2 * cell.n_atoms * cell.n_l} < N_G = {n_g}")
    largest = cell.with_k(kpoints[max(sizes, key=sizes.get)]) if sizes else cell
    max_bytes = None if args.max_temp_gib is None else int(min(args.max_temp_gib, 2.0 ** 32) * 2 ** 30)
    per_atom = buffers_per_atom(args.method) * _C16 * largest.n_l * largest.n_g
    if max_bytes is not None and max_bytes < per_atom:
        raise ValueError(f"--max-temp-gib {args.max_temp_gib} is below one atom's {args.method} buffers "
                         f"({hb.memory.format_bytes(per_atom)} at N_G = {largest.n_g})")
    nb = _batch_size(largest, args.method, args.batch_atoms, max_bytes)
    if comm is None:                         # no current GPU yet: the first (--devices 1 makes no context on GPU 0)
        console.use_first_gpu(spec.gpus)
    backend = make_backend(args.blas, spec, args.strategy, comm, _emulation(args))
    workers, nb = _side_by_side(args, backend, largest, nb, len(mine), parallel.ranks_on_node(comm))
    arrays = "device" if workers and args.arrays != "host" else args.arrays
    if arrays == "auto":
        arrays, nb = auto_arrays(backend, largest, args.method, nb, args.interstitial)
    operands = operands_place(arrays, args.operands, backend)
    if operands == "device" and not workers:     # device arrays, or host arrays with their operands on the GPU
        _use_gpu(_context_gpus(backend)[0])
    overlap = args.overlap == "on"
    if overlap and (arrays != "host" or args.method != "refined"):
        raise ValueError(f"--overlap on is for the refined method on host arrays, got --method {args.method} and "
                         f"arrays {arrays}")
    if args.overlap == "auto" and arrays == "host" and args.method == "refined" and _runs_on_gpu(backend):
        room = 0.9 / parallel.ranks_on_node(comm) * hb.memory.host_available() - _host_copies(args, arrays, largest.n_g)
        overlap = fitting_batch(largest, args.method, nb, room, args.interstitial, overlap=True) == nb
    nb = _host_batch(args, largest, nb, arrays, comm, len(workers or [None]), overlap, operands)
    return SimpleNamespace(spec=spec, cell=cell, kpoints=kpoints, mine=mine, backend=backend, arrays=arrays,
                           batch_atoms=nb, path=path, workers=workers, overlap=overlap, largest=largest,
                           operands=operands)


class _BatchProgress:
    """build_hs's progress(batch, batches) as a progress bar on a terminal (console.progress); a build
    repeated after running out of memory starts a new bar."""

    def __init__(self, desc, enabled):
        self.desc, self.enabled, self.bar = desc, enabled, None

    def __call__(self, batch, batches):
        if self.bar is None or batch == 1:
            self.close()
            self.bar = console.progress(batches, self.desc, self.enabled and batches > 1)
        self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _InOrder:
    """Prints each k-point's text once every earlier one of this rank has been printed (k-points built side
    by side finish in any order)."""

    def __init__(self, order, show):
        self.order, self.show, self.done, self.next = list(order), show, {}, 0
        self.lock = threading.Lock()

    def put(self, key, text):
        with self.lock:
            self.done[key] = text
            while self.next < len(self.order) and self.order[self.next] in self.done:
                if self.show:
                    print(self.done.pop(self.order[self.next]), flush=True)
                self.next += 1


def _solve(args, h, s):
    """(eigenvalues, eigenvectors or None, seconds): on the GPU for device arrays; a GPU that runs out of
    memory for the solve's copies hands it to the host."""
    t0 = time.perf_counter()
    try:
        out = solve(h, s, args.solve, vectors=args.vectors)
    except MemoryError as exc:
        if isinstance(h, np.ndarray) or isinstance(exc, hb.InsufficientMemory):
            raise
        log.info("GPU out of memory in the solve (%s); solving on the host", f"{type(exc).__name__}: {exc}")
        out = solve(h.get(), s.get(), args.solve, vectors=args.vectors)
    values, vectors = out if args.vectors else (out, None)
    values = values.get() if hasattr(values, "get") else values
    return values, vectors, time.perf_counter() - t0


def _build(args):
    comm = parallel.world()
    rank = comm.Get_rank() if comm is not None else 0
    if args.quiet:                           # nothing but errors (console's -q keeps warnings)
        for name in (PROG, "hybridblas", "py.warnings"):
            logging.getLogger(name).setLevel(logging.ERROR)
    elif rank != 0:
        log.setLevel(logging.WARNING)        # notes from rank 0 only
    plan = parallel.on_every_rank(comm, lambda: _plan(args, comm))
    cell, nb = plan.cell, plan.batch_atoms
    ranks = f", {comm.Get_size()} MPI ranks" if comm is not None else ""
    spread = f", k-points side by side on GPUs {[g for g, _ in plan.workers]}" if plan.workers else ""
    emulated = "; FP64 products emulated on INT8 tensor cores" if args.emulate else ""
    log.info("%s: N_A=%d N_L=%d Kmax=%s (%d k-point%s, %s, devices=%s%s); arrays: %s, %d atoms per batch%s%s",
             cell.name, cell.n_atoms, cell.n_l, cell.kmax, args.kpoints, "s" if args.kpoints > 1 else "",
             args.method, plan.spec, ranks, plan.arrays, nb, spread, emulated)
    parallel.share_k_independent(cell, comm)
    if comm is not None and plan.largest is not cell:
        plan.largest = cell.with_k(plan.largest.k)     # the largest k-point on the broadcast k-independent data
    cell.tmats                               # the k-independent data, once, before the k-point loop
    if args.interstitial:
        cell.step_table
    show = not args.json and comm is None       # -q: each k-point's result line, not its stage table
    writer = None if plan.path is None else HSWriter(plan.path, cell, method=args.method, option="--output",
                                                     interstitial=args.interstitial, n_kpoints=args.kpoints)
    write_lock = threading.Lock()
    printer = _InOrder([ik for ik, _ in plan.mine], show)

    def at_k(item):
        """The crystal at k-point ``item`` with its G+k basis made (side.ahead: one k-point ahead)."""
        kc = cell.with_k(item[1])
        kc.basis
        return kc

    def one(state, item, kc):
        """Build, solve and write one k-point with a worker's backend, arrays and workspace; returns its report
        (a dict), or, for a build left queued on the worker's GPU, a function that returns it once the GPU is
        done (the worker's k-points queued more than QUEUED_KPOINTS before this one are finished here)."""
        ik, k = item
        log.info("k-point %d/%d: k=%s N_G=%d", ik + 1, args.kpoints, k, kc.n_g)
        # device H and S that nothing reads on the host: the next k-point's host work runs beside this one's GPU work
        queued = state.arrays == "device" and not args.solve and writer is None
        with _BatchProgress(f"k-point {ik + 1}/{args.kpoints}", not args.quiet and not plan.workers) as bar:
            h, s, rep = build_hs_with_fallback(kc, method=args.method, interstitial=args.interstitial,
                                               batch_atoms=state.nb, blas=state.backend, arrays=state.arrays,
                                               lower_only=not args.full, return_report=True, progress=bar,
                                               workspace=state.workspace if state.arrays == "host" else None,
                                               overlap=plan.overlap, operands=state.operands, wait=not queued)
        if state.operands == "device" and rep.operands == "host":
            log.info("the remaining k-points%s are built on host arrays too", " of this GPU" if plan.workers else "")
        state.arrays, state.nb = ("host" if isinstance(h, np.ndarray) else "device"), rep.batch_atoms
        state.operands = rep.operands
        extra = dict(k=list(k), k_index=ik, rank=rank, arrays=state.arrays, triangle="full" if args.full else "lower")
        if state.gpu is not None:
            extra["gpu"] = state.gpu
        if queued and not isinstance(h, np.ndarray):
            del h, s
            finish = _Finished(rep, extra, lambda d: printer.put(ik, f"k-point {ik + 1}: " + _summary(d)
                                                                  if args.quiet else rep.table()), ik)
            state.pending.append(finish)
            while len(state.pending) > QUEUED_KPOINTS:
                state.pending.pop(0)()
            return finish
        last(state)                      # k-points still queued (before a fall back to host arrays) come first
        d = rep.as_dict()
        d.update(extra)
        vectors = None
        text = f"k-point {ik + 1}: " + _summary(d) if args.quiet else rep.table()
        if args.solve:
            values, vectors, d["solve_seconds"] = _solve(args, h, s)
            d["eigenvalues"] = values.tolist()
            text += (f"\nsolve ({'GPU' if state.arrays == 'device' else 'host'}) {d['solve_seconds']:.3f} s; lowest "
                     f"eigenvalues (Ha): " + " ".join(f"{e:.6f}" for e in d["eigenvalues"]))
        if writer is not None:
            with write_lock:
                writer.add(ik, kc, h, s, lower=not args.full, eigenvalues=d.get("eigenvalues") if args.vectors
                           else None, eigenvectors=vectors)
        del h, s, vectors
        printer.put(ik, text)
        return d

    def last(state):
        """The worker's k-points still queued on its GPU, finished in order (the loop's clock includes their GPU
        work)."""
        while state.pending:
            state.pending.pop(0)()

    def drain(state):
        """After an error: wait for the worker's queued k-points, print those that completed, and raise nothing
        (the error that stopped the worker is the one reported)."""
        while state.pending:
            try:
                state.pending.pop(0)()
            except Exception as exc:       # noqa: BLE001 - the first error is already on its way up
                log.warning("%s", exc)

    warm = {}

    def ready(backend, gpu):
        """A worker's state, with the first-use costs of its builds paid (warmup.prepare)."""
        state = SimpleNamespace(backend=backend, arrays=plan.arrays, nb=nb, workspace=Workspace(), gpu=gpu,
                                operands=plan.operands, pending=[])
        spent = prepare(plan.largest, backend, plan.arrays, args.method, nb, interstitial=args.interstitial,
                        nev=args.solve, workspace=state.workspace, overlap=plan.overlap, operands=plan.operands)
        warm.update({f"{k} (GPU {gpu})" if gpu is not None else k: v for k, v in spent.items()})
        return state
    clock = {}
    try:
        if plan.workers:
            def start(worker):
                gpu, backend = worker
                _use_gpu(gpu)                    # this thread's current GPU: its device arrays live there
                return ready(backend, gpu)
            reports = side.side_by_side(plan.mine, plan.workers, one, start,
                                        started=lambda: clock.setdefault("t0", time.perf_counter()), prepare=at_k,
                                        finish=last, cleanup=drain)
        else:
            state = ready(plan.backend, None)
            clock["t0"] = time.perf_counter()
            try:
                reports = [one(state, item, kc) for item, kc in side.ahead(plan.mine, at_k)]
                last(state)
            except BaseException:
                drain(state)
                raise
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    if writer is not None:
        writer.close()
        log.info("wrote H and S to %s", plan.path)
    # this rank's k-point loop (the throughput measure: setup, warm-up and process start are paid once per run)
    loop = time.perf_counter() - clock["t0"]
    reports = [r() if callable(r) else r for r in reports]
    loops = comm.gather(loop, root=0) if comm is not None else [loop]
    reports = parallel.gather_reports(reports, comm)
    if rank != 0:
        return 0
    if comm is not None and not args.json:
        for d in reports:
            eig = "" if "eigenvalues" not in d else "; lowest eigenvalues (Ha): " + " ".join(
                f"{e:.6f}" for e in d["eigenvalues"])
            print(f"k-point {d['k_index'] + 1} on rank {d['rank']}: " + _summary(d) + eig)
    if args.json:
        json.dump({"system": cell.name, "kmax": cell.kmax, "devices": str(plan.spec), "arrays": plan.arrays,
                   "batch_atoms": plan.batch_atoms, "ranks": comm.Get_size() if comm is not None else 1,
                   "multi_gpu": "kpoints" if plan.workers else "split", "overlap": plan.overlap,
                   "emulation": _emulation(args),
                   "setup_seconds": cell.setup_seconds(), "warm_up_seconds": warm,
                   "loop_seconds": loops, "kpoints_per_second": args.kpoints / max(loops), "reports": reports,
                   "output": None if plan.path is None else str(plan.path)},
                  sys.stdout, indent=1)
        print()
    return 0


class _Finished:
    """A queued k-point's report: called (once for its effect, then again for the dict) it waits for the GPU
    work of the build, completes the report with ``extra`` and hands it to ``show``."""

    def __init__(self, rep, extra, show, k_index):
        self._rep, self._extra, self._show, self._dict, self._k = rep, extra, show, None, k_index
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            if self._dict is None:
                try:
                    d = self._rep.as_dict()            # waits for the GPU: a fault of its work surfaces here
                except Exception:
                    log.error("k-point %d: its GPU work failed (found when waited for, one k-point later)", self._k + 1)
                    raise
                d.update(self._extra)
                self._show(d)
                self._dict = d
            return self._dict


def _summary(d):
    return (f"N_G={d['N_G']}, {d['total_seconds']:.2f} s, {d['total_tflops']:.3f} TFLOP/s "
            f"(BLAS part {d['blas_tflops']:.3f})")


def _body(args):
    if args.command == "build":
        return _build(args)
    raise console.CLIError(f"unknown command {args.command!r}")


def main(argv=None):
    """``flapw build ...``; returns the exit code (0 done, 1 failed, 2 bad input or refused, 130 Ctrl-C). A
    caller's current GPU is current again on return (a build makes its GPUs current while it runs); a caller that
    had none keeps the GPU the build left current (console.gpu_kept)."""
    with console.gpu_kept():
        return console.run_main(PROG, _body, argv, _parser())


if __name__ == "__main__":
    sys.exit(main())
