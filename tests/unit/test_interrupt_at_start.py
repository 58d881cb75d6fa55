"""A Ctrl-C while a command-line tool is still loading (numpy, scipy, hybridblas, its own modules: about half a
second) ends it the way one during its work does: 'prog: interrupted' as the only line on stderr and exit status
130, never a traceback. Checked for the installed scripts ([project.scripts], run as pip's wrapper runs them) and
for ``python3 -m flapw|cisolver|hybridblas.tuning`` once Python has loaded the package. The SIGINT is real and
sent by the process to itself at a chosen import, so each run is interrupted at the same point."""
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
