"""CPU benchmark: fusedattn vs torch's scaled_dot_product_attention (flash backend).

    python bench/bench_cpu.py [--quick] [--out bench/RESULTS.md]

Both run on the same random inputs in one process: q/k/v are allocated as
[b, s, h, d] (the layout a projection produces) and both libraries get the same
[b, h, s, d] ``transpose(1, 2)`` views through the same SDPA-style call
(``fusedattn.scaled_dot_product_attention`` hands them to the operator as bshd
views, no copy). Forward is timed without autograd; forward+backward with
q/k/v requiring grad and a fixed upstream gradient. Each time is the median of
several runs after warm-up. ratio = torch time / fusedattn time: > 1 means
fusedattn is faster.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedattn

# (b, h, s, d): one shape per sequence length, batch x heads shrinking as s
# grows so that the full grid takes about 5 minutes on 2 cores.
GRID = [
    (4, 8, 512, 64),
    (2, 16, 1024, 64),
    (1, 8, 2048, 128),
    (1, 8, 4096, 64),
]
QUICK_GRID = [(1, 8, 512, 64), (1, 8, 1024, 128)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def torch_sdpa(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def fused_sdpa(q, k, v, causal):
    return fusedattn.scaled_dot_product_attention(q, k, v, is_causal=causal)


def median_time(fn, min_runs: int, max_runs: int, budget_s: float) -> float:
    """Median of at least min_runs timed runs (after one warm-up), more while
    within budget_s, at most max_runs."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= min_runs and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def bench_case(b, h, s, d, dtype, causal, args):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=gen).to(dtype) for _ in range(3))
    dout = torch.randn(b, h, s, d, generator=gen).to(dtype)
    views = [t.transpose(1, 2) for t in (q, k, v)]  # [b, h, s, d], the same memory for both

    row = {}
    with torch.no_grad():
        o_t = torch_sdpa(*views, causal)
        o_f = fused_sdpa(*views, causal)
    row["max_diff"] = (o_t.float() - o_f.float()).abs().max().item()

    for name, fn in (("torch", torch_sdpa), ("fusedattn", fused_sdpa)):
        def fwd():
            with torch.no_grad():
                fn(*views, causal)

        row[f"fwd_{name}"] = median_time(fwd, args.min_runs, args.max_runs, args.budget)

        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        lviews = [t.transpose(1, 2) for t in leaves]

        def fwd_bwd():
            for t in leaves:
                t.grad = None
            fn(*lviews, causal).backward(dout)

        row[f"fwdbwd_{name}"] = median_time(fwd_bwd, args.min_runs, args.max_runs, args.budget)
    return row


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def header() -> str:
    return (f"CPU: {cpu_model()}; threads: {torch.get_num_threads()}; torch {torch.__version__}; "
            f"fusedattn {fusedattn.__version__}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a two-shape grid, fp32 only (smoke run)")
    p.add_argument("--out", help="append the table to this markdown file (e.g. bench/RESULTS.md)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--min-runs", type=int, default=3)
    p.add_argument("--max-runs", type=int, default=10)
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed runs per measurement beyond --min-runs")
    p.add_argument("--dtypes", default=None, help="comma list of fp32,bf16 (default: both)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    grid = QUICK_GRID if args.quick else GRID
    dtypes = args.dtypes.split(",") if args.dtypes else (["fp32"] if args.quick else list(DTYPES))
    print(header(), flush=True)

    lines = [
        "| b | h | s | d | dtype | causal | fwd torch ms | fwd fusedattn ms | fwd ratio "
        "| fwd+bwd torch ms | fwd+bwd fusedattn ms | fwd+bwd ratio | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print(lines[0])
    print(lines[1], flush=True)
    t_start = time.perf_counter()
    for dt_name in dtypes:
        for (b, h, s, d) in grid:
            for causal in (False, True):
                r = bench_case(b, h, s, d, DTYPES[dt_name], causal, args)
                line = (
                    f"| {b} | {h} | {s} | {d} | {dt_name} | {'yes' if causal else 'no'} "
                    f"| {r['fwd_torch'] * 1e3:.2f} | {r['fwd_fusedattn'] * 1e3:.2f} "
                    f"| {r['fwd_torch'] / r['fwd_fusedattn']:.2f} "
                    f"| {r['fwdbwd_torch'] * 1e3:.2f} | {r['fwdbwd_fusedattn'] * 1e3:.2f} "
                    f"| {r['fwdbwd_torch'] / r['fwdbwd_fusedattn']:.2f} | {r['max_diff']:.1e} |"
                )
                lines.append(line)
                print(line, flush=True)
    elapsed = time.perf_counter() - t_start
    print(f"\n{len(lines) - 2} cases in {elapsed:.0f} s")

    if args.out:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        title = "quick grid" if args.quick else "full grid"
        block = [
            f"## CPU: fusedattn vs torch SDPA (flash), {stamp}, {title}",
            "",
            header() + ".",
            "Median of timed runs after warm-up; ratio = torch / fusedattn (> 1: fusedattn faster); "
            "q/k/v are [b, s, h, d] tensors given to both as [b, h, s, d] views.",
            "",
            *lines,
            "",
        ]
        new_file = not os.path.exists(args.out) or os.path.getsize(args.out) == 0
        with open(args.out, "a") as f:
            if new_file:
                f.write("# Benchmark results\n\n")
            f.write("\n".join(block) + "\n")
        print(f"appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
