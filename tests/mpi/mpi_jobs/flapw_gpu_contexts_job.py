"""Run under mpiexec with one GPU per rank: flapw's k-points over the ranks (the CLI's build on --devices gpu, each
rank's hybridblas Context on its share of the GPUs) make a CUDA context on this rank's GPU alone, none on another
rank's (the primary contexts' state as the driver reports it)."""
import ctypes

from flapw import cli
from hybridblas.distributed import local_rank, world


def active_contexts():
    cuda = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_int()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    active = []
    for ordinal in range(count.value):
        device, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        assert cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
        assert cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(on)) == 0
        if on.value:
            active.append(ordinal)
    return active, count.value


comm = world()
code = cli.main(["build", "--system", "NaCl", "--kmax", "2.0", "--kpoints", "2", "--devices", "gpu", "--quiet"])
assert code == 0, code
active, count = active_contexts()
mine = local_rank(comm)[0] % count
assert active == [mine], f"rank {comm.Get_rank()}: contexts on GPUs {active}, its GPU is {mine}"
everyone = comm.allgather(active)
if comm.Get_rank() == 0:
    print(f"flapw gpu contexts OK on {comm.Get_size()} ranks: {everyone}")
