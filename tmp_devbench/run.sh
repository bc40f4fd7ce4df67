#!/bin/bash
set -e
grep -o -w -E "avx512f|avx512_bf16|amx_bf16|amx_tile" /proc/cpuinfo | sort | uniq -c
mkdir -p /tmp/b && cd "$(dirname "$0")/.."
for f in csrc/core/src/cpu/*.cc csrc/core/src/types.cc; do g++ -O3 -std=c++17 -march=native -Icsrc/core/include -c $f -o /tmp/b/$(basename $f).o & done; wait
g++ -O3 -std=c++17 -march=native -Icsrc/core/include -Itests/cpp tests/cpp/bench_cpu_attn.cc /tmp/b/*.o -pthread -o /tmp/b/bench
PY=/opt/torch/.venv/bin/python3
for cfg in "1 8 2048 64 fp32 0" "1 8 2048 64 fp32 1" "1 8 2048 128 fp32 0" "1 8 2048 64 bf16 0" "1 8 2048 128 bf16 0" "4 16 512 64 fp32 0" "4 16 512 128 bf16 1" "2 8 4096 64 bf16 1" "1 16 1024 128 fp32 0"; do
  taskset -c 2,3 /tmp/b/bench 2 $cfg | sed 's/^/ours  /'
  taskset -c 2,3 $PY tmp_devbench/torch_bench.py 2 $cfg | sed 's/^/      /'
done
for cfg in "1 8 1024 64 fp32 0" "2 8 1024 128 bf16 1"; do
  taskset -c 2,3 /tmp/b/bench 2 $cfg 1 | tail -1 | sed "s/^/ours $cfg /"
  taskset -c 2,3 $PY tmp_devbench/torch_bwd.py 2 $cfg
done
