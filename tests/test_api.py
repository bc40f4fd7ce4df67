"""The Python API: DotProductAttention (TransformerEngine's contract) and
fusedattn.scaled_dot_product_attention (torch's contract).

Inputs are made on the CPU and run on conftest.DEVICE (FUSEDATTN_TEST_DEVICE);
the references (tests/reference.py, torch's math SDPA) run on the CPU.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedattn
import reference as R
from fusedattn import DotProductAttention, FwdArgs
from conftest import (DPA_LAYOUTS, MATRIX, assert_matches_reference, build_case, dpa_kwargs, dpa_module,
                      module_on_device, on_device, reference_run, rerun_tol, sample_inputs, to_device, to_host,
                      tol_check)

# ---------------------------------------------------------------------------
# DotProductAttention


def test_te_defaults():
    mod = DotProductAttention(4, 32)
    assert mod.qkv_format == "sbhd"
    assert mod.attn_mask_type == "causal"
    assert mod.attention_dropout == 0.0
    assert mod.num_gqa_groups == 4
    assert mod.softmax_type == "vanilla"
    assert mod.softmax_offset is None
    assert math.isclose(mod.softmax_scale, 1 / math.sqrt(32))
    assert mod.training
    assert list(mod.parameters()) == []
    # The defaults in action: sbhd in, [s, b, h*d] out, top-left causal, 1/sqrt(d) scale.
    torch.manual_seed(0)
    q, k, v = (torch.randn(7, 2, 4, 32) for _ in range(3))
    out = to_host(mod(*on_device((q, k, v))))
    assert out.shape == (7, 2, 128)
    ref = R.attention_ref(q.double(), k.double(), v.double(),
                          FwdArgs(scale=1 / math.sqrt(32), q_format="sbhd", kv_format="sbhd", mask_type="causal"))
    torch.testing.assert_close(out, ref.out.flatten(-2).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt,shape_q,shape_kv,out_shape", [
    ("sbhd", (9, 2, 4, 32), (11, 2, 2, 32), (9, 2, 4 * 16)),
    ("bshd", (2, 9, 4, 32), (2, 11, 2, 32), (2, 9, 4 * 16)),
])
def test_output_shapes_with_distinct_v_dim(fmt, shape_q, shape_kv, out_shape):
    mod = DotProductAttention(4, (32, 16), num_gqa_groups=2, qkv_format=fmt, attn_mask_type="no_mask",
                              attention_type="cross")
    q = torch.randn(*shape_q)
    k = torch.randn(*shape_kv)
    v = torch.randn(*shape_kv[:-1], 16)
    q, k, v = on_device((q, k, v))
    out = mod(q, k, v)
    assert out.shape == out_shape and out.dtype == q.dtype


def test_thd_output_shape_and_per_call_format():
    mod = DotProductAttention(2, 16, attn_mask_type="padding_causal")  # module format sbhd, call thd
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    q, k, v = (torch.randn(10, 2, 16) for _ in range(3))
    q, k, v, cu = on_device((q, k, v, cu))
    out = mod(q, k, v, qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)
    assert out.shape == (10, 32)
    assert torch.equal(out[8:], torch.zeros_like(out[8:]))  # trailing tokens after the last sequence


@pytest.mark.parametrize("cfg", sample_inputs(
    features=("layout", "mask", "bias", "softmax", "heads", "dims", "max_logit", "max_seqlen"),
    pool=[c for c in MATRIX if c.layout in DPA_LAYOUTS and c.dropout == 0 and c.shape != "long"]), ids=str)
def test_dpa_matches_reference(cfg):
    """The module maps TransformerEngine's arguments onto the operator faithfully."""
    case = build_case(cfg)
    dcase = to_device(case)  # the case itself on the CPU
    mod = dpa_module(dcase)
    leaves = dcase.clone_leaves()
    res = mod(**dpa_kwargs(dcase, leaves))
    out, max_logit = res if cfg.max_logit else (res, None)
    out.backward(dcase.dout.flatten(-2))
    out, max_logit = to_host((out, max_logit))
    r64, g64 = reference_run(case, torch.float64)
    rlp, glp = reference_run(case, case.dtype)
    dt = case.dtype
    msgs = [tol_check("out", out, r64.out.flatten(-2), rlp.out.flatten(-2), dt)]
    if cfg.max_logit:
        assert max_logit.shape == (cfg.heads[0],) and max_logit.dtype == out.dtype
        msgs.append(tol_check("max_logit", max_logit.float(), r64.max_logit, rlp.max_logit.float(), dt,
                              where=torch.isfinite(r64.max_logit)))
    for n, t in leaves.items():
        if n == "softmax_offset":
            continue
        msgs.append(tol_check(f"d{n}", t.grad, g64[n], glp[n], dt))
    if cfg.softmax == "learnable":
        msgs.append(tol_check("d_softmax_offset", mod.softmax_offset.grad, g64["softmax_offset"],
                              glp["softmax_offset"], dt))
    assert_matches_reference(msgs)


def test_return_max_logit():
    torch.manual_seed(0)
    mod = DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal", return_max_logit=True)
    q, k, v = (torch.randn(2, 6, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    out, max_logit = to_host(mod(*on_device((q, k, v))))
    assert out.shape == (2, 6, 64)
    assert max_logit.shape == (4,) and max_logit.dtype == torch.bfloat16
    ref = R.attention_ref(q.double(), k.double(), v.double(), FwdArgs(scale=0.25, mask_type="causal"))
    torch.testing.assert_close(max_logit.double(), ref.max_logit, rtol=1e-2, atol=1e-2)


def test_learnable_softmax_offset_is_a_parameter_with_gradient():
    torch.manual_seed(0)
    mod = module_on_device(DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="no_mask",
                                               softmax_type="learnable"))
    assert isinstance(mod.softmax_offset, torch.nn.Parameter)
    assert mod.softmax_offset.shape == (4,) and mod.softmax_offset.dtype == torch.float32
    assert torch.equal(to_host(mod.softmax_offset.detach()), torch.zeros(4))
    assert [n for n, _ in mod.named_parameters()] == ["softmax_offset"]
    assert "softmax_offset" in mod.state_dict()
    with torch.no_grad():
        mod.softmax_offset.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    q, k, v = (torch.randn(2, 5, 4, 16) for _ in range(3))
    mod(*on_device((q, k, v))).square().sum().backward()
    g = to_host(mod.softmax_offset.grad)
    assert g is not None and g.shape == (4,)
    off = to_host(mod.softmax_offset.detach()).double().requires_grad_()
    ref = R.attention_ref(q.double(), k.double(), v.double(),
                          FwdArgs(scale=0.25, softmax_type="learnable"), softmax_offset=off)
    ref.out.square().sum().backward()
    torch.testing.assert_close(g.double(), off.grad, rtol=1e-4, atol=1e-5)
    # An optimizer step moves it.
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    before = mod.softmax_offset.detach().clone()
    opt.step()
    assert not torch.equal(before, mod.softmax_offset.detach())


def test_learnable_offset_survives_module_dtype_cast():
    torch.manual_seed(0)
    mod = module_on_device(DotProductAttention(2, 16, qkv_format="bshd", softmax_type="learnable").to(torch.bfloat16))
    q, k, v = (on_device(torch.randn(1, 4, 2, 16, dtype=torch.bfloat16)).requires_grad_() for _ in range(3))
    mod(q, k, v).sum().backward()
    assert mod.softmax_offset.grad is not None


def test_off_by_one_has_no_parameter():
    torch.manual_seed(0)
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask", softmax_type="off-by-one")
    assert list(mod.parameters()) == []
    q, k, v = (torch.randn(1, 4, 2, 16) for _ in range(3))
    ref = R.attention_ref(q.double(), k.double(), v.double(), FwdArgs(scale=0.25, softmax_type="off-by-one"))
    torch.testing.assert_close(to_host(mod(*on_device((q, k, v)))), ref.out.flatten(-2).float(), rtol=1e-5,
                               atol=1e-5)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    mod = DotProductAttention(2, 16, qkv_format="bshd", attention_dropout=0.5)
    q, k, v = on_device([torch.randn(1, 8, 2, 16) for _ in range(3)])
    mod.eval()
    e1, e2 = mod(q, k, v), mod(q, k, v)
    assert torch.equal(e1, e2)
    no_drop = DotProductAttention(2, 16, qkv_format="bshd")(q, k, v)
    assert torch.equal(e1, no_drop)
    mod.train()
    assert not torch.equal(mod(q, k, v), e1)


def test_packed_qkv_layer_equals_separate_tensors():
    torch.manual_seed(0)
    mod = DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    qkv = on_device(torch.randn(2, 7, 3, 4, 16)).requires_grad_()
    out = mod(qkv_layer=qkv, qkv_interleave_dim=-3)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    ref = mod(q, k, v)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2), **rerun_tol("qkv"))


def test_padding_attention_mask_equals_cu_seqlens():
    torch.manual_seed(0)
    b, s, h, d = 3, 8, 2, 16
    mod = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding")
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    lens = torch.tensor([8, 3, 5])
    pad = torch.arange(s).view(1, 1, 1, s) >= lens.view(b, 1, 1, 1)  # True = padded (TE convention)
    cu = torch.tensor([0, 8, 11, 16], dtype=torch.int32)
    q, k, v, pad, cu = on_device((q, k, v, pad, cu))
    out_mask = mod(q, k, v, attention_mask=pad)
    out_cu = mod(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    torch.testing.assert_close(out_mask, out_cu, rtol=0, atol=0)
    assert torch.equal(out_mask[1, 3:], torch.zeros_like(out_mask[1, 3:]))


def test_mask_type_aliases():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 6, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 4], dtype=torch.int32)
    q, k, v, cu = on_device((q, k, v, cu))
    outs = [DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type=m)(q, k, v, cu_seqlens_q=cu,
                                                                            cu_seqlens_kv=cu)
            for m in ("padding_causal", "padding,causal", "causal,padding", "causal_padding")]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_pre_scale_bias_is_scaled_post_scale_bias():
    torch.manual_seed(0)
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=0.3)
    q, k, v = (torch.randn(2, 5, 2, 16) for _ in range(3))
    bias = torch.randn(1, 2, 5, 5)
    q, k, v, bias = on_device((q, k, v, bias))
    pre = mod(q, k, v, core_attention_bias_type="pre_scale_bias", core_attention_bias=bias)
    post = mod(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=bias * 0.3)
    torch.testing.assert_close(pre, post, rtol=1e-6, atol=1e-6)


def test_alibi_default_slopes():
    torch.manual_seed(0)
    mod = DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = (torch.randn(1, 6, 4, 16) for _ in range(3))
    out = to_host(mod(*on_device((q, k, v)), core_attention_bias_type="alibi"))
    slopes = torch.tensor([2 ** (-8 * (i + 1) / 4) for i in range(4)], dtype=torch.float32)
    ref = R.attention_ref(q.double(), k.double(), v.double(), FwdArgs(scale=0.25, mask_type="causal"),
                          alibi_slopes=slopes)
    torch.testing.assert_close(out, ref.out.flatten(-2).float(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# scaled_dot_product_attention vs torch's


def _torch_sdpa(*args, **kw):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kw)


SDPA_CASES = [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, s_q=5, s_kv=9),
    dict(is_causal=True, s_q=9, s_kv=5),
    dict(mask="bool", mask_shape=(2, 1, 7, 11)),
    dict(mask="bool", mask_shape=(7, 11)),
    dict(mask="bool_empty_rows", mask_shape=(2, 4, 7, 11)),
    dict(mask="float", mask_shape=(2, 4, 7, 11)),
    dict(mask="float", mask_shape=(1, 1, 7, 11), grad_mask=True),
    dict(mask="float", mask_shape=(11,), grad_mask=True),
    dict(enable_gqa=True, h_kv=2),
    dict(enable_gqa=True, h_kv=1, is_causal=True, scale=0.7),
    dict(scale=0.05),
    dict(d_v=32),
    dict(unbatched=True, is_causal=True),
]


@pytest.mark.parametrize("kw", SDPA_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_sdpa_matches_torch(kw):
    torch.manual_seed(0)
    kw = dict(kw)
    b, h_q, s_q, s_kv, d = 2, 4, kw.pop("s_q", 7), kw.pop("s_kv", 11), 16
    h_kv, d_v = kw.pop("h_kv", h_q), kw.pop("d_v", d)
    mask_kind, mask_shape, grad_mask = kw.pop("mask", None), kw.pop("mask_shape", None), kw.pop("grad_mask", False)
    unbatched = kw.pop("unbatched", False)
    q = torch.randn(b, h_q, s_q, d)
    k = torch.randn(b, h_kv, s_kv, d)
    v = torch.randn(b, h_kv, s_kv, d_v)
    if unbatched:
        q, k, v = q[0], k[0], v[0]
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(*mask_shape) > 0.3
    elif mask_kind == "bool_empty_rows":
        mask = torch.rand(*mask_shape) > 0.3
        mask[:, :, 2] = False  # rows that attend to nothing: torch returns zeros there
    elif mask_kind == "float":
        mask = torch.randn(*mask_shape)
    ins = [q, k, v] + ([mask] if mask is not None else [])
    ins_a = [on_device(t.clone()).requires_grad_(t.is_floating_point() and (i < 3 or grad_mask))
             for i, t in enumerate(ins)]  # fusedattn's, on the device
    ins_b = [t.clone().requires_grad_(t.is_floating_point() and (i < 3 or grad_mask))
             for i, t in enumerate(ins)]  # torch's, on the CPU
    extra_a = dict(attn_mask=ins_a[3]) if mask is not None else {}
    extra_b = dict(attn_mask=ins_b[3]) if mask is not None else {}
    out = fusedattn.scaled_dot_product_attention(*ins_a[:3], **extra_a, **kw)
    ref = _torch_sdpa(*ins_b[:3], **extra_b, **kw)
    assert out.shape == ref.shape
    torch.testing.assert_close(to_host(out), ref, rtol=1e-5, atol=1e-5)
    dout = torch.randn_like(ref)
    out.backward(on_device(dout))
    ref.backward(dout)
    for a, r in zip(ins_a, ins_b):
        if r.requires_grad:
            torch.testing.assert_close(to_host(a.grad), r.grad, rtol=1e-5, atol=1e-5)


def test_sdpa_output_layout_matches_torch_contract():
    q, k, v = on_device([torch.randn(2, 4, 6, 16) for _ in range(3)])
    out = fusedattn.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 4, 6, 16) and out.dtype == q.dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_low_precision_within_flash_rule(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 33, 64, dtype=dtype) for _ in range(3))
    out = to_host(fusedattn.scaled_dot_product_attention(*on_device((q, k, v)), is_causal=True))
    ref64 = _torch_sdpa(q.double(), k.double(), v.double(), is_causal=True)
    ref_lp = _torch_sdpa(q, k, v, is_causal=True)
    assert_matches_reference([tol_check("out", out, ref64, ref_lp, dtype)])


def test_sdpa_dropout_keeps_expected_fraction():
    """Dropout applies whenever dropout_p > 0 (torch's functional contract) and follows manual_seed."""
    torch.manual_seed(0)
    s = 128
    q = torch.zeros(1, 2, 64, 16)
    k = torch.randn(1, 2, s, 16)
    v = torch.eye(s).expand(1, 2, s, s).contiguous()
    q, k, v = on_device((q, k, v))
    torch.manual_seed(5)
    out = fusedattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(5)
    again = fusedattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    assert torch.equal(out, again)
    keep = (out * 0.8 * s).round()
    assert torch.allclose(out * 0.8 * s, keep, atol=1e-3)
    rate = keep.mean().item()
    n = keep.numel()
    assert abs(rate - 0.8) < 5 * math.sqrt(0.2 * 0.8 / n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_eager_autograd_equals_operator_autograd(dtype):
    """attention() runs eager backward through its own autograd.Function (less host time per
    call) and compiled code through the operator's registered autograd: both must give the same
    gradients, bit for bit, including dbias, the learnable softmax offset's gradient and a
    non-contiguous dout."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 7, 4, 16, generator=gen, dtype=dtype) for _ in range(3))
    bias = torch.randn(1, 4, 7, 7, generator=gen, dtype=dtype)
    off = torch.randn(4, generator=gen, dtype=torch.float32)
    dout = torch.randn(2, 4, 7, 16, generator=gen, dtype=dtype).transpose(1, 2)  # not contiguous
    args = FwdArgs(scale=0.25, mask_type="causal", softmax_type="learnable")
    leaves = [on_device(t).requires_grad_() for t in (q, k, v, bias, off)]
    out, _ = fusedattn._ops.attention(*leaves[:3], args, bias=leaves[3], softmax_offset=leaves[4])
    got = torch.autograd.grad(out, leaves, on_device(dout))
    leaves2 = [t.detach().clone().requires_grad_() for t in leaves]
    out2 = torch.ops.fusedattn.fwd(*leaves2[:3], leaves2[3], leaves2[4], None, None, None, None, None, None, None,
                                   *args.op_args(), False)[0]
    want = torch.autograd.grad(out2, leaves2, on_device(dout))
    assert torch.equal(out, out2)
    for name, g, w in zip(("dq", "dk", "dv", "dbias", "d_softmax_offset"), got, want):
        assert torch.equal(g, w), name


def test_sdpa_autograd_graph_has_only_the_attention_node():
    """The SDPA wrapper's [b, h, s, d] tensors reach the operator as bshd views inside its
    autograd.Function: out's node is the attention's own, straight onto q, k and v (no transpose
    nodes, which cost host time per call), and its gradients equal torch's."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=gen) for _ in range(3))
    leaves = [on_device(t).requires_grad_() for t in (q, k, v)]
    out = fusedattn.scaled_dot_product_attention(*leaves, is_causal=True)
    assert type(out.grad_fn).__name__ == "_AttentionBackward"
    nexts = [fn for fn, _ in out.grad_fn.next_functions if fn is not None]
    assert [type(fn).__name__ for fn in nexts] == ["AccumulateGrad"] * 3
    assert [fn.variable for fn in nexts] == leaves
    assert out.shape == (2, 4, 9, 16) and out.transpose(1, 2).is_contiguous()
    dout = torch.randn(2, 4, 9, 16, generator=gen)
    got = torch.autograd.grad(out, leaves, on_device(dout))
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(_torch_sdpa(*ref_leaves, is_causal=True), ref_leaves, dout)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape, name
        torch.testing.assert_close(to_host(g), w, rtol=1e-5, atol=1e-5)
