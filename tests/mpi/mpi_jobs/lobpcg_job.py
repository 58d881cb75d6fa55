"""Run under mpiexec: the distributed LOBPCG (rows over ranks) gives the serial energies and J."""
import numpy as np

from cisolver.distributed import world
from cisolver.spectrum import compute_spectrum

comm = world()
for z, n in ((2, 2), (3, 4)):             # 20Ne (dim 640) and 23Na (usdb)
    dist = compute_spectrum("usdb", z, n, nev=5, tol=1e-9, comm=comm)
    if comm.Get_rank() == 0:
        serial = compute_spectrum("usdb", z, n, nev=5, tol=1e-9)
        e_d, e_s = np.array(dist["energies"]), np.array(serial["energies"])
        assert dist["converged"] and serial["converged"]
        assert np.allclose(e_d, e_s, rtol=1e-8, atol=0), (e_d, e_s)
        assert np.allclose(dist["j"], serial["j"], atol=1e-6), (dist["j"], serial["j"])
        print(f"dim {dist['dimension']}: energies {e_d.round(6).tolist()} equal serial")
if comm.Get_rank() == 0:
    print(f"lobpcg OK on {comm.Get_size()} ranks")
