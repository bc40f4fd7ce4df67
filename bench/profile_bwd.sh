#!/usr/bin/env bash
# Nsight Compute on the Hopper backward's main kernel, one harness point (bwd_harness one D S
# CAUSAL: the library's kernel, b*s = 16k, h*d = 2048): full sections and per-instruction (SASS)
# stall samples, to see what its iterations wait on. Writes OUTDIR/ncu_bwd_dD_sS_cC.tgz
# (details.txt, source_sass.csv, the .ncu-rep).
#
#   bench/profile_bwd.sh OUTDIR HARNESS D S CAUSAL   (HARNESS: tests/gpu/hopper/build_bwd.sh's binary)
set -uo pipefail
OUT="${1:?usage: bench/profile_bwd.sh OUTDIR HARNESS D S CAUSAL}"
H="${2:?harness binary}"
D_="${3:?head dim}"
S_="${4:?sequence length}"
C_="${5:?causal 0/1}"
NAME="ncu_bwd_d${D_}_s${S_}_c${C_}"
P="$OUT/$NAME"
mkdir -p "$P"
# Clocks left as they are (the device notes: --clock-control none); the third launch of the main
# kernel, after two timed warm-up calls.
timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none --set full --import-source yes \
  -k regex:"bwd_sm90_(dqtma|d256_dqtma)_kernel" --launch-skip 2 --launch-count 1 -f -o "$P/bwd" \
  "$H" one "$D_" "$S_" "$C_" > "$P/ncu_run.log" 2>&1
echo "ncu rc=$?" >> "$P/ncu_run.log"
ncu -i "$P/bwd.ncu-rep" --page details > "$P/details.txt" 2>&1
ncu -i "$P/bwd.ncu-rep" --page source --csv --print-source sass > "$P/source_sass.csv" 2>&1
(cd "$OUT" && tar czf "$NAME.tgz" "$NAME" && rm -rf "$NAME")
