"""fusedattn's operators against the float64 reference (tests/reference.py).

The main test runs every config of conftest.MATRIX (a pairwise cover of
layouts, masks, windows, bias shapes, ALiBi, softmax types, dropout, GQA/MQA,
head dims, lengths and dtypes, plus edge cases) through forward and backward
and applies FlashAttention's rule to the output, softmax_lse, max_logit and
every gradient (dq, dk, dv, dbias, d_softmax_offset). Further tests pin down
dropout (the exact Philox mask, the keep rate, backward reusing the forward's
mask), rows without visible keys, padding that holds garbage, and gradcheck
in float64.

Cases are built on the CPU, the engine runs on conftest.DEVICE
(FUSEDATTN_TEST_DEVICE) and the reference on the CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

import fusedattn._ops as ops
import reference as R
from conftest import (ATOMIC_GRADS, MATRIX, ON_CUDA, Config, build_case, check_case, device_run, math_sdpa,
                      module_on_device, nan_problem, nan_rule_check, normalise, on_device, reference_run, rerun_tol,
                      run_op, sdpa_nan_sets, to_device, to_host, tol_check, assert_matches_reference)

FwdArgs = ops.FwdArgs


def _slow(cfg: Config) -> bool:
    return cfg.shape == "long" or max(cfg.dims) >= 192


@pytest.mark.parametrize(
    "cfg", [pytest.param(c, marks=[pytest.mark.slow] if _slow(c) else []) for c in MATRIX], ids=str)
def test_matches_reference(cfg):
    check_case(build_case(cfg))


# ---------------------------------------------------------------------------
# Dropout


def _fwd(q, k, v, args, **kw):
    """The forward op with every tensor on DEVICE; the results come back on the CPU."""
    t = dict(bias=None, softmax_offset=None, attn_mask=None, alibi_slopes=None, cu_seqlens_q=None,
             cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, rng_state=None)
    t.update(kw)
    q, k, v, t = on_device((q, k, v, t))
    return to_host(torch.ops.fusedattn.fwd(q, k, v, *t.values(), *args.op_args(), args.return_max_logit))


def _recover_keep_mask(out_rows, p, s_kv):
    """With q = 0 every visible key weighs 1/s_kv and v = I makes out[i, j] = keep[i, j] / ((1-p) s_kv)."""
    k = out_rows.double() * (1 - p) * s_kv
    keep = k.round()
    assert torch.allclose(k, keep, atol=1e-3), "output is not a scaled 0/1 mask"
    return keep.bool()


@pytest.mark.parametrize("p", [0.1, 0.3, 0.75])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd"])
def test_dropout_mask_is_the_philox_mask(layout, p):
    b, h_q, h_kv, s_q, s_kv = 2, 4, 2, 64, 128
    seed, offset = 0x1234_5678_9ABC_DEF0, (7 << 32) + 12345
    rng_state = torch.tensor([seed, offset], dtype=torch.int64)
    q = torch.zeros(b, s_q, h_q, 8)
    k = torch.randn(b, s_kv, h_kv, 8)
    v = torch.eye(s_kv).view(1, s_kv, 1, s_kv).expand(b, s_kv, h_kv, s_kv).contiguous()
    kw = {}
    if layout == "sbhd":
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    elif layout == "thd":
        q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        kw = dict(cu_seqlens_q=torch.tensor([0, s_q, 2 * s_q], dtype=torch.int32),
                  cu_seqlens_kv=torch.tensor([0, s_kv, 2 * s_kv], dtype=torch.int32))
    args = FwdArgs(scale=1.0, q_format=layout, kv_format=layout, mask_type="padding" if layout == "thd" else
                   "no_mask", dropout_p=p)
    out, _, rng_out, _ = _fwd(q, k, v, args, rng_state=rng_state, **kw)
    assert torch.equal(rng_out, rng_state)
    if layout == "sbhd":
        out = out.transpose(0, 1)
    elif layout == "thd":
        out = out.view(b, s_q, h_q, s_kv)
    got = torch.stack([_recover_keep_mask(out[bi].transpose(0, 1), p, s_kv) for bi in range(b)])  # [b,h,i,j]
    want = torch.stack([R.dropout_keep_mask(rng_state, p, bi, h_q, s_q, s_kv) for bi in range(b)])
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} elements differ from Philox"
    n = got.numel()
    rate = got.double().mean().item()
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


def test_dropout_mask_is_layout_independent():
    """Elements are addressed by (sequence, head, position), so bshd and thd with gaps drop the same ones."""
    torch.manual_seed(1)
    p, h, d = 0.4, 2, 16
    lens = [5, 9, 3]
    s = max(lens)
    rng_state = torch.tensor([99, 1 << 40], dtype=torch.int64)
    qb, kb, vb = (torch.randn(3, s, h, d) for _ in range(3))
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    args_b = FwdArgs(scale=0.3, mask_type="padding", dropout_p=p)
    ob = _fwd(qb, kb, vb, args_b, cu_seqlens_q=cu, cu_seqlens_kv=cu, rng_state=rng_state)[0]
    offs = [0, 7, 16]  # gaps of 2, 0 and 1 tokens after the sequences
    cu_pad = torch.tensor([0, 7, 16, 20], dtype=torch.int32)

    def pack(x):
        t = torch.full((20, h, d), float("nan"))
        for bi, n in enumerate(lens):
            t[offs[bi]:offs[bi] + n] = x[bi, :n]
        return t

    args_t = FwdArgs(scale=0.3, q_format="thd", kv_format="thd", mask_type="padding", dropout_p=p)
    ot = _fwd(pack(qb), pack(kb), pack(vb), args_t, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_pad,
              cu_seqlens_kv_padded=cu_pad, rng_state=rng_state)[0]
    for bi, n in enumerate(lens):
        torch.testing.assert_close(ot[offs[bi]:offs[bi] + n], ob[bi, :n], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(ot).all()


def _dropout_case(dtype="fp32", **kw):
    cfg = Config(layout="bshd", mask="causal", dropout=0.3, heads=(4, 2), dims=(32, 32), shape="self32",
                 dtype=dtype, **kw)
    return build_case(normalise(cfg))


def test_dropout_backward_uses_forward_mask():
    case = _dropout_case(bias="1hss", softmax="learnable")
    dcase = to_device(case)  # the case itself on the CPU
    rng_state = dcase.extra["rng_state"]
    original = rng_state.clone()
    out, lse, rng_out, _ = run_op(dcase)
    rng_state.add_(1)  # the op saved its own copy: changing the input afterwards changes nothing
    out.backward(dcase.dout)
    rng_state.copy_(original)
    out, got = to_host((out, {n: t.grad for n, t in dcase.leaves.items()}))
    r64, g64 = reference_run(case, torch.float64)
    rlp, glp = reference_run(case, case.dtype)
    msgs = [tol_check("out", out, r64.out, rlp.out, case.dtype)]
    msgs += [tol_check(f"d{n}", got[n], g64[n], glp[n], case.dtype) for n in got]
    assert_matches_reference(msgs)

    # The check is sensitive: a different seed gives gradients the rule rejects.
    case.extra["rng_state"] = torch.tensor([original[0].item() ^ 1, original[1].item()], dtype=torch.int64)
    r_other, g_other = reference_run(case, torch.float64)
    case.extra["rng_state"] = original.cpu()
    assert not torch.allclose(got["q"].double(), g_other["q"], atol=1e-2)


def test_dropout_bwd_op_reads_the_given_rng_state():
    case = to_device(_dropout_case())
    q, k, v = case.make_qkv(case.leaves)
    a = case.args
    out, lse, rng_out, _ = run_op(case)
    opt = [t.detach() if t is not None else None for t in case.op_tensors()[3:11]]

    def bwd(rng):
        return torch.ops.fusedattn.bwd(case.dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, rng, *opt,
                                       *a.op_args(), False, 0)

    g_same = bwd(rng_out)
    g_again = bwd(rng_out.clone())
    g_other = bwd(rng_out + torch.tensor([0, 1], device=rng_out.device))
    # dq (index 0) on the CPU; dk on CUDA, where dq accumulates with atomics (conftest.ATOMIC_GRADS).
    i, name = (1, "k") if ON_CUDA else (0, "q")
    assert torch.equal(g_same[i], g_again[i]), "bwd is not deterministic for a given rng_state"
    assert not torch.allclose(g_same[i], g_other[i]), "bwd ignores rng_state"
    out.backward(case.dout)
    torch.testing.assert_close(case.leaves[name].grad, g_same[i], rtol=0, atol=0)


def test_dropout_rng_state_follows_torch_manual_seed():
    torch.manual_seed(3)
    q, k, v = on_device([torch.randn(2, 16, 2, 16) for _ in range(3)])
    args = FwdArgs(scale=0.25, dropout_p=0.5)
    torch.manual_seed(11)
    o1, _ = ops.attention(q, k, v, args)
    torch.manual_seed(11)
    o2, _ = ops.attention(q, k, v, args)
    o3, _ = ops.attention(q, k, v, args)
    assert torch.equal(o1, o2)
    assert not torch.equal(o1, o3)


def test_no_dropout_rng_state_out_is_zeros():
    q, k, v = (torch.randn(1, 4, 2, 8) for _ in range(3))
    _, _, rng_out, ml = _fwd(q, k, v, FwdArgs(scale=0.3))
    assert rng_out.dtype == torch.int64 and torch.equal(rng_out, torch.zeros(2, dtype=torch.int64))  # on the CPU
    assert ml.shape == (0,) and ml.dtype == torch.float32


# ---------------------------------------------------------------------------
# Rows without visible keys, garbage in padding


EMPTY_ROW_CASES = [
    Config(layout="bshd", mask="causal_bottom_right", shape="cross_long_q", dtype="fp32"),
    Config(layout="bshd", mask="causal_bottom_right", shape="cross_long_q", dtype="bf16", softmax="learnable"),
    Config(layout="sbhd", mask="no_mask", window="zero", shape="cross_long_q", dtype="fp16", softmax="off-by-one"),
    Config(layout="bshd", mask="arbitrary", attn_mask_shape="bhss", shape="self17", dtype="fp32", bias="bhss"),
    Config(layout="thd", mask="padding_causal_bottom_right", seqlens="random", max_seqlen="given",
           shape="cross_long_q", dtype="fp32", bias="alibi_h"),
    Config(layout="thd_gaps", mask="padding", seqlens="empty", max_seqlen="none", shape="self17", dtype="fp16"),
]


@pytest.mark.parametrize("cfg", [normalise(c) for c in EMPTY_ROW_CASES], ids=str)
def test_rows_without_visible_keys_are_zero(cfg):
    case = build_case(cfg)
    out, lse, _, _, grads = device_run(case)
    r64, _ = reference_run(case, torch.float64)
    # rows that exist but see no key
    empty = r64.row_valid & ~r64.lse_valid  # [b, h, s] or [h, t]
    assert empty.any(), "config has no row without visible keys"
    if case.args.q_format == "thd":
        o = out.permute(1, 0, 2)  # [h, t, d]
        dq = case.make_qkv(grads)[0].permute(1, 0, 2)
    else:
        o = out if case.args.q_format == "bshd" else out.transpose(0, 1)
        o = o.permute(0, 2, 1, 3)  # [b, h, s, d]
        dq = case.make_qkv(grads)[0]
        dq = (dq if case.args.q_format == "bshd" else dq.transpose(0, 1)).permute(0, 2, 1, 3)
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert torch.equal(o[empty], torch.zeros_like(o[empty]))
    assert torch.equal(dq[empty], torch.zeros_like(dq[empty]))
    check_case(build_case(cfg))


@pytest.mark.parametrize("layout,fill", [("bshd", 1e4), ("sbhd_bshd", 1e4), ("thd_gaps", 1e4),
                                         ("thd_gaps", float("nan")), ("th3d", float("nan"))])
def test_padding_contents_are_never_read(layout, fill):
    """Padded rows (bshd) and gaps / trailing tokens (thd) may hold anything: large values, and for thd
    (whose gaps are memory nobody owns) even NaN."""
    cfg = normalise(Config(layout=layout, mask="padding_causal", seqlens="random", max_seqlen="given",
                           shape="self32", softmax="learnable", bias="alibi_bh", heads=(4, 4), dims=(32, 32)))
    case = build_case(cfg)
    with torch.no_grad():
        for name, t in case.leaves.items():
            if name in ("q", "qkv"):
                side = case.q_side
            elif name in ("k", "v", "kv"):
                side = case.kv_side
            else:
                continue
            t[~side.valid()] = fill
        case.dout[~case.q_side.valid()] = fill
    check_case(case)


# ---------------------------------------------------------------------------
# Other properties of the operator


def test_bias_without_grad_and_grad_of_bias_only():
    cfg = normalise(Config(layout="bshd", mask="causal", bias="b1ss", heads=(4, 2), shape="self17"))
    case = build_case(cfg)
    case.leaves["bias"].requires_grad_(False)
    dcase = to_device(case)  # keeps requires_grad; the case itself on the CPU
    out, *_ = run_op(dcase)
    out.backward(dcase.dout)
    assert dcase.leaves["bias"].grad is None
    r64, g64 = reference_run(case, torch.float64)
    rlp, glp = reference_run(case, torch.float32)
    assert_matches_reference([tol_check(f"d{n}", dcase.leaves[n].grad, g64[n], glp[n], torch.float32)
                              for n in ("q", "k", "v")])

    case2 = build_case(cfg)
    for n in ("q", "k", "v"):
        case2.leaves[n].requires_grad_(False)
    dcase2 = to_device(case2)
    out, *_ = run_op(dcase2)
    out.backward(dcase2.dout)
    r64, g64 = reference_run(case2, torch.float64)
    rlp, glp = reference_run(case2, torch.float32)
    assert_matches_reference([tol_check("dbias", dcase2.leaves["bias"].grad, g64["bias"], glp["bias"],
                                        torch.float32)])


def test_broadcast_dout_from_sum():
    """out.sum().backward() hands the op a stride-0 dout."""
    case = build_case(normalise(Config(layout="sbhd", mask="padding_causal", seqlens="random", heads=(4, 1),
                                       bias="11ss", softmax="off-by-one")))
    ones = torch.ones_like(case.dout)
    dcase = to_device(case)
    out, *_ = run_op(dcase)
    out.sum().backward()
    r64, g64 = reference_run(case, torch.float64, dout=ones)
    rlp, glp = reference_run(case, torch.float32, dout=ones)
    assert_matches_reference([tol_check(f"d{n}", dcase.leaves[n].grad, g64[n], glp[n], torch.float32)
                              for n in case.leaves])


def test_outputs_are_fresh_and_contiguous():
    case = to_device(build_case(normalise(Config(layout="bs3hd", mask="causal", shape="self17"))))
    out, lse, rng_out, ml = run_op(case)
    qkv = case.leaves["qkv"]
    assert out.is_contiguous() and lse.is_contiguous()
    assert out.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    out.backward(case.dout)
    dq, dk, dv, *_ = torch.ops.fusedattn.bwd(
        case.dout, *[t.detach() for t in case.make_qkv(case.leaves)], out.detach(), lse, rng_out,
        *case.op_tensors()[3:11], *case.args.op_args(), False, 0)
    for g in (dq, dk, dv):
        assert g.is_contiguous()
    assert dq.untyped_storage().data_ptr() != dk.untyped_storage().data_ptr()


def test_deterministic():
    cfg = normalise(Config(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given",
                           heads=(4, 1), bias="alibi_h", softmax="learnable", dropout=0.25, shape="self32"))
    c1, c2 = build_case(cfg), build_case(cfg)
    r1, r2 = device_run(c1), device_run(c2)
    assert torch.equal(r1[0], r2[0])
    for n in c1.leaves:
        if ON_CUDA and n in ATOMIC_GRADS:  # dq and the like accumulate with atomics on CUDA
            torch.testing.assert_close(r1[4][n], r2[4][n], **rerun_tol(n), msg=lambda m: f"d{n}: {m}")
        else:
            assert torch.equal(r1[4][n], r2[4][n]), f"d{n} differs between identical runs"


def test_float64_matches_reference():
    for cfg in [Config(layout="bshd", mask="padding_causal_bottom_right", seqlens="random", bias="bhss",
                       softmax="learnable", heads=(4, 2), dims=(16, 64), shape="cross_short_q", dtype="fp64"),
                Config(layout="thd_th2d", mask="padding", seqlens="empty", max_seqlen="none", bias="alibi_bh",
                       dropout=0.25, softmax="off-by-one", dims=(32, 32), dtype="fp64")]:
        case = build_case(normalise(cfg))
        out, lse, _, _, grads = device_run(case)
        r64, g64 = reference_run(case, torch.float64)
        # float64 throughout (docs/robustness.md); d_softmax_offset is fp32 by contract.
        torch.testing.assert_close(out, r64.out, rtol=1e-12, atol=1e-12)
        for n in case.leaves:
            tol = 1e-5 if n == "softmax_offset" else 1e-11
            torch.testing.assert_close(grads[n].double(), g64[n].double(), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------
# gradcheck in float64 on tiny shapes

GRADCHECK_CASES = [
    dict(layout="bshd", mask="causal", bias="1hss", softmax="learnable"),
    dict(layout="sbhd", mask="arbitrary", attn_mask_shape="b1ss", window="a", bias="bhss", softmax="off-by-one"),
    dict(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given", bias="alibi_bh",
         heads=(2, 1)),
    dict(layout="bs3hd", mask="no_mask", window="a", brd=False, bias="111s"),
    dict(layout="bshd_bsh2d", mask="causal_bottom_right", dropout=0.25, heads=(4, 2)),
    dict(layout="bshd", mask="padding_causal_bottom_right", seqlens="empty", dims=(8, 16), softmax="learnable",
         bias="b11s"),
    dict(layout="thd_bshd", mask="padding", seqlens="random", max_seqlen="given", bias="11ss"),
]


@pytest.mark.parametrize("kw", GRADCHECK_CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_gradcheck_float64(kw, monkeypatch):
    import conftest

    monkeypatch.setitem(conftest.SHAPES, "tiny", (2, 5, 4))
    monkeypatch.setitem(conftest.SHAPES, "tiny_self", (2, 4, 4))
    kw = dict(kw)
    kw.setdefault("heads", (2, 2))
    kw.setdefault("dims", (8, 8))
    shape = "tiny_self" if kw["layout"] in ("bs3hd",) else "tiny"
    case = to_device(build_case(normalise(Config(dtype="fp64", shape=shape, **kw))))
    # softmax_offset is fp32 by contract, too coarse for finite differences: held constant here
    # (its gradient is checked against the float64 reference in test_matches_reference).
    names = [n for n in case.leaves if n != "softmax_offset"]
    fixed = {n: t.detach() for n, t in case.leaves.items() if n == "softmax_offset"}

    def f(*tensors):
        out, *_ = run_op(case, {**dict(zip(names, tensors)), **fixed})
        return out

    # On CUDA dq accumulates with fp64 atomics: a second backward may differ in the last bits
    # (gradcheck's reentrancy check); 0 on the CPU, whose engine is bitwise deterministic.
    nondet_tol = 1e-12 if ON_CUDA else 0.0
    assert torch.autograd.gradcheck(f, tuple(case.leaves[n] for n in names), atol=1e-6, rtol=1e-5,
                                    nondet_tol=nondet_tol)


# ---------------------------------------------------------------------------
# NaN: the same positions as torch's math attention (docs/robustness.md)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("where,mask_kind", [("q", None), ("k", None), ("v", None), ("q", "causal"),
                                             ("k", "causal"), ("v", "causal"), ("k", "bool"), ("v", "bool"),
                                             ("q", "bool"), ("mask", "float"), ("dout", None), ("dout", "causal")])
def test_nan_propagates_like_torch_math(where, mask_kind, dtype):
    """NaN positions of out and the gradients: torch's math attention's on the CPU engine; on CUDA
    between what the rows see and torch's (nan_rule_check)."""
    import fusedattn

    t, mask, dout = nan_problem(where, mask_kind, dtype)
    is_causal = mask_kind == "causal"
    want, sets = sdpa_nan_sets(t["q"], t["k"], t["v"], attn_mask=mask, is_causal=is_causal, dout=dout)
    dleaves = {n: on_device(x).requires_grad_() for n, x in t.items()}
    if mask is not None and mask.dtype != torch.bool:
        dleaves["mask"] = on_device(mask).requires_grad_()
    got = fusedattn.scaled_dot_product_attention(*(dleaves[n] for n in "qkv"), is_causal=is_causal,
                                                 attn_mask=dleaves.get("mask", on_device(mask)))
    got.backward(on_device(dout.to(dtype)))
    assert sets["out"][0].any() or where == "dout"
    msgs = [nan_rule_check("out", to_host(got), *sets["out"])]
    msgs += [nan_rule_check(f"d{n}", to_host(x.grad), *sets[f"d{n}"]) for n, x in dleaves.items()]
    assert_matches_reference(msgs)
    ok = ~sets["out"][0]
    torch.testing.assert_close(to_host(got).double()[ok], want[ok], rtol=0, atol=5e-2 if dtype == torch.bfloat16
                               else 1e-5)


def test_nan_alibi_slope_and_offset():
    """A NaN ALiBi slope or learnable offset makes every row of its head NaN (their math)."""
    from fusedattn import DotProductAttention

    q, k, v = (torch.randn(2, 9, 4, 16) for _ in range(3))
    slopes = torch.rand(4)
    slopes[2] = float("nan")
    mod = module_on_device(DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal"))
    out = to_host(mod(*on_device((q, k, v)), core_attention_bias_type="alibi",
                      alibi_slopes=on_device(slopes))).view(2, 9, 4, 16)
    assert torch.isnan(out[:, :, 2]).all() and torch.isfinite(out[:, :, [0, 1, 3]]).all()
    mod = module_on_device(DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal",
                                               softmax_type="learnable"))
    with torch.no_grad():
        mod.softmax_offset[1] = float("nan")
    out = to_host(mod(*on_device((q, k, v)))).view(2, 9, 4, 16)
    assert torch.isnan(out[:, :, 1]).all() and torch.isfinite(out[:, :, [0, 2, 3]]).all()


def test_nan_in_masked_padding_is_not_read():
    """Positions outside every sequence (bshd padding, thd gaps) are never read, NaN or not."""
    cfg = normalise(Config(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given",
                           shape="self32"))
    case = build_case(cfg)
    with torch.no_grad():
        for n in ("q", "k", "v"):
            side = case.q_side if n == "q" else case.kv_side
            case.leaves[n][~side.valid()] = float("nan")
    check_case(case)


# ---------------------------------------------------------------------------
# Empty inputs: empty results and empty or zero gradients, like torch


@pytest.mark.parametrize("shapes", [
    ((0, 2, 4, 16), (0, 2, 4, 16), (0, 2, 4, 16)),  # b = 0
    ((1, 2, 0, 16), (1, 2, 4, 16), (1, 2, 4, 16)),  # s_q = 0
    ((1, 2, 4, 16), (1, 2, 0, 16), (1, 2, 0, 16)),  # s_kv = 0: zeros, like torch
    ((1, 2, 4, 0), (1, 2, 4, 0), (1, 2, 4, 0)),     # d = 0
    ((1, 0, 4, 16), (1, 0, 4, 16), (1, 0, 4, 16)),  # no heads
    ((1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 16)),    # d_qk = 0: every q.k is 0, uniform weights
], ids=["b0", "sq0", "skv0", "d0", "h0", "dqk0"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_empty_inputs_like_torch(shapes, is_causal):
    import fusedattn

    leaves = [torch.randn(s, dtype=torch.float64).requires_grad_() for s in shapes]
    want = math_sdpa(*leaves, is_causal=is_causal)
    dout = torch.randn(want.shape, dtype=torch.float64)
    want.backward(dout)
    dleaves = [on_device(x.detach().float()).requires_grad_() for x in leaves]
    got = fusedattn.scaled_dot_product_attention(*dleaves, is_causal=is_causal)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(to_host(got).double(), want.detach(), rtol=1e-5, atol=1e-6)
    got.backward(on_device(dout.float()))
    for x, ref in zip(dleaves, leaves):
        assert x.grad.shape == ref.shape
        torch.testing.assert_close(to_host(x.grad).double(), ref.grad, rtol=1e-5, atol=1e-5)


def test_op_empty_thd_and_no_keys():
    """thd with no tokens (one empty sequence, or no sequence), and backward of s_kv = 0."""
    args = FwdArgs(scale=0.25, q_format="thd", kv_format="thd", mask_type="padding", return_max_logit=True)
    for cu in (torch.tensor([0, 0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)):
        q, k, v = (torch.randn(0, 2, 16) for _ in range(3))
        out, lse, _, ml = _fwd(q, k, v, args, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        assert out.shape == (0, 2, 16) and lse.shape == (2, 0)
        assert torch.equal(ml, torch.full((2,), float("-inf")))
    case = build_case(normalise(Config(layout="bshd", shape="self17")))
    case.leaves["k"] = case.leaves["k"][:, :0].detach().requires_grad_()
    case.leaves["v"] = case.leaves["v"][:, :0].detach().requires_grad_()
    out, lse, _, _, grads = device_run(case)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, torch.full_like(lse, float("-inf")))
    assert torch.equal(grads["q"], torch.zeros_like(grads["q"])) and grads["k"].shape == (2, 0, 4, 32)


# ---------------------------------------------------------------------------
# Double backward raises (no silent zeros)


@pytest.mark.parametrize("path", ["op", "attention"])
def test_double_backward_raises(path):
    case = to_device(build_case(normalise(Config(layout="bshd", mask="causal", shape="self17", dtype="fp64",
                                                 heads=(2, 2), dims=(8, 8)))))
    q, k, v = (case.leaves[n] for n in "qkv")
    if path == "op":
        out = run_op(case)[0]
    else:
        out = ops.attention(q, k, v, case.args)[0]
    dq, = torch.autograd.grad((out * case.dout).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match=r"fusedattn: double backward"):
        torch.autograd.grad(dq.sum(), (q, k, v))

    def f(q, k, v):
        return ops.attention(q, k, v, case.args)[0]

    with pytest.raises(NotImplementedError, match=r"fusedattn: double backward"):
        torch.autograd.gradgradcheck(f, (q, k, v))


# ---------------------------------------------------------------------------
# float64 is float64-accurate


@pytest.mark.parametrize("cfg", [
    Config(layout="bshd", mask="padding_causal_bottom_right", seqlens="random", bias="bhss", softmax="learnable",
           heads=(4, 2), dims=(16, 64), shape="cross_short_q", dtype="fp64", scale=0.3),
    Config(layout="thd_th2d", mask="padding", seqlens="empty", max_seqlen="none", bias="alibi_bh", dropout=0.25,
           softmax="off-by-one", dims=(32, 32), dtype="fp64", scale=0.3),
    Config(layout="sbhd", mask="no_mask", shape="long", dims=(64, 64), dtype="fp64", scale=0.7),
], ids=str)
def test_float64_is_float64_accurate(cfg):
    case = build_case(normalise(cfg))
    out, lse, _, _, grads = device_run(case)
    r64, g64 = reference_run(case, torch.float64)
    torch.testing.assert_close(out, r64.out, rtol=1e-12, atol=1e-12)
    for n in case.leaves:
        if n != "softmax_offset":  # an fp32 parameter: its gradient is fp32
            torch.testing.assert_close(grads[n], g64[n], rtol=1e-11, atol=1e-11, msg=lambda m: f"d{n}: {m}")


def test_float64_huge_scale_like_torch():
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    want = math_sdpa(q, k, v, scale=1e39)
    import fusedattn

    got = to_host(fusedattn.scaled_dot_product_attention(*on_device((q, k, v)), scale=1e39))
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
