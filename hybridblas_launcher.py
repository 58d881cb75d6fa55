"""How the command-line tools start: a Ctrl-C while a tool is still loading numpy, scipy, hybridblas and its own
modules (about half a second) ends it as one during its work does, with 'prog: interrupted' on stderr and exit
status 130, never a traceback.

The installed scripts (flapw, cisolver, hybridblas-tune) call ``flapw()``, ``cisolver()`` and
``hybridblas_tune()`` here, and the packages' ``__main__`` modules call the same functions. This module is
outside the packages and imports only the standard library, so nothing heavy loads before its guard is up.
``python3 -m flapw`` imports the package before its ``__main__``; the packages wrap their own imports in
``loading(__name__)``, which acts only for the tool's own ``python -m`` run and does nothing for a library user.
Both also start CUDA's driver and the contexts of the GPUs that ``--devices`` names beside those imports
(hybridblas_cuda_start).
"""
import importlib
import os
import sys

import hybridblas_cuda_start

__all__ = ["interrupted", "launch", "end_mpi_run", "loading", "flapw", "cisolver", "hybridblas_tune"]

# the package `python -m` runs -> (the tool's name, its module with main())
TOOLS = {"flapw": ("flapw", "flapw.cli"), "cisolver": ("cisolver", "cisolver.cli"),
         "hybridblas.tuning": ("hybridblas-tune", "hybridblas.tuning.cli")}
ONE_GPU_PER_RANK = {"cisolver"}          # under MPI each rank takes one GPU of --devices (local rank -> GPU)


def interrupted(prog):
    """Report a Ctrl-C as 'prog: interrupted' on stderr; returns the exit status of an interrupt, 130."""
    print(f"{prog}: interrupted", file=sys.stderr)
    return 130


def launch(package):
    """Import the tool of ``package`` (a key of TOOLS) and return what its ``main()`` returns, or 130 after
    `interrupted` for a Ctrl-C that comes before main() handles its own."""
    prog, module = TOOLS[package]
    hybridblas_cuda_start.start(sys.argv[1:], one_per_rank=package in ONE_GPU_PER_RANK)
    try:
        code = importlib.import_module(module).main()
    except KeyboardInterrupt:
        code = interrupted(prog)
    return end_mpi_run(code)


def end_mpi_run(code):
    """A tool that ran under MPI (mpi4py's MPI initialized and not finalized): shut logging down, flush stdout and
    stderr, finalize MPI and end the process with ``code`` (an int; None is 0) at once; otherwise return ``code``.
    Every output of the tool is written and closed by then; what this skips is the interpreter's teardown of the GPU
    libraries, NCCL's communicators and the memory pools, which the process's exit frees anyway, and other atexit
    handlers. Two ranks of 48Cr on two H100s: 6.00-6.64 s against 6.42-7.05 s with the teardown."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return code
    status = code if isinstance(code, int) else 0 if code is None else 1
    try:
        logging = sys.modules.get("logging")
        if logging is not None:
            logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):        # a closed pipe or stream: nothing more can be said there
        pass
    mpi.Finalize()
    os._exit(status)


def flapw():
    """The ``flapw`` command."""
    return launch("flapw")


def cisolver():
    """The ``cisolver`` command."""
    return launch("cisolver")


def hybridblas_tune():
    """The ``hybridblas-tune`` command."""
    return launch("hybridblas.tuning")


def module_run_by_python():
    """NAME while ``python -m NAME`` imports it and its packages (sys.argv[0] is then '-m'), else None."""
    argv, orig = getattr(sys, "argv", None) or [], getattr(sys, "orig_argv", None) or []
    if argv[:1] != ["-m"] or len(orig) <= len(argv):
        return None
    word = orig[-len(argv)]                     # the word before the program's arguments: NAME, -mNAME or -BmNAME
    return word.partition("m")[2] if word.startswith("-") else word


class loading:
    """Around a package's imports: while ``python -m`` runs one of the tools in or under ``package``, a Ctrl-C
    ends the process with `interrupted`'s line and status 130; otherwise the exception passes unchanged.

    The exit is immediate (os._exit after flushing stdout and stderr), as nothing has started yet: a SystemExit
    out of the import would not always give 130, since Python's ``-m`` runner turns it into a death by SIGINT
    when the interrupt passed through a string that a library ran with exec (numpy and scipy do, on import)."""

    def __init__(self, package):
        name = module_run_by_python()
        name = name.removesuffix(".__main__") if name else None
        inside = name in TOOLS and (name == package or name.startswith(package + "."))
        self.prog = TOOLS[name][0] if inside else None
        if inside:
            hybridblas_cuda_start.start(sys.argv[1:], one_per_rank=name in ONE_GPU_PER_RANK)

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if self.prog is not None and kind is not None and issubclass(kind, KeyboardInterrupt):
            code = interrupted(self.prog)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return False
