"""Invalid calls raise clear Python exceptions that name the offending argument.

Operator level (the core's validation, raised by the binding: ValueError for
invalid arguments, NotImplementedError for unsupported configurations) and API
level (DotProductAttention, scaled_dot_product_attention).

Inputs are made on the CPU and handed to the op on conftest.DEVICE
(FUSEDATTN_TEST_DEVICE). The checks of cu_seqlens' values (monotone, within
the token dim, ...) are the CPU engine's: CUDA kernels read cu_seqlens on the
device without a host synchronisation (docs/design.md) and clamp bad lengths
instead, so those tests run on the CPU only.
"""

from __future__ import annotations

import pytest
import torch

import fusedattn
from fusedattn import DotProductAttention, FwdArgs, _ops
from conftest import DEVICE, ON_CUDA, on_device

I32 = torch.int32

cpu_engine_check = pytest.mark.skipif(
    ON_CUDA, reason="a check of cu_seqlens' values, which the CPU engine makes; CUDA kernels read cu_seqlens on "
                    "the device without a host sync and clamp lengths instead (docs/design.md)")


def op_fwd(q, k, v, args=None, **kw):
    """torch.ops.fusedattn.fwd with the tensors where they are, its errors as the Python API raises them
    (test_raw_ops_raise_runtime_error_with_the_same_message checks the raw op's)."""
    args = args or FwdArgs(scale=0.25)
    t = dict(bias=None, softmax_offset=None, attn_mask=None, alibi_slopes=None, cu_seqlens_q=None,
             cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, rng_state=None)
    t.update(kw)
    return _ops._call(torch.ops.fusedattn.fwd, q, k, v, *t.values(), *args.op_args(), args.return_max_logit)


def fwd(q, k, v, args=None, **kw):
    """op_fwd with every tensor on DEVICE."""
    q, k, v, kw = on_device((q, k, v, kw))
    return op_fwd(q, k, v, args, **kw)


def qkv(b=2, s_q=6, s_kv=6, h_q=4, h_kv=4, d=16, d_v=None, dtype=torch.float32):
    return (torch.randn(b, s_q, h_q, d, dtype=dtype), torch.randn(b, s_kv, h_kv, d, dtype=dtype),
            torch.randn(b, s_kv, h_kv, d_v or d, dtype=dtype))


def thd(t=10, h=2, d=16):
    return tuple(torch.randn(t, h, d) for _ in range(3))


THD = FwdArgs(scale=0.25, q_format="thd", kv_format="thd", mask_type="padding")


# ---------------------------------------------------------------------------
# Shapes, heads, dims, dtypes


@pytest.mark.parametrize("which,shape,match", [
    ("q", (2, 6, 16), r"\bq must be a 4-D"),
    ("k", (2, 6, 4, 16, 1), r"\bk must be a 4-D"),
    ("v", (6, 4, 16), r"\bv must be a 4-D"),
])
def test_wrong_rank(which, shape, match):
    t = dict(zip("qkv", qkv()))
    t[which] = torch.randn(*shape)
    with pytest.raises(ValueError, match=match):
        fwd(t["q"], t["k"], t["v"])


def test_wrong_rank_thd():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\bq must be a 3-D"):
        fwd(q, k[0], v[0], THD, cu_seqlens_q=torch.tensor([0, 6], dtype=I32),
            cu_seqlens_kv=torch.tensor([0, 6], dtype=I32))


def test_k_v_head_count_mismatch():
    q, k, _ = qkv(h_kv=2)
    v = torch.randn(2, 6, 4, 16)
    with pytest.raises(ValueError, match=r"k and v"):
        fwd(q, k, v)


def test_k_v_sequence_mismatch():
    q, k, _ = qkv()
    v = torch.randn(2, 7, 4, 16)
    with pytest.raises(ValueError, match=r"k and v"):
        fwd(q, k, v)


def test_q_k_head_dim_mismatch():
    q, _, v = qkv()
    k = torch.randn(2, 6, 4, 32)
    with pytest.raises(ValueError, match=r"head dim.*q 16.*k 32|q and k"):
        fwd(q, k, v)


def test_h_q_not_multiple_of_h_kv():
    q, k, v = qkv(h_q=6, h_kv=4)
    with pytest.raises(ValueError, match=r"h_q=6, h_kv=4"):
        fwd(q, k, v)


@pytest.mark.parametrize("d,d_v", [(12, 16), (16, 20), (264, 264)])
def test_unsupported_head_dims(d, d_v):
    q, k, v = qkv(d=d, d_v=d_v)
    with pytest.raises(NotImplementedError, match=r"d_qk|d_v|head dim"):
        fwd(q, k, v)


def test_batch_mismatch():
    q, _, _ = qkv()
    _, k, v = qkv(b=3)
    with pytest.raises(ValueError, match=r"batch"):
        fwd(q, k, v)


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_dtypes(which):
    t = dict(zip("qkv", qkv()))
    t[which] = t[which].half()
    with pytest.raises(ValueError, match=rf"\b{which} must have q's dtype"):
        fwd(t["q"], t["k"], t["v"])


def test_integer_dtype():
    q, k, v = (t.to(torch.int32) for t in qkv())
    with pytest.raises(ValueError, match=r"\bq must be float16, bfloat16, float32 or float64"):
        fwd(q, k, v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for a second device type")
def test_mixed_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\bk must be on the same device as q"):
        op_fwd(q.cuda(), k, v.cuda())


# ---------------------------------------------------------------------------
# cu_seqlens


def test_thd_requires_cu_seqlens():
    q, k, v = thd()
    with pytest.raises(ValueError, match=r"cu_seqlens_q"):
        fwd(q, k, v, THD)


def test_cu_seqlens_wrong_dtype():
    q, k, v = thd()
    cu = torch.tensor([0, 4, 10])
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be int32"):
        fwd(q, k, v, THD, cu_seqlens_q=cu, cu_seqlens_kv=cu.to(I32))


def test_cu_seqlens_wrong_size():
    q, k, v = thd()
    with pytest.raises(ValueError, match=r"cu_seqlens_kv must be a 1-D int32 tensor of size batch \+ 1 = 3"):
        fwd(q, k, v, THD, cu_seqlens_q=torch.tensor([0, 4, 10], dtype=I32),
            cu_seqlens_kv=torch.tensor([0, 4, 6, 10], dtype=I32))


def test_cu_seqlens_wrong_size_bshd_padding():
    q, k, v = qkv()
    args = FwdArgs(scale=0.25, mask_type="padding")
    with pytest.raises(ValueError, match=r"cu_seqlens_q"):
        fwd(q, k, v, args, cu_seqlens_q=torch.tensor([0, 3, 5, 6], dtype=I32),
            cu_seqlens_kv=torch.tensor([0, 3, 6], dtype=I32))


def test_cu_seqlens_padded_size_mismatch():
    q, k, v = thd()
    cu = torch.tensor([0, 4, 8], dtype=I32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q_padded"):
        fwd(q, k, v, THD, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=torch.tensor([0, 5], dtype=I32),
            cu_seqlens_kv_padded=torch.tensor([0, 5, 10], dtype=I32))


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_kv"])
@cpu_engine_check
def test_cu_seqlens_not_monotonic(name):
    q, k, v = thd()
    good = torch.tensor([0, 4, 10], dtype=I32)
    bad = torch.tensor([0, 6, 4], dtype=I32)
    kw = dict(cu_seqlens_q=good, cu_seqlens_kv=good)
    kw[name] = bad
    with pytest.raises(ValueError, match=name):
        fwd(q, k, v, THD, **kw)


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_kv"])
@cpu_engine_check
def test_cu_seqlens_beyond_tokens(name):
    q, k, v = thd(t=10)
    good = torch.tensor([0, 4, 10], dtype=I32)
    kw = dict(cu_seqlens_q=good, cu_seqlens_kv=good)
    kw[name] = torch.tensor([0, 4, 12], dtype=I32)
    with pytest.raises(ValueError, match=name):
        fwd(q, k, v, THD, **kw)


@cpu_engine_check
def test_cu_seqlens_not_starting_at_zero_or_negative():
    q, k, v = thd(t=10)
    good = torch.tensor([0, 4, 10], dtype=I32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fwd(q, k, v, THD, cu_seqlens_q=torch.tensor([-2, 4, 10], dtype=I32), cu_seqlens_kv=good)


@cpu_engine_check
def test_cu_seqlens_padded_overlapping_sequences():
    q, k, v = thd(t=12)
    cu = torch.tensor([0, 4, 10], dtype=I32)  # lengths 4 and 6
    padded = torch.tensor([0, 3, 10], dtype=I32)  # a 3-token slot for a 4-token sequence
    with pytest.raises(ValueError, match="cu_seqlens_q_padded"):
        fwd(q, k, v, THD, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
            cu_seqlens_kv_padded=torch.tensor([0, 5, 11], dtype=I32))


@cpu_engine_check
def test_bshd_padding_lengths_beyond_sequence_dim():
    q, k, v = qkv(s_q=6, s_kv=6)
    args = FwdArgs(scale=0.25, mask_type="padding")
    with pytest.raises(ValueError, match="cu_seqlens_kv"):
        fwd(q, k, v, args, cu_seqlens_q=torch.tensor([0, 6, 12], dtype=I32),
            cu_seqlens_kv=torch.tensor([0, 7, 12], dtype=I32))


@cpu_engine_check
def test_max_seqlen_smaller_than_a_sequence_with_bias():
    """The bias is [.., max_seqlen_q, max_seqlen_kv]: a longer sequence would read past it."""
    q, k, v = thd(t=10)
    cu = torch.tensor([0, 4, 10], dtype=I32)
    args = THD.replace(max_seqlen_q=4, max_seqlen_kv=6)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        fwd(q, k, v, args, cu_seqlens_q=cu, cu_seqlens_kv=cu, bias=torch.randn(1, 2, 4, 6))


def test_cu_seqlens_with_non_padding_mask_in_bshd():
    q, k, v = qkv()
    cu = torch.tensor([0, 3, 6], dtype=I32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is given but attn_mask_type 'causal'"):
        fwd(q, k, v, FwdArgs(scale=0.25, mask_type="causal"), cu_seqlens_q=cu, cu_seqlens_kv=cu)


# ---------------------------------------------------------------------------
# Bias, mask, ALiBi, softmax offset


@pytest.mark.parametrize("shape", [(2, 4, 6, 5), (2, 3, 6, 6), (3, 4, 6, 6), (1, 1, 1, 1), (4, 6, 6)])
def test_bias_shape_mismatch(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"core_attention_bias"):
        fwd(q, k, v, bias=torch.randn(*shape))


def test_bias_dtype_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"core_attention_bias must have q's dtype"):
        fwd(q, k, v, bias=torch.randn(1, 4, 6, 6, dtype=torch.float64))


def test_bias_and_alibi_exclusive():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"core_attention_bias and alibi_slopes"):
        fwd(q, k, v, bias=torch.randn(1, 4, 6, 6), alibi_slopes=torch.rand(4))


@pytest.mark.parametrize("slopes", [torch.rand(3), torch.rand(3, 4), torch.rand(4, dtype=torch.float64)])
def test_alibi_slopes_shape_or_dtype(slopes):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"alibi_slopes"):
        fwd(q, k, v, alibi_slopes=slopes)


def test_thd_bias_needs_max_seqlen():
    q, k, v = thd()
    cu = torch.tensor([0, 4, 10], dtype=I32)
    with pytest.raises(ValueError, match=r"max_seqlen_q and max_seqlen_kv"):
        fwd(q, k, v, THD, cu_seqlens_q=cu, cu_seqlens_kv=cu, bias=torch.randn(1, 2, 6, 6))


def test_arbitrary_mask_required_and_bool():
    q, k, v = qkv()
    arb = FwdArgs(scale=0.25, mask_type="arbitrary")
    with pytest.raises(ValueError, match=r"attention_mask"):
        fwd(q, k, v, arb)
    with pytest.raises(ValueError, match=r"attention_mask must be a bool"):
        fwd(q, k, v, arb, attn_mask=torch.zeros(2, 1, 6, 6))
    with pytest.raises(ValueError, match=r"attention_mask"):
        fwd(q, k, v, arb, attn_mask=torch.zeros(2, 1, 5, 6, dtype=torch.bool))


def test_mask_tensor_with_other_mask_type():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"attention_mask is given but attn_mask_type is 'causal'"):
        fwd(q, k, v, FwdArgs(scale=0.25, mask_type="causal"), attn_mask=torch.zeros(1, 1, 6, 6, dtype=torch.bool))


def test_learnable_softmax_offset():
    q, k, v = qkv()
    args = FwdArgs(scale=0.25, softmax_type="learnable")
    with pytest.raises(ValueError, match=r"softmax_offset"):
        fwd(q, k, v, args)
    with pytest.raises(ValueError, match=r"softmax_offset must be float32 of shape \[h_q\]"):
        fwd(q, k, v, args, softmax_offset=torch.zeros(3))
    with pytest.raises(ValueError, match=r"softmax_offset must be float32"):
        fwd(q, k, v, args, softmax_offset=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"softmax_offset is only used with softmax_type 'learnable'"):
        fwd(q, k, v, FwdArgs(scale=0.25, softmax_type="off-by-one"), softmax_offset=torch.zeros(4))


# ---------------------------------------------------------------------------
# Windows, strings, scalars, dropout


@pytest.mark.parametrize("mask,window", [
    ("causal", (-1, 3)), ("padding_causal", (2, 1)), ("causal_bottom_right", (4, 5)),
    ("no_mask", (-1, 5)), ("no_mask", (5, -1)), ("padding", (-1, 0)), ("arbitrary", (3, -1)),
    ("no_mask", (-2, -1)), ("causal", (-5, 0)),
])
def test_window_incompatible_with_mask(mask, window):
    q, k, v = qkv()
    kw = {}
    if mask == "arbitrary":
        kw["attn_mask"] = torch.zeros(1, 1, 6, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"window_size"):
        fwd(q, k, v, FwdArgs(scale=0.25, mask_type=mask, window_left=window[0], window_right=window[1]), **kw)


@pytest.mark.parametrize("field,value,match", [
    ("q_format", "bhsd", r"qkv_format must be one of 'bshd'.*got 'bhsd'"),
    ("kv_format", "bs3hd", r"qkv_format must be one of .*got 'bs3hd'"),
    ("mask_type", "causal_top_left", r"attn_mask_type must be one of .*got 'causal_top_left'"),
    ("softmax_type", "sink", r"softmax_type must be one of .*got 'sink'"),
])
def test_unknown_strings(field, value, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        fwd(q, k, v, FwdArgs(scale=0.25).replace(**{field: value}))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_dropout_out_of_range(p):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"attention_dropout must be in \[0, 1\)"):
        fwd(q, k, v, FwdArgs(scale=0.25, dropout_p=p), rng_state=torch.zeros(2, dtype=torch.int64))


def test_dropout_without_rng_state():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"rng_state is required when dropout_p > 0"):
        fwd(q, k, v, FwdArgs(scale=0.25, dropout_p=0.1))


@pytest.mark.parametrize("rng", [torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)])
def test_dropout_bad_rng_state(rng):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"rng_state must be an int64 tensor of shape \[2\]"):
        fwd(q, k, v, FwdArgs(scale=0.25, dropout_p=0.1), rng_state=rng)


@pytest.mark.parametrize("scale", [float("inf"), float("nan")])
def test_non_finite_scale(scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"softmax_scale must be finite"):
        fwd(q, k, v, FwdArgs(scale=scale))


def test_bad_max_seqlen():
    q, k, v = thd()
    cu = torch.tensor([0, 4, 10], dtype=I32)
    with pytest.raises(ValueError, match=r"max_seqlen"):
        fwd(q, k, v, THD.replace(max_seqlen_q=0, max_seqlen_kv=6), cu_seqlens_q=cu, cu_seqlens_kv=cu)


def test_raw_ops_raise_runtime_error_with_the_same_message():
    """A stable-ABI kernel's exception reaches Python as RuntimeError: direct torch.ops.fusedattn.* calls
    see that, with the message the Python API raises as ValueError (invalid argument) or
    NotImplementedError (unsupported configuration); other errors stay RuntimeError."""
    q = on_device(torch.randn(1, 4, 2, 8))
    cases = [(FwdArgs(scale=0.25, q_format="bshdx"), ValueError, "fusedattn: invalid argument: qkv_format"),
             (FwdArgs(scale=0.25, window_left=3, window_right=-1), ValueError,
              "fusedattn: invalid argument: "),
             (FwdArgs(scale=0.25, dropout_p=0.5), ValueError, "fusedattn: invalid argument: rng_state")]
    for args, kind, prefix in cases:
        call = (q, q, q, *[None] * 8, None, *args.op_args(), False)
        with pytest.raises(RuntimeError) as raw:
            torch.ops.fusedattn.fwd(*call)
        with pytest.raises(kind) as api:
            _ops._call(torch.ops.fusedattn.fwd, *call)
        assert type(raw.value) is RuntimeError and type(api.value) is kind
        assert str(raw.value) == str(api.value) and str(api.value).startswith(prefix), (str(raw.value), str(api.value))
    # Any other RuntimeError passes through as it is.
    other = RuntimeError("fusedattn::bwd on CUDA does not have a deterministic implementation")

    def raise_other():
        raise other

    with pytest.raises(RuntimeError) as e:
        _ops._call(raise_other)
    assert e.value is other


def test_raw_unsupported_configuration_is_runtime_error_with_the_same_message():
    q = torch.randn(1, 1, 2, 16)
    k = v = torch.randn(4, 4, 2, 16)  # 4 pages of 4 slots
    bias = torch.zeros(1, 2, 1, 8)
    args = FwdArgs(scale=0.25, mask_type="padding")
    call = (*on_device((q, k, v, bias)), *[None] * 3, *on_device((torch.tensor([0, 1], dtype=I32),
            torch.tensor([0, 5], dtype=I32))), None, None, None, *args.op_args(), False,
            on_device(torch.tensor([[0, 1]], dtype=I32)))
    with pytest.raises(RuntimeError) as raw:
        torch.ops.fusedattn.fwd(*call)
    with pytest.raises(NotImplementedError) as api:
        _ops._call(torch.ops.fusedattn.fwd, *call)
    assert type(raw.value) is RuntimeError and str(raw.value) == str(api.value)
    assert str(api.value).startswith("fusedattn: unsupported configuration: core_attention_bias"), str(api.value)


def test_bwd_dout_shape_and_need_dbias():
    q, k, v = on_device(qkv())
    args = FwdArgs(scale=0.25)
    out, lse, rng, _ = fwd(q, k, v, args)
    opt = [None] * 8
    with pytest.raises(ValueError, match=r"\bdout\b"):
        _ops._call(torch.ops.fusedattn.bwd, out[:, :5], q, k, v, out, lse, rng, *opt, *args.op_args(), False, 0)
    with pytest.raises(ValueError, match=r"softmax_lse"):
        _ops._call(torch.ops.fusedattn.bwd, out, q, k, v, out, lse[:, :3], rng, *opt, *args.op_args(), False, 0)
    with pytest.raises(ValueError, match=r"need_dbias"):
        _ops._call(torch.ops.fusedattn.bwd, out, q, k, v, out, lse, rng, *opt, *args.op_args(), True, 0)


# ---------------------------------------------------------------------------
# API level


def test_dpa_gqa_groups_must_divide_heads():
    with pytest.raises(ValueError, match=r"num_gqa_groups"):
        DotProductAttention(6, 16, num_gqa_groups=4)


def test_dpa_unknown_format():
    mod = DotProductAttention(2, 16, qkv_format="bhsd")
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    with pytest.raises(ValueError, match=r"qkv_format"):
        mod(q, k, v)


def test_dpa_unknown_mask_and_softmax():
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    with pytest.raises(ValueError, match=r"attn_mask_type"):
        DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="diagonal")(q, k, v)
    with pytest.raises(ValueError, match=r"softmax_type"):
        DotProductAttention(2, 16, qkv_format="bshd", softmax_type="softer")(q, k, v)


def test_dpa_window_with_causal():
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal", window_size=(-1, 3))
    with pytest.raises(ValueError, match=r"window_size"):
        mod(q, k, v)


def test_dpa_kv_heads_differ_from_module():
    mod = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd")
    q = on_device(torch.randn(1, 4, 4, 16))
    k = v = on_device(torch.randn(1, 4, 4, 16))
    with pytest.raises(ValueError, match=r"num_gqa_groups"):
        mod(q, k, v)


def test_dpa_bias_type_checks():
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask")
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    with pytest.raises(ValueError, match=r"core_attention_bias_type"):
        mod(q, k, v, core_attention_bias_type="mul_bias", core_attention_bias=on_device(torch.zeros(1, 2, 4, 4)))
    with pytest.raises(ValueError, match=r"core_attention_bias"):
        mod(q, k, v, core_attention_bias_type="post_scale_bias")
    with pytest.raises(ValueError, match=r"core_attention_bias"):
        mod(q, k, v, core_attention_bias_type="post_scale_bias",
            core_attention_bias=on_device(torch.zeros(1, 2, 5, 4)))


def test_dpa_thd_without_cu_seqlens():
    mod = DotProductAttention(2, 16, qkv_format="thd", attn_mask_type="padding")
    q, k, v = on_device([torch.randn(8, 2, 16) for _ in range(3)])
    with pytest.raises(ValueError, match=r"cu_seqlens_q"):
        mod(q, k, v)


def test_dpa_unsupported_features():
    with pytest.raises(NotImplementedError, match=r"tp_size"):
        DotProductAttention(2, 16, tp_size=2)
    mod = DotProductAttention(2, 16, qkv_format="bshd")
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    with pytest.raises(TypeError, match=r"inference_params must be a fusedattn.inference.InferenceParams"):
        mod(q, k, v, inference_params=object())


def test_sdpa_mask_with_is_causal():
    q, k, v = on_device([torch.randn(1, 2, 4, 16) for _ in range(3)])
    with pytest.raises(RuntimeError, match=r"attn_mask"):
        fusedattn.scaled_dot_product_attention(q, k, v, attn_mask=on_device(torch.ones(4, 4, dtype=torch.bool)),
                                               is_causal=True)


def test_sdpa_gqa_needs_enable_gqa():
    q = on_device(torch.randn(1, 4, 4, 16))
    k = v = on_device(torch.randn(1, 2, 4, 16))
    with pytest.raises(RuntimeError, match=r"enable_gqa"):
        fusedattn.scaled_dot_product_attention(q, k, v)


def test_sdpa_rank():
    q = on_device(torch.randn(4, 16))
    with pytest.raises(ValueError, match=r"4-D|3-D"):
        fusedattn.scaled_dot_product_attention(q, q, q)


def test_dpa_cross_attention_single_padding_mask_is_rejected():
    """One [b,1,1,s] padding mask only describes self-attention: for s_q != s_kv the keys'
    lengths would silently come from the query mask."""
    from fusedattn import DotProductAttention

    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="padding")
    q, k, v = torch.randn(2, 4, 2, 16), torch.randn(2, 6, 2, 16), torch.randn(2, 6, 2, 16)
    with pytest.raises(ValueError, match=r"attention_mask.*key/value.*\(mask_q, mask_kv\)"):
        mod(q, k, v, attention_mask=torch.zeros(2, 1, 1, 4, dtype=torch.bool))


def test_dpa_integer_padding_mask_counts_like_bool():
    """A 0/1 integer padding mask means the same as the bool mask (logical, not bitwise, not)."""
    from fusedattn import DotProductAttention

    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="padding")
    q, k, v = torch.randn(2, 4, 2, 16), torch.randn(2, 6, 2, 16), torch.randn(2, 6, 2, 16)
    mq = torch.zeros(2, 1, 1, 4, dtype=torch.bool)
    mk = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    mk[0, ..., 4:] = True
    want = mod(q, k, v, attention_mask=(mq, mk))
    got = mod(q, k, v, attention_mask=(mq.int(), mk.int()))
    assert torch.equal(got, want)
    keys_dropped = mod(q, k[:, :4], v[:, :4], attention_mask=(mq, mk[..., :4]))
    assert torch.equal(want[0], keys_dropped[0])


# ---------------------------------------------------------------------------
# 1-D arguments: read as dense arrays, so a strided view is rejected by the op (naming the
# argument) and the Python entry points hand the op contiguous tensors.


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` in every other element of a larger buffer (stride 2), on DEVICE: moving a
    strided view to another device makes it contiguous."""
    buf = torch.full((2 * t.numel(),), 99, dtype=t.dtype, device=DEVICE)
    buf[::2] = t.to(DEVICE)
    return buf[::2]


THD_PADDED = dict(cu_seqlens_q=torch.tensor([0, 4, 10], dtype=I32), cu_seqlens_kv=torch.tensor([0, 4, 10], dtype=I32),
                  cu_seqlens_q_padded=torch.tensor([0, 4, 10], dtype=I32),
                  cu_seqlens_kv_padded=torch.tensor([0, 4, 10], dtype=I32))


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
                                  "softmax_offset", "rng_state"])
def test_strided_1d_argument_is_rejected(name):
    q, k, v = thd()
    kw = dict(THD_PADDED)
    args = THD
    if name == "softmax_offset":
        args = THD.replace(softmax_type="learnable")
        kw["softmax_offset"] = torch.zeros(2)
    elif name == "rng_state":
        args = THD.replace(dropout_p=0.25)
        kw["rng_state"] = torch.tensor([5, 7], dtype=torch.int64)
    kw[name] = _strided(kw[name])
    with pytest.raises(ValueError, match=rf"\b{name} must be contiguous"):
        fwd(q, k, v, args, **kw)


def test_expanded_1d_argument_is_rejected():
    q, k, v = qkv()
    args = FwdArgs(scale=0.25, mask_type="padding")
    cu = torch.tensor([0, 6, 12], dtype=I32)
    with pytest.raises(ValueError, match=r"\bcu_seqlens_kv must be contiguous"):
        fwd(q, k, v, args, cu_seqlens_q=cu, cu_seqlens_kv=torch.tensor([6], dtype=I32, device=DEVICE).expand(3))


def test_strided_alibi_slopes_are_read_by_their_strides():
    q, k, v = qkv()
    slopes = torch.rand(4, device=DEVICE)
    ref = fwd(q, k, v, alibi_slopes=slopes)[0]
    assert torch.equal(fwd(q, k, v, alibi_slopes=_strided(slopes))[0], ref)
    assert torch.equal(fwd(q, k, v, alibi_slopes=slopes[:1].expand(4))[0],
                       fwd(q, k, v, alibi_slopes=slopes[:1].repeat(4))[0])


def test_api_passes_contiguous_1d_tensors():
    """DotProductAttention hands the op contiguous cu_seqlens / slopes: a strided view from the
    caller gives the same result as its contiguous copy."""
    mod = DotProductAttention(2, 16, qkv_format="thd", attn_mask_type="padding_causal")
    q, k, v = on_device(list(thd()))
    kw = on_device(dict(THD_PADDED))
    want = mod(q, k, v, core_attention_bias_type="alibi", alibi_slopes=on_device(torch.tensor([0.5, 0.25])), **kw)
    strided = {n: on_device(_strided(t.cpu())) for n, t in kw.items()}
    got = mod(q, k, v, core_attention_bias_type="alibi", alibi_slopes=on_device(_strided(torch.tensor([0.5, 0.25]))),
              **strided)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------
# A meta tensor among real inputs: a device error naming it, never uninitialised memory


@pytest.mark.parametrize("name", ["v", "cu_seqlens_q", "alibi_slopes"])
def test_meta_tensor_among_inputs(name):
    q, k, v = on_device(list(thd()))
    kw = on_device(dict(cu_seqlens_q=torch.tensor([0, 4, 10], dtype=I32),
                        cu_seqlens_kv=torch.tensor([0, 4, 10], dtype=I32), alibi_slopes=torch.rand(2)))
    if name == "v":
        v = v.to("meta")
    else:
        kw[name] = kw[name].to("meta")
    with pytest.raises(ValueError, match=rf"\b{name} must be on the same device as q"):
        op_fwd(q, k, v, THD, **kw)


def test_meta_tensor_in_backward():
    q, k, v = on_device(qkv())
    args = FwdArgs(scale=0.25)
    out, lse, rng, _ = op_fwd(q, k, v, args)
    with pytest.raises(ValueError, match=r"\bdout must be on the same device as q"):
        torch.ops.fusedattn.bwd(out.to("meta"), q, k, v, out, lse, rng, *[None] * 8, *args.op_args(), False, 0)


# ---------------------------------------------------------------------------
# Silent acceptance: every setting is checked where the caller gives it


def test_scale_must_be_a_number():
    q, k, v = on_device([torch.randn(1, 2, 4, 16) for _ in range(3)])
    with pytest.raises(TypeError, match=r"\bscale must be a real number"):
        fusedattn.scaled_dot_product_attention(q, k, v, scale="0.5")
    with pytest.raises(TypeError, match=r"\bsoftmax_scale must be a real number"):
        DotProductAttention(2, 16, softmax_scale="0.5")
    with pytest.raises(TypeError, match=r"\bsoftmax_scale must be a real number"):
        fusedattn.dot_product_attention(q, k, v, softmax_scale="0.5")


@pytest.mark.parametrize("window,exc", [((1, 2, 3), ValueError), ((3,), ValueError), ((1.5, 2), TypeError),
                                        ((2, True), TypeError), ((2**63, 1), ValueError), ((-2, 1), ValueError),
                                        ("ab", TypeError)])
def test_window_size_is_checked_as_given(window, exc):
    with pytest.raises(exc, match=r"\bwindow_size"):
        DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask", window_size=window)
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask")
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    with pytest.raises(exc, match=r"\bwindow_size"):
        mod(q, k, v, window_size=window)
    with pytest.raises(exc, match=r"\bwindow_size"):
        fusedattn.dot_product_attention(q, k, v, window_size=window)


@pytest.mark.parametrize("p", [-0.5, 1.0, float("nan"), "0.1"])
def test_dropout_is_checked_where_given(p):
    exc = TypeError if isinstance(p, str) else ValueError
    with pytest.raises(exc, match=r"\battention_dropout"):
        DotProductAttention(2, 16, attention_dropout=p)
    q, k, v = on_device([torch.randn(1, 2, 4, 16) for _ in range(3)])
    with pytest.raises(exc, match=r"\bdropout_p"):
        fusedattn.scaled_dot_product_attention(q, k, v, dropout_p=p)
    with pytest.raises(exc, match=r"\bdropout_p"):
        fusedattn.dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=p)


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_dpa_query_heads_and_dims_differ_from_module(fmt):
    mod = DotProductAttention(4, 16, qkv_format=fmt, attn_mask_type="padding")
    tok = (1, 4) if fmt == "bshd" else (4,)
    kw = {} if fmt == "bshd" else on_device(dict(cu_seqlens_q=torch.tensor([0, 4], dtype=I32),
                                                 cu_seqlens_kv=torch.tensor([0, 4], dtype=I32)))
    k = v = on_device(torch.randn(*tok, 4, 16))
    with pytest.raises(ValueError, match=r"query_layer has 3 heads.*num_attention_heads=4"):
        mod(on_device(torch.randn(*tok, 3, 16)), k, v, **kw)
    with pytest.raises(ValueError, match=r"query_layer has head_dim 8.*kv_channels 16"):
        mod(on_device(torch.randn(*tok, 4, 8)), k, v, **kw)


# ---------------------------------------------------------------------------
# Messages name the caller's argument as the caller wrote it


@pytest.mark.parametrize("kw,exc,match", [
    (dict(num_attention_heads=0, kv_channels=16), ValueError, r"num_attention_heads must be a positive int"),
    (dict(num_attention_heads=4, kv_channels=16, num_gqa_groups=0), ValueError,
     r"num_gqa_groups must be a positive int"),
    (dict(num_attention_heads=4, kv_channels=0), ValueError, r"kv_channels must be"),
    (dict(num_attention_heads=4, kv_channels=16, attn_mask_type=None), TypeError, r"attn_mask_type must be a str"),
    (dict(num_attention_heads=4, kv_channels=16, qkv_format=None), TypeError, r"qkv_format must be a str"),
    (dict(num_attention_heads=4, kv_channels=16, softmax_type=None), TypeError, r"softmax_type must be a str"),
])
def test_dpa_constructor_messages(kw, exc, match):
    with pytest.raises(exc, match=match):
        DotProductAttention(**kw)


def test_dpa_forward_mask_type_none_means_the_module_default():
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = on_device([torch.randn(1, 4, 2, 16) for _ in range(3)])
    assert torch.equal(mod(q, k, v, attn_mask_type=None), mod(q, k, v))
    with pytest.raises(TypeError, match=r"attn_mask_type must be a str"):
        fusedattn.dot_product_attention(q, k, v, attn_mask_type=None)


@pytest.mark.parametrize("what,match", [
    ("kv_seq", r"key \(1, 2, 4, 16\) and value \(1, 2, 5, 16\)"),
    ("qk_dim", r"query \(1, 2, 4, 16\) and key \(1, 2, 4, 32\)"),
    ("batch", r"query \(1, 2, 4, 16\) and key \(2, 2, 4, 16\)"),
    ("dtype", r"query, key and value must have the same dtype"),
    ("mask_shape", r"attn_mask of shape \(3, 4\) cannot be broadcast to \(1, 2, 4, 4\)"),
])
def test_sdpa_messages_show_the_callers_shapes(what, match):
    q = torch.randn(1, 2, 4, 16)
    k, v, m = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), None
    if what == "kv_seq":
        v = torch.randn(1, 2, 5, 16)
    elif what == "qk_dim":
        k = torch.randn(1, 2, 4, 32)
    elif what == "batch":
        k, v = torch.randn(2, 2, 4, 16), torch.randn(2, 2, 4, 16)
    elif what == "dtype":
        k = k.double()
    else:
        m = torch.zeros(3, 4)
    q, k, v, m = on_device((q, k, v, m))
    with pytest.raises(RuntimeError, match=match):
        fusedattn.scaled_dot_product_attention(q, k, v, attn_mask=m)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float64])
def test_sdpa_attn_mask_dtype_like_torch(dtype):
    """torch takes a bool mask or a float mask of query's dtype; an integer mask is no additive bias."""
    q, k, v = on_device([torch.randn(1, 2, 4, 16) for _ in range(3)])
    with pytest.raises(RuntimeError, match=r"Expected attn_mask dtype to be bool or float or to match query dtype"):
        fusedattn.scaled_dot_product_attention(q, k, v, attn_mask=on_device(torch.ones(4, 4, dtype=dtype)))


def test_padding_mask_with_wrong_batch_names_attention_mask():
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="padding")
    q, k, v = on_device([torch.randn(2, 4, 2, 16) for _ in range(3)])
    with pytest.raises(ValueError, match=r"attention_mask.* batch 3.*query_layer.* batch 2") as e:
        mod(q, k, v, attention_mask=on_device(torch.zeros(3, 1, 1, 4, dtype=torch.bool)))
    assert "cu_seqlens" not in str(e.value)


@cpu_engine_check
def test_thd_without_max_seqlen_names_the_token_dim():
    q, k, v = thd(t=10)
    with pytest.raises(ValueError, match=r"cu_seqlens_q.*token dim \(10\)") as e:
        fwd(q, k, v, THD, cu_seqlens_q=torch.tensor([0, 12], dtype=I32), cu_seqlens_kv=torch.tensor([0, 10], dtype=I32))
    assert "max_seqlen" not in str(e.value)


@cpu_engine_check
def test_paged_kv_overflow_names_the_page_table():
    q = torch.randn(1, 1, 2, 16)
    k = v = torch.randn(4, 4, 2, 16)  # 4 pages of 4 slots
    args = FwdArgs(scale=0.25, mask_type="padding")
    with pytest.raises(ValueError, match=r"cu_seqlens_kv.*9.*page_table.*2 pages of 4") as e:
        _ops._call(torch.ops.fusedattn.fwd, *on_device((q, k, v)), *[None] * 4,
                   *on_device((torch.tensor([0, 1], dtype=I32), torch.tensor([0, 9], dtype=I32))), None, None, None,
                   *args.op_args(), False, on_device(torch.tensor([[0, 1]], dtype=I32)))
    assert "sequence dim" not in str(e.value)
