"""Decode benchmark: one query token per sequence against a KV cache, fusedattn
(contiguous cache and page_size 16) side by side with torch SDPA's cuDNN and
FlashAttention-2 backends in the same run.

h_q=32, h_kv=8, d=128, bf16, enable_gqa=True for SDPA (contiguous [b, h, s, d]
cache). fusedattn's contiguous cache is the non-paged case of the page-table
API (page_size = context, page_table = batch indices); its paged cache holds
the same keys in randomly permuted pages of 16 slots.

Timing: CUDA graphs (20 calls captured, replayed; per-call time) and CUDA
events around 20 eager calls; medians of several repeats. Each timed call
reads a different copy of the cache (several copies rotate) so that the L2
(60 MB on an H200) does not serve the next call. Cache bytes per call:
b * ctx * h_kv * (d_qk + d_v) * 2.

Bars: batch 1 at context 8192 <= 15 us per call; batch 64 at context 16384
>= 4.0 TB/s; paged (page 16) within 10% of contiguous.

    python bench/bench_decode.py [--out bench/RESULTS.md] [--cases 1x8192,64x16384]

--steps times whole decoding steps instead: one new token per sequence appended
to a cache holding context - 1 tokens, then attention over the context, through
fusedattn.flash_attn_with_kvcache, DotProductAttention(inference_params=...)
(non-paged and 64-slot pages) and cuDNN (index_copy_ of the new k / v into
[b, h_kv, s, d] caches, then SDPA's cuDNN backend), each captured in CUDA
graphs with the caches rotating as above (a model's layers each have their
own). Bars: batch 1 / 8192 <= 16 us per step, batch 64 / 16384 >= 4.3 TB/s of
cache read.

    python bench/bench_decode.py --steps --cases 1x8192,64x16384 [--out bench/RESULTS.md]

Where the time of a call goes: --profile prints, per case, each CUDA kernel of
a contiguous-cache call with its mean duration (torch.profiler, eager calls,
L2 flushed by a write between calls) instead of the table:

    python bench/bench_decode.py --cases 1x8192 --profile

--profile-graph does the same in the timed conditions (CUDA-graph replay,
rotating cache copies) for fusedattn (contiguous) and cuDNN side by side, and
prints each one's kernel time per call next to its replay time per call (the
difference: the gaps between the graph's kernels); with --steps, for the step
implementations.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
try:
    import fusedattn  # noqa: F401
except ImportError:  # not installed: the source tree
    sys.path.insert(0, str(REPO / "python"))
from fusedattn._ops import FwdArgs  # noqa: E402
from bench_timing import median_event_ms  # noqa: E402  (bench/ is the script's directory)

H_Q, H_KV, D = 32, 8, 128
DTYPE = torch.bfloat16
CALLS = 20      # calls per graph / per eager timing loop
REPEATS = 15    # timed repeats (medians)
CASES = [(1, 8192), (8, 8192), (32, 4096), (64, 16384)]
PAGE = 16


def cache_bytes(b, ctx):
    return b * ctx * H_KV * (D + D) * 2


def rotations(b, ctx):
    """Copies of the cache so that consecutive calls miss in L2 (>= ~512 MB of cache, at least 2)."""
    return int(min(8, max(2, math.ceil(512e6 / cache_bytes(b, ctx)))))


def capture(calls):
    """`calls` (a list of closures) captured in one CUDA graph, after a warm-up on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in calls[:3]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    g.replay()
    torch.cuda.synchronize()
    return g


def time_graph(calls):
    """Per-call microseconds of `calls` (a list of CALLS closures) captured in one CUDA graph."""
    g = capture(calls)
    us = median_event_ms(g.replay, REPEATS) * 1e3 / len(calls)
    del g
    return us


def time_eager(calls):
    """Per-call microseconds of the same calls launched eagerly (events around the loop)."""
    for f in calls[:3]:
        f()
    torch.cuda.synchronize()
    def run_all():
        for f in calls:
            f()

    return median_event_ms(run_all, REPEATS) * 1e3 / len(calls)


# One query token per sequence against the cache lengths cu_kv, bottom-right causal.
DECODE_ARGS = FwdArgs(scale=1.0 / math.sqrt(D), q_format="bshd", kv_format="bshd",
                      mask_type="padding_causal_bottom_right")


def decode_call(q, k, v, cu_kv, table):
    """fusedattn's forward op over a KV cache read through `table` (out, lse, rng_state, max_logit)."""
    return torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, None, cu_kv, None, None, None,
                                   *DECODE_ARGS.op_args(), False, table)


def page_table(b, ctx, gen):
    """[b, ctx / PAGE] int32: every sequence's pages, a random permutation of the pool's."""
    pages = ctx // PAGE
    return torch.randperm(b * pages, device="cuda", generator=gen).to(torch.int32).view(b, pages).contiguous()


def paged_pools(k, v, table):
    """K and V caches [b, ctx, h_kv, d] copied into page pools [b * ctx / PAGE, PAGE, h_kv, d] laid
    out by `table`."""
    b, ctx = k.shape[:2]
    pos = torch.arange(ctx, device=k.device)
    k_pool = torch.empty(table.numel(), PAGE, H_KV, D, device=k.device, dtype=k.dtype)
    v_pool = torch.empty_like(k_pool)
    for bi in range(b):
        pg = table[bi, pos // PAGE].long()
        k_pool[pg, pos % PAGE] = k[bi]
        v_pool[pg, pos % PAGE] = v[bi]
    return k_pool, v_pool


def profile_case(b, ctx, gen, under_ncu=False, paged=False):
    """Mean CUDA duration of each kernel of a contiguous-cache call (paged: the paged-16 cache of the
    table) (eager, 50 calls). under_ncu: the same calls without torch.profiler (Nsight Compute needs
    the profiling interface to itself)."""
    dev = "cuda"
    q = torch.randn(b, 1, H_Q, D, device=dev, dtype=DTYPE, generator=gen)
    cu_kv = torch.arange(b + 1, device=dev, dtype=torch.int32) * ctx
    k, v = (torch.randn(b, ctx, H_KV, D, device=dev, dtype=DTYPE, generator=gen) for _ in range(2))
    table = torch.arange(b, device=dev, dtype=torch.int32).view(b, 1)
    if paged:
        table = page_table(b, ctx, gen)
        k, v = paged_pools(k, v, table)
    flush = torch.empty(256 << 20, device=dev, dtype=torch.int8)

    def call():
        return decode_call(q, k, v, cu_kv, table)

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    n = 50
    if under_ncu:
        for _ in range(n):
            flush.add_(1)
            call()
        torch.cuda.synchronize()
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            flush.add_(1)  # evict the cache from L2 between calls
            call()
        torch.cuda.synchronize()
    total = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "elementwise" not in e.name:
            total.setdefault(e.name, []).append(e.device_time)
    print(f"## profile b={b} ctx={ctx}{' paged-16' if paged else ''} ({cache_bytes(b, ctx) / 1e6:.1f} MB of cache per call)")
    for name, ts in sorted(total.items(), key=lambda kv: -sum(kv[1])):
        mean = sum(ts) / len(ts)
        print(f"  {mean:8.2f} us x {len(ts) / n:.0f}/call  {name[:110]}")


def sdpa_call(q, k, v, backend):
    from torch.nn.attention import sdpa_kernel

    def f():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return f


def print_graph_profile(name, calls):
    """Replay time and kernel durations per call of `calls` captured in one graph."""
    g = capture(calls)
    replays = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        e.record()
        torch.cuda.synchronize()
    per_call = a.elapsed_time(e) * 1e3 / (replays * len(calls))
    total = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in ev.name:
            total.setdefault(ev.name, []).append(ev.device_time)
    kernel_sum = sum(sum(ts) for ts in total.values()) / (replays * len(calls))
    print(f"  {name}: {per_call:.2f} us per call in replay, kernels {kernel_sum:.2f} us per call")
    for kname, ts in sorted(total.items(), key=lambda kv: -sum(kv[1])):
        print(f"    {sum(ts) / len(ts):8.2f} us x {len(ts) / (replays * len(calls)):.0f}/call  {kname[:100]}")
    del g


def profile_graph_case(b, ctx, gen):
    """Kernel durations per call inside the timed graphs (rotating copies), fusedattn vs cuDNN."""
    from torch.nn.attention import SDPBackend

    dev = "cuda"
    nrot = rotations(b, ctx)
    q = torch.randn(b, 1, H_Q, D, device=dev, dtype=DTYPE, generator=gen)
    cu_kv = torch.arange(b + 1, device=dev, dtype=torch.int32) * ctx
    table = torch.arange(b, device=dev, dtype=torch.int32).view(b, 1)
    kc = [torch.randn(b, ctx, H_KV, D, device=dev, dtype=DTYPE, generator=gen) for _ in range(nrot)]
    vc = [torch.randn(b, ctx, H_KV, D, device=dev, dtype=DTYPE, generator=gen) for _ in range(nrot)]
    qs = q.transpose(1, 2).contiguous()
    ks = [k.transpose(1, 2).contiguous() for k in kc]
    vs = [v.transpose(1, 2).contiguous() for v in vc]
    impls = {
        "fusedattn": [(lambda k=kc[i % nrot], v=vc[i % nrot]: decode_call(q, k, v, cu_kv, table))
                      for i in range(CALLS)],
        "cudnn": [sdpa_call(qs, ks[i % nrot], vs[i % nrot], SDPBackend.CUDNN_ATTENTION) for i in range(CALLS)],
    }
    print(f"## graph profile b={b} ctx={ctx} ({cache_bytes(b, ctx) / 1e6:.1f} MB of cache per call)")
    for name, calls in impls.items():
        print_graph_profile(name, calls)


def run_case(b, ctx, gen):
    dev = "cuda"
    nrot = rotations(b, ctx)
    q = torch.randn(b, 1, H_Q, D, device=dev, dtype=DTYPE, generator=gen)
    cu_kv = (torch.arange(b + 1, device=dev, dtype=torch.int32) * ctx)
    results = {}

    # fusedattn, contiguous cache: [b, ctx, h_kv, d], page_table = batch indices.
    kc = [torch.randn(b, ctx, H_KV, D, device=dev, dtype=DTYPE, generator=gen) for _ in range(nrot)]
    vc = [torch.randn(b, ctx, H_KV, D, device=dev, dtype=DTYPE, generator=gen) for _ in range(nrot)]
    table_c = torch.arange(b, device=dev, dtype=torch.int32).view(b, 1)

    def fa_call(k, v, table):
        return lambda: decode_call(q, k, v, cu_kv, table)

    calls = [fa_call(kc[i % nrot], vc[i % nrot], table_c) for i in range(CALLS)]
    ref_out = calls[0]()[0]
    results["fa_contig"] = (time_graph(calls), time_eager(calls))

    # fusedattn, paged cache (page 16, pages randomly permuted), the same keys as copy 0.
    table_p = page_table(b, ctx, gen)
    pk, pv = [], []
    for r in range(nrot):
        k_pool, v_pool = paged_pools(kc[r], vc[r], table_p)
        pk.append(k_pool)
        pv.append(v_pool)
    calls = [fa_call(pk[i % nrot], pv[i % nrot], table_p) for i in range(CALLS)]
    paged_out = calls[0]()[0]
    results["fa_paged"] = (time_graph(calls), time_eager(calls))
    del pk, pv

    # torch SDPA on [b, h, s, d] copies of the same caches.
    qs = q.transpose(1, 2).contiguous()
    ks = [k.transpose(1, 2).contiguous() for k in kc]
    vs = [v.transpose(1, 2).contiguous() for v in vc]
    del kc, vc
    sdpa_out = None
    from torch.nn.attention import SDPBackend

    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            calls = [sdpa_call(qs, ks[i % nrot], vs[i % nrot], backend) for i in range(CALLS)]
            o = calls[0]()
            sdpa_out = o if sdpa_out is None else sdpa_out
            results[name] = (time_graph(calls), time_eager(calls))
        except Exception as e:  # a backend that does not take the shape
            results[name] = (float("nan"), float("nan"))
            print(f"# sdpa {name} b={b} ctx={ctx}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    err = {}
    if sdpa_out is not None:
        want = sdpa_out.transpose(1, 2).float()
        err["contig"] = (ref_out.float() - want).abs().max().item()
        err["paged"] = (paged_out.float() - want).abs().max().item()
    del ks, vs
    torch.cuda.empty_cache()
    return results, err


# ---------------------------------------------------------------------------
# Decoding steps: append one token per sequence, then attend over the context.


def step_caches(b, ctx, nrot, layout="bshd"):
    """`nrot` (k, v) cache pairs of `ctx` positions with the same random contents in either layout
    (bshd [b, ctx, h_kv, d], or bhsd [b, h_kv, ctx, d] for SDPA); position ctx - 1 is the step's."""
    out = []
    for r in range(nrot):
        g = torch.Generator(device="cuda").manual_seed(1000 + r)
        kv = [torch.randn(b, ctx, H_KV, D, device="cuda", dtype=DTYPE, generator=g) for _ in range(2)]
        out.append(tuple(x.transpose(1, 2).contiguous() for x in kv) if layout == "bhsd" else tuple(kv))
    return out


def step_flash(b, ctx, nrot, new):
    """fusedattn.flash_attn_with_kvcache on [b, ctx, h_kv, d] caches holding ctx - 1 tokens."""
    from fusedattn import flash_attn_with_kvcache

    q, k, v = new
    caches = step_caches(b, ctx, nrot)
    seqlens = torch.full((b,), ctx - 1, dtype=torch.int32, device="cuda")
    return [(lambda kc=caches[i % nrot][0], vc=caches[i % nrot][1]:
             flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True)) for i in range(CALLS)]


def step_dpa(b, ctx, nrot, new, page=None):
    """DotProductAttention(inference_params=...): one layer per cache copy, after a pre_step that
    records ctx - 1 cached tokens per sequence and one more for the step."""
    from collections import OrderedDict

    from fusedattn import DotProductAttention
    from fusedattn.inference import InferenceParams

    q, k, v = new
    p = InferenceParams(b, ctx, H_KV, D, DTYPE, is_paged=page is not None, page_size=page, device="cuda")
    layers = [DotProductAttention(H_Q, D, num_gqa_groups=H_KV, qkv_format="bshd", attn_mask_type="padding_causal",
                                  layer_number=r + 1) for r in range(nrot)]
    for r, (kc, vc) in enumerate(step_caches(b, ctx, nrot)):
        p.allocate_memory(r + 1)
        pool_k, pool_v = p.cache_manager.cache[r + 1]
        pool_k.view(-1).copy_(kc.view(-1))  # non-paged pools are the caches; paged ones hold pages in order
        pool_v.view(-1).copy_(vc.view(-1))
        del kc, vc
    p.pre_step(OrderedDict((i, ctx - 1) for i in range(b)))
    p.pre_step(OrderedDict((i, 1) for i in range(b)))
    return [(lambda m=layers[i % nrot]: m(q, k, v, inference_params=p).view(b, 1, H_Q, D)) for i in range(CALLS)]


def step_cudnn(b, ctx, nrot, new):
    """cuDNN: index_copy_ of the new k / v into [b, h_kv, ctx, d] caches, then SDPA's cuDNN backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (x.transpose(1, 2).contiguous() for x in new)
    caches = step_caches(b, ctx, nrot, "bhsd")
    pos = torch.full((1,), ctx - 1, dtype=torch.long, device="cuda")

    def call(kc, vc):
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True).transpose(1, 2)

    return [(lambda kc=caches[i % nrot][0], vc=caches[i % nrot][1]: call(kc, vc)) for i in range(CALLS)]


STEP_IMPLS = {
    "flash_attn_with_kvcache": step_flash,
    "DotProductAttention": step_dpa,
    "DotProductAttention paged-64": lambda b, ctx, nrot, new: step_dpa(b, ctx, nrot, new, page=64),
    "cuDNN index_copy + SDPA": step_cudnn,
}


def run_steps_case(b, ctx, gen, profile=False):
    """Per-step us (graph replay) of every implementation, and each one's max |out - cuDNN's out|."""
    nrot = rotations(b, ctx)
    new = tuple(torch.randn(b, 1, h, D, device="cuda", dtype=DTYPE, generator=gen) for h in (H_Q, H_KV, H_KV))
    times, outs = {}, {}
    for name, make in STEP_IMPLS.items():
        calls = None
        try:
            calls = make(b, ctx, nrot, new)
            outs[name] = calls[0]().float()
            if profile:
                print_graph_profile(name, calls)
            else:
                times[name] = time_graph(calls)
        except Exception as e:  # a peer that does not take the shape
            times[name] = float("nan")
            print(f"# {name} b={b} ctx={ctx}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del calls
        torch.cuda.empty_cache()
    ref = outs.get("cuDNN index_copy + SDPA")
    err = {n: (o - ref).abs().max().item() if ref is not None else float("nan") for n, o in outs.items()}
    return times, err


def steps_table(cases, gen):
    names = list(STEP_IMPLS)
    rows, bars = [], []
    for b, ctx in cases:
        t, err = run_steps_case(b, ctx, gen)
        nb = cache_bytes(b, ctx)
        cells = [f"{fmt_us(t[n])} ({nb / (t[n] * 1e-6) / 1e12:.2f} TB/s)" for n in names]
        cudnn = t["cuDNN index_copy + SDPA"]
        ratios = [f"{cudnn / t[n]:.2f}x" for n in names[:-1]]
        errs = " / ".join(f"{err.get(n, float('nan')):.1e}" for n in names[:-1])
        rows.append(f"| {b} | {ctx} | {nb / 1e6:.1f} | " + " | ".join(cells + ratios) + f" | {errs} |")
        print(rows[-1], flush=True)
        for n in ("flash_attn_with_kvcache", "DotProductAttention"):
            if (b, ctx) == (1, 8192):
                bars.append(f"{n} batch 1, context 8192: {t[n]:.1f} us per step (bar <= 16 us; cuDNN "
                            f"{cudnn:.1f}): {'PASS' if t[n] <= 16 else 'FAIL'}")
            if (b, ctx) == (64, 16384):
                tbs = nb / (t[n] * 1e-6) / 1e12
                bars.append(f"{n} batch 64, context 16384: {tbs:.2f} TB/s (bar >= 4.3 TB/s): "
                            f"{'PASS' if tbs >= 4.3 else 'FAIL'}")
    head = [
        f"### Decode step (append + attention; h_q={H_Q}, h_kv={H_KV}, d={D}, bf16, 1 new token) - "
        f"{datetime.date.today().isoformat()}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
        "",
        "Per-step us from CUDA-graph replay (20 steps per graph, median of 15 replays; each step appends to and "
        "reads another cache copy, so L2 does not serve it). TB/s: cache bytes read per step / time. Ratios: "
        "cuDNN's time / fusedattn's. err: max |out - cuDNN's out|.",
        "",
        "| batch | context | cache MB | " + " | ".join(names) + " | " +
        " | ".join(f"vs cuDNN: {n}" for n in names[:-1]) + " | err " + " / ".join(names[:-1]) + " |",
        "|" + "---|" * (3 + len(names) + (len(names) - 1) + 1),
    ]
    return "\n".join(head + rows + [""] + [f"- {x}" for x in bars]) + "\n"


def fmt_us(t):
    return "n/a" if t != t else f"{t:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="append the table to this markdown file (e.g. bench/RESULTS.md)")
    ap.add_argument("--cases", help="comma-separated BxCTX list, e.g. 1x8192,64x16384")
    ap.add_argument("--profile", action="store_true", help="print each kernel's mean duration instead of timing")
    ap.add_argument("--ncu", action="store_true", help="with --profile: the calls alone, for bench/profile_decode.sh")
    ap.add_argument("--paged", action="store_true", help="with --profile: the paged-16 cache instead of the contiguous one")
    ap.add_argument("--profile-graph", action="store_true",
                    help="kernel durations inside the timed graphs, fusedattn and cuDNN, instead of the table")
    ap.add_argument("--steps", action="store_true",
                    help="decoding steps (append + attention) through flash_attn_with_kvcache, "
                         "DotProductAttention(inference_params) and cuDNN instead of attention alone")
    opt = ap.parse_args()
    cases = CASES if not opt.cases else [tuple(int(x) for x in c.split("x")) for c in opt.cases.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    if opt.steps and opt.profile_graph:
        for b, ctx in cases:
            print(f"## graph profile of steps b={b} ctx={ctx} ({cache_bytes(b, ctx) / 1e6:.1f} MB of cache per step)")
            run_steps_case(b, ctx, gen, profile=True)
        return
    if opt.steps:
        table = steps_table(cases, gen)
        print()
        print(table)
        if opt.out:
            with open(opt.out, "a") as f:
                f.write("\n" + table)
        return
    if opt.profile_graph:
        for b, ctx in cases:
            profile_graph_case(b, ctx, gen)
        return
    if opt.profile:
        for b, ctx in cases:
            profile_case(b, ctx, gen, under_ncu=opt.ncu, paged=opt.paged)
        return

    rows, bars = [], []
    for b, ctx in cases:
        r, err = run_case(b, ctx, gen)
        nb = cache_bytes(b, ctx)
        tc, tp, tcu, tf2 = r["fa_contig"][0], r["fa_paged"][0], r["cudnn"][0], r["fa2"][0]
        tbs = nb / (tc * 1e-6) / 1e12
        tbs_p = nb / (tp * 1e-6) / 1e12
        rows.append(
            f"| {b} | {ctx} | {nb / 1e6:.1f} | {fmt_us(tc)} ({tbs:.2f} TB/s) | {fmt_us(tp)} ({tbs_p:.2f} TB/s) | "
            f"{fmt_us(tcu)} | {fmt_us(tf2)} | {tcu / tc:.2f}x | {tf2 / tc:.2f}x | {tp / tc:.3f} | "
            f"{fmt_us(r['fa_contig'][1])} / {fmt_us(r['cudnn'][1])} / {fmt_us(r['fa2'][1])} | "
            f"{err.get('contig', float('nan')):.1e} / {err.get('paged', float('nan')):.1e} |")
        if (b, ctx) == (1, 8192):
            bars.append(f"batch 1, context 8192: {tc:.1f} us per call (bar <= 15 us): "
                        f"{'PASS' if tc <= 15 else 'FAIL'}")
        if (b, ctx) == (64, 16384):
            bars.append(f"batch 64, context 16384: {tbs:.2f} TB/s (bar >= 4.0 TB/s): {'PASS' if tbs >= 4.0 else 'FAIL'}")
        bars.append(f"paged/contiguous b={b} ctx={ctx}: {tp / tc:.3f} (bar <= 1.10): {'PASS' if tp <= 1.1 * tc else 'FAIL'}")
        print(rows[-1], flush=True)

    gpu = torch.cuda.get_device_name(0)
    switches = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("FUSEDATTN_"))
    head = [
        f"### Decode (h_q={H_Q}, h_kv={H_KV}, d={D}, bf16, 1 query token) - {datetime.date.today().isoformat()}, "
        f"{gpu}, torch {torch.__version__}{', ' + switches if switches else ''}",
        "",
        "Per-call us from CUDA-graph replay (20 calls per graph, median of 15 replays; the cache rotates over copies "
        "so L2 does not serve the next call). Ratios: peer time / fusedattn contiguous time (> 1: fusedattn faster). "
        "Eager: CUDA events around 20 eager calls. err: max |fusedattn - SDPA| of the output.",
        "",
        "| batch | context | cache MB | fusedattn contiguous | fusedattn paged-16 | cuDNN | FA2 | vs cuDNN | vs FA2 "
        "| paged / contig | eager us (fusedattn / cuDNN / FA2) | err contig / paged |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    table = "\n".join(head + rows + [""] + [f"- {x}" for x in bars]) + "\n"
    print()
    print(table)
    if opt.out:
        with open(opt.out, "a") as f:
            f.write("\n" + table)


if __name__ == "__main__":
    main()
