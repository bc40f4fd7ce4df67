#!/usr/bin/env bash
# The main job: a small GPT-style model trains and generates under
# torch.compile(fullgraph=True) with fusedattn's attention (CPU, or GPU when present):
# examples/train_gpt.py, after scripts/env.sh has set up the environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
setup_step "running examples/train_gpt.py"
exec "$PY" examples/train_gpt.py "$@"
