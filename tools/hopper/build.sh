#!/usr/bin/env bash
# Build the standalone Hopper (sm_90a) forward-kernel harness (v1, v2, v3, w3).
#   tools/hopper/build.sh [OUT_BINARY]   (default /tmp/hopper_harness)
# Then: OUT check | OUT bench | OUT one D S CAUSAL            (v1, fwd_sm90.cuh)
#       OUT check2 | OUT bench2 | OUT sweep2 | OUT one2 D S CAUSAL
#                                          (v2, fwd_sm90_v2.cuh; bench2/sweep2 time v1 too)
#       OUT check3 | OUT bench3 | OUT one3 D S CAUSAL
#                                          (v3, fwd_sm90_v3.cuh, persistent; vs v2)
#       OUT checkw3 | OUT benchw3 | OUT onew3 S CAUSAL
#                                          (w3, fwd_sm90_v2w3.cuh, d=64 BM=192; vs v2)
# HARNESS_NVCC_FLAGS adds nvcc flags, e.g. -DFUSEDATTN_HOPPER_STAMPS for the `stamps` mode (a binary
# of its own: the stamps instrument v2 in every mode).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/hopper_harness}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
# shellcheck disable=SC2086
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo ${HARNESS_NVCC_FLAGS:-} \
  -o "$OUT" "$ROOT/tools/hopper/harness.cu" -ldl 2>&1 | tee "$LOG"
echo "built $OUT"
# Summary: kernels that spill, and ptxas wgmma diagnostics (C75xx: a
# warpgroup.wait injected / wgmma serialised) -- both should be empty.
echo "ptxas: $(grep -c 'Compiling entry function' "$LOG" || true) kernels," \
  "$(grep -E 'bytes spill stores' "$LOG" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads' || true) with spills," \
  "$(grep -cE 'C75[0-9][0-9]|serializ' "$LOG" || true) wgmma diagnostics"
grep -E 'C75[0-9][0-9]|serializ' "$LOG" || true
# Optional: confirm the kernels use Hopper wgmma (needs cuobjdump + nvdisasm).
if command -v cuobjdump >/dev/null 2>&1; then
  echo "HGMMA instructions in SASS: $(cuobjdump --dump-sass "$OUT" 2>/dev/null | grep -c HGMMA || true)"
fi
