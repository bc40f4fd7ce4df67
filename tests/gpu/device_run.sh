#!/usr/bin/env bash
# One device call: run the prebuilt harness (carried in .tcbuild/), rebuilding
# it on the device if it does not start there, then the correctness cases, a
# memcheck pass on a few small cases, and the timing table. Logs go to $OUT.
#   tests/gpu/device_run.sh [check|bench|peer|sanitize ...]
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
    sanitize) timeout 120 compute-sanitizer --tool memcheck --print-limit 5 "$H" check "d64 plain" 2>&1 | tail -8 ;;
    peer) PYTHONUNBUFFERED=1 timeout 200 python3 tests/gpu/sdpa_peer.py 2>&1 | tee "$OUT/peer.log" ;;
  esac
done
