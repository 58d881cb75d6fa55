"""Benchmarks of the CI eigensolver (cisolver/): the Hamiltonian build, the sparse products, LOBPCG against
its peers in one process and on MPI ranks, the GPU dense steps of an iteration piece by piece, and the plot
of docs/performance.md.

    python3 -m benchmarks.cisolver build --cases 46Ti,24Mg --json out.json
    python3 -m benchmarks.cisolver solve --devices cpu --cases 24Mg,44Ti --out DIR
    mpiexec -n 2 python3 -m benchmarks.cisolver ranks --cases 47V --repeats 3 --out DIR
    python3 -m benchmarks.cisolver plot --out docs/img/cisolver_peers.png
"""
if not __package__:                      # run as a file: start again as a module of the repository
    import os, runpy, sys                # noqa: E401
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runpy.run_module("benchmarks.cisolver", run_name="__main__", alter_sys=True)
    sys.exit()

import sys  # noqa: E402

from benchmarks.common import main  # noqa: E402

COMMANDS = {
    "build": ("ci_build", "the shell-model Hamiltonian build, optionally against a reference tree"),
    "solve": ("ci_solve", "LOBPCG against scipy's eigsh and lobpcg and cupyx's lobpcg, same matrix and start"),
    "ranks": ("ci_ranks", "LOBPCG on MPI ranks, one GPU each (run under mpiexec)"),
    "plot": ("ci_plot", "time to 5 pairs and the dense share figure from benchmarks/results"),
    "spmm-cpu": ("ci_spmm_cpu", "CPU block SpMM: MKL against scipy, and eigsh's SpMV"),
    "spmm-gpu": ("ci_spmm_gpu", "GPU block SpMM layouts, one and two GPUs, against cupyx"),
    "threads": ("ci_threads", "LOBPCG on the CPU with the dense steps on 1, 2, 4 ... threads"),
    "profile": ("ci_profile", "cProfile of LOBPCG's dense steps on a synthetic matrix"),
    "dense-steps": ("ci_dense_steps", "each dense step of an iteration on a GPU, whole calls"),
    "kernels": ("ci_kernels", "GPU and host time of the dense-step kernels against cupy"),
    "queued-steps": ("ci_queued_steps", "GPU time of each queued dense step apart from the host's"),
    "iteration-kernels": ("ci_iteration_kernels", "one queued iteration's dense steps as a range for Nsight Compute"),
    "small-eigh": ("ci_small_eigh", "the Rayleigh-Ritz k x k eigensolve: syevjBatched against XsyevBatched"),
    "float32": ("ci_float32", "float32 LOBPCG energies on a GPU against float64, one change at a time"),
    "cuda-sources": ("ci_cuda_sources", "compile cisolver's CUDA units with NVRTC (no GPU needed)"),
}

if __name__ == "__main__":
    sys.exit(main("cisolver", __doc__, COMMANDS))
