#!/bin/bash
# The measurements behind every table and plot of docs/performance.md, one stage each.
#
#   bash benchmarks/reproduce.sh                      list the stages: heading, machine, where the results go
#   OUT=dir bash benchmarks/reproduce.sh STAGE ...    run these stages (results under dir; default ./reproduce)
#
# Run a stage on the machine its line names: "CPU box" is any machine without a GPU (docs/performance.md's was
# 2 cores), "1 GPU" / "2 GPUs" / "4 GPUs" a node with that many (the tables: H100 and H200), "+ MPI" needs
# mpiexec and mpi4py (the machine's own, else the mpich and mpi4py wheels carried in .whl/, benchmarks/mpi_env.sh).
# The shell-model interactions ship with cisolver; $CISOLVER_DATA is searched first. The plot-* stages redraw
# the figures of docs/img from the JSON kept in benchmarks/results (copy new results there to plot them).
set -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${OUT:-reproduce}")
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
BLAS="python3 -m benchmarks.blas"
FLAPW="python3 -m benchmarks.flapw"
CI="python3 -m benchmarks.cisolver"
TIMER="python3 -m benchmarks.cli"
STORED=benchmarks/results

NAMES=()
declare -A HEADING MACHINE WHERE
stage() { NAMES+=("$1"); HEADING[$1]=$2; MACHINE[$1]=$3; WHERE[$1]=$4; }
stage e2e-flapw      "End to end: FLAPW builds as a user runs them"            "2 GPUs"           "e2e/flapw.json"
stage e2e-cisolver   "End to end: cisolver spectrum of 48Cr"                   "2 GPUs"           "e2e/ci48.json"
stage ab-architecture "At a glance: the architecture rework against the code before it" "2 GPUs"    "ab-architecture.json"
stage blas-cpu       "BLAS core / CPU"                                         "CPU box"          "bench_cpu.json"
stage blas-2gpu      "BLAS core / One and two H200s, host operands"            "2 GPUs"           "blas-24576/"
stage blas-sizes     "BLAS core / One and two H200s, host operands: against n, 2 x H100 (and its plot)" "2 GPUs" "blas-host/"
stage blas-4gpu      "BLAS core / Four H200s (and the scaling plot)"           "4 GPUs"           "blas-24576-x4/"
stage emulation      "BLAS core / FP64 emulated on INT8 tensor cores"          "1 GPU"            "emulation/"
stage emulation-flapw "BLAS core / FP64 emulated: a FLAPW build, TiO2 Kmax 4.0"   "2 GPUs"           "emulation/flapw_tio2_40.json"
stage blas-1gpu      "BLAS core / One H100 (and its plot)"                     "1 GPU"            "h100/"
stage small-calls    "BLAS core / Small calls on one GPU"                      "1 GPU"            "small_calls.log"
stage tuning         "BLAS core / Tuning: calibration and the hand sweep"      "2 GPUs"           "tuning/"
stage staging        "Feeding the GPUs from host memory"                       "4 GPUs"           "staging.json"
stage flapw-device   "FLAPW H and S: TiO2, device arrays, 1 and 2 GPUs"        "2 GPUs"           "flapw-tio2-device/"
stage flapw-device-4 "FLAPW H and S: TiO2 Kmax 4.0 on 1 and 4 GPUs"            "4 GPUs"           "flapw-tio2-x4/"
stage flapw-host     "FLAPW H and S: host arrays against cuBLASXt"             "2 GPUs"           "flapw-*-host/, flapw-crystals-device/"
stage flapw-cpu      "FLAPW H and S: CPU only (TiO2 Kmax 3.5 alone ~50 min)"   "CPU box"          "flapw-cpu/"
stage ci-build       "CI eigensolver: Hamiltonian build"                       "CPU box"          "ci-build/"
stage ci-gpu         "CI eigensolver: against the peers on GPUs"               "2 GPUs"           "cisolver/gpu/"
stage ci-ranks       "CI eigensolver: against the peers, two ranks column"     "2 GPUs + MPI"     "cisolver/ranks/"
stage ci-steps       "CI eigensolver: queued dense steps, small eigensolve"    "1 GPU"            "cisolver/steps-241944.json, small_eigh.json"
stage ci-spmm-gpu    "CI eigensolver: GPU block SpMM"                          "2 GPUs"           "cisolver/spmm-*.json"
stage ci-cpu-node    "CI eigensolver: on the CPU, a GPU node's cores"          "2-GPU node's CPU" "cisolver/cpu/"
stage ci-cpu         "CI eigensolver: on the CPU box, MKL and scipy backends"  "CPU box + mkl"    "cisolver-mkl/, cisolver-scipy/"
stage ci-spmm-cpu    "CI eigensolver: CPU block SpMM, MKL against scipy"       "CPU box + mkl"    "spmm_24Mg.json"
stage ci-float32     "CI eigensolver: float32 on a GPU"                        "1 GPU"            "float32-diagnosis.txt"
stage flapw-mpi      "Beyond one node: FLAPW k-points over ranks"              "2 GPUs + MPI"     "flapw-mpi/runs.json"
stage plot-blas      "figures blas_h100x2_host, blas_h200_scaling, blas_h100, blas_emulation_h200/_h100" "CPU box" "img/blas-*/"
stage plot-flapw     "figure flapw_tio2.png"                                   "CPU box"          "img/flapw_tio2.png"
stage plot-cisolver  "figure cisolver_peers.png"                               "CPU box"          "img/cisolver_peers.png"

if [ $# -eq 0 ]; then
  printf "usage: OUT=dir bash benchmarks/reproduce.sh STAGE ...   (results under \$OUT, default ./reproduce)\n\n"
  printf "%-15s %-18s %-58s %s\n" stage machine "docs/performance.md" "results (under \$OUT)"
  for s in "${NAMES[@]}"; do printf "%-15s %-18s %-58s %s\n" "$s" "${MACHINE[$s]}" "${HEADING[$s]}" "${WHERE[$s]}"; done
  exit 0
fi
for s in "$@"; do
  [ -n "${HEADING[$s]}" ] || { echo "reproduce.sh: unknown stage '$s'; run it without arguments for the list" >&2; exit 2; }
done

run_stage() {
  local O=$OUT
  case $1 in
  e2e-flapw)    OUT=$O/e2e bash benchmarks/campaign_e2e.sh flapw ;;
  e2e-cisolver) OUT=$O/e2e bash benchmarks/campaign_e2e.sh ci48 ;;
  ab-architecture) rm -rf $O/before && mkdir -p $O/before &&      # the packages as the architecture review read them
                git archive 4ce8354 hybridblas flapw cisolver | tar -x -C $O/before &&
                python3 -m benchmarks.ab --trees $O/before . --rounds 2 --json $O/ab-architecture.json ;;
  blas-cpu)     $BLAS cpu --repeat 7 --json $O/bench_cpu.json ;;
  blas-2gpu)    $BLAS gpu --sizes 24576 --modes host --gpu-counts 1 2 --repeats 3 --xt-block 8192 --out $O/blas-24576 ;;
  blas-sizes)   $BLAS gpu --sizes 2048 4096 8192 16384 --modes host --gpu-counts 1 2 --skip xt dynamic \
                    --repeats 3 --out $O/blas-host &&
                $BLAS gpu --sizes 24576 --modes host --gpu-counts 2 --skip dynamic --repeats 2 --out $O/blas-24576 &&
                $BLAS gpu --sizes 32768 --modes host --gpu-counts 2 --skip xt dynamic --repeats 2 --out $O/blas-32768 &&
                $BLAS band-settings --sizes 8192 16384 --routines zherk zher2k --setting k band_plan.OUTER_GAIN=0.0 \
                    --setting outer band_plan.OUTER_GAIN=10.0 --setting k-again band_plan.OUTER_GAIN=0.0 \
                    --setting outer-again band_plan.OUTER_GAIN=10.0 --json $O/band-settings-orders.json &&
                $BLAS band-settings --sizes 24576 --routines zherk --setting k band_plan.OUTER_GAIN=0.0 \
                    --setting outer band_plan.OUTER_GAIN=10.0 band_plan.OUTER_MAX_K=32768 --calls 4 \
                    --json $O/band-settings-24576.json &&
                $BLAS band-settings --sizes 32768 --routines zherk zgemmt --setting default --calls 3 \
                    --json $O/band-settings-32768.json &&
                $BLAS band-replay --sizes 8192 16384 --json $O/band-replay.json &&
                $BLAS turns --sizes 8192 16384 24576 --routines zgemmt zherk zher2k --rounds 5 --json $O/turns.json &&
                $BLAS busy-thread --sizes 8192 --routines zgemmt zherk --calls 3 --rounds 2 --json $O/busy-thread.json &&
                $BLAS shared-gpu --sizes 8192 16384 --routines zgemmt --calls 8 --after 6 --json $O/shared-gpu.json &&
                $BLAS band-settings --sizes 16384 8192 --routines zgemmt --turns 6 --calls 2 --setting columns-768 \
                    --setting one-call cuda_bands.RECT_COLUMNS=0 --json $O/band-settings-columns.json &&
                $BLAS rect-columns --sizes 8192 16384 --columns 0 512 640 768 1024 --json $O/rect-columns.json &&
                $BLAS links --gib 1 --down-share 0.25 --segments 4 8 16 32 64 128 --json $O/links-segments.json &&
                $BLAS first-calls --sizes 8192 --routines zgemmt zherk --calls 12 --json $O/first-calls-8192.json ;;
  emulation)    $BLAS emulation --sizes 4096 8192 12288 16384 --routines zgemm zherk dgemm --cublas-emulation \
                    --out $O/emulation ;;
  emulation-flapw) mkdir -p $O/emulation; for emulate in "" --emulate; do
                  $TIMER --label "TiO2-4.0${emulate:+-emulated}" --json $O/emulation/flapw_tio2_40.json -- \
                    python3 -m flapw build --system TiO2 --kmax 4.0 --devices all --kpoints 2 --json $emulate || exit 1
                done ;;
  blas-4gpu)    HYBRIDBLAS_PIN_HOST=on $BLAS gpu --sizes 24576 --modes host --gpu-counts 1 2 4 --repeats 2 \
                    --xt-block 8192 --out $O/blas-24576-x4 ;;
  blas-1gpu)    $BLAS gpu --sizes 16384 24576 --repeats 2 --out $O/h100/blas-16384-24576 &&
                $BLAS gpu --sizes 24576 --modes host --skip xt --out $O/h100/blas-24576-host ;;
  small-calls)  { $BLAS small-calls --dtype float64 && $BLAS small-calls --dtype float32; } 2>&1 | tee $O/small_calls.log ;;
  tuning)       mkdir -p $O/tuning/node $O/tuning/gpu0
                (time python3 -m hybridblas.tuning calibrate --quick --output $O/tuning/node --no-progress) 2>&1 |
                    tee $O/tuning/node/calibrate.log
                (export CUDA_VISIBLE_DEVICES=0; time python3 -m hybridblas.tuning calibrate --quick \
                    --output $O/tuning/gpu0 --no-progress) 2>&1 | tee $O/tuning/gpu0/calibrate.log
                HYBRIDBLAS_PROFILE_DIR=$O/tuning/node $BLAS sweep-ratio --routine herk --dtype complex128 --n 24576 \
                    --devices cpu cuda:0 cuda:1 --shares 0 0.005 0.01 0.02 --gpu-splits 0.47 0.5 0.53 --rounds 5 \
                    --json $O/tuning/sweep-herk-24576.json ;;
  staging)      $BLAS staging --gib 4 --json $O/staging.json ;;
  flapw-device) $FLAPW build --devices cuda:0 all --blas hybridblas --systems TiO2 --kmax 2.5 3.0 3.5 4.0 --arrays device \
                    --cublas-peak --out $O/flapw-tio2-device ;;
  flapw-device-4) $FLAPW build --devices cuda:0 all --blas hybridblas --systems TiO2 --kmax 4.0 --arrays device \
                    --cublas-peak --out $O/flapw-tio2-x4 ;;
  flapw-host)   $FLAPW build --devices all --blas hybridblas cublasxt --systems TiO2 --kmax 4.0 3.5 --out $O/flapw-tio2-host &&
                $FLAPW build --devices all --blas hybridblas cublasxt --systems AuAg NaCl --kmax 3.0 4.0 \
                    --out $O/flapw-crystals-host &&
                $FLAPW build --devices all --blas hybridblas --systems AuAg NaCl --kmax 3.0 4.0 --arrays device \
                    --out $O/flapw-crystals-device ;;
  flapw-cpu)    $FLAPW build --devices cpu --systems NaCl --kmax 2.5 3.0 --methods refined original --out $O/flapw-cpu &&
                $FLAPW build --devices cpu --systems AuAg --kmax 2.5 3.0 --out $O/flapw-cpu/AuAg &&
                $FLAPW build --devices cpu --systems TiO2 --kmax 2.5 --out $O/flapw-cpu/TiO2-2.5 &&
                $FLAPW build --devices cpu --systems TiO2 --kmax 3.0 --max-temp-gib 8 --out $O/flapw-cpu/TiO2-3.0 &&
                $FLAPW build --devices cpu --systems TiO2 --kmax 3.5 --max-temp-gib 6 --out $O/flapw-cpu/TiO2-3.5 ;;
  ci-build)     mkdir -p $O/ci-build
                $CI build --cases 46Ti,24Mg --json $O/ci-build/bench_build_46Ti_24Mg.json &&
                $CI build --cases 48Cr --storage upper --json $O/ci-build/bench_build_48Cr.json &&
                $CI build --cases 46Ti --storage upper --spectrum --json $O/ci-build/bench_build_46Ti_spectrum.json ;;
  ci-gpu)       $CI solve --devices all --gpu-only --cases 24Mg,46Ti,47V --out $O/cisolver/gpu &&
                $CI solve --devices all --gpu-only --cases 48Cr --dtype float32 --tol 1e-5 --out $O/cisolver/gpu ;;
  ci-ranks)     source benchmarks/mpi_env.sh && mpi_setup &&
                mpiexec $BIND -n 2 $CI ranks --cases 24Mg,46Ti,47V --repeats 3 --out $O/cisolver/ranks &&
                mpiexec $BIND -n 2 $CI ranks --cases 48Cr --dtype float32 --tol 1e-5 --repeats 3 --out $O/cisolver/ranks ;;
  ci-steps)     mkdir -p $O/cisolver
                $CI queued-steps --rows 241944 --dtype float64 --json $O/cisolver/steps-241944.json &&
                $CI small-eigh --matrices $STORED/lobpcg_rr_matrices.npy --json $O/cisolver/small_eigh.json ;;
  ci-spmm-gpu)  mkdir -p $O/cisolver
                $CI spmm-gpu --cases 47V --dtype float64 --json $O/cisolver/spmm-47V-f64.json &&
                $CI spmm-gpu --cases 48Cr --dtype float32 --repeat 5 --json $O/cisolver/spmm-48Cr-f32.json ;;
  ci-cpu-node)  $CI solve --devices cpu --cases 24Mg,46Ti --out $O/cisolver/cpu ;;
  ci-cpu)       $CI solve --devices cpu --cases 24Mg,44Ti --cpu-backend mkl --out $O/cisolver-mkl &&
                $CI solve --devices cpu --cases 24Mg,44Ti --cpu-backend scipy --out $O/cisolver-scipy ;;
  ci-spmm-cpu)  $CI spmm-cpu --repeat 30 --json $O/spmm_24Mg.json ;;
  ci-float32)   $CI float32 2>&1 | tee $O/float32-diagnosis.txt ;;
  flapw-mpi)    source benchmarks/mpi_env.sh && mpi_setup || return 1
                mkdir -p $O/flapw-mpi
                local build="python3 -m flapw build --system TiO2 --kmax 3.0 --kpoints 8 --devices gpu --json"
                mpiexec $BIND -n 2 python3 -m flapw build --system TiO2 --kmax 2.0 --kpoints 2 --devices gpu --json \
                    > $O/flapw-mpi/warm-up.json &&
                CUDA_VISIBLE_DEVICES=0 $TIMER --label 1rank-1gpu --json $O/flapw-mpi/runs.json -- mpiexec $BIND -n 1 $build &&
                $TIMER --label 1rank-2gpus --json $O/flapw-mpi/runs.json -- mpiexec $BIND -n 1 $build &&
                $TIMER --label 2ranks --json $O/flapw-mpi/runs.json -- mpiexec $BIND -n 2 $build ;;
  plot-blas)    $BLAS plot $STORED/h100x2-2026-11-26/blas-host/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-26/blas-host-late/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-26/blas-host-widths/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/after-one-gpu-8192/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-later/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-8192-first-dma/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-side/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-panel/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-columns/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-ahead/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-24576-ahead/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-readings/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-caller/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-unit-k/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-small-one-two/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-host-rebalance/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-24576-rebalance/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/blas-32768-rebalance/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/tail-balance/giver-adds-sizes.json \
                    $STORED/h100x2-2026-11-27/thin-end/blas-host/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/thin-end/blas-24576/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/raw-calls/blas-host/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/raw-calls/blas-24576/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/front/blas-host/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/front/blas-24576/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/host-device/blas-host-device/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/host-path/blas-host-device/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/host-path/blas-24576/bench_blas_gpu.json \
                    $STORED/h100x2-2026-11-27/host-path/blas-8192/bench_blas_gpu.json \
                    --out $O/img/blas-h100x2-host &&
                $BLAS plot $STORED/h200x4-2026-11-22/blas-24576/bench_blas_gpu.json --out $O/img/blas-h200-scaling &&
                $BLAS plot $STORED/h100-2026-11-22/blas-16384-24576/bench_blas_gpu.json --out $O/img/blas-h100 &&
                $BLAS emulation --plot-only $STORED/h200x2-2026-11-26/emulation/bench_blas_emulation.json \
                    --out $O/img/blas-emulation &&
                $BLAS emulation --plot-only $STORED/h100-2026-11-26/emulation/bench_blas_emulation.json \
                    --out $O/img/blas-emulation-h100 ;;
  plot-flapw)   $FLAPW plot --out $O/img/flapw_tio2.png ;;
  plot-cisolver) $CI plot --out $O/img/cisolver_peers.png ;;
  esac
}

status=0
for s in "$@"; do
  echo "=== $s: ${HEADING[$s]} (${MACHINE[$s]}) -> $OUT/${WHERE[$s]}   $(date +%T)"
  mkdir -p "$OUT"
  run_stage "$s" || { echo "=== $s failed" >&2; status=1; }
done
exit $status
