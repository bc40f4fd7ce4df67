#!/usr/bin/env bash
# Operator-level A/B of several installed builds of fusedattn: the grid of bench_gpu.py once per build
# per round, the builds alternated within each round (a drift of the GPU's clocks, which run at their
# power limit, then weighs on all of them alike); each process times the peers too, so every table
# carries its own fusedattn / cuDNN ratios.
#
#   bench/ab_operator.sh OUTDIR ROUNDS "BENCH_GPU_ARGS" BUILD [BUILD ...]
#
# A BUILD is NAME=SITE_DIR or NAME@VAR=value[,VAR=value...]. SITE_DIR holds a fusedattn package (e.g.
# pip install --no-build-isolation --target SITE_DIR .); it is put first on PYTHONPATH. The second form
# times the installed build with those variables set (a dispatch switch such as
# FUSEDATTN_HOPPER_FWD=persistent, so a dispatch change is measured before it is made); "NAME@" alone
# is the installed build as it is. The tables go to OUTDIR/ab_NAME.md, one per round.
set -uo pipefail
OUT="${1:?usage: bench/ab_operator.sh OUTDIR ROUNDS \"BENCH_GPU_ARGS\" BUILD ...}"
ROUNDS="${2:?rounds}"
ARGS="${3-}"
shift 3
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
for ((r = 1; r <= ROUNDS; ++r)); do
  for build in "$@"; do
    if [[ "$build" == *@* && "${build%%@*}" != *=* ]]; then
      name="${build%%@*}"
      vars="${build#*@}"
      echo "== round $r: $name (installed build, ${vars:-no variables})"
      # shellcheck disable=SC2086
      env ${vars//,/ } python3 bench/bench_gpu.py $ARGS --out "$OUT/ab_$name.md" | grep -E "^\| [0-9]"
    else
      name="${build%%=*}"
      site="${build#*=}"
      echo "== round $r: $name ($site)"
      # shellcheck disable=SC2086
      PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python3 bench/bench_gpu.py $ARGS --out "$OUT/ab_$name.md" |
        grep -E "^\| [0-9]"
    fi
  done
done
