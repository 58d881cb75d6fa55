"""MPI jobs (mpiexec, oversubscribed on CI's 2 cores): distributed results equal the serial ones."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci_data import needs_data

JOBS = Path(__file__).parent / "mpi_jobs"
ROOT = Path(__file__).resolve().parents[2]


def _mpiexec():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return shutil.which("mpiexec")


def run_mpi(script, ranks, *args, timeout=240):
    exe = _mpiexec()
    if exe is None:
        pytest.skip("mpi4py or mpiexec not installed (pip install '.[mpi]')")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               # Open MPI refuses to start as root (containers, GPU nodes) without these; MPICH ignores them
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # mpi4py's runner aborts every rank when one raises, so a failed assert does not leave the others waiting
    cmd = [exe, "-n", str(ranks), sys.executable, "-m", "mpi4py", str(JOBS / script), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_gram(ranks):
    out = run_mpi("gram_job.py", ranks)
    assert f"gram OK on {ranks} ranks" in out


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_flapw_kpoints_over_ranks(ranks, tmp_path):
    out = run_mpi("flapw_kpoints_job.py", ranks, tmp_path / "hs")
    assert f"flapw k-points OK on {ranks} ranks" in out


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_lobpcg(ranks):
    out = run_mpi("lobpcg_job.py", ranks)
    assert f"lobpcg OK on {ranks} ranks" in out


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_compare_what_they_read(ranks):
    out = run_mpi("agreed_job.py", ranks)
    assert f"agreed OK on {ranks} ranks" in out


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [3, 6])        # n_d = 2 and 3 (a block stored below the diagonal)
def test_triangular_layout_lobpcg(ranks):
    out = run_mpi("triangular_job.py", ranks)
    assert f"triangular OK on {ranks} ranks" in out


@pytest.mark.mpi
@pytest.mark.multi_gpu
def test_ranks_make_contexts_on_their_own_gpus_only():
    out = run_mpi("gpu_contexts_job.py", 2)
    assert "gpu contexts OK on 2 ranks: [[0], [1]]" in out


@pytest.mark.mpi
@pytest.mark.multi_gpu
def test_flapw_ranks_make_contexts_on_their_own_gpus_only():
    out = run_mpi("flapw_gpu_contexts_job.py", 2)
    assert "flapw gpu contexts OK on 2 ranks" in out


@pytest.mark.multi_gpu
def test_distributed_lobpcg_one_gpu_per_rank():
    out = run_mpi("lobpcg_gpu_job.py", 2)
    assert "lobpcg gpu OK on 2 ranks" in out


def test_world_imports_mpi4py_only_under_a_launcher():
    from hybridblas import distributed
    """Without an MPI launcher's variables world() is None at once and mpi4py stays unimported (0.6 s saved
    on a GPU node); HYBRIDBLAS_MPI=1 asks for it all the same."""
    code = ("import sys; from hybridblas import distributed as d; w = d.world(); "
            "print(w is None, 'mpi4py' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in distributed.LAUNCHER_VARIABLES + ("HYBRIDBLAS_MPI",)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
    pytest.importorskip("mpi4py")
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, HYBRIDBLAS_MPI="1"), capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["True", "True"]           # one process: COMM_WORLD of size 1 gives None


@pytest.mark.mpi
@needs_data
def test_refusal_agreed_by_every_rank():
    """One rank short of memory: every rank refuses with its message (no rank left in a collective); and
    return_vectors under MPI gives the whole eigenvectors on every rank."""
    assert "refusal OK on 2 ranks" in run_mpi("refusal_job.py", 2)
