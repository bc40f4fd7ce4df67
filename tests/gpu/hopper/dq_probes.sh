#!/usr/bin/env bash
# Where the d = 256 backward's dQ reduce-adds cost their time: the backward harness built five times,
# with FUSEDATTN_HOPPER_BWD_DQ_PROBE = 0 (the library's kernel) to 4 (bwd_sm90_d256.cuh: 1 no
# reduce-adds, 2 rows rotated per CTA, 3 stores instead of reduce-adds, 4 release without the read
# wait), each timed at the same points in turn for ROUNDS rounds (the harness's bursts: 20 launches
# back to back, which the sixteenth session measured at 1970-1980 MHz, below the power cap).
# Prints, per point, each probe's median time and its ratio to probe 0; writes OUTDIR/dq_probes.txt.
# Also, from the probe-0 build: check2 (the d = 256 baseline kernel's dQ by 16-byte reductions from
# registers, no staging, against the reference and the TMA kernel) and one2 at the same points (that
# kernel's time next to the TMA kernel's), into the same file.
#
#   tests/gpu/hopper/dq_probes.sh OUTDIR [ROUNDS]
#
# DQ_PROBES_PREBUILT=DIR: take DIR/bwdh_pP where present and starting on this machine (built here
# with the same command) instead of building it.
set -uo pipefail
OUT="${1:?usage: tests/gpu/hopper/dq_probes.sh OUTDIR [ROUNDS]}"
ROUNDS="${2:-3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
# Binaries and build logs outside OUTDIR (the device returns only a few files from $OUT); a failed
# build's log is copied there.
BIN="$(mktemp -d)"
mkdir -p "$OUT"
pids=()
for p in 0 1 2 3 4; do
  pre="${DQ_PROBES_PREBUILT:-}/bwdh_p$p"
  if [ -n "${DQ_PROBES_PREBUILT:-}" ] && [ -x "$pre" ] && { "$pre" none > /dev/null 2>&1; [ $? -eq 2 ]; }; then
    cp "$pre" "$BIN/bwdh_p$p"
  else
    HARNESS_NVCC_FLAGS="-DFUSEDATTN_HOPPER_BWD_DQ_PROBE=$p" "$ROOT/tests/gpu/hopper/build_bwd.sh" "$BIN/bwdh_p$p" \
      > "$BIN/build_p$p.log" 2>&1 &
    pids+=("$!")
  fi
done
for pid in "${pids[@]}"; do
  wait "$pid" || { echo "a probe build failed"; cat "$BIN"/build_p*.log > "$OUT/dq_probe_build.log"; exit 1; }
done

points=("256 8192 1" "256 8192 0" "256 4096 1")
log="$OUT/dq_probes.txt"
: > "$log"
for ((r = 1; r <= ROUNDS; ++r)); do
  for pt in "${points[@]}"; do
    for p in 0 1 2 3 4; do
      # shellcheck disable=SC2086
      line=$("$BIN/bwdh_p$p" one $pt 2>&1 | grep -E "^HBWD d=")
      echo "p$p $pt $line" | tee -a "$log"
    done
  done
done
echo "== check2 (probe 0 build)" | tee -a "$log"
timeout 180 "$BIN/bwdh_p0" check2 2>&1 | tail -12 | tee -a "$log"
for pt in "${points[@]}"; do
  # shellcheck disable=SC2086
  "$BIN/bwdh_p0" one2 $pt 2>&1 | grep -E "^HBWD" | tee -a "$log"
done
python3 - "$log" <<'EOF'
import re, statistics, sys
times = {}
for line in open(sys.argv[1]):
    m = re.match(r"p(\d) (\d+) (\d+) (\d) .* bwd ([0-9.]+) ms", line)
    if m:
        times.setdefault((m.group(2), m.group(3), m.group(4)), {}).setdefault(int(m.group(1)), []).append(float(m.group(5)))
print("| d | s | causal | " + " | ".join(f"probe {p} (ms, / probe 0)" for p in range(5)) + " |")
print("|---|---|---|" + "---|" * 5)
for (d, s, c), per in sorted(times.items()):
    base = statistics.median(per.get(0, [float("nan")]))
    cells = []
    for p in range(5):
        t = statistics.median(per[p]) if p in per else float("nan")
        cells.append(f"{t:.3f} ({t / base:.3f})")
    print(f"| {d} | {s} | {'yes' if c == '1' else 'no'} | " + " | ".join(cells) + " |")
EOF
