"""The robustness rules of docs/robustness.md on the CUDA engines, checked on a GPU.

* Empty inputs (b, s_q, s_kv, thd tokens or sequences, heads, d_qk or d_v = 0): the SDPA function
  against torch's math attention, the operator against the CPU engine, with fresh empty tensors
  (null data) and with empty views of real storage (which the tensor-core and decode engines see).
* NaN: the CUDA rule (conftest.nan_rule_check: at least where a row sees the NaN, nowhere torch's
  math attention is finite) for NaN in q, k, v, a float mask and dout, through every engine a dtype
  and mask reach; exact positions where a row sees everything (padding, ALiBi slopes, the learnable
  offset, max_logit, the decode engine with and without its split-KV combine).
* test_per_engine_small: one small checked forward and backward per engine path (SIMT fp32 and
  fp64, tensor cores, Hopper, decode, copy_to_kv_cache): scripts/gpu_check.sh's default
  compute-sanitizer subset.

Engines by dtype and features (default dispatch on an H200): fp32 / fp64 -> SIMT; fp16 / bf16 bshd
without mask, bias or max_logit at a Hopper head dim -> Hopper; with a padding mask, thd, a bias,
ALiBi, a boolean mask or max_logit -> tensor cores; a page table -> decode. scripts/gpu_check.sh runs
this file again with FUSEDATTN_CUDA_ENGINE=simt.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import conftest as C
import fusedattn
from fusedattn._ops import FwdArgs

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

DEV = "cuda"
LOW = (torch.float16, torch.bfloat16)
# Value tolerances (absolute, scaled by max(1, max|reference|)) of the dtype's arithmetic.
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _close(name, got, want, dtype, where=None):
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if where is not None:
        got, want = got[where], want[where]
    if want.numel() == 0:
        return None
    if not torch.equal(torch.isfinite(got), torch.isfinite(want)) or not torch.equal(got[~torch.isfinite(got)],
                                                                                     want[~torch.isfinite(want)]):
        return f"{name}: non-finite values differ"
    fin = torch.isfinite(want)
    if not fin.any():
        return None
    err = (got[fin] - want[fin]).abs().max().item()
    tol = TOL[dtype] * max(1.0, want[fin].abs().max().item())
    return None if err <= tol else f"{name}: max error {err:.3e} > {tol:.1e}"


# ---------------------------------------------------------------------------
# Empty inputs


def _empty_storage(shape, dtype, storage, gen):
    """A [b, h, s, d] leaf on the GPU: fresh (a zero-size tensor has no data) or, for "view", a view
    of a tensor with one more element along each empty dim (non-null data)."""
    if storage == "fresh" or 0 not in shape:
        t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(DEV)
        return t.requires_grad_()
    full = torch.randn([n if n else 1 for n in shape], generator=gen, dtype=torch.float64).to(dtype).to(DEV)
    view = full
    for dim, n in enumerate(shape):
        if n == 0:
            view = view.narrow(dim, 0, 0)
    return view.detach().requires_grad_()


SDPA_EMPTY = {  # q, k, v shapes [b, h, s, d]
    "b0": ((0, 2, 4, 64), (0, 2, 4, 64), (0, 2, 4, 64)),
    "sq0": ((1, 2, 0, 64), (1, 2, 4, 64), (1, 2, 4, 64)),
    "skv0": ((1, 2, 4, 64), (1, 2, 0, 64), (1, 2, 0, 64)),
    "h0": ((1, 0, 4, 64), (1, 0, 4, 64), (1, 0, 4, 64)),
    "d0": ((1, 2, 4, 0), (1, 2, 4, 0), (1, 2, 4, 0)),
    "dqk0": ((1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 64)),
    "dv0": ((1, 2, 3, 64), (1, 2, 5, 64), (1, 2, 5, 0)),
}


@pytest.mark.parametrize("storage", ["fresh", "view"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(SDPA_EMPTY))
def test_sdpa_empty_like_torch(case, dtype, is_causal, storage):
    """torch's results: empty outputs, zeros for rows without keys, empty or zero gradients; uniform
    weights for d_qk = 0. No launch with a zero grid (a CUDA error) on any engine."""
    gen = torch.Generator().manual_seed(5)
    leaves = [_empty_storage(s, dtype, storage, gen) for s in SDPA_EMPTY[case]]
    ref = [t.detach().cpu().double().requires_grad_() for t in leaves]
    want = C.math_sdpa(*ref, is_causal=is_causal)
    dout = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    want.backward(dout)
    got = fusedattn.scaled_dot_product_attention(*leaves, is_causal=is_causal)
    got.backward(dout.to(dtype).to(DEV))
    torch.cuda.synchronize()
    assert got.dtype == dtype
    msgs = [_close("out", got, want, dtype)]
    msgs += [_close(f"d{n}", t.grad, r.grad, dtype) for n, t, r in zip("qkv", leaves, ref)]
    C.assert_matches_reference(msgs)


def _op_case(name, dtype):
    """An operator call with an empty part (bshd / thd) as a conftest.Case. q, k or v with an empty
    dim is a view of a leaf one element longer there, so that the engines see real storage."""
    gen = torch.Generator().manual_seed(7)
    extra = dict(attn_mask=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
                 cu_seqlens_kv_padded=None, rng_state=None)
    kw = dict(scale=0.125)
    if name.startswith("thd"):
        kw.update(q_format="thd", kv_format="thd", mask_type="padding")
        t_q, t_kv, cu_q, cu_kv = {
            "thd_no_sequence": (5, 5, [0], [0]),             # b = 0: every token is past the sequences
            "thd_empty_sequences": (3, 4, [0, 0, 0], [0, 0, 0]),
            "thd_no_tokens": (0, 0, [0, 0], [0, 0]),
            "thd_no_keys": (6, 3, [0, 2, 6], [0, 0, 0]),     # rows without keys; k / v tokens of no sequence
        }[name]
        extra["cu_seqlens_q"] = torch.tensor(cu_q, dtype=torch.int32)
        extra["cu_seqlens_kv"] = torch.tensor(cu_kv, dtype=torch.int32)
        shapes = {"q": (t_q, 4, 64), "k": (t_kv, 2, 64), "v": (t_kv, 2, 64)}
        sides = [C.Side("thd", len(cu) - 1, max(t, 1), [e - a for a, e in zip(cu, cu[1:])], cu[:-1], t)
                 for t, cu in ((t_q, cu_q), (t_kv, cu_kv))]
    else:
        d_qk, d_v, s_kv = {"skv0_learnable": (64, 64, 0), "skv0_bias": (64, 64, 0), "dv0": (64, 0, 9),
                           "dqk0": (0, 64, 9)}[name]
        kw.update(mask_type="causal_bottom_right" if name == "skv0_bias" else "no_mask")
        shapes = {"q": (2, 17, 4, d_qk), "k": (2, s_kv, 2, d_qk), "v": (2, s_kv, 2, d_v)}
        if name == "skv0_learnable":
            kw.update(softmax_type="learnable", return_max_logit=True)
        if name == "skv0_bias":
            shapes["bias"] = (1, 4, 17, s_kv)
        sides = [C.Side("bshd", 2, 17, [17, 17]), C.Side("bshd", 2, s_kv, [s_kv, s_kv])]
    leaves = {n: torch.randn([max(e, 1) for e in sh] if n in "qkv" else sh, generator=gen,
                             dtype=torch.float64).to(dtype).requires_grad_() for n, sh in shapes.items()}
    if kw.get("softmax_type") == "learnable":
        leaves["softmax_offset"] = torch.randn(4, generator=gen).requires_grad_()

    def view(lv, n):
        t = lv[n]
        for dim, e in enumerate(shapes[n]):
            if e == 0:
                t = t.narrow(dim, 0, 0)
        return t

    def make_qkv(lv):
        return view(lv, "q"), view(lv, "k"), view(lv, "v")

    dout = torch.randn(shapes["q"][:-1] + (shapes["v"][-1],), generator=gen, dtype=torch.float64).to(dtype)
    return C.Case(cfg=None, dtype=dtype, args=FwdArgs(**kw), leaves=leaves, make_qkv=make_qkv, extra=extra,
                  dout=dout, q_side=sides[0], kv_side=sides[1])


OP_EMPTY = ("thd_no_sequence", "thd_empty_sequences", "thd_no_tokens", "thd_no_keys", "skv0_learnable", "skv0_bias",
            "dv0", "dqk0")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", OP_EMPTY)
def test_op_empty_like_cpu_engine(name, dtype):
    """out, softmax_lse, max_logit, rng_state and every gradient as the CPU engine gives them (zeros
    and -inf, or the sink logit, where no key is seen)."""
    case = _op_case(name, dtype)
    out_c, lse_c, rng_c, ml_c, g_c = C.engine_run(case)
    out_g, lse_g, rng_g, ml_g, g_g = C.device_run(case, DEV)
    msgs = [_close("out", out_g, out_c, dtype), _close("softmax_lse", lse_g, lse_c, torch.float32),
            _close("max_logit", ml_g, ml_c, torch.float32)]
    if not torch.equal(rng_g, rng_c):
        msgs.append(f"rng_state: {rng_g.tolist()} != {rng_c.tolist()}")
    msgs += [_close(f"d{n}", g_g[n], g_c[n], torch.float32 if n == "softmax_offset" else dtype) for n in case.leaves]
    C.assert_matches_reference(msgs)


# ---------------------------------------------------------------------------
# NaN: the CUDA rule


NAN_CASES = [(w, m) for m in (None, "causal", "bool") for w in ("q", "k", "k_visible", "v", "dout")] + [
    ("mask", "float"), ("q", "float")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("where,mask_kind", NAN_CASES, ids=[f"{w}-{m}" for w, m in NAN_CASES])
def test_nan_rule_sdpa(where, mask_kind, dtype):
    """out and every gradient follow nan_rule_check; where torch's result is finite, values follow the
    suite's tolerance rule (conftest.tol_check against torch's math attention in float64 and in dtype)."""
    t, mask, dout = C.nan_problem(where, mask_kind, dtype, d=64)
    is_causal = mask_kind == "causal"
    _, sets = C.sdpa_nan_sets(t["q"], t["k"], t["v"], attn_mask=mask, is_causal=is_causal, dout=dout)
    refs = {}
    for dt in (torch.float64, dtype):
        leaves = {n: x.to(dt).requires_grad_() for n, x in t.items()}
        m = mask.to(dt) if mask is not None and mask.dtype != torch.bool else mask
        out = C.math_sdpa(*leaves.values(), attn_mask=m, is_causal=is_causal)
        out.backward(dout.to(dt))
        refs[dt] = {"out": out.detach(), **{f"d{n}": x.grad for n, x in leaves.items()}}
    leaves = {n: x.detach().to(DEV).requires_grad_() for n, x in t.items()}
    dmask = None if mask is None else mask.to(DEV)
    if dmask is not None and dmask.dtype != torch.bool:
        dmask.requires_grad_()
    got = fusedattn.scaled_dot_product_attention(*leaves.values(), attn_mask=dmask, is_causal=is_causal)
    got.backward(dout.to(dtype).to(DEV))
    torch.cuda.synchronize()
    res = {"out": got, **{f"d{n}": x.grad for n, x in leaves.items()}}
    if dmask is not None and dmask.requires_grad:
        res["dmask"] = dmask.grad
    msgs = [C.nan_rule_check(n, r, *sets[n], device=DEV) for n, r in res.items()]
    msgs += [C.tol_check(n, res[n], refs[torch.float64][n], refs[dtype][n], dtype, where=~sets[n][0])
             for n in refs[dtype]]
    C.assert_matches_reference(msgs)


PAD_CASES = ("q_row", "dout_row", "q_padded_row", "k_padded_key", "dout_padded_row")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("where", PAD_CASES)
def test_nan_with_padding_exact(where, dtype):
    """bshd with a padding mask (the tensor-core engine for bf16): a row that sees every key of its
    sequence makes exactly torch's positions NaN; padded rows and keys stay zeros in out, dq, dk, dv
    and a NaN in them is never read. The CPU engine gives the same positions."""
    gen = torch.Generator().manual_seed(9)
    b, s, h, d = 2, 40, 2, 64
    lens_q, lens_kv = [29, 40], [33, 40]
    x = {n: torch.randn(b, s, h, d, generator=gen, dtype=torch.float64).to(dtype) for n in "qkv"}
    dout = torch.randn(b, s, h, d, generator=gen, dtype=torch.float64).to(dtype)
    nan = float("nan")
    target = {"q_row": (x["q"], (0, 5, 1, 3)), "dout_row": (dout, (0, 5, 1, 3)),
              "q_padded_row": (x["q"], (0, 35, 1, 3)), "k_padded_key": (x["k"], (0, 36, 1, 3)),
              "dout_padded_row": (dout, (0, 35, 1, 3))}[where]
    target[0][target[1]] = nan

    def cu(lens):
        return torch.tensor([0] + [sum(lens[:i + 1]) for i in range(b)], dtype=torch.int32)

    args = FwdArgs(scale=1 / math.sqrt(d), mask_type="padding")
    results = {}
    for dev in ("cpu", DEV):
        leaves = {n: t.detach().to(dev).requires_grad_() for n, t in x.items()}
        out, _ = fusedattn._ops.attention(*leaves.values(), args, cu_seqlens_q=cu(lens_q).to(dev),
                                          cu_seqlens_kv=cu(lens_kv).to(dev))
        out.backward(dout.to(dev))
        results[dev] = {"out": C.to_host(out), **{f"d{n}": C.to_host(t.grad) for n, t in leaves.items()}}
    # Expected NaN (torch's math): q row (0, 5, head 1) NaN makes that row's out and dq, and dk and dv
    # of every key of sequence 0 in head 1 (the row sees them all) NaN; its dout element (0, 5, 1, 3)
    # makes dq of the row and dk of those keys NaN (dP and D of the row), and their dv at feature 3.
    want = {n: torch.zeros(b, s, h, d, dtype=torch.bool) for n in ("out", "dq", "dk", "dv")}
    if where in ("q_row", "dout_row"):
        want["dq"][0, 5, 1] = True
        want["dk"][0, :lens_kv[0], 1] = True
    if where == "q_row":
        want["out"][0, 5, 1] = True
        want["dv"][0, :lens_kv[0], 1] = True
    if where == "dout_row":
        want["dv"][0, :lens_kv[0], 1, 3] = True
    msgs = []
    for dev, res in results.items():
        for n, w in want.items():
            if not torch.equal(torch.isnan(res[n]), w):
                msgs.append(f"{dev} {n}: NaN at {int(torch.isnan(res[n]).sum())} positions, expected {int(w.sum())}")
        for n, lens, names in (("q", lens_q, ("out", "dq")), ("kv", lens_kv, ("dk", "dv"))):
            for name in names:
                pad = res[name][0, lens[0]:]
                if not torch.equal(pad, torch.zeros_like(pad)):
                    msgs.append(f"{dev} {name}: padded positions are not zeros")
    for n in want:
        fin = ~want[n]
        msgs.append(_close(f"{n} (cuda vs cpu)", results[DEV][n], results["cpu"][n], dtype, where=fin))
    C.assert_matches_reference(msgs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["alibi", "learnable"])
def test_nan_head_parameter_exact(kind, dtype):
    """A NaN ALiBi slope or learnable offset of head 2: every row of the head (each sees key 0 under
    the causal mask) and, backward, dq of the head, dk and dv of its KV head (key j is seen by rows
    >= j) and d_softmax_offset[2]; the other heads stay finite and equal to the CPU engine's."""
    from fusedattn import DotProductAttention

    gen = torch.Generator().manual_seed(11)
    b, s, h, d = 2, 40, 4, 64
    x = {n: torch.randn(b, s, h, d, generator=gen, dtype=torch.float64).to(dtype) for n in "qkv"}
    dout = torch.randn(b, s, h, d, generator=gen, dtype=torch.float64).to(dtype)
    slopes = torch.rand(h, generator=gen)
    results = {}
    for dev in ("cpu", DEV):
        mod = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal",
                                  softmax_type="learnable" if kind == "learnable" else "vanilla").to(dev)
        kw = {}
        if kind == "learnable":
            with torch.no_grad():
                mod.softmax_offset.copy_(torch.randn(h, generator=torch.Generator().manual_seed(1)))
                mod.softmax_offset[2] = float("nan")
        else:
            sl = slopes.clone()
            sl[2] = float("nan")
            kw = dict(core_attention_bias_type="alibi", alibi_slopes=sl.to(dev))
        leaves = {n: t.detach().to(dev).requires_grad_() for n, t in x.items()}
        out = mod(*leaves.values(), **kw).view(b, s, h, d)
        out.backward(dout.to(dev))
        results[dev] = {"out": C.to_host(out), **{f"d{n}": C.to_host(t.grad) for n, t in leaves.items()}}
        if kind == "learnable":
            results[dev]["doffset"] = C.to_host(mod.softmax_offset.grad).view(1, 1, h, 1)
    msgs = []
    for dev, res in results.items():
        for n, r in res.items():
            want = torch.zeros(r.shape, dtype=torch.bool)
            want[:, :, 2] = True
            if not torch.equal(torch.isnan(r), want):
                msgs.append(f"{dev} {n}: NaN positions are not exactly head 2's")
    # d_softmax_offset is fp32 but sums products of P and dP that the CUDA engines form in the inputs'
    # dtype (the CPU engine in fp32): the inputs' dtype bounds the agreement.
    for n in results["cpu"]:
        msgs.append(_close(f"{n} (cuda vs cpu)", results[DEV][n], results["cpu"][n], dtype,
                           where=~torch.isnan(results["cpu"][n])))
    C.assert_matches_reference(msgs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nan_max_logit(dtype):
    """max_logit is NaN for the heads of a KV head with a NaN key (every row sees it), and equal to the
    CPU engine's for the others."""
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(2, 33, 4, 64, generator=gen).to(dtype)
    k = torch.randn(2, 47, 2, 64, generator=gen).to(dtype)
    v = torch.randn(2, 47, 2, 64, generator=gen).to(dtype)
    k[1, 30, 1, 0] = float("nan")
    args = FwdArgs(scale=0.125, return_max_logit=True)
    ml = {dev: C.to_host(fusedattn._ops.attention(q.to(dev), k.to(dev), v.to(dev), args)[1]) for dev in ("cpu", DEV)}
    want = torch.tensor([False, False, True, True])
    for dev, m in ml.items():
        assert torch.equal(torch.isnan(m), want), f"{dev}: max_logit {m.tolist()}"
    torch.testing.assert_close(ml[DEV][:2], ml["cpu"][:2], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# NaN through the decode engine (and its split-KV combine)

DECODE_FORCED = os.environ.get("FUSEDATTN_DECODE_SPLITS") not in (None, "", "0")


@pytest.mark.parametrize("ctx", [70, 4000], ids=["short", "long"])  # long: several splits at batch 1
@pytest.mark.parametrize("where", ["q", "k", "v", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_nan_decode(where, dtype, ctx):
    """Paged attention of one new token per sequence: each row sees every cached key of its sequence,
    so the NaN positions of out, softmax_lse and max_logit are torch's (and the CPU engine's) exactly,
    also when a NaN partial goes through the split-KV combine; finite values agree."""
    gen = torch.Generator().manual_seed(17)
    b, h_q, h_kv, d, ps = (1 if ctx > 1000 else 3), 8, 2, 128, 16
    pages = (ctx + ps - 1) // ps
    num_pages = b * pages + 3
    table = torch.randperm(num_pages, generator=gen)[: b * pages].view(b, pages).to(torch.int32)
    kc = torch.randn(num_pages, ps, h_kv, d, generator=gen).to(dtype)
    vc = torch.randn(num_pages, ps, h_kv, d, generator=gen).to(dtype)
    q = torch.randn(b, 1, h_q, d, generator=gen).to(dtype)
    lens = [ctx - 3 * i for i in range(b)]
    key = ctx // 2  # sequence 0's cached key ctx / 2: in a middle split
    page, slot = int(table[0, key // ps]), key % ps
    if where == "q":
        q[0, 0, 5, 9] = float("nan")
    elif where == "k":
        kc[page, slot, 1, 4] = float("nan")
    elif where == "v":
        vc[page, slot, 1, 4] = float("nan")
    cu_q = torch.arange(b + 1, dtype=torch.int32)
    cu_kv = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(b)], dtype=torch.int32)
    args = FwdArgs(scale=1 / math.sqrt(d), mask_type="padding_causal_bottom_right", return_max_logit=True)
    res = {}
    for dev in ("cpu", DEV):
        out, lse, _, ml = torch.ops.fusedattn.fwd(q.to(dev), kc.to(dev), vc.to(dev), None, None, None, None,
                                                  cu_q.to(dev), cu_kv.to(dev), None, None, None, *args.op_args(),
                                                  True, table.to(dev))
        res[dev] = C.to_host((out, lse, ml))
    want_out = torch.zeros(b, 1, h_q, d, dtype=torch.bool)
    want_lse = torch.zeros(b, h_q, 1, dtype=torch.bool)
    if where == "q":
        want_out[0, 0, 5] = True
        want_lse[0, 5] = True
    elif where == "k":  # KV head 1: query heads 4..7
        want_out[0, 0, 4:] = True
        want_lse[0, 4:] = True
    elif where == "v":
        want_out[0, 0, 4:, 4] = True
    want_ml = want_lse.any(dim=(0, 2))
    msgs = []
    for dev, (out, lse, ml) in res.items():
        for n, got, w in (("out", out, want_out), ("softmax_lse", lse, want_lse), ("max_logit", ml, want_ml)):
            if not torch.equal(torch.isnan(got), w):
                msgs.append(f"{dev} {n}: NaN at {int(torch.isnan(got).sum())} positions, expected {int(w.sum())}")
    for n, i, dt in (("out", 0, dtype), ("softmax_lse", 1, torch.float32), ("max_logit", 2, torch.float32)):
        msgs.append(_close(n, res[DEV][i], res["cpu"][i], dt, where=~torch.isnan(res["cpu"][i])))
    C.assert_matches_reference(msgs)


@pytest.mark.skipif(DECODE_FORCED, reason="already a child process with forced splits")
def test_nan_decode_forced_splits():
    """test_nan_decode again with 3 splits per sequence (FUSEDATTN_DECODE_SPLITS, read once per
    process): every NaN partial goes through the combine, also for the short caches."""
    r = C.run_tests_in_child(__file__, {"FUSEDATTN_DECODE_SPLITS": "3"}, "test_nan_decode and not forced")
    assert r.returncode == 0, f"run with 3 splits failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert " passed" in r.stdout, r.stdout[-2000:]


# ---------------------------------------------------------------------------
# One small checked call per engine path: the compute-sanitizer subset of scripts/gpu_check.sh


ENGINE_CASES = {
    "simt_fp32": C.Config(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given",
                          bias="alibi_bh", dropout=0.25, softmax="learnable", heads=(4, 2), dims=(64, 32),
                          shape="long", dtype="fp32", max_logit=True),
    "simt_fp64": C.Config(layout="bshd", mask="causal", bias="bhss", heads=(2, 1), dims=(32, 32),
                          shape="self32", dtype="fp64", scale=0.3),
    "tc_fast": C.Config(layout="bshd", mask="padding_causal_bottom_right", seqlens="random", heads=(4, 2),
                        dims=(64, 64), shape="long", dtype="bf16"),
    "tc_general": C.Config(layout="thd", mask="padding", seqlens="empty", max_seqlen="given", bias="1hss",
                           dropout=0.25, heads=(4, 4), dims=(128, 128), shape="long", dtype="fp16"),
    "hopper": C.Config(layout="bshd", mask="causal", heads=(2, 2), dims=(128, 128), shape="self32", dtype="bf16"),
}


@pytest.mark.parametrize("path", list(ENGINE_CASES) + ["decode", "copy_to_kv_cache"])
def test_per_engine_small(path):
    """Forward and backward (attention) or the call (decode, append) against the float64 reference
    or the CPU engine; small enough to run under compute-sanitizer in seconds."""
    if path in ENGINE_CASES:
        C.check_case(C.build_case(C.normalise(ENGINE_CASES[path])), device=DEV)
        return
    gen = torch.Generator().manual_seed(19)
    b, h_kv, d, ps, pages = 2, 2, 64, 16, 8
    kc = torch.randn(b * pages, ps, h_kv, d, generator=gen).to(torch.bfloat16)
    vc = torch.randn(b * pages, ps, h_kv, d, generator=gen).to(torch.bfloat16)
    table = torch.randperm(b * pages, generator=gen).view(b, pages).to(torch.int32)
    if path == "copy_to_kv_cache":
        new = torch.randn(b, 3, h_kv, d, generator=gen).to(torch.bfloat16)
        cu = torch.tensor([0, 3, 5], dtype=torch.int32)
        seqlens = torch.tensor([7, 100], dtype=torch.int32)
        caches = {}
        for dev in ("cpu", DEV):
            k, v = kc.clone().to(dev), vc.clone().to(dev)
            torch.ops.fusedattn.copy_to_kv_cache(new.to(dev), new.to(dev), k, v, table.to(dev), cu.to(dev),
                                                 seqlens.to(dev), "bshd")
            caches[dev] = C.to_host((k, v))
        assert all(torch.equal(a, c) for a, c in zip(caches[DEV], caches["cpu"]))
        return
    q = torch.randn(b, 2, 4, d, generator=gen).to(torch.bfloat16)
    cu_q = torch.tensor([0, 2, 3], dtype=torch.int32)
    cu_kv = torch.tensor([0, 100, 220], dtype=torch.int32)
    args = FwdArgs(scale=0.125, mask_type="padding_causal_bottom_right")
    res = {}
    for dev in ("cpu", DEV):
        out, lse, _, _ = torch.ops.fusedattn.fwd(q.to(dev), kc.to(dev), vc.to(dev), None, None, None, None,
                                                 cu_q.to(dev), cu_kv.to(dev), None, None, None, *args.op_args(),
                                                 False, table.to(dev))
        res[dev] = C.to_host((out, lse))
    C.assert_matches_reference([_close("out", res[DEV][0], res["cpu"][0], torch.bfloat16),
                                _close("softmax_lse", res[DEV][1], res["cpu"][1], torch.float32)])
