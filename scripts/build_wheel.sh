#!/usr/bin/env bash
# Builds the portable wheel, fusedattn-<version>-py3-none-<platform>.whl, into OUTDIR (default dist/):
# the operator library uses torch's stable ABI only (it loads on every torch >= 2.10, CPU or CUDA
# build) and no Python C API (every Python 3), the CPU engine picks AVX-512 / AVX2 / baseline at
# run time, and where nvcc is found the CUDA engine is in it (sm_80, sm_90 and the Hopper path for
# sm_90a; the CUDA runtime linked statically). Installing the wheel needs no compiler.
#
#   scripts/build_wheel.sh [OUTDIR] [-C key=value ...]   (extra -C settings go to scikit-build-core)
#
# Runs in the environment of scripts/env.sh (torch for the headers, scikit-build-core, ninja); the
# same as `python -m build --wheel --no-isolation` with a build folder of its own (build/wheel).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-${FUSEDATTN_VENV:-$ROOT/.venv}/bin/python}"
OUTDIR="$ROOT/dist"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then OUTDIR="$1"; shift; fi
"$PY" -m pip install -q build
cuda=()
if command -v nvcc >/dev/null 2>&1; then
  cuda=(-C cmake.define.FUSEDATTN_CUDA=ON)
  echo "[wheel] nvcc found: the CUDA engine is built in (several minutes on a few cores)" >&2
else
  echo "[wheel] no nvcc: a CPU-only wheel" >&2
fi
"$PY" -m build --wheel --no-isolation --outdir "$OUTDIR" -C build-dir="$ROOT/build/wheel" "${cuda[@]}" "$@" "$ROOT"
