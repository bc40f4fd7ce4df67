#!/usr/bin/env bash
# The main job: a small GPT-style model trains and generates under
# torch.compile(fullgraph=True) with fusedattn's attention (CPU, or GPU when present).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$PY" -m fusedattn.demo "$@"
