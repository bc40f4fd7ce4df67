"""End-to-end example: a small byte-level GPT whose attention is fusedattn's.

    python examples/train_gpt.py [--device auto|cpu|cuda] [--steps 40] [--gen-tokens 32]

(./scripts/run_demo.sh sets up the environment and runs it.) It (a) trains a few
steps under ``torch.compile(fullgraph=True)`` and counts graph breaks (must be
0), (b) checks logits and gradients against the same model with torch's
``F.scaled_dot_product_attention``, (c) generates greedily with a
``dynamic=True`` compile (full recompute per token) and counts compilations,
(c') generates the same tokens through the KV cache
(``fusedattn.inference.InferenceParams``: prefill, then one compiled decode
step per token; CUDA graphs on CUDA) and checks they equal (c)'s, (d) prints
eager and compiled timings and, on a GPU, (e) times its attention call against
torch SDPA on cuDNN at the model's shapes. Exits non-zero on a graph break, a
recompile while decoding or a failed agreement.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusedattn import DotProductAttention

TEXT = """\
Attention lets every position of a sequence look at every other position and decide
how much each one matters. A query is compared with all keys; the scores, scaled by
one over the square root of the head size, go through a softmax, and the weights mix
the values. Causal attention hides the future, so a language model predicts the next
byte from the bytes before it and nothing else.
A fused attention kernel never writes the full score matrix to memory. It walks over
blocks of keys, keeps a running maximum and a running sum for each query row, and
rescales the partial output whenever the maximum grows. The result is the same as the
plain formula, up to rounding, but it needs memory linear in the sequence length.
Grouped-query attention shares each key and value head among several query heads.
The cache of keys and values shrinks by the group size, and the quality barely moves.
Compilers like to see whole programs. When a library hides its kernel behind an
opaque call, the compiler splits the graph around it and loses the chance to fuse the
code before and after. A real operator with a shape function keeps the graph whole.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
"""


@dataclass
class Config:
    vocab: int = 256
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2  # grouped-query attention: 2 query heads per key/value head
    max_len: int = 128
    seq_len: int = 64
    batch: int = 16

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


# ---------------------------------------------------------------------------
# The model. Attention modules take q [b, s, h, d] and k, v [b, s, h_kv, d] and
# return [b, s, h * d]; q/k/v are strided views of one projection (no copy).


def fused_attention(cfg: Config) -> nn.Module:
    return DotProductAttention(cfg.n_head, cfg.head_dim, num_gqa_groups=cfg.n_kv_head,
                               qkv_format="bshd", attn_mask_type="causal")


class TorchSDPAAttention(nn.Module):
    """The reference: torch's F.scaled_dot_product_attention, same contract."""

    def forward(self, q, k, v):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: Config, attn: nn.Module):
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim, bias=False)
        self.attn = attn
        self.proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x, inference_params=None):
        c = self.cfg
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, c.n_head + 2 * c.n_kv_head, c.head_dim)
        q = qkv[:, :, :c.n_head]
        k = qkv[:, :, c.n_head:c.n_head + c.n_kv_head]
        v = qkv[:, :, c.n_head + c.n_kv_head:]
        if inference_params is None:
            a = self.attn(q, k, v)
        else:  # KV-cache generation: x holds only the step's new tokens
            a = self.attn(q, k, v, inference_params=inference_params)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: Config, attn_factory):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, attn_factory(cfg)) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, inference_params=None):
        if inference_params is None:
            pos = self.pos.weight[: idx.shape[1]]
        else:
            # New token i of sequence b sits at position (cache length before the step) + i,
            # read from the device buffer pre_step filled: no host sync inside the step.
            start = inference_params.get_seqlens_pre_step()[: idx.shape[0]].long()
            pos = self.pos(start[:, None] + torch.arange(idx.shape[1], device=idx.device))
        x = self.tok(idx) + pos
        for blk in self.blocks:
            x = blk(x, inference_params)
        return self.ln_f(x) @ self.tok.weight.t()  # tied output embedding


# ---------------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def unique_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def batches(data, cfg: Config, device, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch,), generator=g)
        x = torch.stack([data[i:i + cfg.seq_len] for i in starts])
        y = torch.stack([data[i + 1:i + 1 + cfg.seq_len] for i in starts])
        yield x.to(device), y.to(device)


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train_steps(model, opt, it, n, device, log_every=0):
    losses, times = [], []
    for step in range(n):
        x, y = next(it)

        def step_fn():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss

        loss, dt = timed(step_fn, device)
        losses.append(loss.item())
        times.append(dt)
        if log_every and (step % log_every == 0 or step == n - 1):
            print(f"  step {step:3d}  loss {losses[-1]:.4f}  ({dt * 1e3:.0f} ms)")
    return losses, times


def max_abs_diff(a, b) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def agreement(model, cfg, data, device, tol):
    """Same weights, attention swapped for torch SDPA: logits and all gradients."""
    ref = TinyGPT(cfg, lambda c: TorchSDPAAttention()).to(device)
    ref.load_state_dict(model.state_dict())
    x, y = next(batches(data, cfg, device, seed=1234))
    results = {}
    for name, m in (("fusedattn", model), ("torch_sdpa", ref)):
        m.zero_grad(set_to_none=True)
        logits = m(x)
        loss_fn(logits, y).backward()
        results[name] = (logits.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters()})
    lf, gf = results["fusedattn"]
    lt, gt = results["torch_sdpa"]
    d_logits = max_abs_diff(lf, lt)
    scale_logits = lt.abs().max().item()
    d_grads, worst = 0.0, ""
    ok_grads = True
    for n in gt:
        d = max_abs_diff(gf[n], gt[n])
        bound = tol * max(1.0, gt[n].abs().max().item())
        ok_grads &= d <= bound
        if d > d_grads:
            d_grads, worst = d, n
    ok = d_logits <= tol * max(1.0, scale_logits) and ok_grads
    model.zero_grad(set_to_none=True)
    return ok, d_logits, d_grads, worst


@torch.no_grad()
def generate(model, prompt, n_tokens, device):
    idx = prompt
    per_token = []
    for _ in range(n_tokens):
        logits, dt = timed(lambda: model(idx), device)
        per_token.append(dt)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx, per_token


@torch.no_grad()
def generate_with_kv_cache(model, cfg: Config, prompt, n_tokens, device, backend, mode=None, paged=True):
    """Greedy generation through fusedattn's KV cache: one prefill step, then one
    token per step. The step function is compiled once (fullgraph=True; on CUDA
    also mode="reduce-overhead", one CUDA graph per step shape); the host
    bookkeeping (InferenceParams.pre_step) runs between steps, outside the graph.

    Returns (ids, per-step seconds, compilations, recompiles while decoding)."""
    from collections import OrderedDict

    from fusedattn.inference import InferenceParams

    b, s0 = prompt.shape
    total = s0 + n_tokens
    if total > cfg.max_len:
        raise ValueError(f"prompt + generated tokens ({total}) exceed the model's max_len ({cfg.max_len})")
    dtype = next(model.parameters()).dtype
    params = InferenceParams(b, total, cfg.n_kv_head, cfg.head_dim, dtype, is_paged=paged,
                             page_size=16 if paged else None, device=device)
    for i, blk in enumerate(model.blocks):
        blk.attn.layer_number = i + 1  # each layer appends to and reads its own cache
        params.allocate_memory(i + 1)

    def step(idx):
        return model(idx, inference_params=params)[:, -1]  # logits of each sequence's last new token

    compiled = torch.compile(step, fullgraph=True, backend=backend, mode=mode)
    graphs_before = unique_graphs()
    ids, x, times, graphs = prompt, prompt, [], []
    for t in range(n_tokens):
        params.pre_step(OrderedDict((seq, x.shape[1]) for seq in range(b)))
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        logits, dt = timed(lambda: compiled(x), device)
        x = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, x], dim=1)
        times.append(dt)
        graphs.append(unique_graphs())
    n_graphs = unique_graphs() - graphs_before
    recompiles = graphs[-1] - graphs[1] if len(graphs) > 1 else 0  # after the first decode step
    return ids, times, n_graphs, recompiles


TIMING_REPS, TIMING_WARMUP = 50, 10


def median_event_us(fn) -> float:
    """Median over TIMING_REPS back-to-back calls of fn() (after TIMING_WARMUP calls) of the time CUDA
    events measure around each call, in microseconds."""
    for _ in range(TIMING_WARMUP):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(TIMING_REPS)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def attention_speed(cfg: Config):
    """(e) The model's attention call, fusedattn's against torch SDPA on cuDNN, forward and
    forward+backward, at the model's shapes (q, k, v strided views of one projection) in bf16:
    cuDNN's attention takes 16-bit types only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, hkv = cfg.n_head, cfg.n_kv_head
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(cfg.batch, cfg.seq_len, h + 2 * hkv, cfg.head_dim, device="cuda", dtype=torch.bfloat16,
                      generator=gen, requires_grad=True)
    dout = torch.randn(cfg.batch, cfg.seq_len, h * cfg.head_dim, device="cuda", dtype=torch.bfloat16,
                       generator=gen)
    fused, sdpa = fused_attention(cfg).cuda(), TorchSDPAAttention()

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v)

    def call(attn):
        return attn(qkv[:, :, :h], qkv[:, :, h:h + hkv], qkv[:, :, h + hkv:])

    def forward(attn):
        with torch.no_grad():
            call(attn)

    def forward_backward(attn):
        torch.autograd.grad(call(attn), qkv, dout)

    print(f"\n(e) the attention call on {torch.cuda.get_device_name()}: batch {cfg.batch} x {cfg.seq_len} tokens, "
          f"{h} heads / {hkv} kv heads, head dim {cfg.head_dim}, causal, bf16;\n"
          f"    median of {TIMING_REPS} CUDA-event timings after {TIMING_WARMUP} warm-up calls")
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's reasons why a backend is skipped; the error says enough
            diff = max_abs_diff(call(fused), call(cudnn))
    except RuntimeError as e:  # no cuDNN kernel for this GPU, build or shape
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"  cuDNN attention not available here ({first}); fusedattn alone:")
        for name, run in (("forward", forward), ("forward+backward", forward_backward)):
            print(f"  {name:17s} fusedattn {median_event_us(lambda: run(fused)):8.1f} us")
        return
    print(f"  {'':17s} {'fusedattn':>10s} {'cuDNN':>10s}   cuDNN time / fusedattn time")
    for name, run in (("forward", forward), ("forward+backward", forward_backward)):
        ours, theirs = median_event_us(lambda: run(fused)), median_event_us(lambda: run(cudnn))
        print(f"  {name:17s} {ours:7.1f} us {theirs:7.1f} us   {theirs / ours:.2f}x")
    print(f"  max |fusedattn - cuDNN| of the output: {diff:.2e}")


def printable(ids) -> str:
    return "".join(chr(c) if 32 <= c < 127 else ("\\n" if c == 10 else "?") for c in ids.tolist())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--steps", type=int, default=40,
                   help="compiled training steps (the text stays babble for a few hundred)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--eager-steps", type=int, default=5, help="eager steps timed for comparison")
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--backend", default="inductor", help="torch.compile backend")
    p.add_argument("--tol", type=float, default=1e-3,
                   help="agreement tolerance, relative to max(1, max|reference|)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    torch.manual_seed(args.seed)
    cfg = Config()
    data = torch.tensor(list(TEXT.encode()), dtype=torch.long)
    print(f"fusedattn demo on {device} (torch {torch.__version__}, {torch.get_num_threads()} threads): "
          f"{cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads / {cfg.n_kv_head} kv heads "
          f"(GQA), batch {cfg.batch} x {cfg.seq_len} bytes, {len(data)} bytes of text")
    failures = []
    torch._dynamo.utils.counters.clear()

    model = TinyGPT(cfg, fused_attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    it = batches(data, cfg, device, seed=args.seed)

    # (a) compiled training
    print(f"\n(a) training {args.steps} steps, torch.compile(fullgraph=True, backend={args.backend!r})")
    compiled = torch.compile(model, fullgraph=True, backend=args.backend)
    losses, times = train_steps(compiled, opt, it, args.steps, device, log_every=max(1, args.steps // 5))
    gb = graph_breaks()
    print(f"  graph breaks: {gb}")
    print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if gb:
        failures.append(f"{gb} graph break(s)")
    if not losses[-1] < losses[0]:
        failures.append("loss did not go down")
    steady = times[2:] if len(times) > 3 else times[1:] or times
    compiled_step = statistics.median(steady)
    compile_time = times[0]

    # eager steps on a copy, so the trained model is left alone
    eager_model = copy.deepcopy(model)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=args.lr, weight_decay=0.01)
    eager_opt.load_state_dict(opt.state_dict())
    _, eager_times = train_steps(eager_model, eager_opt, it, args.eager_steps + 1, device)
    eager_step = statistics.median(eager_times[1:])
    del eager_model, eager_opt

    # (b) agreement with torch SDPA, and compiled vs eager
    print("\n(b) agreement with torch.nn.functional.scaled_dot_product_attention (same weights)")
    ok, d_logits, d_grads, worst = agreement(model, cfg, data, device, args.tol)
    print(f"  max |diff| logits: {d_logits:.3e}")
    print(f"  max |diff| grads:  {d_grads:.3e}  (largest in {worst})")
    x, _ = next(batches(data, cfg, device, seed=99))
    # With grad enabled, like training, so the training graph is reused (no_grad would recompile).
    d_comp = max_abs_diff(compiled(x), model(x))
    print(f"  compiled vs eager logits: {d_comp:.3e}")
    ok &= d_comp <= args.tol
    print(f"  agreement: {'OK' if ok else 'FAILED'} (tol {args.tol:g})")
    if not ok:
        failures.append("agreement with torch SDPA")

    # (c) greedy generation, compiled once for every length
    print(f"\n(c) greedy generation of {args.gen_tokens} tokens, torch.compile(dynamic=True, fullgraph=True)")
    model.eval()
    prompt_text = TEXT[:24]
    prompt = torch.tensor([list(prompt_text.encode())], dtype=torch.long, device=device)
    gen_compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=args.backend)
    graphs_before = unique_graphs()
    out, gen_times = generate(gen_compiled, prompt, args.gen_tokens, device)
    n_graphs = unique_graphs() - graphs_before
    eager_out, eager_gen_times = generate(model, prompt, args.gen_tokens, device)
    print(f"  prompt:    {printable(prompt[0])!r}")
    print(f"  generated: {printable(out[0, prompt.shape[1]:])!r}")
    print(f"  (babble, as expected: a model this small ({cfg.n_layer} layers of width {cfg.d_model}), trained "
          f"{args.steps} steps on {len(data)} bytes of text\n"
          "   and predicting one character (byte) at a time, has learned which characters are frequent, not words;\n"
          "   (c) and (c') check that every way of generating gives the same tokens, not the text's quality.)")
    print(f"  compilations during generation: {n_graphs} (recompiles: {max(0, n_graphs - 1)}); "
          f"graphs compiled in this run: {unique_graphs()}")
    print(f"  compiled tokens == eager tokens: {bool(torch.equal(out, eager_out))}")

    # (c') the same generation through the KV cache (prefill once, then one token per step)
    mode = "reduce-overhead" if device.type == "cuda" else None
    print(f"\n(c') KV-cache generation (fusedattn.inference.InferenceParams, paged): prefill + token-by-token "
          f"decode, torch.compile(fullgraph=True{', mode=' + repr(mode) if mode else ''})")
    kv_out, kv_times, kv_graphs, kv_recompiles = generate_with_kv_cache(
        model, cfg, prompt, args.gen_tokens, device, args.backend, mode=mode)
    same = bool(torch.equal(kv_out, eager_out))
    print(f"  generated: {printable(kv_out[0, prompt.shape[1]:])!r}")
    print(f"  compilations: {kv_graphs} (prefill + decode step shapes); recompiles while decoding: "
          f"{kv_recompiles}")
    print(f"  KV-cache tokens == full-recompute tokens: {same}")
    if not same:
        failures.append("KV-cache generation differs from full recompute")
    if kv_recompiles:
        failures.append(f"{kv_recompiles} recompile(s) while decoding with the KV cache")
    if mode == "reduce-overhead":
        skipped = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
        print(f"  cudagraph skips: {skipped}")
        if skipped:
            failures.append(f"{skipped} cudagraph skip(s)")
    gb = graph_breaks()
    print(f"  graph breaks (total): {gb}")
    if gb and not any("graph break" in f for f in failures):
        failures.append(f"{gb} graph break(s)")

    # (d) timings
    tok_per_step = cfg.batch * cfg.seq_len
    gen_steady = gen_times[1:] or gen_times
    print("\n(d) timings")
    print(f"  train step eager:    {eager_step * 1e3:8.1f} ms  ({tok_per_step / eager_step:9.0f} tokens/s)")
    print(f"  train step compiled: {compiled_step * 1e3:8.1f} ms  ({tok_per_step / compiled_step:9.0f} tokens/s)"
          f"  speed-up {eager_step / compiled_step:.2f}x")
    print(f"  first compiled step (compile included): {compile_time:.1f} s")
    # Medians: one full re-forward per token is short enough that a busy machine's
    # hiccups would dominate a mean.
    print(f"  generation eager:    {1 / statistics.median(eager_gen_times):8.1f} tokens/s (median per token)")
    print(f"  generation compiled: {1 / statistics.median(gen_steady):8.1f} tokens/s (median per token;"
          f" first token, compile included: {gen_times[0]:.1f} s)")
    kv_decode = kv_times[2:] or kv_times[1:] or kv_times  # after the prefill and the decode step's compile
    print(f"  generation KV cache: {prompt.shape[0] / statistics.median(kv_decode):8.1f} tokens/s (median per "
          f"decode step; prefill + compile: {kv_times[0]:.1f} s, first decode step: "
          f"{kv_times[1] if len(kv_times) > 1 else float('nan'):.1f} s)")

    if device.type == "cuda":
        attention_speed(cfg)
    else:
        print("\n(e) fusedattn vs cuDNN attention timings: skipped (they run on a GPU)")

    if failures:
        print("\nFAILED: " + "; ".join(failures))
        return 1
    print("\nOK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
