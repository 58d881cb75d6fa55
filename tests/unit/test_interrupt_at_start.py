"""A Ctrl-C while a command-line tool is still loading (numpy, scipy, hybridblas, its own modules: about half a
second) ends it the way one during its work does: 'prog: interrupted' as the only line on stderr and exit status
130, never a traceback. Every entry form is checked: the installed scripts ([project.scripts], run as pip's
wrapper runs them) and ``python3 -m flapw|cisolver|hybridblas.tuning``. The SIGINT is real and sent by the
process to itself at a chosen import, so each run is interrupted at the same point. Importing the packages as a
library is unchanged: no signal handler, no exception hook, a KeyboardInterrupt still reaches the caller."""
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"flapw": ("flapw", "flapw.cli", ["build", "--help"]),
         "cisolver": ("cisolver", "cisolver.cli", ["spectrum", "--help"]),
         "hybridblas.tuning": ("hybridblas-tune", "hybridblas.tuning.cli", ["calibrate", "--help"])}

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")

# Sends this process a SIGINT when `module` is about to be imported (and waits for it to land there).
CTRL_C_AT_IMPORT = textwrap.dedent("""\
    import os, signal, sys, time
    class CtrlC:
        def find_spec(self, name, path=None, target=None):
            if name == {module!r}:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
    sys.meta_path.insert(0, CtrlC())
    """)
# The same as a module of its own, for runs that start with `python -m` (nothing of the test runs before it). The
# SIGINT lands in a string run by exec, as it can in numpy's and scipy's imports: Python's -m runner then ends a
# process that leaves by SystemExit with a death by SIGINT instead of the status it was given.
CTRL_C_MODULE = 'exec("import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(30)")\n'


def _scripts():
    """{script: (module, function)} of pyproject.toml's [project.scripts]."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?:^\[|\Z)", text, re.M | re.S).group(1)
    pairs = re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', section, re.M)
    return {name: tuple(target.split(":")) for name, target in pairs}


def _run(args, pythonpath=(), cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(ROOT)]))
    env.pop("PYTHONSTARTUP", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def _assert_interrupted(out, prog):
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines() == [f"{prog}: interrupted"], out.stderr
    assert out.returncode == 130, (out.returncode, out.stderr)


def _wrapper(module, function):
    """What pip writes as the console script: import the entry point, exit with what it returns."""
    return f"import re, sys\nfrom {module} import {function}\nsys.argv[0] = 'tool'\nsys.exit({function}())\n"


def test_the_scripts_are_the_three_tools():
    assert sorted(_scripts()) == ["cisolver", "flapw", "hybridblas-tune"]


@pytest.mark.parametrize("script", ["flapw", "cisolver", "hybridblas-tune"])
@pytest.mark.parametrize("at", ["numpy", "cli"])
def test_script_interrupted_while_loading(script, at):
    """The console script, interrupted at its first heavy import (numpy) or at its last (the tool's cli module)."""
    module, function = _scripts()[script]
    package = next(p for p, (prog, _, _) in TOOLS.items() if prog == script)
    _, cli, args = TOOLS[package]
    code = CTRL_C_AT_IMPORT.format(module="numpy" if at == "numpy" else cli) + _wrapper(module, function)
    _assert_interrupted(_run(["-c", code, *args]), script)


@pytest.mark.parametrize("package", list(TOOLS))
@pytest.mark.parametrize("spelling", ["-m {}", "-m{}", "-B -m {}"])
def test_python_m_interrupted_while_loading_the_package(package, spelling, tmp_path):
    """`python -m tool`, interrupted while Python imports the package before its __main__ (the first import
    of numpy, which here is a stand-in that sends the SIGINT)."""
    (tmp_path / "numpy.py").write_text(CTRL_C_MODULE)
    prog, _, args = TOOLS[package]
    out = _run([*spelling.format(package).split(), *args], pythonpath=[tmp_path], cwd=tmp_path)
    _assert_interrupted(out, prog)


@pytest.mark.parametrize("package", list(TOOLS))
def test_python_m_interrupted_while_loading_the_cli(package):
    """`python -m tool` (as runpy runs it), interrupted in its __main__ while that imports the cli module."""
    prog, cli, args = TOOLS[package]
    run = f"import runpy\nrunpy.run_module({package!r}, run_name='__main__', alter_sys=True)\n"
    code = CTRL_C_AT_IMPORT.format(module=cli) + run
    _assert_interrupted(_run(["-c", code, *args]), prog)


@pytest.mark.parametrize("package", list(TOOLS))
def test_python_m_still_runs_the_tool(package):
    prog, _, args = TOOLS[package]
    out = _run(["-m", package, *args])
    assert out.returncode == 0 and out.stdout.startswith(f"usage: {prog}"), out.stderr


@pytest.mark.parametrize("orig,argv,name", [
    (["python3", "-m", "flapw", "build"], ["-m", "build"], "flapw"),
    (["python3", "-mcisolver"], ["-m"], "cisolver"),
    (["python3", "-X", "importtime", "-Bm", "hybridblas.tuning", "-m", "x"], ["-m", "-m", "x"], "hybridblas.tuning"),
    (["python3", "-c", "import flapw", "-m"], ["-c", "-m"], None),
    (["python3", "script.py", "-m"], ["script.py", "-m"], None),
    (["python3", "-m", "flapw"], ["/x/flapw/__main__.py"], None),        # after Python has found the module
])
def test_the_module_python_m_runs(orig, argv, name, monkeypatch):
    import hybridblas_launcher
    monkeypatch.setattr(sys, "orig_argv", orig)
    monkeypatch.setattr(sys, "argv", argv)
    assert hybridblas_launcher.module_run_by_python() == name


# ------------------------------------------------------------------ the packages as a library

def test_importing_the_packages_sets_no_handler():
    code = ("import signal, sys\nimport flapw, cisolver, hybridblas.tuning\n"
            "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
            "assert sys.excepthook is sys.__excepthook__\n"
            "assert not [n for n in dir(flapw) + dir(cisolver) + dir(hybridblas) if 'launch' in n]\n")
    out = _run(["-c", code])
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("package", list(TOOLS))
def test_a_library_import_still_raises_keyboard_interrupt(package):
    out = _run(["-c", CTRL_C_AT_IMPORT.format(module="numpy") + f"import {package}\n"])
    assert out.returncode == -signal.SIGINT and out.stderr.rstrip().endswith("KeyboardInterrupt"), out.stderr


def test_another_python_m_program_importing_a_package_keeps_its_keyboard_interrupt(tmp_path):
    """Only the tools' own `python -m` runs are guarded: a program of the user's, run with -m, whose package
    imports flapw sees the KeyboardInterrupt as before."""
    (tmp_path / "numpy.py").write_text(CTRL_C_MODULE)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "__init__.py").write_text("import flapw\n")
    (tmp_path / "mine" / "__main__.py").write_text("print('ran')\n")
    out = _run(["-m", "mine"], pythonpath=[tmp_path], cwd=tmp_path)
    assert out.returncode == -signal.SIGINT and out.stderr.rstrip().endswith("KeyboardInterrupt"), out.stderr


# ------------------------------------------------------------------ the end of a run under MPI

class _FakeMPI:
    def __init__(self, initialized, finalized=False):
        self.calls, self._init, self._fin = [], initialized, finalized

    def Is_initialized(self):
        return self._init

    def Is_finalized(self):
        return self._fin

    def Finalize(self):
        self.calls.append("Finalize")
        self._fin = True


@pytest.mark.parametrize("state", ["absent", "not initialized", "finalized"])
def test_a_run_without_live_mpi_returns_its_code(state, monkeypatch):
    import hybridblas_launcher
    if state == "absent":
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", _FakeMPI(state == "finalized", state == "finalized"))
    monkeypatch.setattr(hybridblas_launcher.os, "_exit", lambda code: pytest.fail("os._exit called"))
    assert hybridblas_launcher.end_mpi_run(3) == 3


def test_a_run_under_mpi_finalizes_and_ends_with_its_code(monkeypatch, capsys):
    """Under MPI the launcher flushes what the tool printed, finalizes MPI, then ends the process with the
    tool's exit status (0 for None)."""
    import hybridblas_launcher
    mpi = _FakeMPI(True)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    ended = []

    def exit_now(code):
        ended.append((code, list(mpi.calls)))
        raise SystemExit(code)
    monkeypatch.setattr(hybridblas_launcher.os, "_exit", exit_now)
    for code, want in [(2, 2), (None, 0), ("not a status", 1)]:
        mpi._fin = False
        mpi.calls.clear()
        with pytest.raises(SystemExit):
            hybridblas_launcher.end_mpi_run(code)
        assert ended[-1] == (want, ["Finalize"])
