#!/usr/bin/env bash
# One device call: run the prebuilt harness (carried in .tcbuild/), rebuilding
# it on the device if it does not start there, then the correctness cases, a
# memcheck pass on a few small cases, and the timing table. Logs go to $OUT.
#   tests/gpu/device_run.sh [check|bench|benchalt|peer|sanitize|ncu ...]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
H=.tcbuild/tc_harness
"$H" none >/dev/null 2>&1
if [ $? -ne 2 ]; then
  echo "prebuilt harness does not run here; rebuilding"
  cp -r .tcbuild /tmp/tcb 2>/dev/null || true
  tests/gpu/build_harness.sh /tmp/tcb > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  H=/tmp/tcb/tc_harness
fi
for step in "${@:-check bench}"; do
  case "$step" in
    check) timeout 300 "$H" check 2>&1 | tee "$OUT/check.log" | grep -v "^PASS" ;;
    bench) timeout 200 "$H" bench 2>&1 | tee "$OUT/bench.log" ;;
    # An alternative build (other tile sizes linked into .tcbuild/tc_harness_alt)
    # timed in the same call, for A/B comparisons.
    benchalt) [ -x .tcbuild/tc_harness_alt ] && timeout 200 .tcbuild/tc_harness_alt bench 2>&1 | sed 's/^BENCH/ALT/' | tee "$OUT/bench_alt.log" ;;
    sanitize) timeout 120 compute-sanitizer --tool memcheck --print-limit 5 "$H" check "d64 plain" 2>&1 | tail -8 ;;
    ncu) for cfg in "128 4096 0" "256 4096 0" "64 4096 0"; do
           timeout 120 ncu --clock-control none -k regex:bwd_kernel -c 1 --section SpeedOfLight \
             --section WarpStateStats --section ComputeWorkloadAnalysis "$H" one $cfg > "$OUT/ncu_${cfg// /_}.txt" 2>&1
           grep -E "Duration|Throughput|Issue Slots|Warp Cycles Per Issued|Stall|Executed Ipc" "$OUT/ncu_${cfg// /_}.txt" | head -30
         done ;;
    peer) PYTHONUNBUFFERED=1 timeout 200 python3 tests/gpu/sdpa_peer.py 2>&1 | tee "$OUT/peer.log" ;;
  esac
done
