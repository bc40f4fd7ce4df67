#!/usr/bin/env bash
# The GPU benchmarks, called by scripts/gpu_check.sh OUTDIR: the attention grid vs FA2 and cuDNN,
# and the decode benchmark when present. Tables go to OUTDIR/RESULTS_gpu.md.
set -uo pipefail
OUT="${1:?usage: bench/run_gpu.sh OUTDIR}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# BENCH_D256_ENV (e.g. FUSEDATTN_HOPPER_BWD=0, set by gpu_check.sh when the Hopper backward
# harness fails at d=256): d=256 is timed in its own process with those variables.
if [ -n "${BENCH_D256_ENV:-}" ]; then
  "$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --dims 64,128 --out "$OUT/RESULTS_gpu.md"
  # shellcheck disable=SC2086
  env ${BENCH_D256_ENV} "$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --dims 256 --out "$OUT/RESULTS_gpu.md"
else
  "$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --out "$OUT/RESULTS_gpu.md"
fi
# BENCH_HOPPER_BWD_AB=1: the grid again with the Hopper backward off (its own process: the
# switch is read once), so the two backward paths sit side by side in one file.
if [ "${BENCH_HOPPER_BWD_AB:-0}" = "1" ]; then
  # shellcheck disable=SC2086
  FUSEDATTN_HOPPER_BWD=0 "$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} --out "$OUT/RESULTS_gpu.md"
fi
# BENCH_GPU_AB="VAR=value ...": the grid once more in a process with those variables (a
# candidate's switch, e.g. FUSEDATTN_HOPPER_BWD=0), headed with its FUSEDATTN_ switches.
# BENCH_GPU_AB_ARGS="...": bench_gpu.py arguments added to that second run's (e.g. --order rotate);
# either one alone also runs it.
if [ -n "${BENCH_GPU_AB:-}" ] || [ -n "${BENCH_GPU_AB_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  env ${BENCH_GPU_AB:-} "$PY" bench/bench_gpu.py ${BENCH_GPU_ARGS:-} ${BENCH_GPU_AB_ARGS:-} --out "$OUT/RESULTS_gpu.md"
fi
# BENCH_DECODE=0 skips the decode benchmark. BENCH_DECODE_AB="VAR=value ..." runs it once more in
# a process with those variables (a candidate's switch): both tables, each headed with its
# FUSEDATTN_ switches, in one file.
if [ "${BENCH_DECODE:-1}" = "1" ] && [ -f bench/bench_decode.py ]; then
  # shellcheck disable=SC2086
  "$PY" bench/bench_decode.py ${BENCH_DECODE_ARGS:-} --out "$OUT/RESULTS_gpu.md"
  if [ -n "${BENCH_DECODE_AB:-}" ]; then
    # shellcheck disable=SC2086
    env ${BENCH_DECODE_AB} "$PY" bench/bench_decode.py ${BENCH_DECODE_ARGS:-} --out "$OUT/RESULTS_gpu.md"
  fi
fi
