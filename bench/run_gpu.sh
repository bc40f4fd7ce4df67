#!/usr/bin/env bash
# The GPU benchmarks, called by scripts/gpu_check.sh OUTDIR: the attention grid vs FA2 and cuDNN,
# and the decode benchmark when present. Tables go to OUTDIR/RESULTS_gpu.md.
set -uo pipefail
OUT="${1:?usage: bench/run_gpu.sh OUTDIR}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --out "$OUT/RESULTS_gpu.md"
# BENCH_HOPPER_BWD_AB=1: the grid again with the Hopper backward off (its own process: the
# switch is read once), so the two backward paths sit side by side in one file.
if [ "${BENCH_HOPPER_BWD_AB:-0}" = "1" ]; then
  FUSEDATTN_HOPPER_BWD=0 "$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --out "$OUT/RESULTS_gpu.md"
fi
if [ -f bench/bench_decode.py ]; then
  "$PY" bench/bench_decode.py --out "$OUT/RESULTS_gpu.md"
fi
