"""Host cost of one small eager call: fusedattn against torch's SDPA on the same tensors.

b=1, h=16, s=128, d=64, causal (bf16 on CUDA, float32 on the CPU). A call this small is bound by the
host: the time per call of N calls issued back to back (one synchronisation at the end) is the host's
cost per call. Forward under no_grad, and forward+backward (q, k, v requiring grad; torch.autograd.grad).
Each of --repeats rounds times one loop of --calls calls of every implementation, the order rotated
between rounds; the table gives each one's median and the median over rounds of its ratio to the
peer's loop in the same round (host timings drift between processes and within one).

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


def per_call_us(fns, calls, repeats, sync):
    """{name: [us per call, one per round]}: every round times one loop of each fn, order rotated."""
    names = list(fns)
    for fn in fns.values():
        for _ in range(20):
            fn()
    sync()
    ts = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            sync()
            ts[name].append(1e6 * (time.perf_counter() - t0) / calls)
    return ts


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

    print(f"host cost per call, {dev}, {dtype}, b=1 h=16 s=128 d=64 causal, torch {torch.__version__}, "
          f"{a.repeats} rounds of {a.calls} calls")
    fwds, fbs = {}, {}
    for name, fn in peers.items():
        def fwd(fn=fn):
            with torch.no_grad():
                fn()

        def fb(fn=fn):
            torch.autograd.grad(fn(), (q, k, v), dout)

        fwds[name], fbs[name] = fwd, fb
    t_fwd = per_call_us(fwds, a.calls, a.repeats, sync)
    t_fb = per_call_us(fbs, a.calls, a.repeats, sync)
    peer = [name for name in peers if name != "fusedattn"][0]

    def ratio(ts, name):
        return statistics.median(x / y for x, y in zip(ts[name], ts[peer]))

    print(f"| implementation | forward us | forward+backward us | forward / {peer} | forward+backward / {peer} |")
    print("|---|---|---|---|---|")
    for name in peers:
        print(f"| {name} | {statistics.median(t_fwd[name]):.1f} | {statistics.median(t_fb[name]):.1f} | "
              f"{ratio(t_fwd, name):.2f} | {ratio(t_fb, name):.2f} |", flush=True)
    profiles = fbs if a.profile else {}
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
