"""The float64 reference checked on its own, independently of the engine.

Every feature of tests/reference.py is compared with torch's math SDPA (masks
and biases built here by plain Python loops), and its Philox with values from
a C program compiled from csrc/core/include/fusedattn/philox.h. This module
imports nothing from fusedattn, so it runs before the extension is built.
"""

from __future__ import annotations

import math
import random
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import reference as R

REPO = Path(__file__).resolve().parents[1]
PHILOX_H = REPO / "csrc" / "core" / "include" / "fusedattn" / "philox.h"


def args_(**kw):
    base = dict(scale=0.3, q_format="bshd", kv_format="bshd", mask_type="no_mask", window_left=-1,
                window_right=-1, bottom_right_diagonal=None, softmax_type="vanilla", dropout_p=0.0,
                max_seqlen_q=None, max_seqlen_kv=None, return_max_logit=False)
    base.update(kw)
    return SimpleNamespace(**base)


def sdpa_math(q, k, v, mask=None, scale=None, is_causal=False, enable_gqa=False):
    """torch math SDPA on bshd tensors."""
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, scale=scale, is_causal=is_causal,
                                           enable_gqa=enable_gqa)
    return o.transpose(1, 2)


def rand(*shape, req=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=req)


def grads_of(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout, allow_unused=True)


def assert_close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def loop_visible(lq, lk, wl, wr, bottom_right):
    """Visibility by the definition, element by element."""
    diag = lk - lq if bottom_right else 0
    m = torch.zeros(lq, lk, dtype=torch.bool)
    for i in range(lq):
        for j in range(lk):
            ok = True
            if wl >= 0 and j < i + diag - wl:
                ok = False
            if wr >= 0 and j > i + diag + wr:
                ok = False
            m[i, j] = ok
    return m


# ---------------------------------------------------------------------------
# Philox


# Values printed by a C++ program that includes philox.h (dropout_draws(seed,
# offset, bh, i, j_group)); the first is Random123's known-answer test for
# Philox4x32-10 with zero counter and key.
PHILOX_KAT = {
    (0, 0, 0, 0, 0): (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
    (1, 0, 0, 0, 0): (0xE3E80670, 0xE50A0EBC, 0x95F222C0, 0xB615AA27),
    (123456789, 987654321, 5, 17, 3): (0x9B7C31F8, 0x874C673F, 0x19E988DB, 0xE44E8031),
    (9223372036854775807, 81985529216486895, 1000, 4095, 1023): (0xC2D8602C, 0x4E41C11B, 0xE18E5838, 0x8B47EE5D),
    (4611686014132420609, 21474836487, 7, 129, 31): (0xEB9A034D, 0x7CB1C0D4, 0x035A5CC6, 0x284C2198),
    (42, 1099511627776, 3, 2, 1): (0xCF3191B6, 0xB19B0F10, 0x7F250891, 0x552B5AC1),
}


@pytest.mark.parametrize("key", list(PHILOX_KAT), ids=str)
def test_philox_known_answers(key):
    seed, offset, bh, i, jg = key
    got = [R.dropout_draws(seed, offset, torch.tensor(bh), torch.tensor(i), torch.tensor(4 * jg + w)).item()
           for w in range(4)]
    assert got == list(PHILOX_KAT[key])


@pytest.mark.parametrize("p,thr", [(0.1, 429496736), (0.5, 2147483648), (0.9999999, 4294966784),
                                   (1.0, 4294967295), (0.3, 1288490240), (0.0, 0)])
def test_dropout_threshold_matches_philox_h(p, thr):
    # Thresholds printed by philox.h's dropout_threshold(float p).
    assert R.dropout_threshold(p) == thr


_C_DRIVER = r"""
#include "fusedattn/philox.h"
#include <cstdio>
int main() {
  long long seed, offset, bh, i, j;
  while (std::scanf("%lld %lld %lld %lld %lld", &seed, &offset, &bh, &i, &j) == 5) {
    auto r = fusedattn::dropout_draws(seed, offset, bh, i, j >> 2);
    std::printf("%u %d\n", r.x[j & 3], (int)fusedattn::dropout_keep(seed, offset, bh, i, j,
                                                                     fusedattn::dropout_threshold(0.25f)));
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile philox.h")
def test_philox_matches_compiled_header(tmp_path):
    src = tmp_path / "philox_driver.cc"
    src.write_text(_C_DRIVER)
    exe = tmp_path / "philox_driver"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{PHILOX_H.parents[1]}", str(src), "-o", str(exe)], check=True)
    rng = random.Random(7)
    rows = []
    for _ in range(400):
        rows.append((rng.randrange(-2**63, 2**63), rng.randrange(-2**63, 2**63), rng.randrange(0, 2**20),
                     rng.randrange(0, 2**16), rng.randrange(0, 2**16)))
    rows += [(0, 0, 0, 0, j) for j in range(8)] + [(-1, -1, 2**31, 2**31 - 1, 2**31 - 1)]
    stdin = "\n".join(" ".join(str(x) for x in r) for r in rows) + "\n"
    res = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True)
    want = [tuple(int(x) for x in line.split()) for line in res.stdout.strip().splitlines()]
    seed = [r[0] for r in rows]
    got = [R.dropout_draws(r[0], r[1], torch.tensor(r[2]), torch.tensor(r[3]), torch.tensor(r[4])).item()
           for r in rows]
    thr = R.dropout_threshold(0.25)
    assert len(want) == len(rows) == len(seed)
    assert got == [w[0] for w in want]
    assert [int(g >= thr) for g in got] == [w[1] for w in want]


def test_keep_rate_of_reference_mask():
    p = 0.3
    keep = torch.stack([R.dropout_keep_mask((1234, 99), p, b, 4, 64, 64) for b in range(4)])
    n = keep.numel()
    rate = keep.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) < 5 * sigma
    # Different sequences and heads draw different masks.
    assert not torch.equal(keep[0, 0], keep[0, 1])
    assert not torch.equal(keep[0], keep[1])


# ---------------------------------------------------------------------------
# Attention vs torch math SDPA


@pytest.mark.parametrize("s_q,s_kv", [(7, 7), (5, 11), (11, 5)])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right"])
def test_reference_masks_vs_sdpa(s_q, s_kv, mask_type):
    torch.manual_seed(0)
    b, h, d = 2, 3, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, 16)
    dout = torch.randn(b, s_q, h, 16, dtype=torch.float64)
    ref = R.attention_ref(q, k, v, args_(mask_type=mask_type, scale=0.37))
    vis = loop_visible(s_q, s_kv, -1, -1 if mask_type == "no_mask" else 0, mask_type == "causal_bottom_right")
    rows = vis.any(-1)
    exp = sdpa_math(q, k, v, mask=vis, scale=0.37)
    # math SDPA gives NaN on rows with no visible key; the reference gives zeros.
    exp = torch.where(rows.view(1, -1, 1, 1), exp, torch.zeros(()))
    assert_close(ref.out, exp)
    assert torch.equal(ref.out[:, ~rows], torch.zeros_like(ref.out[:, ~rows]))
    g_ref = grads_of(ref.out, (q, k, v), dout)
    g_exp = grads_of(exp, (q, k, v), dout)
    for a, e in zip(g_ref, g_exp):
        assert torch.isfinite(a).all()
        assert_close(a, torch.nan_to_num(e, nan=0.0))


def test_reference_top_left_causal_is_torch_is_causal():
    torch.manual_seed(1)
    q, k, v = rand(1, 6, 2, 8), rand(1, 9, 2, 8), rand(1, 9, 2, 8)
    ref = R.attention_ref(q, k, v, args_(mask_type="causal", scale=0.5))
    assert_close(ref.out, sdpa_math(q, k, v, scale=0.5, is_causal=True))


@pytest.mark.parametrize("mask_type,wl,wr,brd", [
    ("no_mask", 2, 1, None), ("no_mask", 0, 0, None), ("no_mask", 3, 2, False), ("causal", 2, 0, None),
    ("causal_bottom_right", 1, 0, None), ("arbitrary", 2, 3, True), ("padding", 4, 0, None)])
@pytest.mark.parametrize("s_q,s_kv", [(9, 9), (6, 13), (13, 6)])
def test_reference_windows_vs_sdpa(mask_type, wl, wr, brd, s_q, s_kv):
    torch.manual_seed(2)
    b, h, d = 2, 2, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    attn_mask = None
    if mask_type == "arbitrary":
        attn_mask = torch.rand(b, 1, s_q, s_kv) < 0.3
    ref = R.attention_ref(q, k, v, args_(mask_type=mask_type, window_left=wl, window_right=wr,
                                         bottom_right_diagonal=brd, scale=0.4), attn_mask=attn_mask)
    bottom_right = {"causal": False, "causal_bottom_right": True}.get(mask_type, True if brd is None else brd)
    vis = loop_visible(s_q, s_kv, wl, wr, bottom_right).expand(b, h, s_q, s_kv)
    if attn_mask is not None:
        vis = vis & ~attn_mask
    rows = vis.any(-1)  # [b, h, s_q]
    exp = sdpa_math(q, k, v, mask=vis, scale=0.4)
    exp = torch.where(rows.transpose(1, 2).unsqueeze(-1), exp, torch.zeros(()))
    assert_close(ref.out, exp)
    dout = torch.randn_like(exp)
    for a, e in zip(grads_of(ref.out, (q, k, v), dout), grads_of(exp, (q, k, v), dout)):
        assert torch.isfinite(a).all()
        assert_close(a, torch.nan_to_num(e, nan=0.0))


@pytest.mark.parametrize("bias_shape", ["bhss", "1hss", "b1ss", "11ss", "111s", "b11s"])
def test_reference_bias_vs_sdpa(bias_shape):
    torch.manual_seed(3)
    b, h, s_q, s_kv, d = 2, 3, 5, 7, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    shape = [b if bias_shape[0] == "b" else 1, h if bias_shape[1] == "h" else 1,
             s_q if bias_shape[2] == "s" else 1, s_kv]
    bias = rand(*shape)
    ref = R.attention_ref(q, k, v, args_(mask_type="causal_bottom_right", scale=0.2), bias=bias)
    vis = loop_visible(s_q, s_kv, -1, 0, True)
    add = torch.where(vis, bias, torch.tensor(float("-inf"), dtype=torch.float64))
    exp = sdpa_math(q, k, v, mask=add, scale=0.2)
    assert_close(ref.out, exp)
    dout = torch.randn_like(exp)
    for a, e in zip(grads_of(ref.out, (q, k, v, bias), dout), grads_of(exp, (q, k, v, bias), dout)):
        assert_close(a, e)


@pytest.mark.parametrize("slopes_shape", ["h", "bh"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right"])
def test_reference_alibi_vs_sdpa(slopes_shape, mask_type):
    torch.manual_seed(4)
    b, h, s_q, s_kv, d = 2, 4, 5, 8, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    slopes = torch.rand(h if slopes_shape == "h" else (b, h), dtype=torch.float32)
    ref = R.attention_ref(q, k, v, args_(mask_type=mask_type, scale=0.3), alibi_slopes=slopes)
    bottom_right = mask_type != "causal"
    diag = s_kv - s_q if bottom_right else 0
    add = torch.zeros(b, h, s_q, s_kv, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            sl = float(slopes[hi] if slopes.dim() == 1 else slopes[bi, hi])
            for i in range(s_q):
                for j in range(s_kv):
                    add[bi, hi, i, j] = -sl * abs(j - i - diag)
    vis = loop_visible(s_q, s_kv, -1, -1 if mask_type == "no_mask" else 0, bottom_right)
    add = torch.where(vis, add, torch.tensor(float("-inf"), dtype=torch.float64))
    exp = sdpa_math(q, k, v, mask=add, scale=0.3)
    assert_close(ref.out, exp)


@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (6, 1)])
def test_reference_gqa_vs_sdpa(h_q, h_kv):
    torch.manual_seed(5)
    q, k, v = rand(2, 5, h_q, 8), rand(2, 6, h_kv, 8), rand(2, 6, h_kv, 16)
    ref = R.attention_ref(q, k, v, args_(scale=0.25))
    exp = sdpa_math(q, k, v, scale=0.25, enable_gqa=True)
    assert_close(ref.out, exp)
    dout = torch.randn_like(exp)
    for a, e in zip(grads_of(ref.out, (q, k, v), dout), grads_of(exp, (q, k, v), dout)):
        assert_close(a, e)


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal_bottom_right"])
def test_reference_sink_vs_sdpa_with_extra_key(softmax_type, mask_type):
    """A sink is an extra key with logit sink[h] and a zero value."""
    torch.manual_seed(6)
    b, h, s_q, s_kv, d = 2, 3, 4, 6, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    offset = torch.randn(h, dtype=torch.float32, requires_grad=True) if softmax_type == "learnable" else None
    # s_q > ... : make row 0 fully masked for causal_bottom_right by s_q > s_kv? keep s_q < s_kv here.
    ref = R.attention_ref(q, k, v, args_(mask_type=mask_type, softmax_type=softmax_type, scale=0.3),
                          softmax_offset=offset)
    sink = offset.double() if offset is not None else torch.zeros(h, dtype=torch.float64)
    k_ext = torch.cat([k, torch.zeros(b, 1, h, d, dtype=torch.float64)], 1)
    v_ext = torch.cat([v, torch.zeros(b, 1, h, d, dtype=torch.float64)], 1)
    vis = loop_visible(s_q, s_kv, -1, -1 if mask_type == "no_mask" else 0, True)
    add = torch.where(vis, torch.zeros(()), torch.tensor(float("-inf"), dtype=torch.float64))
    add = add.expand(b, h, s_q, s_kv)
    add = torch.cat([add, sink.view(1, h, 1, 1).expand(b, h, s_q, 1)], -1)
    exp = sdpa_math(q, k_ext, v_ext, mask=add, scale=0.3)
    assert_close(ref.out, exp)
    dout = torch.randn_like(exp)
    ins = (q, k, v) + ((offset,) if offset is not None else ())
    for a, e in zip(grads_of(ref.out, ins, dout), grads_of(exp, ins, dout)):
        assert_close(a.double(), e.double(), tol=1e-6 if a.dtype == torch.float32 else 1e-10)
    # lse includes the sink.
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * 0.3
    logits = torch.where(vis, logits, torch.tensor(float("-inf"), dtype=torch.float64))
    lse = torch.logsumexp(torch.cat([logits, sink.view(1, h, 1, 1).expand(b, h, s_q, 1)], -1), -1)
    assert_close(ref.lse, lse)


def test_reference_sink_rows_without_keys_are_zero():
    torch.manual_seed(7)
    q, k, v = rand(1, 7, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8)
    offset = torch.randn(2, requires_grad=True)
    ref = R.attention_ref(q, k, v, args_(mask_type="causal_bottom_right", softmax_type="learnable"),
                          softmax_offset=offset)
    # Rows 0..3 see no key (diag = -4).
    assert torch.equal(ref.out[:, :4], torch.zeros_like(ref.out[:, :4]))
    assert not ref.lse_valid[0, :, :4].any() and ref.lse_valid[0, :, 4:].all()
    g = grads_of(ref.out, (q, k, v, offset), torch.randn_like(ref.out))
    assert all(torch.isfinite(x).all() for x in g)
    assert torch.equal(g[0][:, :4], torch.zeros_like(g[0][:, :4]))


def _pack_thd(seqs, gaps):
    """Concatenate [len, h, d] sequences with `gaps` garbage tokens after each."""
    h, d = seqs[0].shape[1:]
    parts, cu, cu_pad = [], [0], [0]
    for s, g in zip(seqs, gaps):
        parts.append(s)
        parts.append(torch.full((g, h, d), 1e4, dtype=s.dtype))
        cu.append(cu[-1] + s.shape[0])
        cu_pad.append(cu_pad[-1] + s.shape[0] + g)
    return torch.cat(parts), torch.tensor(cu, dtype=torch.int32), torch.tensor(cu_pad, dtype=torch.int32)


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("gaps", [False, True])
def test_reference_thd_vs_per_sequence_sdpa(mask_type, gaps):
    torch.manual_seed(8)
    h, d = 2, 8
    lq, lk = [3, 5, 1, 4], [4, 2, 6, 0]
    qs = [torch.randn(n, h, d, dtype=torch.float64) for n in lq]
    ks = [torch.randn(n, h, d, dtype=torch.float64) for n in lk]
    vs = [torch.randn(n, h, d, dtype=torch.float64) for n in lk]
    g = [1, 0, 2, 3] if gaps else [0] * 4
    q, cq, cqp = _pack_thd(qs, g)
    k, ck, ckp = _pack_thd(ks, g)
    v, _, _ = _pack_thd(vs, g)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    a = args_(q_format="thd", kv_format="thd", mask_type=mask_type, scale=0.3)
    ref = R.attention_ref(q, k, v, a, cu_seqlens_q=cq, cu_seqlens_kv=ck,
                          cu_seqlens_q_padded=cqp if gaps else None, cu_seqlens_kv_padded=ckp if gaps else None)
    dout = torch.randn_like(ref.out)
    gq, gk, gv = grads_of(ref.out, (q, k, v), dout)
    offs_q = cqp if gaps else cq
    offs_k = ckp if gaps else ck
    covered_q = torch.zeros(q.shape[0], dtype=torch.bool)
    covered_k = torch.zeros(k.shape[0], dtype=torch.bool)
    for bi in range(4):
        oq, ok_ = int(offs_q[bi]), int(offs_k[bi])
        covered_q[oq:oq + lq[bi]] = True
        covered_k[ok_:ok_ + lk[bi]] = True
        qb = q[oq:oq + lq[bi]].detach().clone().requires_grad_()
        kb = k[ok_:ok_ + lk[bi]].detach().clone().requires_grad_()
        vb = v[ok_:ok_ + lk[bi]].detach().clone().requires_grad_()
        wr = -1 if mask_type == "padding" else 0
        vis = loop_visible(lq[bi], lk[bi], -1, wr, mask_type != "padding_causal")
        rows = vis.any(-1)
        if lk[bi] == 0:
            exp = torch.zeros(lq[bi], h, d, dtype=torch.float64)
        else:
            exp = sdpa_math(qb[None], kb[None], vb[None], mask=vis, scale=0.3)[0]
            exp = torch.where(rows.view(-1, 1, 1), exp, torch.zeros(()))
        assert_close(ref.out[oq:oq + lq[bi]], exp)
        if lk[bi] > 0:
            db = dout[oq:oq + lq[bi]]
            eq, ek, ev = grads_of(exp, (qb, kb, vb), db)
            assert_close(gq[oq:oq + lq[bi]], torch.nan_to_num(eq, nan=0.0))
            assert_close(gk[ok_:ok_ + lk[bi]], torch.nan_to_num(ek, nan=0.0))
            assert_close(gv[ok_:ok_ + lk[bi]], torch.nan_to_num(ev, nan=0.0))
    # Gaps: zero output and zero gradients.
    assert torch.equal(ref.out[~covered_q], torch.zeros_like(ref.out[~covered_q]))
    assert torch.equal(gq[~covered_q], torch.zeros_like(gq[~covered_q]))
    assert torch.equal(gk[~covered_k], torch.zeros_like(gk[~covered_k]))
    assert torch.equal(gv[~covered_k], torch.zeros_like(gv[~covered_k]))
    assert torch.isfinite(ref.out).all()


def test_reference_bshd_padding_vs_per_sequence_sdpa():
    torch.manual_seed(9)
    b, s_q, s_kv, h, d = 3, 6, 7, 2, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    lq, lk = [6, 2, 4], [3, 7, 5]
    cq = torch.tensor([0, 6, 8, 12], dtype=torch.int32)
    ck = torch.tensor([0, 3, 10, 15], dtype=torch.int32)
    ref = R.attention_ref(q, k, v, args_(mask_type="padding_causal_bottom_right"), cu_seqlens_q=cq,
                          cu_seqlens_kv=ck)
    for bi in range(b):
        vis = loop_visible(lq[bi], lk[bi], -1, 0, True)
        exp = sdpa_math(q[bi:bi + 1, :lq[bi]], k[bi:bi + 1, :lk[bi]], v[bi:bi + 1, :lk[bi]], mask=vis, scale=0.3)
        exp = torch.nan_to_num(exp, nan=0.0)
        assert_close(ref.out[bi, :lq[bi]], exp[0])
        assert torch.equal(ref.out[bi, lq[bi]:], torch.zeros_like(ref.out[bi, lq[bi]:]))
    assert ref.row_valid[1, :, :2].all() and not ref.row_valid[1, :, 2:].any()


def test_reference_sbhd_equals_bshd():
    torch.manual_seed(10)
    q, k, v = rand(2, 5, 2, 8), rand(2, 7, 2, 8), rand(2, 7, 2, 8)
    a = args_(mask_type="causal", scale=0.3)
    r1 = R.attention_ref(q, k, v, a)
    a2 = args_(mask_type="causal", scale=0.3, q_format="sbhd", kv_format="sbhd")
    r2 = R.attention_ref(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), a2)
    assert_close(r2.out.transpose(0, 1), r1.out)
    assert_close(r2.lse, r1.lse)


def test_reference_dropout_matches_manual_mask():
    torch.manual_seed(11)
    b, h, s_q, s_kv, d = 2, 2, 5, 9, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    p = 0.4
    rng = torch.tensor([2**40 + 17, 3 * 2**33 + 5], dtype=torch.int64)
    ref = R.attention_ref(q, k, v, args_(dropout_p=p, scale=0.3), rng_state=rng)
    probs = torch.softmax(torch.einsum("bihd,bjhd->bhij", q, k) * 0.3, -1)
    thr = R.dropout_threshold(p)
    seed, off = 2**40 + 17, 3 * 2**33 + 5
    keep = torch.zeros(b, h, s_q, s_kv, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(s_q):
                for j in range(s_kv):
                    w = R.dropout_draws(seed, off, torch.tensor(bi * h + hi), torch.tensor(i), torch.tensor(j))
                    keep[bi, hi, i, j] = int(w) >= thr
    exp = torch.einsum("bhij,bjhd->bihd", torch.where(keep, probs / (1 - p), torch.zeros(())), v)
    assert_close(ref.out, exp)


def test_reference_max_logit():
    torch.manual_seed(12)
    b, h, s_q, s_kv, d = 2, 3, 5, 6, 8
    q, k, v = rand(b, s_q, h, d), rand(b, s_kv, h, d), rand(b, s_kv, h, d)
    bias = rand(1, h, s_q, s_kv)
    ref = R.attention_ref(q, k, v, args_(mask_type="causal", scale=0.3, softmax_type="off-by-one"), bias=bias)
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * 0.3 + bias
    vis = loop_visible(s_q, s_kv, -1, 0, False)
    exp = torch.where(vis, logits, torch.tensor(float("-inf"), dtype=torch.float64)).amax(dim=(0, 2, 3))
    assert_close(ref.max_logit, exp.detach())


def test_reference_low_precision_is_close_but_not_exact():
    """The in-dtype run really computes in that dtype (else the tolerance rule would be vacuous)."""
    torch.manual_seed(13)
    q, k, v = rand(2, 16, 2, 32, req=False), rand(2, 16, 2, 32, req=False), rand(2, 16, 2, 32, req=False)
    q16, k16, v16 = q.half(), k.half(), v.half()
    a = args_(scale=1 / math.sqrt(32))
    r64 = R.attention_ref(q16.double(), k16.double(), v16.double(), a).out
    r16 = R.attention_ref(q16, k16, v16, a, compute_dtype=torch.float16).out
    assert r16.dtype == torch.float16
    err = (r16.double() - r64).abs().max().item()
    assert 0 < err < 1e-2
