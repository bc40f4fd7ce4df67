#!/usr/bin/env bash
# Every test: the torch-free check, the core's C++ unit tests (ctest), the portable wheel (built
# once, CUDA engine included where nvcc exists, with -Werror on the CUDA sources) installed into a
# fresh environment and its operator tests run there, and the Python suite (numerics, operator
# contract, compile, errors, API; GPU tests run where a GPU is).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

echo "== the core and CUDA sources include no torch headers"
if grep -rnE '#\s*include\s*[<"](torch|ATen|c10)/' csrc/core csrc/cuda 2>/dev/null; then
  echo "torch headers in the torch-free core"; exit 1
fi

echo "== environment and build"
source "$ROOT/scripts/env.sh"
export PATH="$VENV/bin:$PATH"  # ninja and cmake helpers from the environment

echo "== C++ unit tests of the core"
cmake -S . -B build/cpp -G Ninja -DFUSEDATTN_BUILD_EXTENSION=OFF -DFUSEDATTN_BUILD_TESTS=ON >/dev/null
cmake --build build/cpp
(cd build/cpp && ctest --output-on-failure)

echo "== CUDA sources: the generated files and the supported-configuration table are current"
"$PY" csrc/cuda/tc/gen_kernels.py --check
"$PY" csrc/cuda/hopper/gen_wgmma.py --check
"$PY" csrc/cuda/hopper/gen_kernels.py --check
if command -v nvcc >/dev/null 2>&1; then
  "$PY" tools/support_table/support_table.py --check  # docs/api.md's table, from the support checks
else
  echo "no nvcc: docs/api.md's supported-configuration table is not checked"
fi

echo "== the portable wheel: built once (CUDA engine for sm_80 / sm_90 / sm_90a where nvcc exists)"
WHEELHOUSE="$ROOT/build/wheelhouse"
rm -rf "$WHEELHOUSE"
t0=$SECONDS
"$ROOT/scripts/build_wheel.sh" "$WHEELHOUSE" -C cmake.define.FUSEDATTN_CUDA_WERROR=ON
WHEEL="$(ls "$WHEELHOUSE"/fusedattn-*.whl)"
echo "built $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)) in $((SECONDS - t0)) s"

echo "== the wheel in a fresh environment (binary packages only: nothing is compiled)"
WHEEL_VENV="$ROOT/build/wheel-venv"
rm -rf "$WHEEL_VENV"
if [ "$("$PY" -c 'import sys, torch; print(torch.__file__.startswith(sys.prefix))')" = "True" ]; then
  "$PY" -m venv "$WHEEL_VENV"  # the same interpreter, with the same torch installed afresh
  WHEEL_TORCH=("torch==$TORCH_VERSION")
else
  "$PY" -m venv --system-site-packages "$WHEEL_VENV"  # the machine's torch (a CUDA build on a GPU machine)
  WHEEL_TORCH=()
fi
"$WHEEL_VENV/bin/python" -m pip install -q --only-binary=:all: "${WHEEL_TORCH[@]}" numpy pytest expecttest hypothesis \
  "$WHEEL"
expect_cuda=0
if command -v nvcc >/dev/null 2>&1; then expect_cuda=1; fi
(cd "$ROOT/tests" && FUSEDATTN_EXPECT_CUDA_KERNELS=$expect_cuda "$WHEEL_VENV/bin/python" -m pytest -q \
  -p no:cacheprovider test_wheel.py test_opcheck.py test_contract.py test_api.py test_errors.py test_numerics.py)

echo "== Python tests"
cd "$ROOT/tests"
"$PY" -m pytest -q -p no:cacheprovider "$@" .
