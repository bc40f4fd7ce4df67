#!/usr/bin/env bash
# Build the standalone Hopper (sm_90a) backward-kernel harness.
#   tools/hopper/build_bwd.sh [OUT_BINARY]   (default /tmp/hopper_bwd_harness)
# Then: OUT check | OUT bench | OUT one D S CAUSAL | OUT checkdet | OUT benchdet | OUT onedet D S CAUSAL
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/hopper_bwd_harness}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
# HARNESS_NVCC_FLAGS adds nvcc flags.
# shellcheck disable=SC2086
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo -I "$ROOT/csrc/core/include" -I "$ROOT/csrc/cuda" ${HARNESS_NVCC_FLAGS:-} \
  -o "$OUT" "$ROOT/tools/hopper/bwd_harness.cu" -ldl
echo "built $OUT"
# Optional: confirm the main kernels use Hopper wgmma (needs cuobjdump).
if command -v cuobjdump >/dev/null 2>&1; then
  echo "HGMMA instructions in SASS: $(cuobjdump --dump-sass "$OUT" 2>/dev/null | grep -c HGMMA || true)"
fi
