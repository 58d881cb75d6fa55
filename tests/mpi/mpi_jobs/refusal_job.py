"""Run under mpiexec: a run too big for one rank's memory is refused on every rank with the same message (none
is left waiting in a collective), before anything is built; the eigenvectors come back gathered on every rank."""
import numpy as np

import hybridblas as hb
from cisolver.distributed import world
from cisolver.spectrum import compute_spectrum

comm = world()
rank = comm.Get_rank()
real = hb.memory.host_available
if rank == comm.Get_size() - 1:                  # only the last rank's node is short of memory
    hb.memory.host_available = lambda: 1 << 20
try:
    compute_spectrum("usdb", 2, 2, nev=5, comm=comm)
except hb.InsufficientMemory as exc:
    message = str(exc)
else:
    raise AssertionError(f"rank {rank}: not refused")
assert "M-scheme dimension 640" in message and "921.6 KiB of available host memory" in message, message
assert len(set(comm.allgather(message))) == 1
hb.memory.host_available = real
out = compute_spectrum("usdb", 2, 2, nev=3, tol=1e-9, comm=comm, return_vectors=True)
v = out["eigenvectors"]
assert v.shape == (640, 3) and np.allclose(v.T @ v, np.eye(3), atol=1e-8)
assert all(np.array_equal(v, other) for other in comm.allgather(v))
if rank == 0:
    print(f"refusal OK on {comm.Get_size()} ranks")
