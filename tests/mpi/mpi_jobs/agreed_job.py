"""Run under mpiexec: Iterations._agreed gives back what every rank read alike, and raises on every rank
(not only on the one that differs) when one rank read something else; prepare_collectives does nothing on
every rank when one rank has no GPU (or no NCCL), and refuses a device that is no GPU index."""
import numpy as np

from cisolver.distributed import world
from cisolver.iterations import Iterations

comm = world()
run = Iterations.__new__(Iterations)       # only the communicator matters here
run.comm = comm
same = (np.arange(3.0), 1.5, np.array([True, False]), True)
assert run._agreed(same) is same
assert run._agreed(np.array([2.0, 3.0])).tolist() == [2.0, 3.0]
try:
    run._agreed((np.array([1.0, 2.0 + (comm.Get_rank() == comm.Get_size() - 1) * 1e-16 * 4]), True))
except RuntimeError as exc:
    assert "different results" in str(exc)
else:
    raise AssertionError("ranks that read different values were not told")
from hybridblas import distributed  # noqa: E402
# the last rank has no GPU: no rank starts NCCL's set-up (none waits in it for that rank)
device = None if comm.Get_rank() == comm.Get_size() - 1 else 0
assert distributed.prepare_collectives(comm, device) is None and not distributed._NCCL_PENDING
try:
    distributed.prepare_collectives(comm, -1)
except ValueError as exc:
    assert "device must be a GPU index or None, got -1" in str(exc)
else:
    raise AssertionError("a negative device was taken")
assert distributed.prepare_collectives(None, 0) is None
comm.Barrier()
if comm.Get_rank() == 0:
    print(f"agreed OK on {comm.Get_size()} ranks")
