"""Property-based tests (hypothesis): random problems against the float64 reference.

* attention: random formats (bshd, sbhd, thd and mixes), lengths (empty sequences, thd gaps),
  heads (GQA/MQA), head dims, masks, windows and diagonals, bias shapes, ALiBi, softmax types,
  dropout, dtypes, scales, and q/k/v as contiguous, row-strided, head-dim-strided, transposed
  (bhsd memory), offset and expanded (stride-0 batch) views; forward and backward go through
  conftest.check_case, the suite's tolerance rule;
* paged KV-cache attention: random page sizes, pools and page tables against the reference over
  the gathered keys;
* KV-cache call sequences: random joins, leaves, prefills and decode steps through
  InferenceParams and DotProductAttention, every step against the reference;
* NaN: one NaN anywhere in q, k, v or a float mask gives NaN where docs/robustness.md says
  (conftest.nan_rule_check): exactly where torch's math attention does on the CPU engine; on CUDA
  at least where a row sees the NaN and nowhere torch's result is finite;
* the documented exception: a strided 1-D argument is a ValueError naming it.

Budget and seeds (docs/robustness.md): every test is derandomized (its examples are a fixed
function of the test), with a fixed max_examples and a per-example deadline; the file takes about
a minute on 2 cores. The engine runs on conftest.DEVICE (FUSEDATTN_TEST_DEVICE), the reference on
the CPU.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from datetime import timedelta

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fusedattn  # noqa: E402
from fusedattn import FwdArgs  # noqa: E402
from conftest import (ATTN_MASK_SHAPES, CAUSAL_MASKS, DTYPES, MASKS, PADDING_MASKS, Case, Side,  # noqa: E402
                      check_case, nan_rule_check, on_device, sdpa_nan_sets, to_host, tol_check)
import reference as R  # noqa: E402
from test_kv_cache import D_K, D_V, H, H_KV, attention_ref, rows  # noqa: E402


def fuzz_settings(max_examples: int):
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=timedelta(seconds=60),
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


FORMATS = [("bshd", "bshd"), ("sbhd", "sbhd"), ("thd", "thd"), ("thd", "bshd"), ("bshd", "thd"), ("sbhd", "bshd")]
VIEWS = ("contiguous", "row_strided", "d_strided", "bhsd", "offset", "expanded")


# ---------------------------------------------------------------------------
# One attention problem


@st.composite
def problems(draw):
    q_fmt, kv_fmt = draw(st.sampled_from(FORMATS))
    mask = draw(st.sampled_from(MASKS))
    p = dict(q_fmt=q_fmt, kv_fmt=kv_fmt, mask=mask)
    p["b"] = draw(st.integers(1, 3))
    p["s_q"] = draw(st.integers(1, 70))
    p["s_kv"] = draw(st.integers(1, 70))
    h_kv = draw(st.integers(1, 3))
    p["heads"] = (h_kv * draw(st.integers(1, 3)), h_kv)
    p["dims"] = (draw(st.sampled_from([8, 16, 24, 32, 64])), draw(st.sampled_from([8, 16, 32, 64])))
    p["dtype"] = draw(st.sampled_from(["fp32", "fp16", "bf16", "fp64"]))
    varlen = [fmt == "thd" or mask in PADDING_MASKS for fmt in (q_fmt, kv_fmt)]
    p["lens_q"] = [draw(st.integers(0, p["s_q"])) if varlen[0] else p["s_q"] for _ in range(p["b"])]
    p["lens_kv"] = [draw(st.integers(0, p["s_kv"])) if varlen[1] else p["s_kv"] for _ in range(p["b"])]
    p["gaps"] = draw(st.booleans())
    p["window"] = draw(st.sampled_from(["none", "none", "window"]))
    p["wl"], p["wr"] = draw(st.integers(0, 12)), draw(st.integers(0, 12))
    p["brd"] = draw(st.sampled_from([None, False, True]))
    p["bias"] = draw(st.sampled_from(["none", "none", "alibi_h", "alibi_bh", "bhss", "1hss", "b11s", "111s"]))
    p["mask_shape"] = draw(st.sampled_from(ATTN_MASK_SHAPES))
    p["softmax"] = draw(st.sampled_from(["vanilla", "vanilla", "off-by-one", "learnable"]))
    p["dropout"] = draw(st.sampled_from([0.0, 0.0, 0.25]))
    p["scale"] = draw(st.sampled_from([None, 0.05, 0.7, 1.9, -0.3]))
    p["views"] = [draw(st.sampled_from(VIEWS)) for _ in range(3)]
    p["seed"] = draw(st.integers(0, 2**31 - 1))
    return p


def _side(fmt, b, s, lens, gaps, gen) -> Side:
    if fmt != "thd":
        return Side(fmt, b, s, lens)
    offsets, cu, cu_pad = [], [0], [0]
    for n in lens:
        offsets.append(cu_pad[-1])
        cu.append(cu[-1] + n)
        cu_pad.append(cu_pad[-1] + n + (int(torch.randint(0, 3, (), generator=gen)) if gaps else 0))
    return Side(fmt, b, max(max(lens), 1), lens, offsets=offsets if gaps else cu[:-1], t=cu_pad[-1] + 1,
                cu=torch.tensor(cu, dtype=torch.int32),
                cu_padded=torch.tensor(cu_pad, dtype=torch.int32) if gaps else None)


def _leaf_and_view(shape, view, dtype, gen, allow_expand):
    """A leaf and the function that makes the op's input from it (applied to the float64 clone
    for the reference and to gradients for the padding checks)."""
    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)

    if view == "row_strided":  # rows further apart than the head dim
        return rnd(*shape[:-1], shape[-1] + 8), lambda x: x[..., : shape[-1]]
    if view == "d_strided":  # stride 2 along the head dim
        return rnd(*shape[:-1], 2 * shape[-1]), lambda x: x[..., ::2]
    if view == "bhsd" and len(shape) == 4:  # [b, h, s, d] memory seen as bshd / sbhd
        return rnd(shape[0], shape[2], shape[1], shape[3]), lambda x: x.transpose(1, 2)
    if view == "offset":
        n = math.prod(shape)
        return rnd(n + 5), lambda x: x[5:].view(shape)
    if view == "expanded" and allow_expand and len(shape) == 4:  # one batch entry (bshd dim 0) for all
        return rnd(1, *shape[1:]), lambda x: x.expand(shape)
    return rnd(*shape), lambda x: x


def build_problem(p) -> Case:
    dtype = DTYPES[p["dtype"]]
    gen = torch.Generator().manual_seed(p["seed"])
    b, (h_q, h_kv), (d_qk, d_v) = p["b"], p["heads"], p["dims"]
    q_side = _side(p["q_fmt"], b, p["s_q"], p["lens_q"], p["gaps"], gen)
    kv_side = _side(p["kv_fmt"], b, p["s_kv"], p["lens_kv"], p["gaps"], gen)
    mask = p["mask"]
    thd = "thd" in (p["q_fmt"], p["kv_fmt"])

    def tok(side):
        return side.token_shape()

    leaves, views = {}, {}
    full_kv = all(n == kv_side.s for n in kv_side.lens) and kv_side.fmt == "bshd"
    for name, side, h, d, view in (("q", q_side, h_q, d_qk, p["views"][0]), ("k", kv_side, h_kv, d_qk, p["views"][1]),
                                   ("v", kv_side, h_kv, d_v, p["views"][2])):
        leaves[name], views[name] = _leaf_and_view(tok(side) + (h, d), view, dtype, gen,
                                                   allow_expand=name != "q" and full_kv)

    def make_qkv(lv):
        return tuple(views[n](lv[n]) for n in "qkv")

    extra = dict(attn_mask=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
                 cu_seqlens_kv_padded=None, rng_state=None)
    for key, side in (("q", q_side), ("kv", kv_side)):
        if side.fmt == "thd":
            extra[f"cu_seqlens_{key}"], extra[f"cu_seqlens_{key}_padded"] = side.cu, side.cu_padded
        elif mask in PADDING_MASKS:
            extra[f"cu_seqlens_{key}"] = torch.tensor([0] + [sum(side.lens[:i + 1]) for i in range(b)],
                                                      dtype=torch.int32)
    ms_q, ms_kv = q_side.s, kv_side.s  # bias / mask extents: the sequence dims or max_seqlen
    code = p["bias"]
    if code.startswith("alibi"):
        extra["alibi_slopes"] = torch.rand((h_q,) if code == "alibi_h" else (b, h_q), generator=gen) * 0.5
    elif code != "none":
        shape = [b if code[0] == "b" else 1, h_q if code[1] == "h" else 1, ms_q if code[2] == "s" else 1, ms_kv]
        leaves["bias"] = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    if mask == "arbitrary":
        c = p["mask_shape"]
        shape = [b if c[0] == "b" else 1, h_q if c[1] == "h" else 1, ms_q if c[2] == "s" else 1,
                 ms_kv if c[3] == "s" else 1]
        extra["attn_mask"] = torch.rand(*shape, generator=gen) < 0.3
    if p["softmax"] == "learnable":
        leaves["softmax_offset"] = torch.randn(h_q, generator=gen)
    if p["dropout"] > 0:
        extra["rng_state"] = torch.randint(0, 2**62, (2,), generator=gen)
    for t in leaves.values():
        t.requires_grad_(True)
    if mask in CAUSAL_MASKS:
        wl, wr = (p["wl"], 0) if p["window"] == "window" else (-1, 0)
    else:
        wl, wr = (p["wl"], p["wr"]) if p["window"] == "window" else (-1, -1)
    need_max = thd and (code not in ("none", "alibi_h", "alibi_bh") or mask == "arbitrary")
    args = FwdArgs(scale=p["scale"] if p["scale"] is not None else 1.0 / math.sqrt(d_qk), q_format=p["q_fmt"],
                   kv_format=p["kv_fmt"], mask_type=mask, window_left=wl, window_right=wr,
                   bottom_right_diagonal=p["brd"], softmax_type=p["softmax"], dropout_p=p["dropout"],
                   max_seqlen_q=ms_q if p["q_fmt"] == "thd" and (need_max or p["gaps"]) else None,
                   max_seqlen_kv=ms_kv if p["kv_fmt"] == "thd" and (need_max or p["gaps"]) else None)
    dout = torch.randn(tok(q_side) + (h_q, d_v), generator=gen, dtype=torch.float64).to(dtype)
    return Case(cfg=None, dtype=dtype, args=args, leaves=leaves, make_qkv=make_qkv, extra=extra, dout=dout,
                q_side=q_side, kv_side=kv_side)


@fuzz_settings(max_examples=150)
@given(problems())
def test_fuzz_attention_matches_reference(p):
    for e in (f"formats {p['q_fmt']}/{p['kv_fmt']}", f"mask {p['mask']}", f"dtype {p['dtype']}",
              f"bias {p['bias']}", *(f"view {v}" for v in p["views"])):
        event(e)  # --hypothesis-show-statistics lists what the examples covered
    check_case(build_problem(p))


# ---------------------------------------------------------------------------
# Paged KV-cache attention (forward)


@st.composite
def paged_problems(draw):
    b = draw(st.integers(1, 3))
    page_size = draw(st.sampled_from([1, 3, 4, 16]))
    max_pages = draw(st.integers(1, 5))
    lens_kv = [draw(st.integers(0, max_pages * page_size)) for _ in range(b)]
    lens_q = [draw(st.integers(0, min(n, 6))) for n in lens_kv]
    h_kv = draw(st.integers(1, 2))
    return dict(b=b, page_size=page_size, max_pages=max_pages, lens_kv=lens_kv, lens_q=lens_q,
                heads=(h_kv * draw(st.integers(1, 3)), h_kv), d=draw(st.sampled_from([8, 32, 64])),
                q_fmt=draw(st.sampled_from(["bshd", "thd"])), mask=draw(st.sampled_from(
                    ["padding", "padding_causal_bottom_right"])), dtype=draw(st.sampled_from(["fp32", "bf16"])),
                spare=draw(st.integers(0, 4)), seed=draw(st.integers(0, 2**31 - 1)))


@fuzz_settings(max_examples=60)
@given(paged_problems())
def test_fuzz_paged_attention_matches_reference(p):
    dtype = DTYPES[p["dtype"]]
    gen = torch.Generator().manual_seed(p["seed"])
    b, ps, mp, (h_q, h_kv), d = p["b"], p["page_size"], p["max_pages"], p["heads"], p["d"]
    num_pages = b * mp + p["spare"]
    perm = torch.randperm(num_pages, generator=gen)
    page_table = perm[: b * mp].view(b, mp).to(torch.int32)
    k_pool = torch.randn(num_pages, ps, h_kv, d, generator=gen).to(dtype)
    v_pool = torch.randn(num_pages, ps, h_kv, d, generator=gen).to(dtype)
    s_q = max(max(p["lens_q"]), 1)
    if p["q_fmt"] == "thd":
        q = torch.randn(sum(p["lens_q"]) + 1, h_q, d, generator=gen).to(dtype)
    else:
        q = torch.randn(b, s_q, h_q, d, generator=gen).to(dtype)
    cu_q = torch.tensor([0] + [sum(p["lens_q"][:i + 1]) for i in range(b)], dtype=torch.int32)
    cu_kv = torch.tensor([0] + [sum(p["lens_kv"][:i + 1]) for i in range(b)], dtype=torch.int32)
    args = FwdArgs(scale=1 / math.sqrt(d), q_format=p["q_fmt"], kv_format="bshd", mask_type=p["mask"])
    out, lse, _, _ = torch.ops.fusedattn.fwd(*on_device((q, k_pool, v_pool)), None, None, None, None,
                                             *on_device((cu_q, cu_kv)), None, None, None, *args.op_args(), False,
                                             on_device(page_table))
    # The same keys gathered into a bshd tensor [b, max_pages * page_size, h, d].
    k = k_pool[page_table.long()].reshape(b, mp * ps, h_kv, d)
    v = v_pool[page_table.long()].reshape(b, mp * ps, h_kv, d)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
    r64 = R.attention_ref(q, k, v, args, compute_dtype=torch.float64, **kw)
    rlp = R.attention_ref(q, k, v, args, compute_dtype=dtype, **kw)
    msgs = [tol_check("out", to_host(out), r64.out, rlp.out, dtype),
            tol_check("softmax_lse", to_host(lse), r64.lse.nan_to_num(0.0), rlp.lse.nan_to_num(0.0), dtype,
                      where=r64.lse_valid)]
    assert not [m for m in msgs if m], msgs


# ---------------------------------------------------------------------------
# KV-cache call sequences


@st.composite
def cache_scenarios(draw):
    max_batch, max_seq = 3, 24
    steps, lengths = [], {}
    next_id = 0
    for _ in range(draw(st.integers(1, 5))):
        step = OrderedDict()
        for sid in list(lengths):
            if draw(st.integers(0, 4)) == 0:  # leaves
                del lengths[sid]
        for sid in lengths:
            step[sid] = draw(st.integers(1, 3))
        while len(step) < max_batch and (not step or draw(st.booleans())):  # joins with a prefill
            step[next_id] = draw(st.integers(1, 6))
            next_id += 1
        step = OrderedDict((s, n) for s, n in step.items() if lengths.get(s, 0) + n <= max_seq)
        if not step:
            continue
        for s, n in step.items():
            lengths[s] = lengths.get(s, 0) + n
        lengths = {s: lengths[s] for s in step}
        steps.append(step)
    return dict(steps=steps, paged=draw(st.booleans()), page_size=draw(st.sampled_from([2, 5, 8])),
                fmt=draw(st.sampled_from(["bshd", "sbhd", "thd"])), max_batch=max_batch, max_seq=max_seq,
                seed=draw(st.integers(0, 2**31 - 1)))


@fuzz_settings(max_examples=30)
@given(cache_scenarios())
def test_fuzz_kv_cache_sequences_match_reference(sc):
    from fusedattn import DotProductAttention
    from fusedattn.inference import InferenceParams

    fmt, dev = sc["fmt"], on_device(torch.zeros(1)).device
    params = InferenceParams(sc["max_batch"], sc["max_seq"], H_KV, D_K, torch.float32, head_dim_v=D_V,
                             is_paged=sc["paged"],
                             page_size=sc["page_size"] if sc["paged"] else None, qkv_format=fmt,
                             max_ctx_len=8 if fmt == "thd" else None, device=dev)
    layer = DotProductAttention(H, (D_K, D_V), num_gqa_groups=H_KV, qkv_format=fmt, attn_mask_type="padding_causal",
                                layer_number=1).to(dev)
    gen = torch.Generator().manual_seed(sc["seed"])
    prefix = {}
    for step in sc["steps"]:
        lens = list(step.values())
        b, s, t = len(lens), max(lens), sum(lens)
        shape = {"bshd": (b, s), "sbhd": (s, b), "thd": (t,)}[fmt]
        q, k, v = (torch.randn(*shape, h, d, generator=gen) for h, d in ((H, D_K), (H_KV, D_K), (H_KV, D_V)))
        params.pre_step(step)
        out = to_host(layer(*on_device((q, k, v)), inference_params=params))
        msgs = []
        for i, sid in enumerate(step):
            pk, pv = prefix.get(sid, (k.new_zeros(0, H_KV, D_K), v.new_zeros(0, H_KV, D_V)))
            prefix[sid] = (torch.cat([pk, rows(k, fmt, lens, i)]), torch.cat([pv, rows(v, fmt, lens, i)]))
            qi = rows(q, fmt, lens, i)
            msgs.append(tol_check(f"seq {sid}", rows(out, fmt, lens, i), attention_ref(qi, *prefix[sid], torch.float64),
                                  attention_ref(qi, *prefix[sid], torch.float32), torch.float32))
        prefix = {sid: kv for sid, kv in prefix.items() if sid in step}
        assert not [m for m in msgs if m], msgs


# ---------------------------------------------------------------------------
# NaN like torch's math attention


@st.composite
def nan_problems(draw):
    return dict(b=draw(st.integers(1, 2)), h=draw(st.integers(1, 3)), s_q=draw(st.integers(1, 80)),
                s_kv=draw(st.integers(1, 80)), d=draw(st.sampled_from([8, 32])),
                where=draw(st.sampled_from(["q", "k", "v", "mask"])), mask=draw(st.sampled_from(
                    ["none", "causal", "bool", "float"])), dtype=draw(st.sampled_from(["fp32", "fp64", "fp16"])),
                pos=draw(st.integers(0, 2**31 - 1)), seed=draw(st.integers(0, 2**31 - 1)))


@fuzz_settings(max_examples=80)
@given(nan_problems())
def test_fuzz_nan_like_torch_math(p):
    dtype = DTYPES[p["dtype"]]
    gen = torch.Generator().manual_seed(p["seed"])
    b, h, s_q, s_kv, d = p["b"], p["h"], p["s_q"], p["s_kv"], p["d"]
    t = {n: torch.randn(b, h, s, d, generator=gen).to(dtype) for n, s in (("q", s_q), ("k", s_kv), ("v", s_kv))}
    mask = None
    if p["mask"] == "bool":
        mask = torch.rand(b, 1, s_q, s_kv, generator=gen) < 0.7
    elif p["mask"] == "float":
        mask = torch.randn(b, h, s_q, s_kv, generator=gen).to(dtype)
    where = p["where"] if p["where"] != "mask" or p["mask"] == "float" else "q"
    x = mask if where == "mask" else t[where]
    x.view(-1)[p["pos"] % x.numel()] = float("nan")
    is_causal = p["mask"] == "causal"
    _, sets = sdpa_nan_sets(t["q"], t["k"], t["v"], attn_mask=mask, is_causal=is_causal)
    got = to_host(fusedattn.scaled_dot_product_attention(*on_device(tuple(t[n] for n in "qkv")),
                                                         attn_mask=on_device(mask), is_causal=is_causal))
    msg = nan_rule_check("out", got, *sets["out"])
    assert msg is None, msg


# ---------------------------------------------------------------------------
# The documented exception: 1-D arguments must be dense


@fuzz_settings(max_examples=10)
@given(st.sampled_from(["cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"]),
       st.integers(2, 4))
def test_fuzz_strided_1d_arguments_raise(name, step):
    # The strided view is made on the test device: moving one there would copy it densely.
    cu = {n: on_device(torch.tensor([0, 3, 7], dtype=torch.int32))
          for n in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")}
    buf = on_device(torch.zeros(3 * step, dtype=torch.int32))
    buf[::step] = cu[name]
    cu[name] = buf[::step]
    q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
    args = FwdArgs(scale=0.25, q_format="thd", kv_format="thd", mask_type="padding")
    with pytest.raises(ValueError, match=rf"\b{name} must be contiguous"):
        fusedattn._ops._call(torch.ops.fusedattn.fwd, *on_device((q, k, v)), None, None, None, None,
                             *cu.values(), None, *args.op_args(), False)
