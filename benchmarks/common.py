"""What the benchmark drivers share: the subcommand frame, the command line and JSON a run records, CPU
timing, and the shell-model cases.

A driver is a table {command: (module of benchmarks.measure, one-line help)}; each module has a docstring
(the command's description), ``add_arguments(parser)`` and ``run(args)``. No module needs CuPy, mpi4py or
matplotlib to import (they are imported where they are used), so every --help works on any machine.
"""
import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

from hybridblas.console import CLIError, add_common_options, run_main

# name: (interaction, valence protons, valence neutrons)
CASES = {"18O": ("usdb", 0, 2), "20Ne": ("usdb", 2, 2), "24Mg": ("usdb", 4, 4), "28Si": ("usdb", 6, 6),
         "44Ti": ("gxpf1a", 2, 2), "46Ti": ("gxpf1a", 2, 4), "47V": ("gxpf1a", 3, 4), "48Cr": ("gxpf1a", 4, 4),
         "50Ca": ("gxpf1a", 0, 10)}


def build_parser(prog, doc, commands):
    """The driver's parser: one subparser per command, described by its module's docstring."""
    parser = argparse.ArgumentParser(prog=f"python3 -m benchmarks.{prog}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, summary) in commands.items():
        module = importlib.import_module(f"benchmarks.measure.{module_name}")
        p = sub.add_parser(name, help=summary, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        add_common_options(p)
        p.set_defaults(run=module.run)
    return parser


def main(prog, doc, commands, argv=None):
    """Parse, run the chosen command; errors end as one line and an exit code (hybridblas.console)."""
    return run_main(f"benchmarks.{prog}", lambda args: args.run(args), argv, build_parser(prog, doc, commands))


def command_line():
    """This process's command as a user types it: python3 -m benchmarks.<driver> ... ."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = ["python3", "-m", spec.name] if spec is not None else [os.path.basename(sys.executable), sys.argv[0]]
    return " ".join(head + sys.argv[1:])


def write_json(path, doc):
    """Write ``doc`` to ``path`` as indented JSON (nothing when path is None)."""
    if path:
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)


def best_of(fn, repeat):
    """(min, median) wall seconds of ``repeat`` calls of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def timed(fn):
    """fn()'s result and its wall seconds."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def case_list(text):
    """argparse type: a comma list of CASES names."""
    cases = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        raise argparse.ArgumentTypeError(f"unknown case(s) {bad or text!r}; choose from {sorted(CASES)}")
    return cases


def problem(case):
    """The ShellModelProblem of a CASES name."""
    from cisolver.data import resolve_interaction
    from cisolver.shellmodel import hamiltonian, snt
    inter, z, n = CASES[case]
    return hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction(inter)), z, n)


def full_from_upper(hu):
    """The full symmetric CSR matrix from its upper triangle."""
    import scipy.sparse as sp
    return (hu + hu.T - sp.diags(hu.diagonal())).tocsr()


def refuse(message):
    """Bad input found after parsing: one line, exit code 2."""
    raise CLIError(message)


def gpu_sync(cp, gpus):
    """A function that waits for all work queued on each of ``gpus`` (blas_gpu.timed's ``sync``)."""
    def sync():
        for g in gpus:
            cp.cuda.Device(g).synchronize()
    return sync


def gpus_or_refuse(command, what="a GPU"):
    """(CuPy, how many GPUs it sees); the command is refused (exit 2) where there is no CuPy or no CUDA driver."""
    try:
        import cupy
        return cupy, cupy.cuda.runtime.getDeviceCount()
    except Exception:                   # noqa: BLE001 - no CuPy, or no CUDA driver
        refuse(f"{command} times {what}: CuPy sees none")


def one_gpu_doc(cp, benchmark, **fields):
    """The JSON document of a run on GPU 0: benchmark, date, command line, host, the GPU's name and SMs, ``fields``
    and an empty results list."""
    import datetime
    import platform
    return {"benchmark": benchmark, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": command_line(), "host": platform.node(),
            "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "sms": cp.cuda.runtime.deviceGetAttribute(16, 0),        # cudaDevAttrMultiProcessorCount
            **fields, "results": []}


def two_gpus(command):
    """CuPy, where it sees at least two GPUs; else the command is refused (exit 2) saying how many it sees."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:                   # noqa: BLE001 - no CuPy, or no CUDA driver
        count = 0
    if count < 2:
        refuse(f"{command} compares two GPUs: this node has {count} that CuPy can use")
    return cupy


def two_gpu_run(command, benchmark, **fields):
    """(cupy, a hybridblas Context of GPUs 0 and 1, their indices, the run's JSON document: benchmark, date,
    command line, host, ``fields``, the GPUs' names and an empty results list); refused as two_gpus is."""
    import datetime
    import platform

    import hybridblas as hb
    cp = two_gpus(command)
    from hybridblas.devices.cuda import CUDADevice
    gpus = (0, 1)
    doc = {"benchmark": benchmark, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(), **fields,
           "gpus": [cp.cuda.runtime.getDeviceProperties(g)["name"].decode() for g in gpus], "results": []}
    return cp, hb.Context(devices=[CUDADevice(g) for g in gpus]), gpus, doc
