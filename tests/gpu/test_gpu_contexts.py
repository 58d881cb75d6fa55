"""A process that works on GPU 1 alone makes no CUDA context on GPU 0 (the driver's primary-context state, in a
fresh process): device switches on hybridblas's worker threads, and the tools' runs on --devices 1, which give a
caller that worked on GPU 0 its GPU back."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = r"""
import cupy
from hybridblas import workers
from hybridblas.testing import gpus_with_contexts as active


def on_one(_=None):
    with cupy.cuda.Device(1):
        return float(cupy.arange(4.0).sum())

cupy.cuda.Device(1).use()
assert on_one() == 6.0
assert workers.start(on_one).result() == 6.0
assert workers.map(on_one, range(8), 4) == [6.0] * 8
group = workers.Group(2)
assert group.map(on_one, range(4)) == [6.0] * 4
group.close()
print("active", active())
"""


@pytest.mark.multi_gpu
def test_work_on_gpu_1_makes_no_context_on_gpu_0():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "active [1]" in proc.stdout, proc.stdout


TOOL = r"""
import sys
import cupy
from cisolver import cli as cisolver_cli
from flapw import cli as flapw_cli
from hybridblas.testing import gpus_with_contexts as active


if sys.argv[1] == "kept":
    cupy.cuda.Device(0).use()                        # the caller works on GPU 0: it is current again after
tools = {"cisolver": (cisolver_cli, ["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "3",
                                     "--nev", "3", "--devices", "1", "--quiet"]),
         "flapw": (flapw_cli, ["build", "--system", "NaCl", "--kmax", "2.0", "--devices", "1", "--quiet"])}
if sys.argv[2] == "cisolver-api":                   # the Python API: the solve's arrays on GPU 1 all the same
    from cisolver import compute_spectrum
    out = compute_spectrum("usdb", 2, 3, 3, devices=[1])
    assert out["converged"], out
else:
    module, argv = tools[sys.argv[2]]
    assert module.main(argv) == 0
print("active", active(), "current", cupy.cuda.runtime.getDevice())
"""


@pytest.mark.multi_gpu
@pytest.mark.parametrize("tool", ["cisolver", "cisolver-api", "flapw"])
@pytest.mark.parametrize("caller, expected", [
    ("fresh", "active [1] current 1"),           # a run on GPU 1 alone: no context on GPU 0
    ("kept", "active [0, 1] current 0"),         # a caller that worked on GPU 0 gets it back
])
def test_a_tool_on_gpu_1(tool, caller, expected):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", TOOL, caller, tool], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout, proc.stdout
