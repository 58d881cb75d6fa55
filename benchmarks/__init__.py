"""Benchmarks of hybridblas and its two consumers, run from the repository root as modules:

    python3 -m benchmarks.blas COMMAND ...       the BLAS core (CPU, GPUs, small calls, staging, ratio sweep)
    python3 -m benchmarks.flapw COMMAND ...      FLAPW H and S builds, and their plot
    python3 -m benchmarks.cisolver COMMAND ...   the CI eigensolver: build, SpMM, solves against peers, steps
    python3 -m benchmarks.cli --label L -- CMD   wall clock of a command-line run in a fresh process
    bash benchmarks/reproduce.sh [STAGE ...]     every table and plot of docs/performance.md, by stage

Each driver lists its commands with --help; each command's --help gives its options. The measurements
live in benchmarks/measure/, one module per command; benchmarks/common.py holds what they share.
"""
