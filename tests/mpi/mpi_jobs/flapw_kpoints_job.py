"""Run under mpiexec: `flapw build --kpoints N --output F` spread over the ranks gives the serial H and S."""
import glob
import sys

import numpy as np

from flapw import System, build_hs, cli, parallel

out_stem = sys.argv[1]
args = ["build", "--system", "NaCl", "--kmax", "1.8", "--supercell", "1", "1", "1", "--kpoints", "4",
        "--interstitial", "--output", out_stem + ".npz", "--quiet"]
assert cli.main(args) == 0
comm = parallel.world()
comm.Barrier()
if comm.Get_rank() == 0:
    files = sorted(glob.glob(out_stem + ".rank*.npz"))
    assert len(files) == comm.Get_size(), files
    got = {}
    for f in files:
        with np.load(f) as z:
            got.update({key: z[key] for key in z.files})
    cell = System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))
    for ik, k in enumerate(cli._kpoints(4, cell.k)):
        h, s = build_hs(cell.with_k(k), interstitial=True)
        for name, ref in (("H", h), ("S", s)):
            err = np.abs(got[f"{name}_{ik}"] - ref).max() / np.abs(ref).max()
            assert err < 1e-13, (name, ik, err)
    print(f"flapw k-points OK on {comm.Get_size()} ranks")
