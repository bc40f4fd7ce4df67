#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, a CUDA build of torch, nvcc,
# scikit-build-core, cmake and ninja (no network needed), build fusedattn from
# this checkout, run the GPU tests and a short timing, write every log to
# OUTDIR and print a summary table last.
#
#   scripts/gpu_check.sh OUTDIR
#
# Environment:
#   PYTHON                 interpreter with torch (default: python3)
#   TORCH_CUDA_ARCH_LIST   architectures to build (default: the GPU's, e.g. 9.0)
#   SKBUILD_CMAKE_DEFINE   extra CMake definitions, e.g. "FUSEDATTN_CUDA_TC=OFF"
#   GPU_CHECK_ENGINES      engines the GPU tests run with (default "default simt":
#                          the dispatch as built, then FUSEDATTN_CUDA_ENGINE=simt)
#   GPU_CHECK_PYTEST       extra pytest arguments (e.g. "-x -k thd")
#   GPU_CHECK_SKIP_BUILD=1 use the fusedattn already installed
#   GPU_CHECK_WHEEL        a wheel file (scripts/build_wheel.sh's, built on another machine) installed
#                          instead of building this checkout
#   GPU_CHECK_JOBS         pytest-xdist workers for the test suites (default 1; for correctness
#                          runs, not timings)
#   GPU_CHECK_SANITIZER    a pytest -k expression: those tests of tests/gpu also run under
#                          compute-sanitizer memcheck, racecheck and initcheck (default
#                          "per_engine_small": test_robust_gpu.py's one small call per engine path,
#                          SIMT fp32 / fp64, tensor cores fast / general, Hopper, decode,
#                          copy_to_kv_cache; "" skips the sanitizer)
#   GPU_CHECK_SANITIZER_TIMEOUT  seconds per sanitizer run (default 300)
#   GPU_CHECK_BENCH=0      skip the benchmarks and timings; bench/run_gpu.sh's own variables pass
#                          through (BENCH_GPU_ARGS, BENCH_GPU_AB="VAR=value": the grid again with a
#                          switch set, BENCH_GPU_AB_ARGS: or with more bench_gpu.py arguments,
#                          BENCH_DECODE=0, BENCH_DECODE_ARGS, and BENCH_DECODE_AB="VAR=value": the
#                          decode table again with a switch set)
#   GPU_CHECK_HOPPER       Hopper harness steps on a 9.0 GPU (default "v2 v3 w3 bwd"; bwd-check:
#                          the backward's check alone; v3 / w3: the persistent forward, d=64 with
#                          three consumer warpgroups; bwd-det: the deterministic mode; w3-skip:
#                          the d = 64 three-consumer forward with and without skipping the tiles
#                          a warpgroup's rows never see; w3p: the persistent three-consumer
#                          forward against the one-tile one; "" skips). A backward
#                          check that fails at d=256 makes the benchmark time d=256 with
#                          FUSEDATTN_HOPPER_BWD=0
#   GPU_CHECK_PREBUILT     a folder holding harness binaries built elsewhere (fwdh: build.sh's,
#                          bwdh: build_bwd.sh's, e.g. carried to the device): each one that starts
#                          here is used instead of building it; when every harness the steps need
#                          is ready, the steps run while the package builds
#   GPU_CHECK_PROFILE      bench_gpu.py --profile arguments (e.g. "--dims 128 --s 2048,8192"): each
#                          kernel of a fusedattn and a cuDNN call with its duration, after the build
#                          and before the tests (profile.log)
#   GPU_CHECK_HOPPER_BWD=0 skip the pytest pass with the Hopper backward turned off (the
#                          sm80-class backward on the shapes the Hopper one takes)
#   GPU_CHECK_SUITES       which test suites run (default "gpu decode suite": tests/gpu, the
#                          decode tests, the main suite on CUDA; "" runs none of them)
#   GPU_CHECK_SUITE_PATHS  what the main-suite step runs (default "tests": all of it)
#   GPU_CHECK_DECODE_PROBE=1  build and run tools/decode_probe (what limits the batch-1
#                          decode kernel's reads; 9.0 GPUs; its DPROBE lines go to the summary)
#   GPU_CHECK_STEP_TIMEOUT seconds per pytest run (default 400); a run that dies on a
#                          signal is re-run from its last test under cuda-gdb for a native backtrace
#   GPU_CHECK_TIME         seconds the whole check may take (e.g. 560 under the device tool's 600 s
#                          per call): every step's limit is cut to what is left, so the summary and
#                          the log archive are written even when the steps do not all fit
set -uo pipefail
OUT="${1:?usage: scripts/gpu_check.sh OUTDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
export PYTHONUNBUFFERED=1
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

declare -a SUMMARY=()
note() { SUMMARY+=("$(printf '%-34s %s' "$1" "$2")"); }
now() { date +%s; }
DEADLINE=$(( $(now) + ${GPU_CHECK_TIME:-86400} ))
# limit SECONDS: SECONDS, or less when GPU_CHECK_TIME leaves less (20 s kept for the summary).
limit() {
  local left=$(( DEADLINE - $(now) - 20 ))
  [ "$left" -lt 1 ] && left=1
  if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

# ---- environment ---------------------------------------------------------------
{
  echo "== nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "== nvcc"; nvcc --version 2>&1 | tail -2
  echo "== python / torch"
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" 2>&1
  echo "== build tools"; "$PY" -m pip show scikit-build-core cmake ninja 2>&1 | grep -E "^(Name|Version)"
} > "$OUT/env.log" 2>&1
GPU="$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null || echo none)"
note "gpu" "$GPU"
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST="$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))" 2>/dev/null || echo "8.0;9.0")"
  export TORCH_CUDA_ARCH_LIST
fi
note "architectures" "$TORCH_CUDA_ARCH_LIST"

# ---- Hopper harnesses (9.0 GPUs): the standalone kernels before their library use ----
# GPU_CHECK_HOPPER lists what to run: v2 (the one-tile forward: check2, bench2), v3 (the persistent
# forward: check3, bench3 = v2 and v3), w3 (the d=64 three-consumer forward: checkw3, benchw3), bwd
# (the backward: check, bench), bwd-check (check alone), bwd-det (the deterministic mode: checkdet,
# benchdet), w3-skip (the d = 64 three-consumer forward with SKIP flipped: checkw3s, benchw3s), w3p
# (the persistent three-consumer forward: checkw3p, benchw3p), v2-check / v3-check (check2 / check3
# alone); "" skips them.
# Their builds (one nvcc each, independent of the package) start now and overlap pip's build.
status=0
case "$TORCH_CUDA_ARCH_LIST" in 9.0*) hopper_steps="${GPU_CHECK_HOPPER-v2 v3 w3 bwd}" ;; *) hopper_steps="" ;; esac
HH="$OUT/hopper_fwd_harness"; HB="$OUT/hopper_bwd_harness"
pids=()
need_fwd=0; need_bwd=0
for step in $hopper_steps; do
  case "$step" in v2*|v3*|w3*) need_fwd=1 ;; bwd*) need_bwd=1 ;; esac
done
# prebuilt NAME DEST: copy GPU_CHECK_PREBUILT/NAME to DEST if it starts on this machine (an unknown
# mode makes a harness print the device and exit 2; a binary the loader refuses exits otherwise).
prebuilt() {
  local src="${GPU_CHECK_PREBUILT:-}/$1"
  [ -n "${GPU_CHECK_PREBUILT:-}" ] && [ -x "$src" ] || return 1
  "$src" none > /dev/null 2>&1
  [ $? -eq 2 ] || { note "prebuilt $1" "does not start here: building it"; return 1; }
  cp "$src" "$2" && note "prebuilt $1" "used"
}
harness_ready=1
if [ $need_fwd = 1 ] && ! prebuilt fwdh "$HH"; then
  harness_ready=0
  tools/hopper/build.sh "$HH" > "$OUT/hopper_build.log" 2>&1 & pids+=("$!:fwd")
fi
if [ $need_bwd = 1 ] && ! prebuilt bwdh "$HB"; then
  harness_ready=0
  tools/hopper/build_bwd.sh "$HB" > "$OUT/hopper_bwd_build.log" 2>&1 & pids+=("$!:bwd")
fi

# run_hopper_steps: the harness steps; each writes "name<TAB>result" lines, merged into the
# summary once they are done (they run beside the package build when their binaries are ready).
run_hopper_steps() {
  local st=0 step h runs r t0 lim rc pj
  for pj in "${pids[@]}"; do
    wait "${pj%%:*}" || { printf 'hopper %s harness build\tFAILED\n' "${pj##*:}"; st=1; }
  done
  for step in $hopper_steps; do
    case "$step" in
      v2) h="$HH"; runs="check2 bench2" ;;
      v3) h="$HH"; runs="check3 bench3" ;;
      w3) h="$HH"; runs="checkw3 benchw3" ;;
      v2-check) h="$HH"; runs="check2" ;;
      v3-check) h="$HH"; runs="check3" ;;
      bwd) h="$HB"; runs="check bench" ;;
      bwd-check) h="$HB"; runs="check" ;;
      bwd-det) h="$HB"; runs="checkdet benchdet" ;;
      w3-skip) h="$HH"; runs="checkw3s benchw3s" ;;
      w3p) h="$HH"; runs="checkw3p benchw3p" ;;
      *) printf 'hopper step %s\tunknown\n' "$step"; continue ;;
    esac
    [ -x "$h" ] || continue
    for r in $runs; do
      t0=$(now)
      # check2's ping-pong named barriers have no watchdog: a hang costs this limit.
      case "$r" in check) lim=120 ;; check2|check3|checkw3|checkw3s|checkw3p|checkdet) lim=180 ;; *) lim=240 ;; esac
      timeout "$(limit "$lim")" "$h" "$r" > "$OUT/hopper_${step%-check}_${r}.log" 2>&1
      rc=$?
      [ $rc -ne 0 ] && st=1
      printf 'hopper %s %s\trc=%s %s (%s s)\n' "$step" "$r" "$rc" \
        "$(grep -E "passed|FAIL" "$OUT/hopper_${step%-check}_${r}.log" | tail -1)" "$(( $(now) - t0 ))"
    done
  done
  return $st
}
hopper_bg=""
if [ -n "$hopper_steps" ] && [ $harness_ready = 1 ]; then
  run_hopper_steps > "$OUT/hopper_steps.txt" 2>&1 &
  hopper_bg=$!
fi

# ---- build -------------------------------------------------------------------------
if [ -n "${GPU_CHECK_WHEEL:-}" ]; then
  t0=$(now)
  "$PY" -m pip install --no-deps --no-index --force-reinstall "$GPU_CHECK_WHEEL" > "$OUT/build.log" 2>&1
  rc=$?
  note "wheel $(basename "$GPU_CHECK_WHEEL")" "install rc=$rc in $(( $(now) - t0 )) s"
  if [ $rc -ne 0 ]; then
    tail -20 "$OUT/build.log"
    printf '\n== summary\n'; printf '%s\n' "${SUMMARY[@]}"
    exit 1
  fi
elif [ "${GPU_CHECK_SKIP_BUILD:-0}" != "1" ]; then
  t0=$(now)
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$PY" -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1
  rc=$?
  note "build (pip install .)" "rc=$rc in $(( $(now) - t0 )) s"
  grep -E "fusedattn: |ptxas (warning|error)|error:" "$OUT/build.log" > "$OUT/build_summary.log" 2>/dev/null
  if [ $rc -ne 0 ]; then
    tail -40 "$OUT/build.log"
    printf '\n== summary\n'; printf '%s\n' "${SUMMARY[@]}"
    exit 1
  fi
fi
"$PY" -c "import fusedattn, torch; print(torch._C._dispatch_has_kernel_for_dispatch_key('fusedattn::fwd', 'CUDA'))" \
  > "$OUT/cuda_registered.log" 2>&1
note "CUDA kernels registered" "$(tail -1 "$OUT/cuda_registered.log")"
# How the extension links the C++ runtime: a static libstdc++ copy inside _C.so
# beside the process's shared one is a known source of host crashes.
{
  so="$("$PY" -c "import fusedattn, os; print(os.path.join(os.path.dirname(fusedattn.__file__), '_C.so'))")"
  ldd "$so"
  echo "std:: symbols defined in _C.so: $(nm -D --defined-only -C "$so" | grep -c " std::")"
  echo "g++ libstdc++.so: $(g++ -print-file-name=libstdc++.so)"; ls -l "$(dirname "$(g++ -print-file-name=libstdc++.a)")"/libstdc++* 2>&1
} > "$OUT/link.log" 2>&1
note "std:: symbols defined in _C.so" "$(grep -oE "[0-9]+$" "$OUT/link.log" | head -1)"

# ---- Hopper harness runs (here, unless they ran beside the build) ---------------------
if [ -n "$hopper_steps" ]; then
  if [ -n "$hopper_bg" ]; then
    wait "$hopper_bg" || status=1
  else
    run_hopper_steps > "$OUT/hopper_steps.txt" 2>&1 || status=1
  fi
  while IFS=$'\t' read -r k v; do note "$k" "$v"; done < "$OUT/hopper_steps.txt"
  rm -f "$HH" "$HB"
  if grep -qE "^FAIL .* d=256 " "$OUT/hopper_bwd_check.log" 2>/dev/null; then
    export BENCH_D256_ENV="FUSEDATTN_HOPPER_BWD=0"
    note "hopper bwd d=256" "FAILED its check: d=256 benchmarked with FUSEDATTN_HOPPER_BWD=0"
  fi
fi

# ---- decode probe (9.0 GPUs, opt-in) ----------------------------------------------------
if [ "${GPU_CHECK_DECODE_PROBE:-0}" = "1" ] && [[ "$TORCH_CUDA_ARCH_LIST" == 9.0* ]]; then
  t0=$(now)
  { tools/decode_probe/build.sh "$OUT/decode_probe" && timeout "$(limit 180)" "$OUT/decode_probe"; } > "$OUT/decode_probe.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "decode probe" "rc=$rc $(grep -c '^DPROBE-CHECK .* ok' "$OUT/decode_probe.log") variants checked ok ($(( $(now) - t0 )) s)"
  rm -f "$OUT/decode_probe"
fi

# ---- kernel profile of fusedattn and cuDNN calls (opt-in) ------------------------------
if [ -n "${GPU_CHECK_PROFILE:-}" ]; then
  t0=$(now)
  # shellcheck disable=SC2086
  timeout "$(limit 300)" "$PY" bench/bench_gpu.py --profile ${GPU_CHECK_PROFILE} > "$OUT/profile.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "bench_gpu.py --profile" "rc=$rc ($(( $(now) - t0 )) s)"
fi

# ---- tests ---------------------------------------------------------------------------
# run_pytest LOG ARGS...: pytest with a time limit; on a crash (killed by a signal) the
# test that was running is re-run under cuda-gdb so the log ends with a native backtrace.
run_pytest() {
  local log="$1"; shift
  timeout "$(limit "${GPU_CHECK_STEP_TIMEOUT:-400}")" "$PY" -m pytest -v -rfEs -p no:cacheprovider "$@" > "$log" 2>&1
  local rc=$?
  if [ $rc -gt 128 ] && [ $rc -ne 137 ] && command -v cuda-gdb > /dev/null; then
    local last
    last="$(grep -oE "^[^ ]+::[^ ]+" "$log" | tail -1)"
    if [ -n "$last" ]; then
      { echo "== crash (rc=$rc) in $last: cuda-gdb backtrace"
        timeout "$(limit 180)" cuda-gdb -batch -ex run -ex bt --args "$PY" -m pytest -x -q -p no:cacheprovider "$last" 2>&1 | tail -60
      } >> "$log"
    fi
  fi
  return $rc
}
# run_pytest_jobs LOG ARGS...: run_pytest over GPU_CHECK_JOBS pytest-xdist workers (when pytest-xdist is
# installed; otherwise one process).
run_pytest_jobs() {
  local log="$1"; shift
  local jobs="${GPU_CHECK_JOBS:-1}"
  if [ "$jobs" -gt 1 ] && "$PY" -c "import xdist" 2>/dev/null; then
    run_pytest "$log" -n "$jobs" "$@"
  else
    run_pytest "$log" "$@"
  fi
}
SUITES=" ${GPU_CHECK_SUITES-gpu decode suite} "
pytest_counts() { grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped)|(passed|failed|error)(,| in )" "$1" | tail -1 | sed 's/=//g'; }
for engine in ${GPU_CHECK_ENGINES:-default simt}; do
  [[ "$SUITES" == *" gpu "* ]] || break
  log="$OUT/test_gpu_${engine}.log"
  t0=$(now)
  if [ "$engine" = "simt" ]; then export FUSEDATTN_CUDA_ENGINE=simt; else unset FUSEDATTN_CUDA_ENGINE; fi
  # shellcheck disable=SC2086
  FUSEDATTN_TEST_DEVICE=cuda run_pytest_jobs "$log" tests/gpu --ignore=tests/gpu/test_decode.py ${GPU_CHECK_PYTEST:-}
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "tests/gpu ($engine engine)" "rc=$rc $(pytest_counts "$log") ($(( $(now) - t0 )) s)"
done
unset FUSEDATTN_CUDA_ENGINE
# On a 9.0 GPU the Hopper backward takes the common shapes; the engine tests once more with it
# off keep the sm80-class backward (what other GPUs run) covered on those shapes.
if [[ "$TORCH_CUDA_ARCH_LIST" == 9.0* ]] && [ "${GPU_CHECK_HOPPER_BWD:-1}" = "1" ] && [[ "$SUITES" == *" gpu "* ]]; then
  log="$OUT/test_sm80_bwd.log"
  t0=$(now)
  # shellcheck disable=SC2086
  FUSEDATTN_HOPPER_BWD=0 FUSEDATTN_TEST_DEVICE=cuda run_pytest_jobs "$log" tests/gpu/test_cuda_engine.py ${GPU_CHECK_PYTEST:-}
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "tests/gpu engine (FUSEDATTN_HOPPER_BWD=0)" "rc=$rc $(pytest_counts "$log") ($(( $(now) - t0 )) s)"
fi
# Attention over a KV cache (page_table): the decode engine (default) and the
# SIMT engine's paged reads (simt), plus copy_to_kv_cache on CUDA.
for engine in ${GPU_CHECK_ENGINES:-default simt}; do
  [[ "$SUITES" == *" decode "* ]] || break
  log="$OUT/test_decode_${engine}.log"
  t0=$(now)
  if [ "$engine" = "simt" ]; then export FUSEDATTN_CUDA_ENGINE=simt; else unset FUSEDATTN_CUDA_ENGINE; fi
  # shellcheck disable=SC2086
  FUSEDATTN_TEST_DEVICE=cuda run_pytest_jobs "$log" tests/gpu/test_decode.py tests/test_kv_cache.py \
    ${GPU_CHECK_PYTEST:-}
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "tests/gpu/test_decode ($engine)" "rc=$rc $(pytest_counts "$log") ($(( $(now) - t0 )) s)"
done
unset FUSEDATTN_CUDA_ENGINE
# The main suite on the GPU, once its conftest honours FUSEDATTN_TEST_DEVICE.
if [[ "$SUITES" != *" suite "* ]]; then
  :
elif grep -q "FUSEDATTN_TEST_DEVICE" tests/conftest.py 2>/dev/null; then
  t0=$(now)
  # shellcheck disable=SC2086
  FUSEDATTN_TEST_DEVICE=cuda run_pytest_jobs "$OUT/test_suite_cuda.log" -m "not slow" ${GPU_CHECK_SUITE_PATHS:-tests} \
    --ignore=tests/gpu ${GPU_CHECK_PYTEST:-}
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "tests/ (FUSEDATTN_TEST_DEVICE=cuda)" "rc=$rc $(pytest_counts "$OUT/test_suite_cuda.log") ($(( $(now) - t0 )) s)"
else
  note "tests/ (FUSEDATTN_TEST_DEVICE=cuda)" "not run: tests/conftest.py does not read FUSEDATTN_TEST_DEVICE yet"
fi

# ---- compute-sanitizer on a few tests ------------------------------------------------
sanitize="${GPU_CHECK_SANITIZER-per_engine_small}"
if [ -n "$sanitize" ] && ! command -v compute-sanitizer > /dev/null; then
  note "compute-sanitizer" "not run: compute-sanitizer is not on PATH"
elif [ -n "$sanitize" ]; then
  for tool in memcheck racecheck initcheck; do
    t0=$(now)
    timeout "$(limit "${GPU_CHECK_SANITIZER_TIMEOUT:-300}")" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$PY" -m pytest -q -x -p no:cacheprovider tests/gpu -k "$sanitize" \
      > "$OUT/sanitizer_${tool}.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && status=1
    note "compute-sanitizer $tool" "rc=$rc $(grep -E "ERROR SUMMARY" "$OUT/sanitizer_${tool}.log" | tail -1) \
$(pytest_counts "$OUT/sanitizer_${tool}.log") ($(( $(now) - t0 )) s)"
  done
fi

# ---- benchmarks: the attention grid vs FA2 and cuDNN, decode vs SDPA (BENCH_GPU_ARGS=--quick: d=128 only)
if [ "${GPU_CHECK_BENCH:-1}" = "1" ] && [ -x bench/run_gpu.sh ]; then
  timeout "$(limit 86400)" bench/run_gpu.sh "$OUT" > "$OUT/bench.log" 2>&1
  note "bench/run_gpu.sh" "rc=$?"
fi

printf '\n== benchmark tables\n'
cat "$OUT/RESULTS_gpu.md" 2>/dev/null
grep -h -E "^(HBENCH|HBENCH2|HDIFF|HBWD)" "$OUT"/hopper_*_bench*.log "$OUT"/hopper_*_sweep*.log 2>/dev/null
grep -h -E "^DPROBE " "$OUT/decode_probe.log" 2>/dev/null
printf '\n== failures\n'
grep -hE "^(FAILED|ERROR) " "$OUT"/test_*.log 2>/dev/null | head -30
printf '\n== summary\n'
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
# The device tool returns at most 8 files: keep the tables and the summary
# loose, pack every log into one archive.
(cd "$OUT" && find . -maxdepth 1 -type f -name '*.log' -printf '%f\n' | tar czf logs.tgz -T - && rm -f ./*.log)
exit $status
