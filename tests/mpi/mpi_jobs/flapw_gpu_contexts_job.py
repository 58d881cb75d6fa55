"""Run under mpiexec with one GPU per rank: flapw's k-points over the ranks (the CLI's build on --devices gpu, each
rank's hybridblas Context on its share of the GPUs) make a CUDA context on this rank's GPU alone, none on another
rank's (the primary contexts' state as the driver reports it)."""
from flapw import cli
from hybridblas.devspec import gpu_count
from hybridblas.distributed import local_rank, world
from hybridblas.testing import gpus_with_contexts

comm = world()
code = cli.main(["build", "--system", "NaCl", "--kmax", "2.0", "--kpoints", "2", "--devices", "gpu", "--quiet"])
assert code == 0, code
active = gpus_with_contexts()
lrank, lsize = local_rank(comm)
n = gpu_count()
mine = [g for g in range(n) if g % lsize == lrank] or [lrank % n]          # node_context's share of the GPUs
assert active == mine, f"rank {comm.Get_rank()}: contexts on GPUs {active}, its GPUs are {mine}"
everyone = comm.allgather(active)
if comm.Get_rank() == 0:
    print(f"flapw gpu contexts OK on {comm.Get_size()} ranks: {everyone}")
