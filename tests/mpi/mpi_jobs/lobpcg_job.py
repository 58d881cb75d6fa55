"""Run under mpiexec: the distributed LOBPCG (rows over ranks) gives the serial energies and J; the observables,
their work shared by the ranks, equal one rank's own on the same vectors, on every rank."""
import numpy as np

from cisolver.data import resolve_interaction
from cisolver.distributed import world
from cisolver.observables import compute_observables
from cisolver.shellmodel import hamiltonian, nushellx
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
out = compute_spectrum("usdb", 3, 4, nev=4, tol=1e-9, comm=comm, return_vectors=True)
problem = hamiltonian.ShellModelProblem(nushellx.read_interaction(resolve_interaction("usdb")), 3, 4)
alone = compute_observables(problem, out["eigenvectors"])
assert out["observables"] == alone, (out["observables"], alone)
assert all(other == alone for other in comm.allgather(out["observables"]))
if comm.Get_rank() == 0:
    print(f"lobpcg OK on {comm.Get_size()} ranks")
