#!/usr/bin/env bash
# Build tools/tc/tc_harness (the tensor-core engine's GPU check and timer)
# without the rest of the package: the generated kernel instantiations,
# tc/dispatch.cu, the device-attribute cache, the core's checks and params, and
# the harness. Incremental: an object is rebuilt when its source or any
# tc/common/core header is newer.
#   tools/tc/build.sh OUTDIR ["-gencode ..."]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/build/tc_harness}"
ARCH="${2:--gencode arch=compute_90,code=sm_90}"
mkdir -p "$OUT"
INC="-I$ROOT/csrc/core/include -I$ROOT/csrc/cuda/include -I$ROOT/csrc/cuda"
newest_hdr=$(ls -t "$ROOT"/csrc/cuda/tc/*.h "$ROOT"/csrc/cuda/common/*.h "$ROOT"/csrc/cuda/common/*.cuh \
             "$ROOT"/csrc/core/include/fusedattn/*.h | head -1)
jobs=()
for f in "$ROOT"/csrc/cuda/tc/generated/*.cu "$ROOT"/csrc/cuda/tc/dispatch.cu "$ROOT"/csrc/cuda/common/device.cu \
         "$ROOT"/tools/tc/tc_harness.cu "$ROOT"/csrc/core/src/{check,params,types,overrides}.cc; do
  o="$OUT/$(basename "${f%.*}").o"
  if [ ! -f "$o" ] || [ "$f" -nt "$o" ] || [ "$newest_hdr" -nt "$o" ]; then jobs+=("$f"); fi
done
build_one() {
  f="$1"; o="$OUT/$(basename "${f%.*}").o"
  case "$f" in
    *.cc) g++ -std=c++17 -O2 $INC -c "$f" -o "$o" ;;
    *) nvcc -std=c++17 -O3 $ARCH $INC -Xptxas -warn-spills -c "$f" -o "$o" ;;
  esac
}
export -f build_one; export OUT ARCH INC
if [ ${#jobs[@]} -gt 0 ]; then
  printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -I{} bash -c 'build_one "$@"' _ {}
fi
nvcc $ARCH -o "$OUT/tc_harness" "$OUT"/*.o -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc
echo "built $OUT/tc_harness"
