"""CuPy's own kernels of a GPU run's solve and observables, compiled by a helper process while the run plans
and builds H.

CuPy compiles each elementwise and reduction kernel the first time a process meets it (NVRTC, about 0.1 s
each) and keeps it in its on-disk kernel cache. On a machine whose cache is empty, one 48Cr run (gxpf1a,
float32, two H100s) met 33 of them one after the other on its main thread: 11 in LOBPCG (the start's float64
copies, strided copies, the closing residuals) and 22 in the observables (ladder operators, occupations,
norms), 3.1-3.5 s of the run. cisolver's own kernels (cisolver.cuda_modules) already compile beside the build.

``start`` launches a helper, ``python -c 'import cisolver.warmup as w; w.main()' '<task>'`` (``plan``: the
task as JSON). It runs the same code on small stand-ins on the run's first GPU (where LOBPCG's dense steps and
the observables run), each on a thread of its own, and so leaves those kernels in the cache, where the run's
process finds them before it would compile them:
- compute_observables' steps (occupations and parity, <T^2>, the E2/M1 transitions) for a few nucleons in the
  same valence space (``few``: 2 of a species, 1 where its number is odd), on random vectors laid out as
  LOBPCG returns them (the first ``nev`` columns of a row-major block of ``block_size``), in the run's dtype;
- LOBPCG (MAXITER iterations at most) on a tridiagonal matrix of STAND_IN_ROWS rows, held on that GPU as the
  run's H is, whose lowest eigenvalues lie apart so that its columns converge one by one.
A process of its own: the same stand-ins on threads of the run's process took the interpreter lock from its host
build (the GPU build started up to 1.2 s later) and would have shared its CUDA state. What the helper computes
is dropped, and it writes nothing but CuPy's cache. Its failures cost only the time it would have saved: on a
GPU in exclusive-process compute mode it cannot open the device, which the run's process holds by then (``start``
reads the GPU's free memory before it launches the helper), and it ends at once.
``Warmup.close`` (spectrum.run calls it before it returns, also on an exception) ends a helper still running.

2 x H100, 48Cr gxpf1a float32 ``--devices all``, an empty cache each run, with and without the helper in turn
on one machine: 5.71-6.09 s against 6.98-7.59 s; the main thread compiled 12-16 kernels instead of 33 (on
another machine kb3g float64 6.13 against 8.80 s, one GPU 6.29 against 7.80 s). The stand-ins' cover is checked
on a GPU (tests/gpu/test_gpu_warmup.py: 35 compilations without the helper, 3 after it).

Only where a cold cache is likely: ``start`` returns None when cisolver's own units for the dtype already lie
compiled in the cache (cuda_modules.cached: this machine ran cisolver in this dtype before, and CuPy's kernels
were cached beside them), when no GPU is used, under MPI (no process is started beside the ranks), when the run
has fewer rows than three blocks, when the first GPU's free memory after the run's estimate is less than
HEADROOM times the stand-in's needs plus CONTEXT_BYTES, or when $CISOLVER_WARMUP is 0.
"""
import json
import os
import subprocess
import sys

import numpy as np

ENV = "CISOLVER_WARMUP"
MAXITER = 12            # LOBPCG iterations of the stand-in at most (its columns converge one by one before)
STAND_IN_ROWS = 4096    # rows of LOBPCG's stand-in at most
OBSERVABLES_MAX_DIM = 200_000   # the observables' stand-in problem at most (a few nucleons in a large space)
OBSERVABLE_PARTS = ("states", "isospin", "transitions")     # compute_observables' steps, one thread each
HEADROOM = 8            # free GPU memory after the run's estimate, in multiples of LOBPCG's stand-in's bytes
CONTEXT_BYTES = 1 << 30     # the helper's CUDA context and CuPy's pool, counted against the headroom
FEW_MAX = 2             # nucleons of a species in the observables' stand-in at most


def few(n):
    """Nucleons of one species in the stand-in problem: ``n`` up to FEW_MAX, beyond it FEW_MAX less one
    where ``n`` is odd (the same parity, so the same 2M and the same kinds of blocks)."""
    if n <= FEW_MAX:
        return n
    return FEW_MAX - (n - FEW_MAX) % 2


def stand_in_bytes(rows, block_size, itemsize):
    """GPU bytes of a LOBPCG stand-in: its blocks (S, H S twice each, R: 13 block_size columns) and its
    tridiagonal matrix in CSR (about 3 entries a row)."""
    return rows * (13 * block_size * itemsize + 3 * (itemsize + 4) + 4)


class Warmup:
    """The helper process under way."""

    def __init__(self, process):
        self.process = process

    def close(self, timeout=5.0):
        """End the helper if it still runs (its kernels compiled so far stay cached); returns its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def _applies(rq):
    """A run in one process on GPUs, the helper not turned off by $CISOLVER_WARMUP."""
    return rq.devices != "cpu" and rq.comm is None and os.environ.get(ENV, "").strip() != "0"


def plan(rq, spare):
    """The helper's task for the run ``rq`` (spectrum.prepare's request) as a JSON-ready dict, or None when
    there is nothing to gain (see the module's notes). ``spare``: the first GPU's free bytes less the run's
    estimate there."""
    if not _applies(rq):
        return None
    b = rq.block_size or rq.nev + 3
    rows = min(rq.counts.dimension, STAND_IN_ROWS)
    if rows < 3 * b or spare < HEADROOM * stand_in_bytes(rows, b, rq.dtype.itemsize) + CONTEXT_BYTES:
        return None
    z, n = few(rq.n_protons), few(rq.n_neutrons)
    obs = rq.observables
    observables = None
    if obs is not None and (z, n) != (rq.n_protons, rq.n_neutrons):
        observables = {"protons": z, "neutrons": n, "eff_charge": list(obs.eff_charge), "gl": list(obs.gl),
                       "gs": list(obs.gs), "b": obs.b, "hbar_omega": obs.hbar_omega}
    return {"device": int(rq.devices[0]), "dtype": str(rq.dtype), "nev": rq.nev, "block_size": b,
            "tol": rq.tol, "rows": rows, "interaction": str(rq.interaction.path), "observables": observables}


def start(rq):
    """Launch the helper for the run ``rq``; a Warmup, or None (``plan``). Call it before cuda_modules.prepare:
    a unit compiled by then would read as cached."""
    if not _applies(rq) or not sys.executable:      # (an embedding interpreter names none)
        return None
    import cupy
    from . import cuda_modules
    if cuda_modules.cached(cupy, rq.dtype, rq.devices[0]):
        return None
    import hybridblas as hb
    task = plan(rq, hb.memory.gpu_free(rq.devices[0]) - rq.memory.gpu.get(rq.devices[0], 0.0))
    if task is None:
        return None
    try:
        process = subprocess.Popen([sys.executable, "-c", f"import {__name__} as w; w.main()", json.dumps(task)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    return Warmup(process)


def _solve(task, rows):
    import scipy.sparse as sp
    from .operators import SymmetricOperator
    from .solver import _lobpcg
    b, dtype = task["block_size"], np.dtype(task["dtype"])
    off = 0.01 * np.random.default_rng(1).standard_normal(rows - 1)
    diag = np.linspace(0.0, 1.0, rows)
    diag[:b] = -1.0 - np.arange(b)[::-1]      # b lowest eigenvalues well apart: columns converge one by one
    h = sp.diags([off, diag, off], [-1, 0, 1], format="csr")
    op = SymmetricOperator(h, storage="full", devices=[task["device"]], dtype=dtype)
    _lobpcg(op, task["nev"], block_size=b, tol=task["tol"], maxiter=MAXITER, seed=0, dtype=dtype)


def _stand_in_states(task):
    """The observables' stand-in: normalised random vectors of a few nucleons in the run's valence space, laid
    out as LOBPCG returns its vectors; None where that problem has fewer states than a block or more than
    OBSERVABLES_MAX_DIM."""
    import cupy
    from .data import resolve_interaction
    from .observables import states
    from .shellmodel import nushellx
    from .shellmodel.hamiltonian import ShellModelProblem
    obs, b = task["observables"], task["block_size"]
    problem = ShellModelProblem(nushellx.read_interaction(resolve_interaction(task["interaction"])),
                                obs["protons"], obs["neutrons"])
    if not b <= problem.dimension <= OBSERVABLES_MAX_DIM:
        return None
    block = cupy.asarray(np.random.default_rng(0).standard_normal((problem.dimension, b)), dtype=task["dtype"])
    return problem, states.normalised(problem, block[:, :task["nev"]])


def _observables(task, part, stand_in):
    from .observables import TransitionOptions, states, transitions
    problem, st = stand_in
    if part == "states":
        states.occupations(problem, st)
        states.parity_expectation(problem, st)
    elif part == "isospin":
        states.isospin_squared(problem, st)
    else:
        obs = task["observables"]
        opts = TransitionOptions(tuple(obs["eff_charge"]), tuple(obs["gl"]), tuple(obs["gs"]), obs["b"],
                                 obs["hbar_omega"])
        transitions.electromagnetic(problem, st, opts)


def _guarded(task, fn, *args):
    import cupy
    try:
        cupy.cuda.Device(task["device"]).use()     # the thread's GPU for good: leaving a `with` block would switch
        out = fn(task, *args)                       # it to device 0 and make that GPU's context (~500 MiB)
        cupy.cuda.get_current_stream().synchronize()
        return out
    except Exception:       # noqa: BLE001 (only time is lost: the run meets those kernels itself)
        return None


def main(argv=None):
    """The helper: ``python -c 'import cisolver.warmup as w; w.main()' '<plan as JSON>'``. Returns 0, whatever
    the stand-ins met. LOBPCG's stand-in starts at once on a thread; this thread makes the observables'
    stand-in (one problem, its states normalised: the steps' common start), then each step gets a thread (the
    stand-in is only read, and its results are dropped)."""
    import threading
    task = json.loads((sys.argv[1:] if argv is None else argv)[0])
    threads = [threading.Thread(target=_guarded, args=(task, _solve, task["rows"]), daemon=True)]
    threads[0].start()
    stand_in = _guarded(task, _stand_in_states) if task["observables"] is not None else None
    if stand_in is not None:
        for part in OBSERVABLE_PARTS:
            threads.append(threading.Thread(target=_guarded, args=(task, _observables, part, stand_in), daemon=True))
            threads[-1].start()
    for t in threads:
        t.join()
    return 0
