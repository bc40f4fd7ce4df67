"""One forward+backward of fusedattn and of cuDNN (torch SDPA) per grid point, for Nsight Compute.

Each listed point runs each implementation's forward+backward CALLS times on bench_gpu.py's inputs
(bf16, b*s = 16k, h*d = 2048), so that ncu can pick the backward main kernels of both by name and
compare their counters (DRAM and L2 traffic, cycles, clock) on the same work:

    ncu --clock-control none -k regex:'bwd_sm90|bprop' --metrics ... \\
        python bench/ncu_point.py --points 256:8192:1,256:8192:0 [--calls 1]

A point is d:s:causal. Warm-up calls run before ncu's counted launches only when --warmup is given
(ncu then skips them with --launch-skip).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import point_impls  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", required=True, help="comma-separated d:s:causal (causal 0 or 1)")
    ap.add_argument("--impls", default="fusedattn,cudnn", help="comma-separated, of fusedattn, fa2, cudnn")
    ap.add_argument("--calls", type=int, default=1, help="forward+backward calls per implementation and point")
    ap.add_argument("--warmup", type=int, default=0, help="calls before the counted ones")
    opts = ap.parse_args()
    for point in opts.points.split(","):
        d, s, causal = (int(x) for x in point.split(":"))
        impls = point_impls(d, s, bool(causal))
        for name in opts.impls.split(","):
            fb = impls[name][1]
            for _ in range(opts.warmup + opts.calls):
                fb()
            torch.cuda.synchronize()
            print(f"ran {name} d={d} s={s} causal={causal}", flush=True)


if __name__ == "__main__":
    main()
