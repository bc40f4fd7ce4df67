"""fusedattn behind torch's SDPA flash backend (fusedattn.integrations.sdpa), on the CPU.

torch's provider mechanism overrides aten's flash operators. On the CPU that is SDPA's CPU flash
operator, which the tests here drive through unmodified F.scaled_dot_product_attention,
nn.TransformerEncoderLayer, a transformers model with attn_implementation="sdpa" and a
torch.compile'd function: outputs and gradients match the math backend by FlashAttention's rule,
the profiler shows fusedattn's operators, calls fusedattn does not take run torch's kernel, and
leaving the context restores torch's kernels and the provider active before. The CUDA overrides
cannot run here; their implementations are called directly on CPU tensors (same conversion code)
and checked against fusedattn's flash-attn API and torch's meta functions (strides, dtypes).
tests/gpu/test_sdpa_provider_gpu.py runs them through the dispatcher on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile

import fusedattn
from conftest import tol_check
from fusedattn.integrations import sdpa

reg = pytest.importorskip("torch.nn.attention._registry")
if not hasattr(reg, "register_flash_attention_impl"):
    pytest.skip("torch without the flash-attention provider registry", allow_module_level=True)

REGISTERED_ON_IMPORT = sdpa.NAME in reg.list_flash_attention_impls()
ACTIVE_ON_IMPORT = reg.current_flash_attention_impl()


def _ops_in(prof):
    return {e.name for e in prof.events() if e.name.startswith("fusedattn::")}


def test_nothing_registered_or_activated_on_import():
    assert not REGISTERED_ON_IMPORT and ACTIVE_ON_IMPORT is None
    assert sdpa.register() == "fusedattn"
    assert "fusedattn" in reg.list_flash_attention_impls()
    assert reg.current_flash_attention_impl() is None  # registered, not active


# name -> (q shape [b, h, s_q, d], kv shape [b, h_kv, s_kv, d], F.sdpa kwargs)
CASES = {
    "causal": ((2, 4, 33, 64), (2, 4, 33, 64), dict(is_causal=True)),
    "cross": ((2, 4, 9, 32), (2, 4, 23, 32), {}),
    "bool_mask": ((2, 2, 17, 32), (2, 2, 19, 32), dict(mask="bool")),
    "float_mask": ((1, 3, 12, 16), (1, 3, 12, 16), dict(mask="float")),
    "gqa": ((2, 6, 14, 32), (2, 2, 14, 32), dict(enable_gqa=True, is_causal=True)),
    "scale": ((2, 2, 8, 128), (2, 2, 8, 128), dict(scale=0.3)),
}


def _inputs(name, dtype, gen):
    qs, ks, kw = CASES[name]
    q, k, v = (torch.randn(*s, generator=gen).to(dtype) for s in (qs, ks, ks))
    kw = dict(kw)
    mask = kw.pop("mask", None)
    if mask == "bool":
        kw["attn_mask"] = torch.rand(qs[0], 1, qs[2], ks[2], generator=gen) > 0.3
    elif mask == "float":
        kw["attn_mask"] = torch.randn(qs[2], ks[2], generator=gen).to(dtype)
    return (q, k, v), kw


def _run(qkv, kw, dtype, dout):
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in qkv]
    kw = {n: (a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a) for n, a in kw.items()}
    out = F.scaled_dot_product_attention(*leaves, **kw)
    out.backward(dout.to(dtype))
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_matches_math_backend(name, dtype):
    gen = torch.Generator().manual_seed(len(name))
    qkv, kw = _inputs(name, dtype, gen)
    dout = torch.randn(*qkv[0].shape[:-1], qkv[2].shape[-1], generator=gen).to(dtype)
    with sdpa.activated(), profile() as prof:
        out, grads = _run(qkv, kw, dtype, dout)
    assert _ops_in(prof) == {"fusedattn::fwd", "fusedattn::bwd"}
    with sdpa_kernel(SDPBackend.MATH):
        ref64, g64 = _run(qkv, kw, torch.float64, dout)
        ref_lp, glp = _run(qkv, kw, dtype, dout)
    msgs = [tol_check("out", out, ref64, ref_lp, dtype)]
    msgs += [tol_check(n, g, r, l, dtype) for n, g, r, l in zip(("dq", "dk", "dv"), grads, g64, glp)]
    assert not [m for m in msgs if m], "\n".join(m for m in msgs if m)


def test_leaving_restores_torchs_kernel_and_the_previous_provider():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 32, generator=gen) for _ in range(3))
    removed = []

    class ProbeHandle:
        def remove(self):
            removed.append(True)

    reg.register_flash_attention_impl("probe", register_fn=ProbeHandle)
    reg.activate_flash_attention_impl("probe")
    try:
        with sdpa.activated():
            assert reg.current_flash_attention_impl() == "fusedattn" and removed == [True]
            with profile() as prof:
                F.scaled_dot_product_attention(q, k, v)
            assert _ops_in(prof) == {"fusedattn::fwd"}
        assert reg.current_flash_attention_impl() == "probe"
    finally:
        reg.restore_flash_attention_impl(_raise_warn=False)
    with profile() as prof:
        F.scaled_dot_product_attention(q, k, v)
    assert not _ops_in(prof)
    order = list(torch._C._get_sdp_priority_order())
    with sdpa.activated():  # twice in a row, and nested
        with sdpa.activated():
            pass
        assert reg.current_flash_attention_impl() == "fusedattn"
        # SDPA tries its flash backend first while fusedattn is active (torch prefers cuDNN on sm_90)
        assert list(torch._C._get_sdp_priority_order())[0] == int(SDPBackend.FLASH_ATTENTION)
    assert reg.current_flash_attention_impl() is None
    assert list(torch._C._get_sdp_priority_order()) == order


@pytest.mark.parametrize("what", ["head_dim_12", "dropout"])
def test_calls_fusedattn_does_not_take_run_torchs_kernel(what):
    gen = torch.Generator().manual_seed(2)
    d = 12 if what == "head_dim_12" else 32
    q, k, v = (torch.randn(2, 2, 10, d, generator=gen).requires_grad_(True) for _ in range(3))
    dropout_p = 0.3 if what == "dropout" else 0.0
    assert sdpa.support_reason(q, k, v, dropout_p, -3, cpu_op=True) is not None
    torch.manual_seed(0)
    ref = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    with sdpa.activated(), profile() as prof:
        torch.manual_seed(0)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert not _ops_in(prof)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_support_reason():
    t = torch.zeros(1, 4, 2, 64)
    assert sdpa.support_reason(t, t, t, 0.0, -3) is None
    assert "head dims 40/20" in sdpa.support_reason(torch.zeros(1, 4, 2, 40), torch.zeros(1, 4, 2, 40),
                                                    torch.zeros(1, 4, 2, 20), 0.0, -3)
    assert "dtype torch.int32" in sdpa.support_reason(t.int(), t.int(), t.int(), 0.0, -3)
    assert "3 query heads for 2 key heads" in sdpa.support_reason(torch.zeros(1, 3, 2, 64), t[:, :2], t[:, :2], 0, -3)
    assert "dropout" in sdpa.support_reason(t, t, t, 0.1, -3, cpu_op=True)
    assert sdpa.support_reason(t, t, t, 0.1, -3) is None  # the CUDA operators carry the RNG state to backward


def test_transformer_encoder_layer_matches_math():
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 7, 64, requires_grad=True)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    with sdpa_kernel(SDPBackend.MATH):
        ref = layer(x, src_key_padding_mask=pad)
        ref_grad = torch.autograd.grad(ref[~pad].sum(), x)[0]
    with sdpa.activated(), profile() as prof:
        out = layer(x, src_key_padding_mask=pad)
        grad = torch.autograd.grad(out[~pad].sum(), x)[0]
    assert _ops_in(prof) == {"fusedattn::fwd", "fusedattn::bwd"}
    torch.testing.assert_close(out[~pad], ref[~pad])
    torch.testing.assert_close(grad, ref_grad)


def test_transformers_sdpa_model_matches_math():
    T = pytest.importorskip("transformers")
    cfg = T.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(4)
    model = T.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    ids = torch.randint(1, 64, (3, 10))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        with sdpa_kernel(SDPBackend.MATH):
            ref = model(input_ids=ids, attention_mask=mask).logits
        with sdpa.activated(), profile() as prof:
            out = model(input_ids=ids, attention_mask=mask).logits
    assert "fusedattn::fwd" in _ops_in(prof)
    keep = mask.bool()
    torch.testing.assert_close(out[keep], ref[keep])


def test_compiled_sdpa_runs_fusedattn():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=gen) for _ in range(3))
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), fullgraph=True)
    with sdpa.activated(), profile() as prof:
        out = fn(q, k, v)
    assert "fusedattn::fwd" in _ops_in(prof)
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref)


# ---------------------------------------------------------------------------
# The CUDA overrides' implementations, called directly on CPU tensors


def _meta(*tensors):
    return [None if t is None else t.to("meta") for t in tensors]


def _same_layout(got, want, name):
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride(), (
        f"{name}: {tuple(got.shape)} {got.dtype} {got.stride()} vs torch's meta {tuple(want.shape)} {want.dtype} "
        f"{want.stride()}")


def test_sdpa_flash_cuda_impl_on_cpu_tensors():
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 11, 64, generator=gen)
    k, v = (torch.randn(2, 2, 11, 64, generator=gen) for _ in range(2))
    dout = torch.randn(q.shape, generator=gen)
    res = sdpa._sdpa_flash_cuda(None, q, k, v, 0.0, True, False, scale=None)
    meta = torch.ops.aten._scaled_dot_product_flash_attention(*_meta(q, k, v), 0.0, True, False)
    for i in (0, 1, 6, 7, 8):
        _same_layout(res[i], meta[i], f"output {i}")
    assert res[4:6] == (11, 11)
    grads = sdpa._sdpa_flash_cuda_backward(None, dout, q, k, v, res[0], res[1], None, None, 11, 11, 0.0, True, res[6],
                                           res[7], scale=None)
    for g, t in zip(grads, (q, k, v)):
        _same_layout(g, torch.empty_like(t), "grad")

    def math(dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
        return [out] + list(torch.autograd.grad(out, leaves, dout.to(dtype)))

    ref64, ref32 = math(torch.float64), math(torch.float32)
    msgs = [tol_check(n, g, r, l, torch.float32)
            for n, g, r, l in zip(("out", "dq", "dk", "dv"), (res[0],) + tuple(grads), ref64, ref32)]
    assert not [m for m in msgs if m], "\n".join(m for m in msgs if m)
    with pytest.raises(NotImplementedError, match="return_debug_mask=True"):
        sdpa._sdpa_flash_cuda(None, q, k, v, 0.0, True, True, scale=None)


def test_sdpa_flash_cuda_impl_dropout_carries_the_rng_to_backward():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 9, 32, generator=gen) for _ in range(3))
    torch.manual_seed(11)
    res = sdpa._sdpa_flash_cuda(None, q, k, v, 0.4, False, False, scale=None)
    torch.manual_seed(11)
    want = fusedattn.dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           qkv_format="bshd", dropout_p=0.4).view(1, 9, 2, 32).transpose(1, 2)
    torch.testing.assert_close(res[0], want, rtol=0, atol=0)
    # backward with the forward's (seed, offset): the gradient of the same dropped attention
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    torch.manual_seed(11)
    ref = fusedattn.dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                          qkv_format="bshd", dropout_p=0.4).view(1, 9, 2, 32).transpose(1, 2)
    dout = torch.randn(ref.shape, generator=gen)
    ref_grads = torch.autograd.grad(ref, (qq, kk, vv), dout)
    grads = sdpa._sdpa_flash_cuda_backward(None, dout, q, k, v, res[0], res[1], None, None, 9, 9, 0.4, False, res[6],
                                           res[7], scale=None)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.parametrize("form", ["dense", "varlen", "window", "seqused_k", "block_table"])
def test_flash_attention_forward_impl_on_cpu_tensors(form):
    gen = torch.Generator().manual_seed(8)
    h, h_k, d, scale = 4, 2, 32, 0.2
    kw = dict(scale=scale)
    if form == "dense":
        q = torch.randn(2, 6, h, d, generator=gen)
        k, v = (torch.randn(2, 10, h_k, d, generator=gen) for _ in range(2))
        pos = (None, None, 6, 10, 0.0, True, False)
        want = fusedattn.flash_attn_func(q, k, v, softmax_scale=scale, causal=True, return_attn_probs=True)
    else:
        q = torch.randn(14, h, d, generator=gen)
        k, v = (torch.randn(16, h_k, d, generator=gen) for _ in range(2))
        cu_q = torch.tensor([0, 5, 14], dtype=torch.int32)
        cu_k = torch.tensor([0, 7, 16], dtype=torch.int32)
        window = (3, 0) if form == "window" else (-1, -1)
        kw.update(window_size_left=window[0], window_size_right=window[1])
        pos = (cu_q, cu_k, 9, 9, 0.0, form != "window", False)
        if form in ("varlen", "window"):
            want = fusedattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 9, softmax_scale=scale,
                                                    causal=form == "varlen", window_size=window,
                                                    return_attn_probs=True)
        else:
            used = [4, 6]
            kw["seqused_k"] = torch.tensor(used, dtype=torch.int32)
            if form == "block_table":  # sequence i's keys: pages of 4 slots in a pool, seqused_k[i] of them
                table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)
                k, v = (torch.randn(6, 4, h_k, d, generator=gen) for _ in range(2))
                kw["block_table"] = table
                pos = (cu_q, None) + pos[2:]
                dense_k, dense_v = (t[table.long()].flatten(1, 2) for t in (k, v))
                ks = torch.cat([dense_k[i, :n] for i, n in enumerate(used)])
                vs = torch.cat([dense_v[i, :n] for i, n in enumerate(used)])
            else:  # sequence i's keys start at cu_k[i]; the first seqused_k[i] take part
                ks, vs = torch.cat([k[0:4], k[7:13]]), torch.cat([v[0:4], v[7:13]])
            want = fusedattn.flash_attn_varlen_func(q, ks, vs, cu_q, torch.tensor([0, 4, 10], dtype=torch.int32), 9,
                                                    6, softmax_scale=scale, causal=True, return_attn_probs=True)
    res = sdpa._flash_forward(None, q, k, v, *pos, **kw)
    torch.testing.assert_close(res[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(res[1], want[1], rtol=0, atol=0)
    out = torch.empty_like(q)
    lse = sdpa._flash_forward_inplace(None, out, q, k, v, *pos, **kw)
    torch.testing.assert_close(out, res[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, res[1], rtol=0, atol=0)


@pytest.mark.parametrize("form", ["dense", "varlen_window"])
def test_flash_attention_backward_impl_on_cpu_tensors(form):
    gen = torch.Generator().manual_seed(9)
    if form == "dense":
        q = torch.randn(2, 6, 4, 32, generator=gen)
        k, v = (torch.randn(2, 10, 2, 32, generator=gen) for _ in range(2))
        cu_q = cu_k = None
        max_q, max_k, causal, window = 6, 10, True, (None, None)
    else:
        q = torch.randn(14, 4, 32, generator=gen)
        k, v = (torch.randn(16, 2, 32, generator=gen) for _ in range(2))
        cu_q = torch.tensor([0, 5, 14], dtype=torch.int32)
        cu_k = torch.tensor([0, 7, 16], dtype=torch.int32)
        max_q, max_k, causal, window = 9, 9, False, (2, 1)
    res = sdpa._flash_forward(None, q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, window_size_left=window[0],
                              window_size_right=window[1])
    meta = torch.ops.aten._flash_attention_forward(*_meta(q, k, v, cu_q, cu_k), max_q, max_k, 0.0, causal, False,
                                                    window_size_left=window[0], window_size_right=window[1])
    for i in range(5):
        _same_layout(res[i], meta[i], f"output {i}")
    dout = torch.randn(q.shape, generator=gen)
    grads = sdpa._flash_backward(None, dout, q, k, v, res[0], res[1], cu_q, cu_k, max_q, max_k, 0.0, causal, res[2],
                                 res[3], window_size_left=window[0], window_size_right=window[1])
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    w = tuple(-1 if x is None else x for x in window)
    if form == "dense":
        ref = fusedattn.flash_attn_func(qq, kk, vv, causal=causal, window_size=w)
    else:
        ref = fusedattn.flash_attn_varlen_func(qq, kk, vv, cu_q, cu_k, max_q, max_k, causal=causal, window_size=w)
    for g, r in zip(grads, torch.autograd.grad(ref, (qq, kk, vv), dout)):
        torch.testing.assert_close(g, r, rtol=0, atol=0)
