"""Shell-model Hamiltonian build: this tree's cisolver.shellmodel against a reference copy of the package,
side by side in one process (alternating runs), with a bit-for-bit check of the CSR arrays.

    python3 -m benchmarks.cisolver build --cases 46Ti,24Mg --json out.json
    python3 -m benchmarks.cisolver build --reference /path/to/other/tree/cisolver/shellmodel --cases 46Ti
    python3 -m benchmarks.cisolver build --reference <git revision> --cases 46Ti,48Cr --storage upper --spectrum

Without --reference, this tree's build alone. --reference: a folder holding a shellmodel package, or a git revision of this repository (its
cisolver/shellmodel is extracted to a temporary folder). Times are wall seconds (and process CPU seconds),
median of --repeats runs: ``problem`` = ShellModelProblem(...) (basis, elements, species matrices),
``build`` = problem.build(...). --spectrum also times cisolver.spectrum.compute_spectrum (what
``python3 -m cisolver spectrum`` runs) with either package; --cli-tree DIR times the whole CLI as a process
in another checkout and in this one. Identity: indptr, indices and data (dtype and bytes) for both storages,
and with --check-ranges float32 and row ranges cut inside blocks.
"""
import gc
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cisolver import spectrum
from cisolver.data import resolve_interaction
from cisolver.shellmodel import hamiltonian, snt
from hybridblas.console import CLIError, check_output_path, positive_int

from benchmarks.common import CASES, case_list, write_json

ROOT = Path(__file__).resolve().parents[2]


def load_reference(where):
    """The reference shellmodel package as a module named shellmodel_reference."""
    folder = Path(where)
    if not folder.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix="shellmodel_reference_"))
        names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", where, "cisolver/shellmodel/"],
                               check=True, capture_output=True, text=True).stdout.split()
        if not names:
            raise CLIError(f"--reference {where!r}: neither a folder nor a git revision with cisolver/shellmodel")
        for name in names:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{where}:{name}"], check=True,
                                  capture_output=True).stdout
            (tmp / Path(name).name).write_bytes(text)
        folder = tmp
    spec = importlib.util.spec_from_file_location("shellmodel_reference", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["shellmodel_reference"] = module
    spec.loader.exec_module(module)
    return (importlib.import_module("shellmodel_reference.hamiltonian"),
            importlib.import_module("shellmodel_reference.snt"))


def identical(a, b):
    return (a.shape == b.shape and a.indptr.dtype == b.indptr.dtype and a.indices.dtype == b.indices.dtype
            and a.data.dtype == b.data.dtype and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and a.data.tobytes() == b.data.tobytes())


def timed(fn):
    """fn's result, wall seconds and process CPU seconds (all threads)."""
    gc.collect()
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def row_ranges(problem):
    """Ranges cut inside blocks between proton determinants, a whole block, and the whole matrix."""
    blocks = problem.basis.blocks
    mid = max(blocks, key=lambda b: b.size)
    return [(mid.offset + mid.n_n, mid.offset + max(2, mid.n_p // 2) * mid.n_n),
            (blocks[0].offset, mid.offset + mid.n_n), (mid.offset, mid.offset + mid.size)]


def compare_case(name, versions, storages, repeats, threads, check_ranges, blocks=None):
    inter_name, z, n = CASES[name]
    path = resolve_interaction(inter_name)
    rec = {"case": name, "interaction": inter_name, "protons": z, "neutrons": n, "threads": threads,
           "cores": len(os.sched_getaffinity(0)), "load_average": os.getloadavg()[0]}
    print(f"{name}: {inter_name} {z}p {n}n" + (f", row blocks {blocks}" if blocks else ""), flush=True)
    problems, t_problem = {}, {k: [] for k in versions}
    for _ in range(repeats):
        for label, (ham, rd) in versions.items():
            inter = rd.read_snt(path)
            problems[label], dt, _ = timed(lambda: ham.ShellModelProblem(inter, z, n))
            t_problem[label].append(dt)
    rec["dimension"] = problems["new"].dimension
    rec["problem_seconds"] = {k: statistics.median(v) for k, v in t_problem.items()}
    print(f"  dimension {rec['dimension']}, problem set-up median "
          + ", ".join(f"{k} {v:.3f}s" for k, v in rec["problem_seconds"].items()), flush=True)
    for storage in storages:
        times, cpu = {k: [] for k in versions}, {k: [] for k in versions}
        same = True
        for rep in range(repeats):
            built = {}
            for label in versions:
                (h, _), dt, dc = timed(lambda: problems[label].build(storage, n_threads=threads, blocks=blocks))
                times[label].append(dt)
                cpu[label].append(dc)
                if rep == 0 and len(versions) > 1:
                    built[label] = h
                del h
            if built:
                same &= identical(built["reference"], built["new"])
                rec[f"nnz_{storage}"] = int(built["new"].nnz)
            built.clear()
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        rec[storage] = {"build_seconds": med, "build_cpu_seconds": med_cpu, "runs": times, "cpu_runs": cpu,
                        "identical": same if len(versions) > 1 else None}
        ratio = f", new/reference {med['new'] / med['reference']:.2f}" if "reference" in med else ""
        print(f"  {storage}: build median " + ", ".join(f"{k} {v:.3f}s" for k, v in med.items()) + ratio
              + " (CPU " + ", ".join(f"{k} {v:.3f}s" for k, v in med_cpu.items()) + ")"
              + (f", identical: {same}" if len(versions) > 1 else ""), flush=True)
    if check_ranges and len(versions) > 1:
        ok = True
        for storage in storages:
            for dtype in (np.float64, np.float32):
                ok &= identical(problems["reference"].build(storage, dtype)[0],
                                problems["new"].build(storage, dtype)[0])
            for lo, hi in row_ranges(problems["new"]):
                ok &= identical(problems["reference"].build(storage, rows=(lo, hi))[0],
                                problems["new"].build(storage, rows=(lo, hi))[0])
        rec["identical_float32_and_row_ranges"] = ok
        print(f"  float32 and row ranges identical: {ok}", flush=True)
    return rec


def compare_spectrum(name, versions, repeats, nev, threads):
    inter_name, z, n = CASES[name]
    times = {k: [] for k in versions}
    energies = {}
    for _ in range(repeats):
        for label, (ham, _) in versions.items():
            spectrum.hamiltonian = ham
            try:
                out, dt, _ = timed(lambda: spectrum.compute_spectrum(inter_name, z, n, nev, n_threads=threads))
            finally:
                spectrum.hamiltonian = hamiltonian
            times[label].append((dt, out["seconds"]["read+build"]))
            energies[label] = out["energies"]
    med = {k: {"total": statistics.median(t for t, _ in v), "read+build": statistics.median(b for _, b in v)}
           for k, v in times.items()}
    same = len({tuple(e) for e in energies.values()}) == 1
    print(f"  spectrum ({nev} states, same energies: {same}): median " + ", ".join(
        f"{k} total {v['total']:.2f}s (read+build {v['read+build']:.2f}s)" for k, v in med.items()), flush=True)
    return {"spectrum_seconds": med, "spectrum_runs": times, "energies": energies}


def compare_cli(name, tree, repeats, nev):
    """Wall seconds of the whole ``python3 -m cisolver spectrum`` run in another tree and in this one,
    alternating, and the 'read+build' seconds each run prints."""
    inter_name, z, n = CASES[name]
    cmd = [sys.executable, "-m", "cisolver", "spectrum", "--interaction", inter_name, "--protons", str(z),
           "--neutrons", str(n), "--nev", str(nev), "--json"]
    runs = {"reference tree": [], "this tree": []}
    for _ in range(repeats):
        for label, cwd in (("reference tree", tree), ("this tree", ROOT)):
            t = time.perf_counter()
            out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
            runs[label].append((time.perf_counter() - t, json.loads(out.stdout)["seconds"]["read+build"]))
    med = {k: {"total": statistics.median(t for t, _ in v), "read+build": statistics.median(b for _, b in v)}
           for k, v in runs.items()}
    print(f"  CLI spectrum ({nev} states), median of {repeats}: " + ", ".join(
        f"{k} {v['total']:.2f}s (read+build {v['read+build']:.2f}s)" for k, v in med.items()), flush=True)
    return {"cli_seconds": med, "cli_runs": runs}


def add_arguments(ap):
    ap.add_argument("--reference", help="folder of a shellmodel package, or a git revision (omit: this tree only)")
    ap.add_argument("--cases", type=case_list, default="46Ti", help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--storage", default="upper,full", help="comma list of upper, full")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="n_threads of both builds (default: each one's own)")
    ap.add_argument("--check-ranges", action="store_true", help="also compare float32 and row-range builds")
    ap.add_argument("--blocks", help="comma list of row blocks: build only those (a matrix too big for the reference)")
    ap.add_argument("--spectrum", action="store_true", help="also time compute_spectrum with either package")
    ap.add_argument("--nev", type=positive_int, default=5)
    ap.add_argument("--cli-tree", help="also time the whole CLI run in this other repository tree vs this one")
    ap.add_argument("--json", help="write the records to this file")


def run(args):
    check_output_path(args.json, "--json")
    storages = args.storage.split(",")
    if any(s not in ("upper", "full") for s in storages):
        raise CLIError(f"--storage must be a comma list of upper, full; got {args.storage!r}")
    versions = {}
    if args.reference:
        versions["reference"] = load_reference(args.reference)
    versions["new"] = (hamiltonian, snt)
    print(f"cores available: {len(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.1f}", flush=True)
    records = []
    for name in args.cases:
        blocks = [int(b) for b in args.blocks.split(",")] if args.blocks else None
        rec = compare_case(name, versions, storages, args.repeats, args.threads, args.check_ranges, blocks)
        rec["blocks"] = blocks
        if args.spectrum:
            rec.update(compare_spectrum(name, versions, args.repeats, args.nev, args.threads))
        if args.cli_tree:
            rec.update(compare_cli(name, args.cli_tree, args.repeats, args.nev))
        records.append(rec)
    write_json(args.json, records)
    return 0
