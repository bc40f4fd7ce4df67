"""flash-attn's API (fusedattn.flash_attn_*) and torch's varlen_attn signature (fusedattn.varlen_attn).

A port of flash-attn 2.8's tests/test_flash_attn.py for the supported subset, smaller so the CPU
runs them: its head dims (32 ... 256, including 40, 59 and 111, which the API pads to a multiple
of 8), its (seqlen_q, seqlen_k) pairs up to 256 / 512, MHA / GQA / MQA, causal, local windows
(one side unbounded too), ALiBi, padded varlen batches, and flash_attn_with_kvcache with new
keys appended in place, a paged cache through a caller-owned block table (random block
permutation, small blocks), cache_batch_idx, cache_leftpad and rotary embeddings (interleaved
and GPT-NeoX, full and half rotary dims). The reference is this file's own float64
implementation of flash-attn's documented semantics (bottom-right alignment over each
sequence's valid keys), independent of fusedattn's mask vocabulary; the rule is FlashAttention's
(conftest.tol_check). Also: torch.compile(fullgraph=True) with one graph, return values,
errors, and (on CUDA) CUDA-graph capture of a decode step.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import fusedattn
from conftest import DEVICE, ON_CUDA, tol_check
from fusedattn import (FwdArgs, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                       flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                       flash_attn_with_kvcache, varlen_attn)
from fusedattn.flash_attn_interface import AuxRequest

HAS_SOFTCAP = "softcap" in {f.name for f in dataclasses.fields(FwdArgs)}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# ---------------------------------------------------------------------------
# Reference: flash-attn's semantics, per sequence, dense.


def _visible(lq: int, lk: int, causal: bool, window) -> torch.Tensor:
    """[lq, lk]: query i sees key j iff i + lk - lq - left <= j <= i + lk - lq + right (-1 unbounded)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(lq).view(-1, 1) + lk - lq
    j = torch.arange(lk).view(1, -1)
    vis = torch.ones(lq, lk, dtype=torch.bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def ref_sequence(q, k, v, *, causal=False, window=(-1, -1), alibi=None, softcap=0.0, scale=None):
    """One sequence: q [lq, h, d], k/v [lk, h_k, d] in their compute dtype -> (out [lq, h, d_v], lse [h, lq])."""
    lq, h = q.shape[0], q.shape[1]
    lk, h_k = k.shape[0], k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = k.repeat_interleave(h // h_k, dim=1)
    v = v.repeat_interleave(h // h_k, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    if alibi is not None:
        i = torch.arange(lq).view(-1, 1) + lk - lq
        j = torch.arange(lk).view(1, -1)
        s = s - alibi.to(s.dtype).view(-1, 1, 1) * (i - j).abs().to(s.dtype)
    vis = _visible(lq, lk, causal, window).to(s.device)
    row_ok = vis.any(-1)
    s = s.masked_fill(~vis, float("-inf")).masked_fill(~row_ok.view(1, -1, 1), 0.0)
    p = torch.softmax(s, dim=-1) * row_ok.view(1, -1, 1)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~row_ok.view(1, -1), float("-inf"))
    return torch.einsum("hij,jhd->ihd", p, v), lse


def ref_batch(q, k, v, dtype, q_lens=None, k_lens=None, **kw):
    """Padded batch q [b, sq, h, d]: sequence b has queries [0, q_lens[b]) and keys [0, k_lens[b]).
    Returns (out [b, sq, h, d_v] zeros at padded rows, lse [b, h, sq])."""
    b, sq = q.shape[0], q.shape[1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=dtype)
    lse = torch.full((b, q.shape[2], sq), float("-inf"), dtype=dtype)
    for bi in range(b):
        lq = sq if q_lens is None else q_lens[bi]
        lk = k.shape[1] if k_lens is None else k_lens[bi]
        alibi = kw.get("alibi")
        kwb = dict(kw, alibi=alibi[bi] if alibi is not None and alibi.dim() == 2 else alibi)
        o, l = ref_sequence(q[bi, :lq].to(dtype), k[bi, :lk].to(dtype), v[bi, :lk].to(dtype), **kwb)
        out[bi, :lq] = o
        lse[bi, :, :lq] = l
    return out, lse


# ---------------------------------------------------------------------------
# Cases


D_LIST = [32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256]
SEQ_PAIRS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1, 147), (27, 27)]
MHA = {"mha": (6, 6), "gqa": (6, 2), "mqa": (6, 1)}
WINDOWS = {"full": (-1, -1), "local": (21, 7), "left": (17, -1), "right": (-1, 9)}


def _cases():
    """Every head dim twice; the other settings cycle so that each value meets many others."""
    out = []
    for n, d in enumerate(D_LIST * 2):
        sq, sk = SEQ_PAIRS[n % len(SEQ_PAIRS)]
        if d > 128:  # keep the CPU run short: the large head dims get the shorter pairs
            sq, sk = min(sq, 113), min(sk, 147)
        out.append(dict(d=d, sq=sq, sk=sk, causal=n % 2 == 1, window=list(WINDOWS)[(n // 2) % 4],
                        mha=list(MHA)[n % 3], dtype=list(DTYPES)[(n // 3) % 3], alibi=(n // 5) % 2 == 1))
    return out


def _case_id(c):
    return "d{d}-{sq}x{sk}-{w}{c}-{mha}-{dtype}{a}".format(
        d=c["d"], sq=c["sq"], sk=c["sk"], w=c["window"], c="-causal" if c["causal"] else "", mha=c["mha"],
        dtype=c["dtype"], a="-alibi" if c["alibi"] else "")


def _randn(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(dtype)


def _leaves(*tensors):
    """Device copies that require grad, and float64 CPU copies that require grad."""
    dev = [t.detach().clone().to(DEVICE).requires_grad_(True) for t in tensors]
    f64 = [t.detach().double().requires_grad_(True) for t in tensors]
    return dev, f64


def _grads(tensors):
    out = [t.grad.detach().cpu() for t in tensors]
    for t in tensors:
        t.grad = None
    return out


def _lse_check(lse, lse64, lse_lp, dtype):
    """softmax_lse by the rule on rows that see a key; -inf on rows that see none (fusedattn's
    convention, the log of an empty sum; flash-attn's kernels write +inf there)."""
    rows = torch.isfinite(lse64)
    if not torch.all(lse.detach().cpu()[~rows] == float("-inf")):
        return "softmax_lse: rows without a visible key are not -inf"
    return tol_check("softmax_lse", lse, lse64.nan_to_num(neginf=0.0), lse_lp.detach().nan_to_num(neginf=0.0), dtype,
                     where=rows)


def _check_all(checks):
    msgs = [m for m in checks if m]
    assert not msgs, "\n".join(msgs)


@pytest.mark.parametrize("c", _cases(), ids=_case_id)
def test_flash_attn_output(c):
    dtype = DTYPES[c["dtype"]]
    h, h_k = MHA[c["mha"]]
    b, d = 2, c["d"]
    gen = torch.Generator().manual_seed(c["d"] * 7 + c["sq"])
    q = _randn(b, c["sq"], h, d, dtype=dtype, gen=gen)
    k = _randn(b, c["sk"], h_k, d, dtype=dtype, gen=gen)
    v = _randn(b, c["sk"], h_k, d, dtype=dtype, gen=gen)
    dout = _randn(b, c["sq"], h, d, dtype=dtype, gen=gen)
    alibi = torch.rand(b, h, generator=gen) * 0.3 if c["alibi"] else None
    window = WINDOWS[c["window"]]
    (qd, kd, vd), leaves64 = _leaves(q, k, v)
    out, lse, s_dmask = flash_attn_func(qd, kd, vd, causal=c["causal"], window_size=window,
                                        alibi_slopes=None if alibi is None else alibi.to(DEVICE),
                                        return_attn_probs=True)
    assert s_dmask is None and lse.dtype == torch.float32 and lse.shape == (b, h, c["sq"])
    out.backward(dout.to(DEVICE))
    got = _grads((qd, kd, vd))
    kw = dict(causal=c["causal"], window=window, alibi=alibi)
    ref64, lse64 = ref_batch(*leaves64, torch.float64, **kw)
    ref64.backward(dout.double())
    g64 = _grads(leaves64)
    leaves_lp = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref_lp, lse_lp = ref_batch(*leaves_lp, dtype, **kw)
    ref_lp.backward(dout)
    glp = _grads(leaves_lp)
    checks = [tol_check("out", out, ref64, ref_lp, dtype), _lse_check(lse, lse64, lse_lp, dtype)]
    checks += [tol_check(n, g, r, l, dtype) for n, g, r, l in zip(("dq", "dk", "dv"), got, g64, glp)]
    _check_all(checks)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_packed_forms_equal_separate_tensors(dtype):
    dtype = DTYPES[dtype]
    gen = torch.Generator().manual_seed(4)
    qkv = _randn(2, 37, 3, 4, 64, dtype=dtype, gen=gen).to(DEVICE).requires_grad_(True)
    kv = _randn(2, 53, 2, 2, 64, dtype=dtype, gen=gen).to(DEVICE).requires_grad_(True)
    dout = _randn(2, 37, 4, 64, dtype=dtype, gen=gen).to(DEVICE)
    q, k, v = (t.detach().clone().requires_grad_(True) for t in qkv.unbind(2))
    out_p = flash_attn_qkvpacked_func(qkv, causal=True)
    out_s = flash_attn_func(q, k, v, causal=True)
    (out_p * dout).sum().backward()
    (out_s * dout).sum().backward()
    torch.testing.assert_close(out_p, out_s, rtol=0, atol=0)
    torch.testing.assert_close(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2), rtol=0, atol=0)

    k2, v2 = (t.detach().clone().requires_grad_(True) for t in kv.unbind(2))
    q2 = q.detach().clone().requires_grad_(True)
    out_kv = flash_attn_kvpacked_func(q2, kv, window_size=(5, 3))
    out_sep = flash_attn_func(q2, k2, v2, window_size=(5, 3))
    torch.testing.assert_close(out_kv, out_sep, rtol=0, atol=0)
    out_kv.backward(dout)
    out_sep.backward(dout)
    torch.testing.assert_close(kv.grad, torch.stack([k2.grad, v2.grad], dim=2), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# varlen


def _random_lengths(b, max_len, gen, mode):
    """flash-attn's generate_random_padding_mask modes: 'random' (>= max - 20), 'third' (>= max / 3)."""
    low = max(1, max_len - 20) if mode == "random" else max_len // 3
    return torch.randint(low, max_len + 1, (b,), generator=gen).tolist()


def _unpad(x, lens):
    return torch.cat([x[i, :n] for i, n in enumerate(lens)])


def _cu(lens):
    return torch.tensor([0] + lens).cumsum(0).to(torch.int32)


VARLEN_CASES = [
    dict(d=64, sq=113, sk=203, causal=False, window=(-1, -1), mha="mha", dtype="fp16", mode="random"),
    dict(d=128, sq=128, sk=217, causal=True, window=(-1, -1), mha="gqa", dtype="bf16", mode="third"),
    dict(d=59, sq=108, sk=256, causal=True, window=(33, -1), mha="mqa", dtype="fp32", mode="random"),
    dict(d=96, sq=256, sk=128, causal=False, window=(19, 11), mha="gqa", dtype="fp16", mode="third"),
    dict(d=256, sq=65, sk=65, causal=True, window=(-1, -1), mha="mha", dtype="bf16", mode="random"),
    dict(d=40, sq=1, sk=147, causal=True, window=(-1, -1), mha="gqa", dtype="fp32", mode="third"),
]


@pytest.mark.parametrize("c", VARLEN_CASES, ids=lambda c: "d{d}-{sq}x{sk}-{mha}-{dtype}-{mode}".format(**c)
                         + ("-causal" if c["causal"] else "") + ("-w%d_%d" % c["window"]))
def test_flash_attn_varlen_output(c):
    dtype = DTYPES[c["dtype"]]
    h, h_k = MHA[c["mha"]]
    b, d = 3, c["d"]
    gen = torch.Generator().manual_seed(c["sq"] + c["d"])
    q_lens = _random_lengths(b, c["sq"], gen, c["mode"])
    k_lens = _random_lengths(b, c["sk"], gen, c["mode"])
    q = _randn(b, c["sq"], h, d, dtype=dtype, gen=gen)
    k = _randn(b, c["sk"], h_k, d, dtype=dtype, gen=gen)
    v = _randn(b, c["sk"], h_k, d, dtype=dtype, gen=gen)
    dout = _randn(b, c["sq"], h, d, dtype=dtype, gen=gen)
    (qu, ku, vu), _ = _leaves(_unpad(q, q_lens), _unpad(k, k_lens), _unpad(v, k_lens))
    out, lse, _ = flash_attn_varlen_func(qu, ku, vu, _cu(q_lens).to(DEVICE), _cu(k_lens).to(DEVICE), max(q_lens),
                                         max(k_lens), causal=c["causal"], window_size=c["window"],
                                         return_attn_probs=True)
    assert out.shape == qu.shape and lse.shape == (h, sum(q_lens))
    out.backward(_unpad(dout, q_lens).to(DEVICE))
    got = _grads((qu, ku, vu))

    kw = dict(q_lens=q_lens, k_lens=k_lens, causal=c["causal"], window=c["window"])
    leaves64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref64, lse64 = ref_batch(*leaves64, torch.float64, **kw)
    ref64.backward(dout.double())
    leaves_lp = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref_lp, lse_lp = ref_batch(*leaves_lp, dtype, **kw)
    ref_lp.backward(dout)
    lens = (q_lens, k_lens, k_lens)
    g64 = [_unpad(t.grad, n) for t, n in zip(leaves64, lens)]
    glp = [_unpad(t.grad, n) for t, n in zip(leaves_lp, lens)]
    lse64_u = torch.cat([lse64[i, :, :n] for i, n in enumerate(q_lens)], dim=1)
    lse_lp_u = torch.cat([lse_lp[i, :, :n] for i, n in enumerate(q_lens)], dim=1).detach()
    checks = [tol_check("out", out, _unpad(ref64, q_lens), _unpad(ref_lp, q_lens), dtype),
              _lse_check(lse, lse64_u, lse_lp_u, dtype)]
    checks += [tol_check(n, g, r, l, dtype) for n, g, r, l in zip(("dq", "dk", "dv"), got, g64, glp)]
    _check_all(checks)


def test_varlen_packed_forms_equal_separate_tensors():
    gen = torch.Generator().manual_seed(6)
    lens = [7, 19, 4]
    cu = _cu(lens).to(DEVICE)
    qkv = _randn(sum(lens), 3, 4, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    q, k, v = qkv.unbind(1)
    ref = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    torch.testing.assert_close(flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True), ref, rtol=0, atol=0)
    kv = torch.stack([k, v], dim=1)
    torch.testing.assert_close(flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lens), max(lens), causal=True), ref,
                               rtol=0, atol=0)


# ---------------------------------------------------------------------------
# KV cache


def _rotary_ref(x, angles, interleaved):
    """x [s, h, d] float64 rotated by angles [s, rd / 2] on its first rd channels (complex multiply)."""
    rd = 2 * angles.shape[-1]
    rot = x[..., :rd]
    if interleaved:
        pairs = torch.view_as_complex(rot.reshape(*rot.shape[:-1], rd // 2, 2).contiguous())
        rot = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)[:, None]).flatten(-2)
    else:
        z = torch.complex(rot[..., : rd // 2], rot[..., rd // 2:]) * torch.polar(torch.ones_like(angles), angles)[:, None]
        rot = torch.cat([z.real, z.imag], dim=-1)
    return torch.cat([rot, x[..., rd:]], dim=-1)


KV_CASES = [
    dict(d=64, sq=1, s_cache=128, new=True, paged=False, batch_idx=False, leftpad=False, rotary=None, causal=True,
         window=(-1, -1), mha="gqa", dtype="fp16", alibi=False),
    dict(d=128, sq=1, s_cache=339, new=True, paged=True, batch_idx=False, leftpad=False, rotary="interleaved",
         causal=True, window=(-1, -1), mha="mqa", dtype="bf16", alibi=False),
    dict(d=56, sq=4, s_cache=96, new=True, paged=False, batch_idx=True, leftpad=True, rotary="neox", causal=False,
         window=(-1, -1), mha="mha", dtype="fp32", alibi=False),
    dict(d=32, sq=3, s_cache=200, new=True, paged=True, batch_idx=False, leftpad=False, rotary="neox_half",
         causal=True, window=(23, 0), mha="gqa", dtype="fp16", alibi=True),
    dict(d=96, sq=1, s_cache=160, new=False, paged=True, batch_idx=False, leftpad=False, rotary=None,
         causal=False, window=(-1, -1), mha="gqa", dtype="fp32", alibi=False),
    dict(d=256, sq=2, s_cache=64, new=True, paged=False, batch_idx=True, leftpad=False, rotary="interleaved_half",
         causal=False, window=(9, 3), mha="gqa", dtype="bf16", alibi=False),
    dict(d=40, sq=5, s_cache=77, new=False, paged=False, batch_idx=True, leftpad=True, rotary=None, causal=True,
         window=(-1, -1), mha="mqa", dtype="fp16", alibi=True),
]


def _kv_id(c):
    parts = ["d%d" % c["d"], "q%d" % c["sq"], "cache%d" % c["s_cache"], c["mha"], c["dtype"]]
    for flag in ("new", "paged", "batch_idx", "leftpad", "causal", "alibi"):
        if c[flag]:
            parts.append(flag)
    if c["rotary"]:
        parts.append("rot_" + c["rotary"])
    if c["window"] != (-1, -1):
        parts.append("w%d_%d" % c["window"])
    return "-".join(parts)


def test_flash_attn_kvcache_head_dim_not_multiple_of_8_raises_before_writing():
    """A cache whose head dim the operator cannot attend in place is refused before the append."""
    gen = torch.Generator().manual_seed(59)
    q = _randn(2, 1, 4, 59, dtype=torch.float32, gen=gen)
    k_cache = _randn(2, 32, 4, 59, dtype=torch.float32, gen=gen)
    v_cache = _randn(2, 32, 4, 59, dtype=torch.float32, gen=gen)
    before = k_cache.clone()
    new = _randn(2, 1, 4, 59, dtype=torch.float32, gen=gen)
    with pytest.raises(NotImplementedError, match="k_cache has head dim 59"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, new, new.clone(),
                                          cache_seqlens=torch.tensor([3, 5], dtype=torch.int32, device=DEVICE))
    assert torch.equal(k_cache, before)


@pytest.mark.parametrize("c", KV_CASES, ids=_kv_id)
def test_flash_attn_kvcache(c):
    dtype = DTYPES[c["dtype"]]
    h, h_k = MHA[c["mha"]]
    b, d, sq, s_cache = 3, c["d"], c["sq"], c["s_cache"]
    s_new = sq if c["new"] else 0
    gen = torch.Generator().manual_seed(d + s_cache)
    b_cache = b + 2 if c["batch_idx"] else b
    q = _randn(b, sq, h, d, dtype=dtype, gen=gen)
    k_new = _randn(b, s_new, h_k, d, dtype=dtype, gen=gen) if c["new"] else None
    v_new = _randn(b, s_new, h_k, d, dtype=dtype, gen=gen) if c["new"] else None
    k_dense = _randn(b_cache, s_cache, h_k, d, dtype=dtype, gen=gen)
    v_dense = _randn(b_cache, s_cache, h_k, d, dtype=dtype, gen=gen)
    cache_seqlens = torch.randint(1 if c["new"] else 2, s_cache - s_new + 1, (b,), generator=gen, dtype=torch.int32)
    batch_idx = torch.randperm(b_cache, generator=gen)[:b].to(torch.int32) if c["batch_idx"] else None
    leftpad = (torch.stack([torch.randint(0, int(n), (1,), generator=gen)[0] for n in cache_seqlens]).to(torch.int32)
               if c["leftpad"] else None)
    alibi = torch.rand(b, h, generator=gen) * 0.3 if c["alibi"] else None
    rotary = {}
    angles = None
    if c["rotary"]:
        rd = d - d % 16 if not c["rotary"].endswith("half") else (d // 2) - (d // 2) % 16
        angles = torch.rand(s_cache, rd // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        rotary = dict(rotary_cos=torch.cos(angles).to(dtype).to(DEVICE), rotary_sin=torch.sin(angles).to(dtype).to(DEVICE),
                      rotary_interleaved=c["rotary"].startswith("interleaved"))

    rows = batch_idx.long() if batch_idx is not None else torch.arange(b)
    if c["paged"]:
        block = 16
        n_blocks = math.ceil(s_cache / block)
        perm = torch.randperm(b * n_blocks, generator=gen)
        block_table = perm.view(b, n_blocks).to(torch.int32)
        pad = n_blocks * block - s_cache
        src_k = torch.cat([k_dense[:b], torch.zeros(b, pad, h_k, d, dtype=dtype)], dim=1).view(b * n_blocks, block, h_k, d)
        src_v = torch.cat([v_dense[:b], torch.zeros(b, pad, h_k, d, dtype=dtype)], dim=1).view(b * n_blocks, block, h_k, d)
        k_cache = torch.empty_like(src_k)
        v_cache = torch.empty_like(src_v)
        k_cache[perm] = src_k
        v_cache[perm] = src_v
        view = lambda cache: cache[block_table.long()].flatten(1, 2)[:, :s_cache]  # noqa: E731
    else:
        block_table = None
        k_cache, v_cache = k_dense.clone(), v_dense.clone()
        view = lambda cache: cache[rows]  # noqa: E731
    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)

    out, lse = flash_attn_with_kvcache(
        q.to(DEVICE), k_cache, v_cache, None if k_new is None else k_new.to(DEVICE),
        None if v_new is None else v_new.to(DEVICE), cache_seqlens=cache_seqlens.to(DEVICE),
        cache_batch_idx=None if batch_idx is None else batch_idx.to(DEVICE),
        cache_leftpad=None if leftpad is None else leftpad.to(DEVICE),
        block_table=None if block_table is None else block_table.to(DEVICE), causal=c["causal"],
        window_size=c["window"], alibi_slopes=None if alibi is None else alibi.to(DEVICE), return_softmax_lse=True,
        **rotary)
    k_after, v_after = view(k_cache.cpu()), view(v_cache.cpu())

    def reference(dt):
        outs = torch.zeros(b, sq, h, d, dtype=dt)
        lses = torch.zeros(b, h, sq, dtype=dt)
        k_want, v_want = k_dense[rows].to(dt), v_dense[rows].to(dt)
        for bi in range(b):
            n, lp = int(cache_seqlens[bi]), 0 if leftpad is None else int(leftpad[bi])
            qb = q[bi].to(dt)
            if s_new:
                kb = k_new[bi].to(dt)
                if angles is not None:
                    pos = torch.arange(n, n + s_new)
                    kb = _rotary_ref(kb.double(), angles[pos], rotary["rotary_interleaved"]).to(dt)
                k_want[bi, n:n + s_new] = kb
                v_want[bi, n:n + s_new] = v_new[bi].to(dt)
            if angles is not None:
                per_token = c["causal"] or c["window"] != (-1, -1)
                pos = torch.arange(n, n + sq) if per_token else torch.full((sq,), n)
                qb = _rotary_ref(qb.double(), angles[pos], rotary["rotary_interleaved"]).to(dt)
            end = n + s_new
            o, l = ref_sequence(qb, k_want[bi, lp:end], v_want[bi, lp:end], causal=c["causal"], window=c["window"],
                                alibi=None if alibi is None else alibi[bi])
            outs[bi], lses[bi] = o, l
        return outs, lses, k_want, v_want

    ref64, lse64, k_want64, v_want64 = reference(torch.float64)
    ref_lp, lse_lp, k_want_lp, _ = reference(dtype)
    checks = [tol_check("out", out, ref64, ref_lp, dtype), _lse_check(lse, lse64, lse_lp, dtype)]
    if angles is None:  # appended keys are copies: exact
        checks.append(None if torch.equal(k_after, k_want64.to(dtype)) else "k_cache: appended keys differ")
    else:
        checks.append(tol_check("k_cache", k_after, k_want64, k_want_lp, dtype))
    checks.append(None if torch.equal(v_after, v_want64.to(dtype)) else "v_cache: appended values differ")
    _check_all(checks)


def test_kvcache_leaves_other_cache_rows_alone():
    gen = torch.Generator().manual_seed(8)
    k_cache = _randn(5, 16, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    v_cache = _randn(5, 16, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    k0, v0 = k_cache.clone(), v_cache.clone()
    q = _randn(2, 1, 4, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    k = _randn(2, 1, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    flash_attn_with_kvcache(q, k_cache, v_cache, k, k.clone(), cache_seqlens=5, cache_batch_idx=idx)
    written = torch.zeros(5, 16, dtype=torch.bool)
    written[[3, 1], 5] = True
    assert torch.equal(k_cache.cpu()[~written], k0.cpu()[~written])
    assert torch.equal(v_cache.cpu()[~written], v0.cpu()[~written])
    assert torch.equal(k_cache.cpu()[3, 5], k.cpu()[0, 0]) and torch.equal(k_cache.cpu()[1, 5], k.cpu()[1, 0])


# ---------------------------------------------------------------------------
# torch.compile and CUDA graphs


def _paged_decode_inputs(gen, dtype=torch.float32):
    b, h, h_k, d, block, n_blocks = 2, 4, 2, 64, 8, 4
    k_cache = _randn(b * n_blocks, block, h_k, d, dtype=dtype, gen=gen).to(DEVICE)
    v_cache = _randn(b * n_blocks, block, h_k, d, dtype=dtype, gen=gen).to(DEVICE)
    table = torch.randperm(b * n_blocks, generator=gen).view(b, n_blocks).to(torch.int32).to(DEVICE)
    q = _randn(b, 1, h, d, dtype=dtype, gen=gen).to(DEVICE)
    k = _randn(b, 1, h_k, d, dtype=dtype, gen=gen).to(DEVICE)
    v = _randn(b, 1, h_k, d, dtype=dtype, gen=gen).to(DEVICE)
    seqlens = torch.tensor([5, 17], dtype=torch.int32, device=DEVICE)
    return q, k_cache, v_cache, k, v, seqlens, table


def test_kvcache_compiles_to_one_graph_and_appends_in_place():
    from torch._dynamo.testing import CompileCounterWithBackend

    q, k_cache, v_cache, k, v, seqlens, table = _paged_decode_inputs(torch.Generator().manual_seed(9))
    k_eager, v_eager = k_cache.clone(), v_cache.clone()

    def step(q, k_cache, v_cache, k, v, seqlens, table):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                                       causal=True)

    want = step(q, k_eager, v_eager, k, v, seqlens, table)
    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(step, fullgraph=True, backend=counter)(q, k_cache, v_cache, k, v, seqlens, table)
    assert counter.frame_count == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)


def test_func_and_varlen_compile_to_one_graph():
    from torch._dynamo.testing import CompileCounterWithBackend

    gen = torch.Generator().manual_seed(10)
    q = _randn(2, 9, 4, 32, dtype=torch.float32, gen=gen).to(DEVICE).requires_grad_(True)
    k = _randn(2, 11, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE).requires_grad_(True)
    cu = torch.tensor([0, 7, 18], dtype=torch.int32, device=DEVICE)

    def fn(q, k):
        a = flash_attn_func(q, k, k, causal=True, window_size=(3, -1))
        b = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1)[:18], k.flatten(0, 1)[:18],
                                   cu, cu, 11, 11, causal=True)
        c = varlen_attn(q.flatten(0, 1)[:18], k.flatten(0, 1)[:18], k.flatten(0, 1)[:18], cu, cu, 11, 11,
                        window_size=(-1, 0), enable_gqa=True)
        return a.sum() + b.sum() + c.sum()

    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(fn, fullgraph=True, backend=counter)(q, k)
    assert counter.frame_count == 1
    got.backward()
    gq = q.grad.clone()
    q.grad = None
    fn(q, k).backward()
    torch.testing.assert_close(gq, q.grad)


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs: FUSEDATTN_TEST_DEVICE=cuda")
def test_kvcache_decode_step_captures_in_a_cuda_graph():
    q, k_cache, v_cache, k, v, seqlens, table = _paged_decode_inputs(torch.Generator().manual_seed(11),
                                                                     dtype=torch.bfloat16)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, cache_seqlens=seqlens, block_table=table)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                                      causal=True)
    for _ in range(3):  # the caches and lengths move on between replays; the graph reads them
        seqlens.add_(1)
        want = flash_attn_with_kvcache(q, k_ref, v_ref, k, v, cache_seqlens=seqlens, block_table=table, causal=True)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


# ---------------------------------------------------------------------------
# Return values, options, errors


def test_return_values_and_softmax_scale():
    gen = torch.Generator().manual_seed(12)
    q, k, v = (_randn(1, 6, 2, 16, dtype=torch.float32, gen=gen).to(DEVICE) for _ in range(3))
    out = flash_attn_func(q, k, v, softmax_scale=0.3)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    ref, _ = ref_batch(q.cpu(), k.cpu(), v.cpu(), torch.float64, scale=0.3)
    msg = tol_check("out", out, ref, ref_batch(q.cpu(), k.cpu(), v.cpu(), torch.float32, scale=0.3)[0], torch.float32)
    assert msg is None, msg
    out2, lse, s_dmask = flash_attn_func(q, k, v, softmax_scale=0.3, return_attn_probs=True)
    assert torch.equal(out2, out) and s_dmask is None and lse.shape == (1, 2, 6)
    with pytest.raises(NotImplementedError, match="return_attn_probs=True with dropout_p > 0"):
        flash_attn_func(q, k, v, dropout_p=0.1, return_attn_probs=True)


def test_dropout_is_fusedattns_counter_based_dropout():
    gen = torch.Generator().manual_seed(13)
    q, k, v = (_randn(2, 20, 4, 32, dtype=torch.float32, gen=gen).to(DEVICE) for _ in range(3))
    torch.manual_seed(3)
    a = flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    torch.manual_seed(3)
    b = fusedattn.dot_product_attention(q, k, v, qkv_format="bshd", attn_mask_type="causal_bottom_right",
                                        dropout_p=0.3).view_as(a)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, flash_attn_func(q, k, v, causal=True))


def test_softcap():
    gen = torch.Generator().manual_seed(14)
    q, k, v = (_randn(1, 7, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE) * 4 for _ in range(3))
    if not HAS_SOFTCAP:
        with pytest.raises(NotImplementedError, match="softcap=5.0"):
            flash_attn_func(q, k, v, softcap=5.0)
        return
    out = flash_attn_func(q, k, v, softcap=5.0, causal=True)
    ref64, _ = ref_batch(q.cpu(), k.cpu(), v.cpu(), torch.float64, softcap=5.0, causal=True)
    ref32, _ = ref_batch(q.cpu(), k.cpu(), v.cpu(), torch.float32, softcap=5.0, causal=True)
    msg = tol_check("out", out, ref64, ref32, torch.float32)
    assert msg is None, msg


def test_softcap_off_values_are_plain_attention():
    gen = torch.Generator().manual_seed(15)
    q, k, v = (_randn(1, 7, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE) for _ in range(3))
    plain = flash_attn_func(q, k, v)
    for off in (0.0, -1.0):  # flash-attn: <= 0 deactivates
        torch.testing.assert_close(flash_attn_func(q, k, v, softcap=off), plain, rtol=0, atol=0)


def test_deterministic():
    gen = torch.Generator().manual_seed(16)
    q, k, v = (_randn(1, 7, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE).requires_grad_(True) for _ in range(3))
    if ON_CUDA and not torch.are_deterministic_algorithms_enabled():
        with pytest.raises(NotImplementedError, match="torch.use_deterministic_algorithms"):
            flash_attn_func(q, k, v, deterministic=True)
    else:
        flash_attn_func(q, k, v, deterministic=True).sum().backward()
    with torch.no_grad():  # inference: the flag concerns backward only
        flash_attn_func(q, k, v, deterministic=True)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(k=True), ValueError, "k and v must be given together"),
    (dict(k=True, v=True, cache_seqlens=None), ValueError, "cache_seqlens is required"),
    (dict(rotary_cos=True), ValueError, "rotary_cos and rotary_sin"),
    (dict(block_table=True, cache_batch_idx=True), ValueError, "cache_batch_idx does not apply"),
    (dict(block_table=True, cache_leftpad=True), ValueError, "cache_leftpad does not apply"),
])
def test_kvcache_errors(kwargs, exc, match):
    gen = torch.Generator().manual_seed(17)
    q = _randn(2, 1, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    cache = _randn(4, 8, 2, 32, dtype=torch.float32, gen=gen).to(DEVICE)
    values = dict(k=q, v=q, rotary_cos=torch.zeros(8, 8, device=DEVICE),
                  block_table=torch.zeros(2, 2, dtype=torch.int32, device=DEVICE),
                  cache_batch_idx=torch.zeros(2, dtype=torch.int32, device=DEVICE),
                  cache_leftpad=torch.zeros(2, dtype=torch.int32, device=DEVICE))
    call = dict(cache_seqlens=3)
    for name, given in kwargs.items():
        call[name] = values[name] if given is True else given
    with pytest.raises(exc, match=match):
        flash_attn_with_kvcache(q, cache, cache.clone(), **call)


# ---------------------------------------------------------------------------
# varlen_attn (torch.nn.attention.varlen's signature)


def test_varlen_attn_signature_matches_torch():
    import inspect

    from torch.nn.attention import varlen

    # torch's signature grows between releases (2.11 lacks enable_gqa, seqused_k, block_table, num_splits):
    # ours is the newest one, so the installed torch's parameters are a prefix of ours.
    ours, theirs = inspect.signature(varlen_attn), inspect.signature(varlen.varlen_attn)
    assert list(ours.parameters)[: len(theirs.parameters)] == list(theirs.parameters)
    for name, p in theirs.parameters.items():
        assert ours.parameters[name].default == p.default and ours.parameters[name].kind == p.kind, name
    assert AuxRequest._fields == varlen.AuxRequest._fields


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (6, 0)])
def test_varlen_attn(window):
    gen = torch.Generator().manual_seed(18)
    q_lens, k_lens = [5, 12, 1], [9, 12, 20]
    b, h, h_k, d = 3, 4, 2, 32
    q = _randn(b, max(q_lens), h, d, dtype=torch.float32, gen=gen)
    k = _randn(b, max(k_lens), h_k, d, dtype=torch.float32, gen=gen)
    v = _randn(b, max(k_lens), h_k, d, dtype=torch.float32, gen=gen)
    out, lse = varlen_attn(_unpad(q, q_lens).to(DEVICE), _unpad(k, k_lens).to(DEVICE), _unpad(v, k_lens).to(DEVICE),
                           _cu(q_lens).to(DEVICE), _cu(k_lens).to(DEVICE), max(q_lens), max(k_lens),
                           return_aux=AuxRequest(lse=True), window_size=window, enable_gqa=True)
    assert lse.shape == (h, sum(q_lens))
    causal = window == (-1, 0)
    kw = dict(q_lens=q_lens, k_lens=k_lens, causal=causal, window=window)
    ref64, _ = ref_batch(q, k, v, torch.float64, **kw)
    ref32, _ = ref_batch(q, k, v, torch.float32, **kw)
    msg = tol_check("out", out, _unpad(ref64, q_lens), _unpad(ref32, q_lens), torch.float32)
    assert msg is None, msg


def test_varlen_attn_seqused_k_and_block_table():
    gen = torch.Generator().manual_seed(19)
    b, h, d, block = 2, 2, 32, 4
    used = [6, 11]
    q = _randn(b, 1, h, d, dtype=torch.float32, gen=gen)
    k = _randn(b, 16, h, d, dtype=torch.float32, gen=gen)
    v = _randn(b, 16, h, d, dtype=torch.float32, gen=gen)
    cu_q = _cu([1, 1]).to(DEVICE)
    seqused = torch.tensor(used, dtype=torch.int32, device=DEVICE)
    ref64, _ = ref_batch(q, k, v, torch.float64, k_lens=used)
    ref32, _ = ref_batch(q, k, v, torch.float32, k_lens=used)
    # keys of sequence i start at cu_seq_k[i]; only the first seqused_k[i] take part
    out = varlen_attn(q.flatten(0, 1).to(DEVICE), k.flatten(0, 1).to(DEVICE), v.flatten(0, 1).to(DEVICE), cu_q,
                      _cu([16, 16]).to(DEVICE), 1, 16, seqused_k=seqused)
    msg = tol_check("out (seqused_k)", out, ref64.flatten(0, 1), ref32.flatten(0, 1), torch.float32)
    assert msg is None, msg
    perm = torch.randperm(b * 4, generator=gen)
    k_pool, v_pool = torch.empty(b * 4, block, h, d), torch.empty(b * 4, block, h, d)
    k_pool[perm], v_pool[perm] = k.reshape(b * 4, block, h, d), v.reshape(b * 4, block, h, d)
    out = varlen_attn(q.flatten(0, 1).to(DEVICE), k_pool.to(DEVICE), v_pool.to(DEVICE), cu_q, None, 1, 16,
                      seqused_k=seqused, block_table=perm.view(b, 4).to(torch.int32).to(DEVICE))
    msg = tol_check("out (block_table)", out, ref64.flatten(0, 1), ref32.flatten(0, 1), torch.float32)
    assert msg is None, msg


def test_varlen_attn_errors():
    q = torch.zeros(4, 4, 32, device=DEVICE)
    k = torch.zeros(4, 2, 32, device=DEVICE)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="Try setting enable_gqa=True"):
        varlen_attn(q, k, k, cu, cu, 4, 4)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        varlen_attn(q, torch.zeros(4, 3, 32, device=DEVICE), torch.zeros(4, 3, 32, device=DEVICE), cu, cu, 4, 4,
                    enable_gqa=True)
    with pytest.raises(ValueError, match="block_table requires seqused_k"):
        varlen_attn(q, k.view(1, 4, 2, 32), k.view(1, 4, 2, 32), cu, None, 4, 4, enable_gqa=True,
                    block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))
