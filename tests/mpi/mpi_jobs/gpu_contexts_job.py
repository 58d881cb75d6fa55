"""Run under mpiexec with one GPU per rank: a GPU spectrum run (rows built on the GPUs, NCCL, observables on
threads) makes a CUDA context on this rank's GPU alone, none on another rank's (the primary contexts' state as
the driver reports it)."""
import ctypes

from cisolver.distributed import world
from hybridblas.distributed import local_rank
from cisolver.spectrum import compute_spectrum


def active_contexts():
    cuda = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_int()
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    active = []
    for ordinal in range(count.value):
        device, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        assert cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
        assert cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(on)) == 0
        if on.value:
            active.append(ordinal)
    return active, count.value


comm = world()
out = compute_spectrum("usdb", 3, 4, nev=3, comm=comm, devices="all", dtype="float64")
active, count = active_contexts()
mine = local_rank(comm)[0] % count
assert out["devices"] == [mine], (out["devices"], mine)
assert active == [mine], f"rank {comm.Get_rank()}: contexts on GPUs {active}, its GPU is {mine}"
assert out["converged"] and "observables" in out
everyone = comm.allgather(active)
if comm.Get_rank() == 0:
    print(f"gpu contexts OK on {comm.Get_size()} ranks: {everyone}")
