#!/usr/bin/env bash
# Harness A/B of several builds at a list of points, the builds alternated per point (so a drift of
# the GPU's clocks weighs on all of them alike), several rounds; checks first.
#
#   tools/hopper/ab_points.sh [-r ROUNDS] [-c "CHECK ..."] -p "MODE ARGS" [-p ...] BIN [BIN ...]
#
# -c: harness check modes each binary runs first (e.g. "check2 check3"; a mode a binary lacks prints
# its usage line); -p: a timing point, a harness mode and its arguments (e.g. "one3 64 2048 0",
# "onew3 8192 1", "one 128 8192 0" for bwd_harness binaries). Prints one line per check and per timed
# run: "check BIN MODE: <summary>" and "r<round> BIN MODE ARGS <TF/s>"; ab_points.py turns the
# timing lines into a table with each build's ratio to the first.
set -uo pipefail
ROUNDS=2
CHECKS=""
POINTS=()
while getopts "r:c:p:" opt; do
  case "$opt" in
    r) ROUNDS="$OPTARG" ;;
    c) CHECKS="$OPTARG" ;;
    p) POINTS+=("$OPTARG") ;;
    *) echo "usage: $0 [-r ROUNDS] [-c \"CHECK ...\"] -p \"MODE ARGS\" [-p ...] BIN [BIN ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -eq 0 ] || [ ${#POINTS[@]} -eq 0 ]; then
  echo "usage: $0 [-r ROUNDS] [-c \"CHECK ...\"] -p \"MODE ARGS\" [-p ...] BIN [BIN ...]" >&2
  exit 2
fi
for bin in "$@"; do
  for mode in $CHECKS; do
    # shellcheck disable=SC2086
    echo "check $(basename "$bin") $mode: $("$bin" $mode 2>&1 | tail -n 1)"
  done
done
for ((r = 1; r <= ROUNDS; ++r)); do
  for point in "${POINTS[@]}"; do
    for bin in "$@"; do
      # shellcheck disable=SC2086
      tf=$("$bin" $point 2>&1 | grep -o '[0-9.]* TF/s' | head -n 1)
      echo "r$r $(basename "$bin") $point ${tf:-no-result}"
    done
  done
done
