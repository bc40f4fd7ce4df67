"""Model-zoo benchmark: the attention calls real models make, fusedattn against the best peer that runs each.

Configurations (bf16, b * s = 16k tokens, s in {4k, 8k, 16k}, forward and forward+backward):

    llama3     h 32/8, d 128, causal, q/k/v stored [b, h, s, d] (what Hugging Face passes after rotary)
    mistral    llama3 with a sliding window of 4096 (left 4095)
    gemma2     h 16/8, d 256, causal, window 4096, softcap 50, stored [b, h, s, d]
    gptoss     h 64/8, d 64, causal, learnable sinks; gptoss-w128: the same with a window of 128
    mla        h 32, d_qk 192, d_v 128, causal (DeepSeek-style prefill)
    phi2       h 32, d 80, causal
    packed     thd, h 32/8, d 128, causal documents of ~2k tokens (8 per 16k), packs of s tokens
    *-plain    fusedattn's own plain causal call at the b, h, s, d of a configuration no peer runs
               (softcap; learnable sinks in the backward, which the frontend's Python graph API lacks)

Peers: cuDNN through torch SDPA (SDPBackend.CUDNN_ATTENTION) where it takes the call; the cuDNN frontend
graph API (TransformerEngine's FusedAttention backend; `cudnn` from nvidia-cudnn-frontend) with GQA,
windows, sinks and ragged thd; FlashAttention-2 through torch SDPA (SDPBackend.FLASH_ATTENTION) and
torch.nn.attention.varlen.varlen_attn. A peer that refuses a call is left out of that row. The bar is
fusedattn / best peer >= 1.0; where no peer runs a configuration it is fusedattn / its own
*-plain >= 0.9.

Method (as bench_gpu.py): every implementation in one process on the same tensors; --rounds rounds, the
order rotated each round; each measurement after --idle seconds of an idle GPU (a common predecessor);
do_bench medians (L2 flushed), the median over rounds in the table. TFLOP/s count visible (i, j) pairs
only: 2 * (d_qk + d_v) FLOPs per pair forward, 3.5x that for forward+backward. A check column gives
max |out - out_peer| / max |out_peer| of each peer's forward against fusedattn's (bf16 rounding: ~1e-2).

    python bench/bench_zoo.py [--s 4096,8192,16384] [--configs llama3,packed] [--rounds 2] [--out FILE] [--profile]
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import statistics
import time
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_gpu import time_ms, tflops, write_table
from bench_timing import cuda_kernel_times
from fusedattn._ops import FwdArgs, attention

try:
    import cudnn
except ImportError:  # the peer is then absent from every row
    cudnn = None

TOKENS = 16384


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    h_q: int
    h_kv: int
    d_qk: int
    d_v: int
    window: int = 0          # keys j with i - window < j <= i; 0: plain causal
    softcap: float = 0.0
    sinks: bool = False
    packed: bool = False     # thd documents of DOC_TOKENS tokens on average
    peers: bool = True       # False: fusedattn alone (the *-plain rows)

    @property
    def scale(self):
        return 1.0 / math.sqrt(self.d_qk)


DOC_TOKENS = 2048
CONFIGS = [
    Config("llama3", 32, 8, 128, 128),
    Config("mistral", 32, 8, 128, 128, window=4096),
    Config("gemma2", 16, 8, 256, 256, window=4096, softcap=50.0),
    Config("gemma2-plain", 16, 8, 256, 256, peers=False),
    Config("gptoss", 64, 8, 64, 64, sinks=True),
    Config("gptoss-w128", 64, 8, 64, 64, window=128, sinks=True),
    Config("gptoss-plain", 64, 8, 64, 64, peers=False),
    Config("mla", 32, 32, 192, 128),
    Config("phi2", 32, 32, 80, 80),
    Config("packed", 32, 8, 128, 128, packed=True),
]
PLAIN_OF = {"gemma2": "gemma2-plain", "gptoss": "gptoss-plain", "gptoss-w128": "gptoss-plain"}


def doc_lengths(s, gen):
    """A pack of s tokens cut into s / DOC_TOKENS documents of random lengths (at least 64 tokens)."""
    n = max(1, s // DOC_TOKENS)
    cuts = sorted(torch.randint(1, s // 64, (n - 1,), generator=gen).tolist())
    bounds = [0] + [64 * c for c in cuts] + [s]
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    return [x for x in lengths if x > 0]


def visible_pairs(lengths, window):
    """Causal (i, j) pairs with i - window < j <= i, summed over sequences of these lengths."""
    total = 0
    for n in lengths:
        if window <= 0 or window >= n:
            total += n * (n + 1) // 2
        else:
            total += window * (window + 1) // 2 + (n - window) * window
    return total


class Point:
    """One configuration at one s: the tensors every implementation reads, and its FLOP count."""

    def __init__(self, cfg: Config, s: int):
        self.cfg, self.s = cfg, s
        gen = torch.Generator().manual_seed(s + cfg.h_q)
        dev, dt = "cuda", torch.bfloat16
        if cfg.packed:
            self.lengths = [x for _ in range(TOKENS // s) for x in doc_lengths(s, gen)]
            t = sum(self.lengths)
            shape_q, shape_kv, shape_v = (t, cfg.h_q, cfg.d_qk), (t, cfg.h_kv, cfg.d_qk), (t, cfg.h_kv, cfg.d_v)
            cu = torch.tensor([0] + list(torch.tensor(self.lengths).cumsum(0).tolist()), dtype=torch.int32)
            self.cu = cu.to(dev)
            self.max_len = max(self.lengths)
        else:
            b = TOKENS // s
            self.lengths = [s] * b
            # [b, h, s, d] storage, as Hugging Face models hold q, k, v after rotary embeddings.
            shape_q, shape_kv, shape_v = (b, cfg.h_q, s, cfg.d_qk), (b, cfg.h_kv, s, cfg.d_qk), (b, cfg.h_kv, s, cfg.d_v)
        self.q = torch.randn(shape_q, generator=gen).to(dev, dt).requires_grad_()
        self.k = torch.randn(shape_kv, generator=gen).to(dev, dt).requires_grad_()
        self.v = torch.randn(shape_v, generator=gen).to(dev, dt).requires_grad_()
        out_shape = shape_q[:-1] + (cfg.d_v,)
        self.dout = torch.randn(out_shape, generator=gen).to(dev, dt)
        self.sinks = torch.randn(cfg.h_q, generator=gen).to(dev, torch.float32) if cfg.sinks else None
        self.flops = 2 * (cfg.d_qk + cfg.d_v) * cfg.h_q * visible_pairs(self.lengths, cfg.window)

    def grads(self, out, dout):
        return torch.autograd.grad(out, (self.q, self.k, self.v), dout)


def fusedattn_impl(p: Point):
    c = p.cfg
    fields = dict(scale=c.scale, window_left=c.window - 1 if c.window else -1, window_right=0 if c.window else -1,
                  softmax_type="learnable" if c.sinks else "vanilla")
    if c.softcap:
        fields["softcap"] = c.softcap  # a TypeError here means the build has no softcap: the row says so
    if c.packed:
        args = FwdArgs(q_format="thd", kv_format="thd", mask_type="padding_causal", max_seqlen_q=p.max_len,
                       max_seqlen_kv=p.max_len, **fields)

        def fn():
            return attention(p.q, p.k, p.v, args, softmax_offset=p.sinks, cu_seqlens_q=p.cu, cu_seqlens_kv=p.cu)[0]
        return fn, p.dout
    args = FwdArgs(mask_type="causal", **fields)
    qt, kt, vt = (t.transpose(1, 2) for t in (p.q, p.k, p.v))

    def fn():
        return attention(qt, kt, vt, args, softmax_offset=p.sinks)[0].transpose(1, 2)
    return fn, p.dout


def sdpa_impl(backend):
    def make(p: Point):
        c = p.cfg
        if c.packed or c.window or c.softcap or c.sinks:
            return None
        gqa = c.h_q != c.h_kv

        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(p.q, p.k, p.v, is_causal=True, scale=c.scale, enable_gqa=gqa)
        return fn, p.dout
    return make


def varlen_impl(p: Point):
    c = p.cfg
    if not c.packed or c.window or c.softcap or c.sinks:
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None

    # torch's signature moved between releases: causal as window_size=(-1, 0) or as is_causal=True.
    params = inspect.signature(varlen_attn).parameters
    kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if c.h_q != c.h_kv and "enable_gqa" in params:
        kw["enable_gqa"] = True
    kw["scale"] = c.scale

    def fn():
        return varlen_attn(p.q, p.k, p.v, p.cu, p.cu, p.max_len, p.max_len, **kw)
    return fn, p.dout


class CudnnFrontend:
    """cuDNN's SDPA through the frontend's graph API: forward and backward graphs built once per point.

    Dense points hand cuDNN the [b, h, s, d] tensors as they are; packed points describe each document as
    [b, h, s_max, d] with the packed [t, h, d] strides and a ragged offset per document (what TransformerEngine
    passes for thd)."""

    def __init__(self, p: Point):
        c = p.cfg
        self.p = p
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        self.o = torch.empty(p.dout.shape, device="cuda", dtype=torch.bfloat16)
        self.grads = [torch.empty_like(t) for t in (p.q, p.k, p.v)]
        if c.packed:
            b, s = len(p.lengths), p.max_len
            # Ragged offsets: b + 1 document starts (the last is the token count), in elements.
            starts = torch.tensor([0] + p.lengths, dtype=torch.int64).cumsum(0).view(b + 1, 1, 1, 1).cuda()
            self.seq_len = torch.tensor(p.lengths, dtype=torch.int32, device="cuda").view(b, 1, 1, 1)
            self.max_t = (sum(p.lengths) + 63) // 64 * 64

            def layout(h, d):
                return [b, h, s, d], [s * h * d, d, h * d, 1], starts * (h * d)
        else:
            b, s = p.q.shape[0], p.s
            self.seq_len = None
            self.max_t = None

            def layout(h, d):
                return [b, h, s, d], [h * s * d, s * d, d, 1], None
        # name -> (buffer, dims, strides, ragged offset or None)
        self.specs = {
            "q": (p.q.detach(), *layout(c.h_q, c.d_qk)), "k": (p.k.detach(), *layout(c.h_kv, c.d_qk)),
            "v": (p.v.detach(), *layout(c.h_kv, c.d_v)), "o": (self.o, *layout(c.h_q, c.d_v)),
            "dO": (p.dout, *layout(c.h_q, c.d_v)), "dQ": (self.grads[0], *layout(c.h_q, c.d_qk)),
            "dK": (self.grads[1], *layout(c.h_kv, c.d_qk)), "dV": (self.grads[2], *layout(c.h_kv, c.d_v)),
        }
        self.stats = torch.empty(b, c.h_q, s, 1, device="cuda", dtype=torch.float32)
        self.sink = p.sinks.view(1, c.h_q, 1, 1) if c.sinks else None
        self.dsink = torch.empty_like(self.sink) if c.sinks else None
        self.fwd = self._forward_graph()
        self.bwd = None
        try:
            self.bwd = self._backward_graph()
        except Exception as e:  # noqa: BLE001 - the frontend raises several types; the row shows no figure
            print(f"  cudnn-fe backward unavailable for {c.name}: {str(e).splitlines()[0][:160]}")

    def _graph(self):
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        return g, {}

    def _tensor(self, g, pack, name):
        buf, dims, strides, offset = self.specs[name]
        t = g.tensor(name=name, dim=dims, stride=strides, data_type=cudnn.data_type.BFLOAT16)
        pack[t] = buf
        if offset is not None:
            ro = g.tensor_like(offset)
            t.set_ragged_offset(ro)
            pack[ro] = offset
        return t

    def _output(self, g, pack, t, name):
        buf, dims, strides, offset = self.specs[name]
        t.set_output(True).set_dim(dims).set_stride(strides)
        pack[t] = buf
        if offset is not None:
            ro = g.tensor_like(offset)
            t.set_ragged_offset(ro)
            pack[ro] = offset

    def _options(self, g, pack):
        c = self.p.cfg
        kw = dict(attn_scale=c.scale, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
                  diagonal_band_right_bound=0)
        if c.window:
            kw["diagonal_band_left_bound"] = c.window  # TransformerEngine's mapping: window_left + 1
        if self.seq_len is not None:
            sq, skv = g.tensor_like(self.seq_len), g.tensor_like(self.seq_len)
            pack[sq], pack[skv] = self.seq_len, self.seq_len
            kw.update(use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv)
        if self.sink is not None:
            sink = g.tensor_like(self.sink)
            pack[sink] = self.sink
            kw["sink_token"] = sink
        return kw

    @staticmethod
    def _finish(g, pack):
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return g, pack, torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)

    def _forward_graph(self):
        g, pack = self._graph()
        q, k, v = (self._tensor(g, pack, n) for n in ("q", "k", "v"))
        o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, **self._options(g, pack))
        self._output(g, pack, o, "o")
        stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
        pack[stats] = self.stats
        return self._finish(g, pack)

    def _backward_graph(self):
        g, pack = self._graph()
        q, k, v, o, do = (self._tensor(g, pack, n) for n in ("q", "k", "v", "o", "dO"))
        stats = g.tensor_like(self.stats)
        pack[stats] = self.stats
        kw = self._options(g, pack)
        if self.dsink is not None:
            dsink = g.tensor_like(self.dsink)
            pack[dsink] = self.dsink
            kw["dsink_token"] = dsink
        if self.max_t is not None:
            kw.update(max_total_seq_len_q=self.max_t, max_total_seq_len_kv=self.max_t)
        dq, dk, dv = g.sdpa_backward(name="sdpa_backward", q=q, k=k, v=v, o=o, dO=do, stats=stats, **kw)
        for t, name in ((dq, "dQ"), (dk, "dK"), (dv, "dV")):
            self._output(g, pack, t, name)
        return self._finish(g, pack)

    def forward(self):
        g, pack, ws = self.fwd
        g.execute(pack, ws, handle=self.handle)
        return self.o

    def forward_backward(self):
        self.forward()
        g, pack, ws = self.bwd
        g.execute(pack, ws, handle=self.handle)


def cudnn_fe_impl(p: Point):
    """(forward, forward+backward) callables, not autograd: this peer runs its own two graphs."""
    if cudnn is None or p.cfg.softcap:
        return None
    try:
        fe = CudnnFrontend(p)
    except Exception as e:  # noqa: BLE001
        print(f"  cudnn-fe refuses {p.cfg.name} s={p.s}: {str(e).splitlines()[0][:160]}")
        return None
    return fe


PEERS: Dict[str, Callable] = {
    "cudnn-sdpa": sdpa_impl(SDPBackend.CUDNN_ATTENTION),
    "cudnn-fe": cudnn_fe_impl,
    "fa2": sdpa_impl(SDPBackend.FLASH_ATTENTION),
    "fa2-varlen": varlen_impl,
}


def callables(p: Point):
    """name -> (forward, forward+backward, forward output for the check) for every implementation that runs."""
    out = {}
    try:
        fn, dout = fusedattn_impl(p)
        out["fusedattn"] = fn, dout
    except TypeError as e:
        print(f"  fusedattn cannot express {p.cfg.name}: {e}")
    if p.cfg.peers:
        for name, make in PEERS.items():
            made = make(p)
            if made is not None:
                out[name] = made
    result = {}
    for name, made in out.items():
        if isinstance(made, CudnnFrontend):
            fe = made
            result[name] = (fe.forward, fe.forward_backward if fe.bwd else None, fe.forward)
            continue
        fn, dout = made

        def fwd(fn=fn):
            with torch.no_grad():
                return fn()

        def fb(fn=fn, dout=dout):
            p.grads(fn(), dout)

        result[name] = (fwd, fb, fwd)
    return result


def check(impls):
    """max |out - out_peer| / max |out_peer| of each implementation's forward against fusedattn's."""
    if "fusedattn" not in impls:
        return {}
    try:
        ref = impls["fusedattn"][2]().float()
    except (RuntimeError, NotImplementedError) as e:
        print(f"  fusedattn failed: {str(e)[:200]}")
        return {}
    errs = {}
    for name, (_, _, out) in impls.items():
        if name == "fusedattn":
            continue
        try:
            o = out().float()
            errs[name] = ((o - ref).abs().max() / o.abs().max()).item()
        except RuntimeError:
            errs[name] = float("nan")
    return errs


def profile_point(cfg: Config, s: int, calls: int = 10):
    """Each CUDA kernel of every implementation's forward and forward+backward at one point, with its
    mean duration per call (torch.profiler): where a configuration's time goes."""
    p = Point(cfg, s)
    for name, (fwd, fb, _) in callables(p).items():
        for mode, fn in (("fwd", fwd), ("fb", fb)):
            if fn is None:
                continue
            try:
                fn()
            except RuntimeError as e:  # a peer that does not take this configuration (check() skips it too)
                print(f"  {name} {mode}: not available ({str(e).splitlines()[0][:100]})")
                continue
            torch.cuda.synchronize()
            total = {k: sum(ts) / calls for k, ts in cuda_kernel_times(fn, calls).items()}
            print(f"  {name} {mode}: {sum(total.values()):.1f} us of kernels per call")
            for kname, us in sorted(total.items(), key=lambda x: -x[1]):
                print(f"    {us:9.1f} us  {kname[:150]}")
    del p
    torch.cuda.empty_cache()


def run_point(cfg: Config, s: int, rounds: int, idle: float):
    p = Point(cfg, s)
    impls = callables(p)
    errs = check(impls)
    times: Dict[str, list] = {}
    names = list(impls)
    for r in range(rounds if names else 0):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fwd, fb, _ = impls[name]
            for mode, fn in (("fwd", fwd), ("fb", fb)):
                if fn is None:
                    continue
                torch.cuda.synchronize()
                time.sleep(idle)
                times.setdefault((name, mode), []).append(time_ms(fn))
    rates = {key: tflops(statistics.median(ts), (3.5 if key[1] == "fb" else 1) * p.flops) for key, ts in times.items()}
    del impls, p
    torch.cuda.empty_cache()
    return rates, errs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--s", default="4096,8192,16384")
    ap.add_argument("--configs", default=",".join(c.name for c in CONFIGS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle", type=float, default=0.4, help="seconds of idle GPU before each measurement")
    ap.add_argument("--out", default=None, help="append the table to this file")
    ap.add_argument("--profile", action="store_true",
                    help="print each implementation's kernels and their durations per point instead of the table")
    a = ap.parse_args()
    wanted = a.configs.split(",")
    cfgs = [c for c in CONFIGS if c.name in wanted or any(PLAIN_OF.get(w) == c.name for w in wanted)]
    ss = [int(x) for x in a.s.split(",")]
    if a.profile:
        for cfg in cfgs:
            for s in ss:
                print(f"# {cfg.name} s={s}", flush=True)
                profile_point(cfg, s)
        return
    results = {}
    for cfg in cfgs:
        for s in ss:
            print(f"# {cfg.name} s={s}", flush=True)
            results[(cfg.name, s)] = run_point(cfg, s, a.rounds, a.idle)
    lines = ["| config | s | mode | fusedattn | cudnn-sdpa | cudnn-fe | fa2 | fa2-varlen | best peer | ratio | bar |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    met = total = 0
    for cfg in cfgs:
        if not cfg.peers:
            continue
        for s in ss:
            rates, errs = results[(cfg.name, s)]
            for mode in ("fwd", "fb"):
                ours = rates.get(("fusedattn", mode), float("nan"))
                peers = {n: rates[(n, mode)] for n in PEERS if (n, mode) in rates and rates[(n, mode)] == rates[(n, mode)]}
                cells = []
                for n in PEERS:
                    r = rates.get((n, mode))
                    cell = "-" if r is None or r != r else f"{r:.0f}"
                    if n in errs and mode == "fwd" and cell != "-":
                        cell += f" ({errs[n]:.0e})"
                    cells.append(cell)
                if peers:
                    best = max(peers, key=peers.get)
                    ratio, bar = ours / peers[best], 1.0
                else:
                    plain = results.get((PLAIN_OF.get(cfg.name, ""), s), ({}, {}))[0].get(("fusedattn", mode))
                    best = "own plain causal" if plain else "none"
                    ratio, bar = (ours / plain if plain else float("nan")), 0.9
                ok = ratio == ratio and ratio >= bar
                met += ok
                total += 1
                lines.append(f"| {cfg.name} | {s} | {mode} | {ours:.0f} | " + " | ".join(cells)
                             + f" | {best} | {ratio:.2f} | {'met' if ok else 'below'} (>= {bar}) |")
    caption = (f"TFLOP/s (visible pairs), bf16, b*s = {TOKENS}, {a.rounds} rounds rotated, {a.idle} s idle before "
               f"each measurement; peer cells carry their forward's max relative difference to fusedattn's output. "
               f"Bar met at {met} of {total} points. Command: `python bench/bench_zoo.py --configs {a.configs} --s {a.s} "
               f"--rounds {a.rounds}`")
    write_table("Model zoo", caption, lines, a.out)


if __name__ == "__main__":
    main()
