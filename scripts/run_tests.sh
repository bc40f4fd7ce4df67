#!/usr/bin/env bash
# Every test: the torch-free check, the core's C++ unit tests (ctest), the
# Python suite (numerics, operator contract, compile, errors, API).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

echo "== the core and CUDA sources include no torch headers"
if grep -rnE '#\s*include\s*[<"](torch|ATen|c10)/' csrc/core csrc/cuda 2>/dev/null; then
  echo "torch headers in the torch-free core"; exit 1
fi

echo "== C++ unit tests of the core"
cmake -S . -B build/cpp -G Ninja -DFUSEDATTN_BUILD_EXTENSION=OFF -DFUSEDATTN_BUILD_TESTS=ON >/dev/null \
  || cmake -S . -B build/cpp -DFUSEDATTN_BUILD_EXTENSION=OFF -DFUSEDATTN_BUILD_TESTS=ON >/dev/null
cmake --build build/cpp -j 2
(cd build/cpp && ctest --output-on-failure)

echo "== environment and build"
source "$ROOT/scripts/env.sh"

echo "== Python tests"
cd "$ROOT/tests"
"$PY" -m pytest -q -p no:cacheprovider "$@" .
