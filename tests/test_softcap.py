"""Logit soft-capping (FwdArgs.softcap, params.h's FwdParams::softcap): s = softcap * tanh(scale q.k / softcap),
then bias / ALiBi and the masks (flash-attn's order), against the float64 reference (tests/reference.py) with
FlashAttention's tolerance rule, and gradcheck in float64."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import Config, build_case, check_case, normalise, run_op, to_device, to_host
from fusedattn._ops import FwdArgs, attention

# A scale that makes the logits a few units large, so that a cap of 1.5 bends them.
CASES = [
    dict(layout="bshd", mask="causal", dtype="fp32", max_logit=True),
    dict(layout="bshd", mask="no_mask", bias="1hss", dtype="bf16"),
    dict(layout="sbhd", mask="arbitrary", attn_mask_shape="b1ss", window="a", bias="bhss", softmax="off-by-one",
         dtype="fp16"),
    dict(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given", bias="alibi_bh",
         heads=(4, 2), dtype="fp32"),
    dict(layout="bshd_bsh2d", mask="causal_bottom_right", dropout=0.25, heads=(4, 2), softmax="learnable",
         dtype="bf16"),
    dict(layout="bshd", mask="padding_causal", seqlens="random", dims=(64, 64), dtype="fp32"),
]


def _capped(kw, softcap):
    kw = dict(kw)
    kw.setdefault("heads", (2, 2))
    kw.setdefault("dims", (16, 16))
    kw.setdefault("scale", 0.75)
    case = build_case(normalise(Config(**kw)))
    case.args = case.args.replace(softcap=softcap)
    return case


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_softcap_matches_reference(kw):
    check_case(_capped(kw, softcap=1.5))


def test_softcap_changes_the_result():
    """Not a silent no-op: with a cap below the logits the output moves, and a huge cap is the uncapped call."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 32, dtype=torch.float64) * 2 for _ in range(3))
    args = FwdArgs(scale=1.0, mask_type="causal")
    plain, _ = attention(q, k, v, args)
    capped, _ = attention(q, k, v, args.replace(softcap=2.0))
    loose, _ = attention(q, k, v, args.replace(softcap=1e6))
    assert (plain - capped).abs().max() > 1e-2
    torch.testing.assert_close(loose, plain, rtol=1e-6, atol=1e-6)  # lse is fp32


GRADCHECK_CASES = [
    dict(layout="bshd", mask="causal", bias="1hss"),
    dict(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given", bias="alibi_bh",
         heads=(2, 1)),
    dict(layout="sbhd", mask="no_mask", window="a", brd=False, bias="111s", softmax="off-by-one"),
]


@pytest.mark.parametrize("kw", GRADCHECK_CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_softcap_gradcheck_float64(kw, monkeypatch):
    import conftest

    monkeypatch.setitem(conftest.SHAPES, "tiny", (2, 5, 4))
    kw = dict(kw, dtype="fp64", shape="tiny", dims=(8, 8))
    kw.setdefault("heads", (2, 2))
    case = to_device(_capped(kw, softcap=0.8))
    names = list(case.leaves)

    def f(*tensors):
        out, *_ = run_op(case, dict(zip(names, tensors)))
        return out

    assert torch.autograd.gradcheck(f, tuple(case.leaves[n] for n in names), atol=1e-6, rtol=1e-5,
                                    nondet_tol=1e-12 if case.dout.is_cuda else 0.0)


@pytest.mark.parametrize("softcap", [-1.0, math.inf, math.nan, 1e-50, 1e300])
def test_softcap_bad_values(softcap):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="softcap must be 0 \\(off\\) or a finite positive value"):
        attention(q, q, q, FwdArgs(scale=0.5, softcap=softcap))


def test_softcap_max_logit_is_capped():
    """max_logit reports the capped logits (what the softmax saw)."""
    q = torch.full((1, 4, 1, 8), 3.0, dtype=torch.float64)
    out, ml = attention(q, q, q, FwdArgs(scale=1.0, softcap=5.0, return_max_logit=True))
    assert ml is not None and float(to_host(ml)[0]) == pytest.approx(5.0 * math.tanh(72.0 / 5.0), rel=1e-6)


def test_softcap_through_the_module_and_the_function_compiles_in_one_graph():
    """DotProductAttention(softcap=...) and dot_product_attention(softcap=...) give the operator's capped
    result (against the float64 capped reference) and trace under torch.compile(fullgraph=True) with no
    graph break; a bad cap is refused where it is given."""
    import fusedattn
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 24, 4, 16, generator=gen, dtype=torch.float64) * 3 for _ in range(3))
    dpa = fusedattn.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal", softcap=2.0)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / 4.0
    s = 2.0 * torch.tanh(s / 2.0)
    s = s.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v).reshape(2, 24, 64)
    got = dpa(q, k, v)
    assert torch.allclose(got, want, atol=1e-10, rtol=1e-10)
    fn_out = fusedattn.dot_product_attention(q, k, v, attn_mask_type="causal", softcap=2.0)
    assert torch.equal(fn_out, got)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(dpa, fullgraph=True)
    assert torch.allclose(compiled(q, k, v), want, atol=1e-10, rtol=1e-10)
    assert sum(counters["graph_break"].values()) == 0
    with pytest.raises(ValueError, match="softcap"):
        fusedattn.DotProductAttention(4, 16, softcap=-1.0)
    with pytest.raises(TypeError, match="softcap"):
        fusedattn.dot_product_attention(q, k, v, softcap="50")
