#!/usr/bin/env bash
# Nsight Compute on one Hopper kernel at one harness point: full sections and per-instruction
# (SASS) stall samples, to see what its iterations wait on. The harness runs its point as usual
# (warm-up and timed calls); the third launch of a kernel matching KERNEL_REGEX is profiled.
# Writes OUTDIR/ncu_NAME.tgz (details.txt, source_sass.csv, the .ncu-rep).
#
#   bench/profile_hopper.sh OUTDIR NAME HARNESS KERNEL_REGEX HARNESS_ARGS...
# e.g. the library's d = 128 backward at s = 8k, and the v2 forward at the same point:
#   bench/profile_hopper.sh $OUT bwd_d128 build/bwdh 'bwd_sm90_(d256_)?kernel' one 128 8192 0
#   bench/profile_hopper.sh $OUT fwd_d128 build/fwdh 'fwd_sm90_kernel' one2 128 8192 0
# (HARNESS: the binary of tools/hopper/build_bwd.sh or build.sh.)
set -uo pipefail
OUT="${1:?usage: bench/profile_hopper.sh OUTDIR NAME HARNESS KERNEL_REGEX HARNESS_ARGS...}"
NAME="ncu_${2:?name}"
H="${3:?harness binary}"
K="${4:?kernel regex}"
shift 4
P="$OUT/$NAME"
mkdir -p "$P"
# Clocks left as they are (the device notes: --clock-control none).
timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none --set full --import-source yes \
  -k regex:"$K" --launch-skip 2 --launch-count 1 -f -o "$P/prof" "$H" "$@" > "$P/ncu_run.log" 2>&1
echo "ncu rc=$?" >> "$P/ncu_run.log"
ncu -i "$P/prof.ncu-rep" --page details > "$P/details.txt" 2>&1
ncu -i "$P/prof.ncu-rep" --page source --csv --print-source sass > "$P/source_sass.csv" 2>&1
(cd "$OUT" && tar czf "$NAME.tgz" "$NAME" && rm -rf "$NAME")
