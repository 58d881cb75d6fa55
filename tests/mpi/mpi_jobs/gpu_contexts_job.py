"""Run under mpiexec with one GPU per rank: a GPU spectrum run (rows built on the GPUs, NCCL, observables on
threads) makes a CUDA context on this rank's GPU alone, none on another rank's (the primary contexts' state as
the driver reports it)."""
from cisolver.distributed import world
from hybridblas.devspec import gpu_count
from hybridblas.distributed import local_rank
from hybridblas.testing import gpus_with_contexts
from cisolver.spectrum import compute_spectrum

comm = world()
out = compute_spectrum("usdb", 3, 4, nev=3, comm=comm, devices="all", dtype="float64")
active = gpus_with_contexts()
mine = local_rank(comm)[0] % gpu_count()
assert out["devices"] == [mine], (out["devices"], mine)
assert active == [mine], f"rank {comm.Get_rank()}: contexts on GPUs {active}, its GPU is {mine}"
assert out["converged"] and "observables" in out
everyone = comm.allgather(active)
if comm.Get_rank() == 0:
    print(f"gpu contexts OK on {comm.Get_size()} ranks: {everyone}")
