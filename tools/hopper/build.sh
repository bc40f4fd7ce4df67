#!/usr/bin/env bash
# Build the standalone Hopper (sm_90a) forward-kernel harness (fwd_kernel.cuh's variants).
#   tools/hopper/build.sh [OUT_BINARY]   (default /tmp/hopper_harness)
# Then: OUT check2 | OUT bench2 | OUT one2 D S CAUSAL     (v2: one CTA per query tile)
#       OUT check3 | OUT bench3 | OUT one3 D S CAUSAL     (v3: persistent; vs v2)
#       OUT checkw3 | OUT benchw3 | OUT onew3 S CAUSAL    (w3: d=64, three consumers; vs v2)
#       OUT checkw3s | OUT benchw3s | OUT checkw3p | OUT benchw3p  (harness.cu's header)
# HARNESS_NVCC_FLAGS adds nvcc flags.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/hopper_harness}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
# shellcheck disable=SC2086
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo -I "$ROOT/csrc/core/include" -I "$ROOT/csrc/cuda" ${HARNESS_NVCC_FLAGS:-} \
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
