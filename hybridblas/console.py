"""What the three command-line tools share: -q/-v/--version, logging, progress, checked output paths, and
one way out for every error (a one-line message and an exit code, never a raw traceback).

Exit codes: 0 success; 1 the work ran but did not succeed (e.g. an eigensolver that did not converge) or
failed unexpectedly; 2 bad input or a request refused before any work (an argument, a device, an output
path, a size that would not fit in memory); 130 interrupted (Ctrl-C).
"""
import argparse
import logging
import os
import re
import sys
import traceback
from pathlib import Path

from hybridblas_launcher import interrupted

from . import workers
from ._version import __version__

__all__ = ["tool_parser", "add_common_options", "configure_logging", "progress", "check_output_path", "run_main",
           "gpu_kept", "use_first_gpu", "positive_int", "nonnegative_int", "positive_float", "CLIError"]


class CLIError(Exception):
    """A failure to report in one line with an exit code (2 unless given)."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


class ToolParser(argparse.ArgumentParser):
    """argparse for the tools: a bad option is one line, 'prog: error: message (--help lists the options)', with
    exit 2; values like -1e-3 are numbers, not options."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def tool_parser(prog, description):
    """(parser, subparsers) of a tool with subcommands: ``prog --version`` and one required command."""
    parser = ToolParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser, parser.add_subparsers(dest="command", required=True)


def add_common_options(parser):
    """-q/--quiet, -v/--verbose (repeatable) and --version on ``parser``."""
    parser.add_argument("-q", "--quiet", action="store_true", help="print results only, no notes or progress")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more detail (-v: debug notes; tracebacks of unexpected errors)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def configure_logging(prog, quiet=False, verbose=0):
    """Notes go to stderr through logging as 'prog: message'; -q keeps warnings only, -v adds debug.

    Also sets the level of the 'hybridblas' logger (profile notices and fault warnings go through it).
    Returns the program's logger.
    """
    level = logging.WARNING if quiet else (logging.DEBUG if verbose else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    for name in (prog, "hybridblas"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level)
        lg.propagate = False
    logging.captureWarnings(True)
    warn = logging.getLogger("py.warnings")
    warn.handlers[:] = [handler]
    warn.propagate = False
    return logging.getLogger(prog)


class _Silent:
    def update(self, n=1):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(total, desc, enabled=True):
    """A progress bar on stderr when it is a terminal (tqdm, if installed) and ``enabled``; else nothing,
    so log files and pipes never fill with carriage-return lines. Use as a context manager or call
    ``update(n)`` and ``close()``."""
    if not enabled or not total or not hasattr(sys.stderr, "isatty") or not sys.stderr.isatty():
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def check_output_path(path, option="--output"):
    """Refuse, before any work, an output path that cannot be written: a missing or read-only folder, an
    existing folder in the file's place. Returns the path as a Path; writes nothing."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{option} {str(path)!r} is a folder; give a file name")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise CLIError(f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise CLIError(f"{option} {str(path)!r} cannot be written (permission denied)")
    return p


def _typed(kind, test, what):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return parse


positive_int = _typed(int, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = _typed(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _typed(float, lambda v: v > 0 and v == v and v != float("inf"), "a finite number > 0")


class gpu_kept:
    """Around a tool's ``main()``: the calling thread's current GPU, where it had one (CuPy loaded and a CUDA
    context current), is current again on exit, whatever the run made current. A thread without one keeps the
    GPU the run left current (the first it ran on): switching it to CUDA's default device 0 would make a context
    on a GPU the run may not have used (a CUDA context holds about 500 MiB of that GPU until the process ends)."""

    def __enter__(self):
        self.before = workers.current_device()
        return self

    def __exit__(self, kind, exc, tb):
        now = workers.current_device()
        if self.before is not None and now is not None and now != self.before:
            try:
                sys.modules["cupy"].cuda.Device(self.before).use()
            except Exception:          # the driver went away meanwhile: nothing to give back
                pass
        return False


def use_first_gpu(gpus):
    """Make the first of ``gpus`` (GPU ids) current on the calling thread where the thread has no current GPU yet,
    at the start of a run on them. The run's device switches (``with cupy.cuda.Device(i)``) switch back to the
    current device; on a thread that has none that is CUDA's default device 0, whose context (about 500 MiB) a run
    on GPU 1 alone would then make. A thread that has a current GPU keeps it (the switches come back to a GPU it
    holds a context on already). Nothing where ``gpus`` is empty; where CuPy, the driver or the GPU is missing,
    the caller's own checks report it."""
    if not gpus or workers.current_device() is not None:
        return
    try:
        import cupy
        cupy.cuda.Device(gpus[0]).use()
    except Exception:                  # no CuPy, driver or such GPU: left to the caller's checks
        return


def run_main(prog, body, argv=None, parser=None):
    """Parse ``argv`` with ``parser`` (if given), configure logging, run ``body(args)`` and turn every
    outcome into an exit code: errors of input and refusals (ValueError, TypeError, file errors,
    MemoryError, CLIError) print 'prog: error: message' and return 2; Ctrl-C returns 130; anything else
    prints its type and message (the traceback with -v) and returns 1. argparse's own exits (--help,
    --version, a bad option, whose message it has printed) return their code too."""
    try:
        args = parser.parse_args(argv) if parser is not None else None
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    verbose = getattr(args, "verbose", 0)
    configure_logging(prog, getattr(args, "quiet", False), verbose)
    try:
        code = body(args)
    except KeyboardInterrupt:
        return interrupted(prog)
    except CLIError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.code
    except (ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError,
            NotADirectoryError, MemoryError) as exc:
        if verbose:
            traceback.print_exc()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:   # no raw traceback reaches a user unless asked for with -v
        if verbose:
            traceback.print_exc()
        print(f"{prog}: error: {type(exc).__name__}: {exc} (run with -v for the traceback)", file=sys.stderr)
        return 1
    return 0 if code is None else int(code)
