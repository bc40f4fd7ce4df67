"""fusedattn behind torch's SDPA flash backend on CUDA (fusedattn.integrations.sdpa).

Inside ``sdpa.activated()`` (torch's ``activate_flash_attention_impl("fusedattn")``), unmodified
code reaches fusedattn's operators through aten's CUDA flash operators:

* F.scaled_dot_product_attention (fp16/bf16; causal, cross lengths, GQA, head dims 64-256) matches
  the math backend by FlashAttention's rule, forward and backward, and the profiler shows
  fusedattn::fwd / fusedattn::bwd; with dropout it equals fusedattn's own dropout for the same seed;
* torch.nn.attention.varlen.varlen_attn equals fusedattn.varlen_attn (windows, GQA, seqused_k);
* a stock nn.TransformerEncoderLayer and a transformers Llama with attn_implementation="sdpa"
  match the math backend;
* torch.compile(fullgraph=True) (Inductor) and CUDA-graph capture run fusedattn's kernels;
* leaving the context restores torch's flash kernel.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import fusedattn
from conftest import tol_check
from fusedattn.integrations import sdpa

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

DEV = "cuda"


def _fusedattn_ops(prof):
    return {e.name for e in prof.events() if e.name.startswith("fusedattn::")}


def _profile():
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


# name -> (q shape [b, h, s_q, d], kv shape [b, h_kv, s_kv, d], kwargs)
CASES = {
    "causal_d64": ((2, 8, 256, 64), (2, 8, 256, 64), dict(is_causal=True)),
    "cross_d128": ((2, 4, 100, 128), (2, 4, 333, 128), {}),
    "gqa_d128": ((1, 16, 512, 128), (1, 4, 512, 128), dict(is_causal=True, enable_gqa=True)),
    "d256_scale": ((2, 4, 129, 256), (2, 4, 129, 256), dict(scale=0.05)),
    "d96": ((2, 4, 64, 96), (2, 4, 80, 96), {}),
}


def _run(qkv, kw, dtype, dout):
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in qkv]
    out = F.scaled_dot_product_attention(*leaves, **kw)
    out.backward(dout.to(dtype))
    return out.detach().float().cpu(), [t.grad.float().cpu() for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_matches_math_backend(name, dtype):
    qs, ks, kw = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    qkv = [torch.randn(*s, generator=gen).to(DEV) for s in (qs, ks, ks)]
    dout = torch.randn(*qs[:-1], ks[-1], generator=gen).to(DEV)
    with sdpa.activated(), _profile() as prof:
        out, grads = _run(qkv, kw, dtype, dout)
        torch.cuda.synchronize()
    assert {"fusedattn::fwd", "fusedattn::bwd"} <= _fusedattn_ops(prof)
    with sdpa_kernel(SDPBackend.MATH):
        ref64, g64 = _run(qkv, kw, torch.float64, dout)
        ref_lp, glp = _run(qkv, kw, dtype, dout)
    msgs = [tol_check("out", out, ref64, ref_lp, dtype)]
    msgs += [tol_check(n, g, r, l, dtype) for n, g, r, l in zip(("dq", "dk", "dv"), grads, g64, glp)]
    assert not [m for m in msgs if m], "\n".join(m for m in msgs if m)
    with _profile() as prof:  # outside the context: torch's own flash kernel again
        F.scaled_dot_product_attention(*[t.to(dtype) for t in qkv], **kw)
        torch.cuda.synchronize()
    assert not _fusedattn_ops(prof)


def test_sdpa_dropout_is_fusedattns_dropout():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 128, 64, generator=gen).to(DEV, torch.bfloat16).requires_grad_(True)
               for _ in range(3))
    with sdpa.activated():
        torch.manual_seed(5)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    torch.manual_seed(5)
    want = fusedattn.dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), qkv_format="bshd",
                                           attn_mask_type="causal", dropout_p=0.2).view(2, 128, 4, 64).transpose(1, 2)
    want_grads = torch.autograd.grad(want.float().sum(), (q, k, v))
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)])
def test_torch_varlen_attn_runs_fusedattn(window):
    from torch.nn.attention.varlen import varlen_attn as torch_varlen_attn

    # GQA where torch's varlen_attn takes enable_gqa (torch 2.11's does not)
    gqa = "enable_gqa" in inspect.signature(torch_varlen_attn).parameters
    kw = dict(window_size=window, **({"enable_gqa": True} if gqa else {}))
    gen = torch.Generator().manual_seed(2)
    lens = [100, 7, 300]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(DEV)
    q = torch.randn(sum(lens), 8, 128, generator=gen).to(DEV, torch.bfloat16)
    k, v = (torch.randn(sum(lens), 2 if gqa else 8, 128, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    want = fusedattn.varlen_attn(q, k, v, cu, cu, 300, 300, **kw)
    with sdpa.activated(), _profile() as prof:
        got = torch_varlen_attn(q, k, v, cu, cu, 300, 300, **kw)
        torch.cuda.synchronize()
    assert "fusedattn::fwd" in _fusedattn_ops(prof)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _rule(pairs, dtype):
    msgs = [tol_check(n, g, r, l, dtype) for n, g, r, l in pairs]
    assert not [m for m in msgs if m], "\n".join(m for m in msgs if m)


def test_transformer_encoder_layer_matches_math():
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(512, 8, dim_feedforward=512, dropout=0.0, batch_first=True).to(DEV)
    x = torch.randn(4, 200, 512, device=DEV)

    def run(dtype, fused):
        mod = copy.deepcopy(layer).to(dtype)
        xx = x.to(dtype).requires_grad_(True)
        ctx = sdpa.activated() if fused else sdpa_kernel(SDPBackend.MATH)
        with ctx, _profile() as prof:
            out = mod(xx)
            grad = torch.autograd.grad(out.sum(), xx)[0]
            torch.cuda.synchronize()
        return out.detach().cpu(), grad.cpu(), _fusedattn_ops(prof)

    out, grad, ops = run(torch.float16, True)
    assert {"fusedattn::fwd", "fusedattn::bwd"} <= ops
    ref64, g64, _ = run(torch.float64, False)
    ref_lp, glp, _ = run(torch.float16, False)
    _rule([("out", out, ref64, ref_lp), ("dx", grad, g64, glp)], torch.float16)


def test_transformers_sdpa_model_matches_math():
    T = pytest.importorskip("transformers")
    cfg = T.LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512)
    torch.manual_seed(4)
    base = T.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).to(DEV).eval()
    ids = torch.randint(0, 128, (2, 300), device=DEV)

    def run(dtype, fused):
        model = copy.deepcopy(base).to(dtype)
        ctx = sdpa.activated() if fused else sdpa_kernel(SDPBackend.MATH)
        with torch.no_grad(), ctx, _profile() as prof:
            logits = model(input_ids=ids).logits
            torch.cuda.synchronize()
        return logits.cpu(), _fusedattn_ops(prof)

    out, ops = run(torch.bfloat16, True)
    assert "fusedattn::fwd" in ops
    _rule([("logits", out, run(torch.float64, False)[0], run(torch.bfloat16, False)[0])], torch.bfloat16)


def test_compiled_and_cuda_graph_captured_sdpa_run_fusedattn():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 8, 256, 128, generator=gen).to(DEV, torch.bfloat16) for _ in range(3))
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), fullgraph=True)
    with sdpa.activated():
        with _profile() as prof:
            out = fn(q, k, v)
            torch.cuda.synchronize()
        assert "fusedattn::fwd" in _fusedattn_ops(prof)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=0)
        F.scaled_dot_product_attention(q, k, v, is_causal=True)  # warm-up before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        graph.replay()
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
    torch.testing.assert_close(captured, want, rtol=0, atol=0)
