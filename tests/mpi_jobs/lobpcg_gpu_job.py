"""Run under mpiexec on a GPU node: the distributed LOBPCG with one GPU per rank gives the serial
energies; prints the time per iteration and the communication share."""
import numpy as np

from cisolver.distributed import world
from cisolver.spectrum import compute_spectrum

comm = world()
if comm is None:                          # one rank
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
dist = compute_spectrum("usdb", 3, 4, nev=5, tol=1e-9, comm=comm, devices="all")     # 23Na, dim 13029
if comm.Get_rank() == 0:
    serial = compute_spectrum("usdb", 3, 4, nev=5, tol=1e-9)
    e_d, e_s = np.array(dist["energies"]), np.array(serial["energies"])
    assert dist["converged"], dist
    assert np.allclose(e_d, e_s, rtol=1e-8, atol=0), (e_d, e_s)
    assert np.allclose(dist["j"], serial["j"], atol=1e-6), (dist["j"], serial["j"])
    sec = dist["seconds"]["solve_detail"]
    print(f"devices {dist['devices']} (rank 0): {dist['iterations']} iterations, "
          f"{1e3 * dist['seconds']['solve'] / dist['iterations']:.1f} ms each, communication "
          f"{sec['communication']:.3f} s of {dist['seconds']['solve']:.3f} s")
    print(f"lobpcg gpu OK on {comm.Get_size()} ranks")
