# Sourced by the run_* scripts: a virtual environment with torch, the build
# tools and fusedattn built against that torch. Idempotent; a second run only
# rebuilds what changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FUSEDATTN_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  # System site-packages stay visible, so a torch the machine already has (a
  # CUDA build on a GPU machine) is used rather than replaced.
  python3 -m venv --system-site-packages "$VENV"
fi
# torch: keep one that is already installed (a CUDA build on a GPU machine);
# otherwise 2.13.0, the CPU build that CPU machines hold on disk (a bare
# `torch` requirement would pull a multi-GB CUDA build).
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==${FUSEDATTN_TORCH_VERSION:-2.13.0}"
fi
"$PY" -m pip install -q numpy pytest expecttest hypothesis "scikit-build-core>=0.10" ninja
# Built against the installed torch: no build isolation.
"$PY" -m pip install -q --no-build-isolation "$ROOT"
