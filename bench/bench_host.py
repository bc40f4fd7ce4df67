"""Host cost of one small eager call: fusedattn against torch's SDPA on the same tensors.

b=1, h=16, s=128, d=64, causal (bf16 on CUDA, float32 on the CPU). A call this small is bound by the
host: the time per call of N calls issued back to back (one synchronisation at the end) is the host's
cost per call. Forward under no_grad, and forward+backward (q, k, v requiring grad; torch.autograd.grad).
Medians of --repeats loops of --calls calls.

    python bench/bench_host.py [--device cuda|cpu] [--calls 200] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedattn


def per_call_us(fn, calls, repeats, sync):
    for _ in range(20):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        ts.append(1e6 * (time.perf_counter() - t0) / calls)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true",
                    help="also print torch.profiler's per-op host time of 50 forward+backward calls of each")
    a = ap.parse_args()
    dev = a.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    q, k, v = (torch.randn(1, 16, 128, 64, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    peers = {"fusedattn": lambda: fusedattn.scaled_dot_product_attention(q, k, v, is_causal=True)}
    if dev == "cuda":
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        peers["cudnn (torch SDPA)"] = cudnn
    else:
        peers["torch SDPA"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    print(f"host cost per call, {dev}, {dtype}, b=1 h=16 s=128 d=64 causal, torch {torch.__version__}")
    print("| implementation | forward us | forward+backward us |")
    print("|---|---|---|")
    profiles = {}
    for name, fn in peers.items():
        def fwd(fn=fn):
            with torch.no_grad():
                fn()

        def fb(fn=fn):
            torch.autograd.grad(fn(), (q, k, v), dout)

        print(f"| {name} | {per_call_us(fwd, a.calls, a.repeats, sync):.1f} | "
              f"{per_call_us(fb, a.calls, a.repeats, sync):.1f} |", flush=True)
        if a.profile:
            profiles[name] = fb
    for name, fb in profiles.items():
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(50):
                fb()
            sync()
        print(f"\n== {name}: forward+backward, 50 calls")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
