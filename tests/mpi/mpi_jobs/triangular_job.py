"""Run under mpiexec with n_d (n_d + 1) / 2 ranks: MFDn's triangular layout gives H x and the energies
of the serial code."""
import numpy as np

from cisolver.data import resolve_interaction
from cisolver.distributed import world
from cisolver.shellmodel import hamiltonian, snt
from cisolver.spectrum import compute_spectrum
from cisolver.triangular import TriangularLayout, TriangularOperator, build_block

comm = world()
if comm is None:                        # one rank: hybridblas.distributed.world() gives None
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

# the product itself, against the serial full H on random vectors
problem = hamiltonian.ShellModelProblem(snt.read_snt(resolve_interaction("usdb")), 3, 4, None)   # 23Na
grid = TriangularLayout([b.size for b in problem.basis.blocks], size)
op = TriangularOperator(build_block(problem, grid, rank), grid, problem.dimension, comm)
x = np.random.default_rng(3).standard_normal((problem.dimension, 5))
lo, hi = op.local
got = op.matmat(x[lo:hi])
h, _ = problem.build(storage="full")
want = (h @ x)[lo:hi]
err = np.abs(got - want).max() / np.abs(want).max()
assert err < 1e-13, (rank, err)
assert comm.allreduce(hi - lo) == problem.dimension

for z, n in ((2, 2), (3, 4)):             # 20Ne (dim 640) and 23Na
    dist = compute_spectrum("usdb", z, n, nev=5, tol=1e-9, comm=comm, layout="triangular")
    if rank == 0:
        serial = compute_spectrum("usdb", z, n, nev=5, tol=1e-9)
        e_d, e_s = np.array(dist["energies"]), np.array(serial["energies"])
        assert dist["converged"], dist
        assert np.allclose(e_d, e_s, rtol=1e-8, atol=0), (e_d, e_s)
        assert np.allclose(dist["j"], serial["j"], atol=1e-6), (dist["j"], serial["j"])
        print(f"dim {dist['dimension']}: {dist['storage']}, energies {e_d.round(6).tolist()} equal serial")
if rank == 0:
    print(f"triangular OK on {size} ranks")
