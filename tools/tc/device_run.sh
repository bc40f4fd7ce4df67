#!/usr/bin/env bash
# One device call: run the prebuilt harness (carried in .tcbuild/), rebuilding
# it on the device if it does not start there, then the correctness cases, a
# memcheck pass on a few small cases, and the timing table. Logs go to $OUT.
#   tools/tc/device_run.sh [check|bench|checkalt|benchalt|peer|table|sanitize|ncu ...]
# (checkalt/benchalt: other builds linked as .tcbuild/tc_harness_alt*, for A/B timings)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
H=.tcbuild/tc_harness
"$H" none >/dev/null 2>&1
if [ $? -ne 2 ]; then
  echo "prebuilt harness does not run here; rebuilding"
  cp -r .tcbuild /tmp/tcb 2>/dev/null || true
  tools/tc/build.sh /tmp/tcb > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  H=/tmp/tcb/tc_harness
fi
for step in "${@:-check bench}"; do
  case "$step" in
    check) timeout 300 "$H" check 2>&1 | tee "$OUT/check.log" | grep -v "^PASS" ;;
    bench) timeout 200 "$H" bench 2>&1 | tee "$OUT/bench.log" ;;
    # Alternative builds (other variants linked into .tcbuild/tc_harness_alt*)
    # checked / timed in the same call, for A/B comparisons.
    checkalt) for x in .tcbuild/tc_harness_alt*; do [ -x "$x" ] || continue; n=${x##*tc_harness_}
           echo "== $n"; timeout 300 "$x" check 2>&1 | tee "$OUT/check_$n.log" | grep -v "^PASS"; done ;;
    benchalt) for x in .tcbuild/tc_harness_alt*; do [ -x "$x" ] || continue; n=${x##*tc_harness_}
           timeout 200 "$x" bench 2>&1 | sed "s/^BENCH/ALT/" | tee "$OUT/bench_$n.log"; done ;;
    sanitize) timeout 120 compute-sanitizer --tool memcheck --print-limit 5 "$H" check "d64 plain" 2>&1 | tail -8 ;;
    ncu) for cfg in "128 4096 0" "256 4096 0" "64 4096 0"; do
           timeout 120 ncu --clock-control none -k regex:bwd_kernel -c 1 --section SpeedOfLight \
             --section WarpStateStats --section ComputeWorkloadAnalysis "$H" one $cfg > "$OUT/ncu_${cfg// /_}.txt" 2>&1
           grep -E "Duration|Throughput|Issue Slots|Warp Cycles Per Issued|Stall|Executed Ipc" "$OUT/ncu_${cfg// /_}.txt" | head -30
         done ;;
    peer) PYTHONUNBUFFERED=1 timeout 200 python3 tools/tc/sdpa_peer.py 2>&1 | tee "$OUT/peer.log" ;;
    # Short table from the logs above: fusedattn (and the alternative build)
    # against the peer, TF/s and ratios, forward and forward+backward.
    table) python3 - "$OUT" <<'PY'
import glob, os, re, sys
out = sys.argv[1]
def read(path, tag):
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        if tag == "PEER":
            m = re.search(r"d=(\d+) s=(\d+) causal=(\d).*fwd [\d.]+ ms (\d+) TF/s.*fwd\+bwd [\d.]+ ms (\d+) TF/s", line)
        else:
            m = re.search(r"d=(\d+) s=(\d+) .*causal=(\d).*fwd [\d.]+ ms (\d+) TF/s.*bwd [\d.]+ ms (\d+) TF/s.*fwd\+bwd (\d+) TF/s", line)
        if m and line.startswith(tag):
            g = [int(x) for x in m.groups()]
            rows[tuple(g[:3])] = g[3:]
    return rows
new, peer = read(os.path.join(out, "bench.log"), "BENCH"), read(os.path.join(out, "peer.log"), "PEER")
alts = [(os.path.basename(p)[6:-4], read(p, "ALT")) for p in sorted(glob.glob(os.path.join(out, "bench_alt*.log")))]
print("alts:", " ".join(n for n, _ in alts), "(fwd / bwd / f+b columns: new, alts..., FA2, new/FA2)")
for k in sorted(new):
    n, p = new[k], peer.get(k, [0, 0])
    col = lambda i: " ".join(str(v) for v in [n[i]] + [a.get(k, [0, 0, 0])[i] for _, a in alts])
    rf = n[0] / p[0] if p[0] else 0
    rb = n[2] / p[1] if p[1] else 0
    print(f"{k[0]} {k[1]} {k[2]} | {col(0)} {p[0]} {rf:.2f} | {col(1)} | {col(2)} {p[1]} {rb:.2f}")
PY
    ;;
  esac
done
