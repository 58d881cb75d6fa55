"""Build H and S for a small TiO2 cell at two k-points, check them, and solve the eigenproblem.

    PYTHONPATH=. python3 examples/hs_build.py            # CPU
    PYTHONPATH=. python3 examples/hs_build.py all        # CPU and every GPU through hybridblas
"""
import sys

import numpy as np

import flapw
import hybridblas as hb

devices = sys.argv[1] if len(sys.argv) > 1 else "cpu"
ctx = hb.Context(devices=devices)
cell = flapw.System.preset("TiO2", kmax=2.5, supercell=(2, 1, 1))       # 12 atoms, N_L = 81
print(cell, "N_G =", cell.n_g)
for k in [(0.1234, 0.2345, 0.3456), (0.25, 0.0, 0.1)]:
    kc = cell.with_k(k)                                                # radial functions and T are reused
    h, s, rep = flapw.build_hs(kc, method="refined", context=ctx, interstitial=True, return_report=True)
    print(rep.table())
    print("Hermitian:", np.array_equal(h, h.conj().T), " lowest eigenvalues (Ha):",
          np.round(flapw.solve(h, s, 5), 5))

# the empty lattice: eigenvalues reproduce free electrons v0 + |k+G|²/2 from above
empty = flapw.System.preset("AuAg", kmax=3.0, supercell=(1, 1, 1), potential="empty", v0=-0.5)
h, s = flapw.build_hs(empty, context=ctx, interstitial=True)
free = np.sort(-0.5 + empty.basis.norm ** 2 / 2)[:5]
print("empty lattice AuAg, E - E_free (mHa):", np.round(1e3 * (flapw.solve(h, s, 5) - free), 3))
