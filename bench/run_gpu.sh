#!/usr/bin/env bash
# The GPU benchmarks, called by scripts/gpu_check.sh OUTDIR: the attention grid vs FA2 and cuDNN,
# and the decode benchmark when present. Tables go to OUTDIR/RESULTS_gpu.md.
set -uo pipefail
OUT="${1:?usage: bench/run_gpu.sh OUTDIR}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --out "$OUT/RESULTS_gpu.md"
if [ -f bench/bench_decode.py ]; then
  "$PY" bench/bench_decode.py --out "$OUT/RESULTS_gpu.md"
fi
