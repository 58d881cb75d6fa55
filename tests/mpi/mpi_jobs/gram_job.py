"""Run under mpiexec: a distributed Gram matrix (local split-K product + Allreduce) equals the serial one."""
import sys

import numpy as np

from hybridblas import distributed, reference

comm = distributed.world()
size = comm.Get_size() if comm else 1
rank = comm.Get_rank() if comm else 0
rng = np.random.default_rng(42)          # same data on every rank
for dtype in (np.float64, np.complex128):
    s = rng.standard_normal((5003, 12)).astype(dtype)
    if dtype == np.complex128:
        s = s + 1j * rng.standard_normal(s.shape)
    lo, hi = distributed.block_range(s.shape[0], size, rank)
    g = distributed.gram(s[lo:hi], comm)
    want = reference.ref_herk(1.0, s, 0.0, np.zeros((12, 12), dtype), "C", True)
    err = np.abs(np.tril(g - want)).max() / np.abs(want).max()
    assert err < 1e-13, err
    full = distributed.allgather_rows(s[lo:hi], comm)
    assert np.array_equal(full, s)
distributed.rank_print(comm, f"gram OK on {size} ranks")
sys.stdout.flush()
