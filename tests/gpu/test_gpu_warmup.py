"""cisolver.warmup on a GPU: the helper process leaves CuPy's kernels of the observables and of LOBPCG in an empty
kernel cache, so that a later process computing them compiles (almost) nothing; cuda_modules.cached reads the
cache as it is; a run with the helper gives the energies of a run without it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = {"device": 0, "dtype": "float32", "nev": 5, "block_size": 8, "tol": 1e-5, "rows": 4096,
        "interaction": "usdb", "observables": {"protons": 2, "neutrons": 2, "eff_charge": [1.5, 0.5], "gl": [1.0, 0.0],
                                               "gs": [5.586, -3.826], "b": None, "hbar_omega": None}}

# a process that counts NVRTC compilations (after cisolver's own units) while it computes the observables of 24Mg's random vectors (the layout
# LOBPCG returns) and runs LOBPCG on a random tridiagonal matrix, both as a run would meet them
COUNT = r"""
import json, sys
import numpy as np, cupy, scipy.sparse as sp
from cupy_backends.cuda.libs import nvrtc
calls = []
real = nvrtc.compileProgram
def counting(prog, options):
    calls.append(1)
    return real(prog, options)
nvrtc.compileProgram = counting
from cisolver import cuda_modules, warmup
from cisolver.observables import compute_observables, TransitionOptions
from cisolver.operators import SymmetricOperator
from cisolver.shellmodel.hamiltonian import ShellModelProblem
from cisolver.data import resolve_interaction
from cisolver.shellmodel import nushellx
from cisolver.solver import _lobpcg
[cuda_modules.function(cupy, np.float32, n) for n in cuda_modules.kernel_names(np.float32)]
before = len(calls)
problem = ShellModelProblem(nushellx.read_interaction(resolve_interaction("usdb")), 4, 4)
block = cupy.asarray(np.random.default_rng(3).standard_normal((problem.dimension, 8)), dtype=np.float32)
obs = compute_observables(problem, block[:, :5], TransitionOptions())
n = 20000
d = np.linspace(0.0, 1.0, n); d[:8] = -1.0 - np.arange(8)[::-1]
off = 0.01 * np.random.default_rng(4).standard_normal(n - 1)
op = SymmetricOperator(sp.diags([off, d, off], [-1, 0, 1], format="csr"), storage="full", devices=[0], dtype=np.float32)
res = _lobpcg(op, 5, block_size=8, tol=1e-5, maxiter=40, seed=1, dtype=np.float32)
print(json.dumps({"compiles": len(calls) - before, "cached": cuda_modules.cached(cupy, np.float32, 0)}))
"""


def _env(cache):
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _counted(cache):
    out = subprocess.run([sys.executable, "-c", COUNT], env=_env(cache), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_helper_leaves_the_kernels_a_run_meets(tmp_path):
    cold = _counted(tmp_path / "cold")            # nothing cached: every CuPy kernel compiles in the process
    assert cold["cached"] and cold["compiles"] >= 15
    warmed = tmp_path / "warmed"
    helper = subprocess.run([sys.executable, "-c", "import cisolver.warmup as w; w.main()", json.dumps(TASK)],
                            env=_env(warmed), capture_output=True, text=True, timeout=300)
    assert helper.returncode == 0, helper.stderr[-3000:]
    after = _counted(warmed)
    assert after["compiles"] <= 4, (cold, after)     # 2 x H100: 35 without the helper, 3 after it


def test_cached_reads_the_cache(tmp_path, monkeypatch):
    import cupy
    from cisolver import cuda_modules
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(cuda_modules, "_fallback_folder", lambda: str(tmp_path / "fallback"))
    assert not cuda_modules.cached(cupy, np.float64, 0)
    for name in ("_modules", "_pending", "_failed", "_functions"):
        monkeypatch.setattr(cuda_modules, name, {})
    [cuda_modules.function(cupy, np.float64, n) for n in cuda_modules.kernel_names(np.float64)]
    assert cuda_modules.cached(cupy, np.float64, 0)
    assert not cuda_modules.cached(cupy, np.float32, 0)


def test_spectrum_with_the_helper_matches_one_without(tmp_path, monkeypatch):
    from cisolver import compute_spectrum
    args = ("usdb", 4, 4)
    kw = dict(nev=3, devices="0", dtype="float64")
    with monkeypatch.context() as m:
        m.setenv("CUPY_CACHE_DIR", str(tmp_path / "kernels"))    # the helper starts: nothing cached there
        with_helper = compute_spectrum(*args, **kw)
    with monkeypatch.context() as m:
        m.setenv("CISOLVER_WARMUP", "0")
        without = compute_spectrum(*args, **kw)
    assert np.allclose(with_helper["energies"], without["energies"], rtol=0, atol=1e-8)
    assert with_helper["j"] == without["j"]
