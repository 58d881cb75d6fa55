"""Benchmarks of the FLAPW H and S builds (flapw/): end-to-end and BLAS-part rates by system, Kmax, device
set and BLAS backend, and the plot of docs/performance.md.

    python3 -m benchmarks.flapw build --devices cpu --systems NaCl --kmax 2.5 3.0 --out DIR
    python3 -m benchmarks.flapw build --devices cuda:0 all --systems TiO2 --kmax 4.0 --arrays device \
        --cublas-peak --out DIR
    python3 -m benchmarks.flapw plot --out docs/img/flapw_tio2.png
"""
if not __package__:                      # run as a file: start again as a module of the repository
    import os, runpy, sys                # noqa: E401
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runpy.run_module("benchmarks.flapw", run_name="__main__", alter_sys=True)
    sys.exit()

import sys  # noqa: E402

from benchmarks.common import main  # noqa: E402

COMMANDS = {
    "build": ("flapw_build", "H and S builds by system, Kmax, device set and BLAS backend (one JSON each)"),
    "plot": ("flapw_plot", "the TiO2 TF/s against Kmax figure from benchmarks/results"),
}

if __name__ == "__main__":
    sys.exit(main("flapw", __doc__, COMMANDS))
