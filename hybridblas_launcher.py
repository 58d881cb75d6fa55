"""How the command-line tools start: a Ctrl-C while a tool is still loading numpy, scipy, hybridblas and its own
modules (about half a second) ends it as one during its work does, with 'prog: interrupted' on stderr and exit
status 130, never a traceback.

The installed scripts (flapw, cisolver, hybridblas-tune) call ``flapw()``, ``cisolver()`` and
``hybridblas_tune()`` here, and the packages' ``__main__`` modules call the same functions. This module is
outside the packages and imports only the standard library, so nothing heavy loads before its guard is up.
"""
import importlib
import sys

__all__ = ["interrupted", "launch", "flapw", "cisolver", "hybridblas_tune"]

# the package `python -m` runs -> (the tool's name, its module with main())
TOOLS = {"flapw": ("flapw", "flapw.cli"), "cisolver": ("cisolver", "cisolver.cli"),
         "hybridblas.tuning": ("hybridblas-tune", "hybridblas.tuning.cli")}


def interrupted(prog):
    """Report a Ctrl-C as 'prog: interrupted' on stderr; returns the exit status of an interrupt, 130."""
    print(f"{prog}: interrupted", file=sys.stderr)
    return 130


def launch(package):
    """Import the tool of ``package`` (a key of TOOLS) and return what its ``main()`` returns, or 130 after
    `interrupted` for a Ctrl-C that comes before main() handles its own."""
    prog, module = TOOLS[package]
    try:
        return importlib.import_module(module).main()
    except KeyboardInterrupt:
        return interrupted(prog)


def flapw():
    """The ``flapw`` command."""
    return launch("flapw")


def cisolver():
    """The ``cisolver`` command."""
    return launch("cisolver")


def hybridblas_tune():
    """The ``hybridblas-tune`` command."""
    return launch("hybridblas.tuning")
