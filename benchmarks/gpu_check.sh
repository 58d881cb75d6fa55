#!/bin/bash
# One device-machine step: environment, GPU tests, then a benchmark. Logs and JSON under $OUT.
# usage: OUT=dir bash benchmarks/gpu_check.sh "<pytest args>" "<benchmark args>"
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-results/gpu}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import cupy, hybridblas.cublas as c; print('cupy', cupy.__version__, 'libcublas', c.library_path())" 2>&1 | tee -a "$OUT/env.txt"
if [ -n "$1" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider $1 2>&1 | tee "$OUT/pytest.txt" | tail -40
fi
if [ -n "$2" ]; then
  timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/bench_blas_gpu.py --out "$OUT" $2 2>&1 | tee "$OUT/bench.txt"
fi
