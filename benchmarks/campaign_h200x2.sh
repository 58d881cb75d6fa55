#!/bin/bash
# GPU campaigns (2×H200, 4×H200) in few device calls: consumer GPU tests, the BLAS acceptance runs, the tuning
# calibration and ratio sweep, the FLAPW and CI benchmarks, and the MPI k-point throughput.
# Each stage has its own time limit; results are tarred after every stage so a cut run still returns.
#   usage (device machine, repo root):  OUT=dir bash benchmarks/campaign_h200x2.sh [stage ...]
# The interaction files do not travel with the repo: copy ../shared/data/interactions into .data/ (git-
# ignored), carry .data, and export CISOLVER_DATA=$PWD/.data/interactions. For the MPI stages without an
# mpiexec there, carry .whl/ with the mpich and mpi4py (cp312) wheels. Only 8 files come back: the tarball
# $OUT/campaign.tgz holds everything.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONWARNINGS=ignore
OUT=${OUT:-campaign}; W=$OUT/work; mkdir -p "$W"
STAGES=${*:-"env tests blas tune flapw ci mpi"}
pack() { tar czf "$OUT/campaign.tgz" -C "$OUT" work 2>/dev/null; }
stage() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T), limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" bash -c "$*" > "$W/$name.log" 2>&1
  echo "rc=$? after $((SECONDS - t0)) s" | tee -a "$W/$name.log"
  tail -n 25 "$W/$name.log"
  pack
}
# an MPI from pip (mpich + mpi4py wheels carried in .whl/) when the machine has no mpiexec
MPI_SETUP='command -v mpiexec >/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH; };'
for s in $STAGES; do case $s in
env) stage env 60 "nvidia-smi; nproc; free -g; python3 -c 'import cupy, numpy, scipy; print(cupy.__version__, numpy.__version__, scipy.__version__)'; python3 -c 'from mpi4py import MPI; print(MPI.Get_library_version())' || true; which mpiexec" ;;
tests) stage tests 100 "python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_gpu_consumers.py}" ;;
blas) stage blas 300 "python3 benchmarks/bench_blas_gpu.py --sizes 24576 --modes host --repeats 2 --xt-block 0 8192 --out $W/blas2 && python3 benchmarks/bench_blas_gpu.py --sizes 24576 --modes host --gpus 1 --skip xt --repeats 2 --out $W/blas1" ;;
tune) stage tune 170 "mkdir -p $W/prof; export HYBRIDBLAS_PROFILE_DIR=$W/prof; (time python3 -m hybridblas.tuning calibrate --quick --output $W/prof --no-progress) && python3 -m hybridblas.tuning show --json > $W/prof/show.json; python3 benchmarks/sweep_static_ratio.py --routine herk --dtype complex128 --n 16384 --devices cpu cuda:0 cuda:1 --shares 0 0.005 0.01 0.02 0.04 --min-time 0.5 --reps 2 --json $W/sweep-herk-16384.json" ;;
flapw) stage flapw 170 "python3 benchmarks/bench_flapw.py --devices all --blas hybridblas --systems TiO2 --kmax 4.0 --arrays device --cublas-peak --out $W/flapw-k4 && python3 benchmarks/bench_flapw.py --devices all --blas hybridblas cublasxt --systems TiO2 --kmax 2.5 3.0 --out $W/flapw-k25" ;;
ci) stage ci 120 "python3 benchmarks/bench_cisolver.py --devices all --cases 24Mg --out $W/ci" ;;
mpi) stage mpi 200 "$MPI_SETUP export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; mpiexec -n 2 python3 -m flapw build --system TiO2 --kmax 2.0 --kpoints 2 --devices gpu --json > $W/mpi-warm.json; for run in 1gpu:1:0 1:1: 2:2:; do IFS=: read tag r vis <<< \$run; t0=\$(date +%s.%N); CUDA_VISIBLE_DEVICES=\${vis:-\$(seq -s, 0 \$((\$(nvidia-smi -L | wc -l) - 1)))} mpiexec -n \$r python3 -m flapw build --system TiO2 --kmax ${MPI_KMAX:-3.0} --kpoints ${MPI_KPOINTS:-8} --devices gpu --json > $W/mpi-\$tag.json; echo ranks=\$r gpus=\${vis:-all} wall=\$(python3 -c \"print(\$(date +%s.%N) - \$t0)\") s; python3 -c \"import json; d=json.load(open('$W/mpi-\$tag.json')); print('arrays', d['arrays'], 'loop s', d['loop_seconds'], 'k/s', d['kpoints_per_second'])\"; done" ;;
sweep) stage sweep 200 "export HYBRIDBLAS_PROFILE_DIR=\${PROFILE_DIR:-$W/prof}; python3 benchmarks/sweep_static_ratio.py --routine ${SWEEP_ROUTINE:-herk} --dtype complex128 --n ${SWEEP_N:-24576} --devices cpu cuda:0 cuda:1 --shares 0 0.005 0.01 0.02 --gpu-splits 0.47 0.5 0.53 --rounds 5 --json $W/sweep-${SWEEP_ROUTINE:-herk}-${SWEEP_N:-24576}.json" ;;
# feeding the GPUs: copy threads, cudaHostRegister, DMA from all GPUs at once
staging) stage staging 200 "python3 benchmarks/bench_staging.py --gib 4 --big-gib ${BIG_GIB:-10} --json $W/staging.json" ;;
gputests) stage gputests ${TESTS_LIMIT:-420} "python3 -m pytest -q -p no:cacheprovider -m 'gpu or multi_gpu' --durations=8 ${TESTS:-tests/}" ;;
# scaling over the node's GPUs (1, 2, 4 ...) on the same host arrays, against cuBLASXt with the same GPUs
scale) stage scale ${SCALE_LIMIT:-560} "python3 benchmarks/bench_blas_gpu.py --sizes ${SCALE_N:-24576} --modes host --gpu-counts ${COUNTS:-1 2 4} --repeats ${REPEATS:-2} --xt-block 8192 --out $W/scale" ;;
flapwn) stage flapwn 300 "python3 benchmarks/bench_flapw.py --devices ${FLAPW_DEVICES:-cuda:0 all} --blas hybridblas --systems TiO2 --kmax ${FLAPW_KMAX:-4.0} --arrays device --cublas-peak --out $W/flapw-n" ;;
tunequick) stage tunequick 200 "mkdir -p $W/prof; export HYBRIDBLAS_PROFILE_DIR=$W/prof; (time python3 -m hybridblas.tuning calibrate --quick --output $W/prof --no-progress) && python3 -m hybridblas.tuning show --json > $W/prof/show.json" ;;
# small hybridblas calls on one GPU (small), n = 32768 on 1, 2, 4 GPUs (scale32), a FLAPW build with page-locking
# off / auto / on (flapwpin), the size curve (curve, curve2), TiO2 over Kmax on one GPU and all (flapw1), AuAg and
# NaCl with device and host arrays (crystals); FLAPW host-array builds against cuBLASXt: flapwxt
small) stage small 90 "python3 benchmarks/bench_small_calls.py --dtype float64 && python3 benchmarks/bench_small_calls.py --dtype float32" ;;
scale32) stage scale32 560 "python3 benchmarks/bench_blas_gpu.py --sizes 32768 --modes host --gpu-counts ${COUNTS:-1 2 4} --repeats 2 --xt-block 8192 --xt-max-seconds 10 --out $W/scale32" ;;
flapwpin) stage flapwpin 400 "for p in off auto on; do HYBRIDBLAS_PIN_HOST=\$p python3 benchmarks/bench_flapw.py --devices all --blas hybridblas --systems TiO2 --kmax 3.0 --repeat 3 --out $W/flapw-pin-\$p; done" ;;
curve) stage curve 400 "python3 benchmarks/bench_blas_gpu.py --sizes 8192 16384 32768 --modes host device --xt-block 0 8192 --out $W/curve" ;;
flapw1) stage flapw1 300 "python3 benchmarks/bench_flapw.py --devices cuda:0 all --blas hybridblas --systems TiO2 --kmax 2.5 3.0 3.5 4.0 --arrays device --cublas-peak --out $W/flapw-all" ;;
crystals) stage crystals 300 "python3 benchmarks/bench_flapw.py --devices all --blas hybridblas --systems AuAg NaCl --kmax 3.0 4.0 --arrays device --out $W/flapw-crystals-device && python3 benchmarks/bench_flapw.py --devices all --blas hybridblas cublasxt --systems AuAg NaCl --kmax 3.0 4.0 --out $W/flapw-crystals-host" ;;
cibig) stage cibig ${CI_LIMIT:-400} "python3 benchmarks/bench_cisolver.py --devices all --cases ${CI_CASES:-24Mg,46Ti,47V} ${CI_FLAGS:-} --out $W/ci-big" ;;
ci48) stage ci48 ${CI48_LIMIT:-200} "python3 benchmarks/bench_cisolver.py --devices all --gpu-only --cases 48Cr --dtype float32 --tol 1e-5 ${CI48_FLAGS:-} --out $W/ci-48cr" ;;
mpici) stage mpici 500 "$MPI_SETUP export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; python3 -m cisolver spectrum --interaction gxpf1a --protons 4 --neutrons 4 --nev 5 --dtype float32 --tol 1e-5 --devices 0 --json > $W/mpici-1.json; mpiexec -n 2 python3 -m cisolver spectrum --interaction gxpf1a --protons 4 --neutrons 4 --nev 5 --dtype float32 --tol 1e-5 --devices all --json > $W/mpici-2.json; python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py -k gpu" ;;
# LOBPCG on two MPI ranks, one GPU each (rows split by nonzeros, iterations queued: NCCL sums and gathers)
ciranks) stage ciranks ${RANKS_LIMIT:-420} "$MPI_SETUP export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; mpiexec --version | head -1; mpiexec --bind-to none -n 2 python3 benchmarks/bench_cisolver_ranks.py --cases ${RANKS_CASES:-24Mg,46Ti,47V} --repeats 3 ${RANKS_FLAGS:-} --out $W/ci-ranks && { [ \"${RANKS48:-1}\" = 0 ] || mpiexec --bind-to none -n 2 python3 benchmarks/bench_cisolver_ranks.py --cases 48Cr --dtype float32 --tol 1e-5 --repeats 2 ${RANKS_FLAGS:-} --out $W/ci-ranks; } && mpiexec --bind-to none -n 2 python3 -m cisolver spectrum --interaction gxpf1a --protons 3 --neutrons 4 --nev 5 --devices all --json > $W/ci-ranks/spectrum-47V-2ranks.json" ;;
# LOBPCG on two ranks under NCCL settings for small messages (NCCL_ENVS: ;-separated lists of VAR=value)
ncclenv) stage ncclenv ${RANKS_LIMIT:-420} "$MPI_SETUP export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; IFS=';' read -ra envs <<< \"${NCCL_ENVS:-NCCL_PROTO=LL;NCCL_MAX_NCHANNELS=1}\"; for e in '' \"\${envs[@]}\"; do echo \"--- NCCL settings: \${e:-defaults}\"; env \$e mpiexec --bind-to none -n 2 python3 benchmarks/bench_cisolver_ranks.py --cases ${RANKS_CASES:-47V} --repeats ${NCCL_REPEATS:-2} --out $W/ci-ranks-nccl\${e//[^A-Za-z0-9]/_} | grep -v 'no profile'; done" ;;
# the dense steps of a LOBPCG iteration at 48Cr's size, piece by piece (one GPU)
dense) stage dense 90 "python3 benchmarks/bench_dense_steps.py --rows 1963461 --block 8 --dtype float32 --json $W/dense-f32.json && python3 benchmarks/bench_dense_steps.py --rows 1963461 --block 8 --dtype float64 --json $W/dense-f64.json" ;;
# host-side profile of the dense steps (cProfile) on a cheap-SpMM matrix of 48Cr's size and of 24Mg's
profdense) stage profdense 150 "python3 benchmarks/profile_lobpcg_dense.py --rows 1963461 --dtype float32 && python3 benchmarks/profile_lobpcg_dense.py --rows 28503 --dtype float64" ;;
# a one-GPU profile (the node's first GPU only)
tune1) stage tune1 150 "mkdir -p $W/prof1; export HYBRIDBLAS_PROFILE_DIR=$W/prof1 CUDA_VISIBLE_DEVICES=0; (time python3 -m hybridblas.tuning calibrate --quick --output $W/prof1 --no-progress) && python3 -m hybridblas.tuning show --json > $W/prof1/show.json" ;;
curve2) stage curve2 ${CURVE_LIMIT:-240} "python3 benchmarks/bench_blas_gpu.py --sizes ${CURVE_SIZES:-4096 8192 16384} --modes host --gpu-counts 1 2 --repeats 1 --xt-block 8192 --xt-max-seconds 5 --out $W/curve2" ;;
flapwxt) stage flapwxt ${XT_LIMIT:-500} "python3 benchmarks/bench_flapw.py --devices all --blas ${XT_BLAS:-hybridblas cublasxt} --systems TiO2 --kmax ${XT_KMAX:-3.5 4.0} --out $W/flapw-xt" ;;
# host time of small hybridblas calls on a GPU, and of LOBPCG's dense steps at 48Cr's size (cProfile)
hbprof) stage hbprof ${HBPROF_LIMIT:-120} "python3 benchmarks/profile_hb_calls.py --calls 300 && python3 benchmarks/profile_lobpcg_dense.py --rows 1963461 --dtype float32 --iterations 15" ;;
# ours and the CPU peers on the node's cores only, and ours with the dense steps on 1..16 threads
cicpu) stage cicpu ${CPU_LIMIT:-240} "python3 benchmarks/bench_cisolver.py --devices cpu --cases ${CPU_CASES:-24Mg,46Ti} --out $W/ci-cpu" ;;
cpusweep) stage cpusweep ${SWEEP_LIMIT:-150} "python3 benchmarks/sweep_cisolver_threads.py --cases ${CPU_CASES:-24Mg,46Ti} --threads 1,2,4,8,16 --json $W/cpu-threads.json" ;;
# cisolver's row kernels against its cuBLAS route, at 48Cr's and 24Mg's sizes
rowk) stage rowk ${ROWK_LIMIT:-150} "python3 benchmarks/bench_dense_kernels.py --rows 1963461 --json $W/kernels-48cr.json && python3 benchmarks/bench_dense_kernels.py --rows 28503 --json $W/kernels-24mg.json" ;;
# block SpMM on one and two GPUs: cisolver.gpu_spmm against cupyx as cisolver used it before (same matrix)
spmm) stage spmm ${SPMM_LIMIT:-240} "python3 benchmarks/bench_spmm_gpu.py --cases ${SPMM_CASES:-47V} --dtype float64 --json $W/spmm-f64.json && python3 benchmarks/bench_spmm_gpu.py --cases 48Cr --dtype float32 --repeat 5 --json $W/spmm-48cr-f32.json" ;;
# every call of a LOBPCG iteration, host and GPU time: 48Cr's real Hamiltonian, then the synthetic matrix
trace) stage trace ${TRACE_LIMIT:-150} "for c in ${TRACE_CASES:-24Mg 47V}; do python3 benchmarks/trace_lobpcg_iteration.py --case \$c --dtype float64 --iterations 20; done" ;;
trace48) stage trace48 ${TRACE_LIMIT:-150} "python3 benchmarks/trace_lobpcg_iteration.py --case 48Cr --iterations 15 && python3 benchmarks/trace_lobpcg_iteration.py --iterations 15" ;;
# the GPU time of each queued dense step of an iteration, apart from the host's, at 24Mg's to 48Cr's sizes
steps) stage steps ${STEPS_LIMIT:-200} "for c in ${STEPS_SIZES:-28503:float64 86810:float64 483887:float64 1963461:float32}; do python3 benchmarks/bench_queued_steps.py --rows \${c%:*} --dtype \${c#*:} --json $W/steps-\${c%:*}.json; done" ;;
# the small eigensolve of Rayleigh-Ritz on LOBPCG's own 24 x 24 matrices: cuSOLVER's syevjBatched and XsyevBatched
smalleigh) stage smalleigh ${EIGH_LIMIT:-120} "python3 benchmarks/bench_small_eigh.py --matrices benchmarks/results/lobpcg_rr_matrices.npy --json $W/small_eigh.json" ;;
esac; done
echo "=== done $(date +%T)"
