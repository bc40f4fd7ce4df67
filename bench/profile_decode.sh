#!/usr/bin/env bash
# Nsight Compute on batch-1 decode calls (contiguous cache, context 8192, bench_decode.py's case):
# the decode and combine kernels' full sections and the decode kernel's per-instruction (SASS)
# stall samples, to see what its microseconds wait on. Needs the package installed (gpu_check.sh
# does that). Writes OUTDIR/ncu_decode[_paged].tgz (details.txt, source_sass.csv, the .ncu-rep).
#
#   bench/profile_decode.sh OUTDIR [CASE [paged]]   (CASE as bench_decode.py --cases, default 1x8192;
#                                                    paged: the paged-16 cache of the benchmark)
set -uo pipefail
OUT="${1:?usage: bench/profile_decode.sh OUTDIR [CASE [paged]]}"
CASE="${2:-1x8192}"
PAGED=()
NAME=ncu_decode
if [ "${3:-}" = paged ]; then PAGED=(--paged); NAME=ncu_decode_paged; fi
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
D="$OUT/$NAME"
mkdir -p "$D"
# Clocks left as they are (the device notes: --clock-control none); calls 6 and 7 of the run, after
# the warm-up calls.
timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none --set full --import-source yes \
  -k regex:"decode_kernel|decode_combine_kernel" --launch-skip 6 --launch-count 2 -f -o "$D/decode" \
  "$PY" bench/bench_decode.py --cases "$CASE" --profile --ncu "${PAGED[@]}" > "$D/ncu_run.log" 2>&1
echo "ncu rc=$?" >> "$D/ncu_run.log"
ncu -i "$D/decode.ncu-rep" --page details > "$D/details.txt" 2>&1
ncu -i "$D/decode.ncu-rep" --page source --csv --print-source sass > "$D/source_sass.csv" 2>&1
(cd "$OUT" && tar czf "$NAME.tgz" "$NAME" && rm -rf "$NAME")
