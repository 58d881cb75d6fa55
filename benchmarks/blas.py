"""Benchmarks of the BLAS core: hybridblas against plain BLAS on the CPU, against device cuBLAS and
cuBLASXt on GPUs, small calls, host-to-GPU staging, the static split's ratios, the tall-skinny kernel.

    python3 -m benchmarks.blas cpu --repeat 7
    python3 -m benchmarks.blas gpu --sizes 24576 --modes host --gpu-counts 1 2 --repeats 3 --xt-block 8192 --out DIR
    python3 -m benchmarks.blas emulation --sizes 2048 4096 8192 16384 --out DIR
    python3 -m benchmarks.blas plot DIR1/bench_blas_gpu.json DIR2/bench_blas_gpu.json --out DIR
    python3 -m benchmarks.blas links --gib 1 --down-share 0.25 --json out.json
    python3 -m benchmarks.blas band-settings --sizes 8192 --routines zherk --setting k band_plan.OUTER_GAIN=0 \
        --setting outer band_plan.OUTER_GAIN=10 --json out.json
    python3 -m benchmarks.blas band-replay --sizes 8192 16384 --json out.json
    python3 -m benchmarks.blas band-trace --sizes 8192 --json out.json --plot out.png
    python3 -m benchmarks.blas turns --sizes 8192 16384 --routines zgemmt --rounds 8 --json out.json
    python3 -m benchmarks.blas busy-thread --sizes 8192 --routines zgemmt zherk --json out.json
    python3 -m benchmarks.blas writeback-bound --sizes 8192 --routines zgemmt --rounds 6 --json out.json
    python3 -m benchmarks.blas host-profile --sizes 8192 --routines zgemmt zherk --calls 6 --json out.json
    python3 -m benchmarks.blas shared-gpu --sizes 16384 --routines zgemmt zher2k --calls 10 --json out.json
    python3 -m benchmarks.blas first-calls --sizes 8192 --routines zgemmt zherk --ahead on off --json out.json
    python3 -m benchmarks.blas layout-build --sizes 8192 16384 --repeats 30
    python3 -m benchmarks.blas rect-columns --sizes 16384 --columns 0 512 640 768 1024 --json out.json
"""
if not __package__:                      # run as a file: start again as a module of the repository
    import os, runpy, sys                # noqa: E401
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runpy.run_module("benchmarks.blas", run_name="__main__", alter_sys=True)
    sys.exit()

import sys  # noqa: E402

from benchmarks.common import main  # noqa: E402

COMMANDS = {
    "cpu": ("blas_cpu", "hybridblas herk/gemmt on the CPU against scipy's BLAS and numpy"),
    "gpu": ("blas_gpu", "zherk, zher2k, zgemmt on GPUs, host and device operands, against cuBLAS and cuBLASXt"),
    "plot": ("blas_plot", "merge and plot `gpu` result files (TF/s against n and against GPUs)"),
    "small-calls": ("blas_small_calls", "fixed cost of a small call on a GPU against cupy's matmul"),
    "staging": ("blas_staging", "host-to-GPU paths: copy threads, staging ring, registered DMA"),
    "links": ("blas_links", "page-locked DMA each way per GPU, alone, at once, both ways at once; a peer copy"),
    "band-settings": ("blas_band_settings", "the band path's layout settings side by side on two GPUs, host operands"),
    "band-replay": ("blas_band_replay", "a two-GPU band call's products replayed on device operands, no transfers"),
    "band-trace": ("blas_band_trace", "a two-GPU band call's timeline (uploads, copies, products) and its model"),
    "turns": ("blas_turns", "device cuBLAS on both GPUs and hybridblas on host operands in turn, with SM clocks"),
    "busy-thread": ("blas_busy_thread", "two-GPU calls on host operands while another Python thread spins or computes"
                    " (numpy, scipy.linalg.blas)"),
    "writeback-bound": ("blas_writeback_bound", "two-GPU band calls with C's write-back as is, none, or contiguous"),
    "host-profile": ("blas_host_profile", "a two-GPU band call's host seconds by function (wall and thread CPU)"),
    "shared-gpu": ("blas_shared_gpu", "two-GPU calls on host operands while another process runs products on GPU 1"),
    "first-calls": ("blas_first_calls", "the first two-GPU calls after page-locking, layouts made ahead or in call"),
    "layout-build": ("blas_layout_build", "host time of laying out a two-GPU band call (no GPU used)"),
    "herkx-widths": ("blas_herkx_widths", "a band call's diagonal-block herkx on one GPU against its width and k"),
    "rect-columns": ("blas_rect_columns", "zgemmt corner-order rectangles on one GPU in cuBLAS calls of a width"),
    "sweep-ratio": ("blas_sweep_ratio", "hand sweep of the static split's ratios against the calibrated profile"),
    "kernels": ("blas_kernels", "the float32 tall-skinny Gram kernel at several launch sizes against cupy"),
    "emulation": ("blas_emulation", "FP64 products emulated on INT8 tensor cores against cuBLAS: time and accuracy"),
}

if __name__ == "__main__":
    sys.exit(main("blas", __doc__, COMMANDS))
