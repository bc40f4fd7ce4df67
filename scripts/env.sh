# Sourced by the run_* scripts: a virtual environment with torch, the build
# tools and fusedattn built against that torch. Idempotent; a second run only
# rebuilds what changed. Each step says what it does on stderr ("[setup] ...");
# the build shows its compile steps, and its full log is build/pip-install.log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FUSEDATTN_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
setup_step() { printf '[setup] %s\n' "$*" >&2; }

if [ ! -x "$PY" ]; then
  # System site-packages stay visible, so a torch the machine already has (a
  # CUDA build on a GPU machine) is used rather than replaced.
  setup_step "creating the environment $VENV"
  python3 -m venv --system-site-packages "$VENV"
fi
# torch: keep one that is already installed (a CUDA build on a GPU machine);
# otherwise 2.13.0, the CPU build that CPU machines hold on disk (a bare
# `torch` requirement would pull a multi-GB CUDA build).
torch_info() { "$PY" -c "import torch; print(torch.__version__, torch.version.cuda or '')" 2>/dev/null; }
TORCH_INFO="$(torch_info || true)"
if [ -z "$TORCH_INFO" ]; then
  setup_step "installing torch ${FUSEDATTN_TORCH_VERSION:-2.13.0} (CPU build; a minute or two)"
  "$PY" -m pip install -q "torch==${FUSEDATTN_TORCH_VERSION:-2.13.0}"
  TORCH_INFO="$(torch_info)"
fi
read -r TORCH_VERSION TORCH_CUDA <<< "$TORCH_INFO "
setup_step "torch $TORCH_VERSION (${TORCH_CUDA:+CUDA }${TORCH_CUDA:-CPU build}); build and test tools: numpy, pytest, hypothesis, transformers, scikit-build-core, ninja"
"$PY" -m pip install -q numpy pytest expecttest hypothesis "transformers==5.17.0" "scikit-build-core>=0.10" ninja
if [ -n "$TORCH_CUDA" ]; then
  setup_step "building fusedattn (C++ and CUDA engines: the CUDA kernels take several minutes the first time)"
else
  setup_step "building fusedattn (C++ engine: about a minute the first time, seconds after)"
fi
# Built against the installed torch: no build isolation. pip's verbose output goes to the log; the
# compile steps (ninja's "[i/n]" lines) and fusedattn's configuration lines are shown as they come.
mkdir -p "$ROOT/build"
PIP_LOG="$ROOT/build/pip-install.log"
build_progress() {
  local line f re_step='^ *\[([0-9]+/[0-9]+)\] (Building|Linking) (.*)$'
  while IFS= read -r line; do
    if [[ "$line" =~ $re_step ]]; then
      f="${BASH_REMATCH[3]##* }"
      f="${f#CMakeFiles/*.dir/}"
      printf '  [%s] %s %s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2],,}" "${f%.o}" >&2
    elif [[ "$line" == *"-- fusedattn: "* ]]; then
      printf '  %s\n' "${line#*-- }" >&2
    fi
  done
}
if ! PYTHONUNBUFFERED=1 "$PY" -m pip install -v --no-build-isolation "$ROOT" 2>&1 | tee "$PIP_LOG" | build_progress; then
  # The first errors (CMake's, a failed compile step's, the compiler's), or the log's end.
  PIP_ERRORS="$(grep -E -A 4 "CMake Error|^ *FAILED: | error: " "$PIP_LOG" | head -n 40 || true)"
  if [ -n "$PIP_ERRORS" ]; then printf '%s\n' "$PIP_ERRORS" >&2; else tail -n 40 "$PIP_LOG" >&2; fi
  setup_step "building fusedattn failed; the full log is $PIP_LOG"
  exit 1
fi
