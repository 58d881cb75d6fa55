#!/bin/bash
# End-to-end campaign on a GPU node: the command-line runs a user waits for (fresh processes, wall clock
# from start to exit, python3 -m benchmarks.cli) and the GPU test suite.
#   usage (device machine, repo root):  OUT=dir bash benchmarks/campaign_e2e.sh [stage ...]
# Stages: ci48 (48Cr with the CLI defaults: the first run of a fresh machine is the cold one), ciprof (where
# a warm 48Cr run spends its time, cProfile), cimpi (two ranks, between two one-process runs), cipairs (one
# process and two ranks in turn, $PAIRS times, then again with bytecode as an installed package has it),
# flapwquick (the rows of the FLAPW table and the 8 k-points), flapw (the FLAPW builds of docs/performance.md,
# device and host arrays, one and two GPUs, 8 k-points), flapwpeak (TiO2 Kmax 4.0's BLAS part against Σ device
# cuBLAS zherk), gputests. MPI: the machine's own mpiexec when it has
# one, else the mpich and mpi4py wheels carried in .whl/.
set -o pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-campaign}; mkdir -p "$OUT"
B="python3 -m benchmarks.cli"
CI="python3 -m cisolver spectrum --nev 5 --json"
FL="python3 -m flapw build --json --kpoints 2"
source benchmarks/mpi_env.sh
for s in ${*:-ci48 flapw gputests}; do echo "=== $s $(date +%T)"; case $s in
ci48)
  $B --json $OUT/ci48.json --label 48Cr-f32-2gpu-cold -- $CI --interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices all
  $B --json $OUT/ci48.json --label 48Cr-f32-2gpu-warm --repeat 2 -- $CI --interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices all
  $B --json $OUT/ci48.json --label 48Cr-f32-1gpu -- $CI --interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices 0
  $B --json $OUT/ci48.json --label 48Cr-kb3g-f64-2gpu-first -- $CI --interaction kb3g --protons 4 --neutrons 4 --devices all
  $B --json $OUT/ci48.json --label 48Cr-kb3g-f64-2gpu -- $CI --interaction kb3g --protons 4 --neutrons 4 --devices all ;;
ciprof)
  python3 -m cProfile -o $OUT/ci48.prof -m cisolver spectrum --interaction gxpf1a --protons 4 --neutrons 4 --nev 5 \
      --dtype float32 --tol 1e-5 --devices all --json > /dev/null
  python3 -c "import pstats; pstats.Stats('$OUT/ci48.prof').sort_stats('cumulative').print_stats(40)" | tail -55 ;;
cimpi)
  mpi_setup; python3 -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"
  $B --json $OUT/ci48.json --label 48Cr-f32-1process-before -- $CI --interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices all
  $B --json $OUT/ci48.json --label 48Cr-f32-2ranks -- mpiexec $BIND -n 2 $CI --interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices all
  $B --json $OUT/ci48.json --label 48Cr-f32-1process-after -- $CI --interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices all ;;
cipairs)    # one process and two ranks in turn, PAIRS times; then as an installed package runs: with bytecode
  mpi_setup; A="--interaction gxpf1a --protons 4 --neutrons 4 --dtype float32 --tol 1e-5 --devices all"
  for i in $(seq ${PAIRS:-5}); do
    $B --json $OUT/ci48.json --label 48Cr-f32-1process -- $CI $A
    $B --json $OUT/ci48.json --label 48Cr-f32-2ranks -- mpiexec $BIND -n 2 $CI $A
  done
  (export PYTHONPYCACHEPREFIX=/tmp/pycache-campaign; unset PYTHONDONTWRITEBYTECODE   # pip compiles at install
   $CI $A > /dev/null; mpiexec $BIND -n 2 $CI $A > /dev/null                         # the first runs write it
   for i in $(seq ${PAIRS:-5}); do
     $B --json $OUT/ci48.json --label 48Cr-f32-1process-bytecode -- $CI $A
     $B --json $OUT/ci48.json --label 48Cr-f32-2ranks-bytecode -- mpiexec $BIND -n 2 $CI $A
   done) ;;
flapwquick)
  python3 -m flapw build -q --system NaCl --kmax 2.5 --devices all --interstitial --solve 5 > /dev/null   # CuPy's kernels
  for sys in "TiO2 3.0" "TiO2 4.0" "AuAg 4.0"; do set -- $sys
    $B --json $OUT/flapw.json --label "$1-$2-device" -- $FL --system $1 --kmax $2 --devices all --interstitial
  done
  $B --json $OUT/flapw.json --label NaCl-3.5-solve20 -- $FL --system NaCl --kmax 3.5 --devices all --interstitial --solve 20
  for sys in "TiO2 3.0" "AuAg 4.0"; do set -- $sys
    $B --json $OUT/flapw.json --label "$1-$2-host" -- $FL --system $1 --kmax $2 --devices all --interstitial --arrays host
  done
  $B --json $OUT/flapw.json --label NaCl-3.0-k8-1gpu -- python3 -m flapw build --json --kpoints 8 --system NaCl --kmax 3.0 --devices 0
  $B --json $OUT/flapw.json --label NaCl-3.0-k8-2gpu -- python3 -m flapw build --json --kpoints 8 --system NaCl --kmax 3.0 --devices all ;;
flapw)
  for sys in "TiO2 3.0" "TiO2 4.0" "AuAg 4.0"; do set -- $sys
    $B --json $OUT/flapw.json --label "$1-$2-device" -- $FL --system $1 --kmax $2 --devices all --interstitial
    $B --json $OUT/flapw.json --label "$1-$2-host" -- $FL --system $1 --kmax $2 --devices all --interstitial --arrays host
  done
  $B --json $OUT/flapw.json --label NaCl-3.5-solve20 -- $FL --system NaCl --kmax 3.5 --devices all --interstitial --solve 20
  $B --json $OUT/flapw.json --label NaCl-3.5-solve20-host -- $FL --system NaCl --kmax 3.5 --devices all --interstitial --solve 20 --arrays host
  $B --json $OUT/flapw.json --label TiO2-4.0-device-1gpu -- $FL --system TiO2 --kmax 4.0 --devices 0 --interstitial --arrays device
  $B --json $OUT/flapw.json --label NaCl-3.0-k8-1gpu -- python3 -m flapw build --json --kpoints 8 --system NaCl --kmax 3.0 --devices 0
  $B --json $OUT/flapw.json --label NaCl-3.0-k8-2gpu -- python3 -m flapw build --json --kpoints 8 --system NaCl --kmax 3.0 --devices all ;;
flapwpeak)
  python3 -m benchmarks.flapw build --devices all --blas hybridblas --systems TiO2 --kmax 4.0 --arrays device \
      --cublas-peak --cublas-shape 29152 31104 --out $OUT/flapw-peak 2>&1 | tail -15
  python3 -c "import json; m = json.load(open('$OUT/flapw-peak/summary.json')); r = m['results'][0]; \
peak = sum(m['meta']['cublas_device_zherk_flops'].values()); print('BLAS part / sum of device cuBLAS zherk at N_G x atoms N_L:', \
round(r['blas_tflops'] * 1e12 / peak, 3), 'peaks', m['meta']['cublas_device_zherk_flops'])" ;;
gputests)
  mpi_setup
  timeout ${TESTS_LIMIT:-420} python3 -m pytest -q -p no:cacheprovider -m "gpu or multi_gpu" -rf --durations=10 \
      ${TESTS:-tests/} 2>&1 | tee $OUT/gputests.log | grep -vE "^SKIPPED|PASSED" | tail -40 ;;
esac; done
echo "=== done $(date +%T)"
