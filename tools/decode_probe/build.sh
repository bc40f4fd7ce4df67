#!/usr/bin/env bash
# Build the decode probe (probe.cu: what limits the batch-1 decode kernel's reads), sm_90a, no torch.
#   tools/decode_probe/build.sh [OUT_BINARY]   (default /tmp/decode_probe)
# Then: OUT   (runs every measurement, a few seconds; prints DPROBE lines and a summary)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/decode_probe}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo \
  -o "$OUT" "$ROOT/tools/decode_probe/probe.cu" 2>&1 | tee "$LOG"
echo "built $OUT"
# Summary: kernels compiled, and how many spill (should be none).
echo "ptxas: $(grep -c 'Compiling entry function' "$LOG" || true) kernels," \
  "$(grep -E 'bytes spill stores' "$LOG" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads' || true) with spills"
