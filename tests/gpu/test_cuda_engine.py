"""The CUDA engine, checked on a GPU (skipped cleanly without one).

* every config of conftest.MATRIX through forward and backward on CUDA,
  against the float64 reference with FlashAttention's rule (the same checks
  as test_numerics.check_case: out, lse, max_logit, rng_state, every
  gradient, exact zeros at padded rows / gaps);
* CUDA against the CPU engine on the same inputs (dropout included: the
  masks are one function of (seed, offset, b, h, i, j) on both engines);
* the dropout mask read back exactly and compared with the CPU engine's;
* head dims up to 256 with d_qk != d_v, long rows, every dtype;
* softcap on the tensor-core kernels (the profiler shows which ran), also deterministic;
* CUDA graph capture of forward + backward, replayed on new inputs copied in;
* torch.compile(fullgraph=True) of forward + backward.

Run with ``FUSEDATTN_TEST_DEVICE=cuda pytest tests/gpu`` (scripts/gpu_check.sh).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import conftest as C

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

DEV = "cuda"


def engine_run_cuda(case):
    """conftest.engine_run on a CUDA copy of the (CPU) case; results come back on the CPU."""
    return C.device_run(case, DEV)


def _slow(cfg) -> bool:
    return cfg.shape == "long" or max(cfg.dims) >= 192


# ---------------------------------------------------------------------------
# The whole matrix against the float64 reference


@pytest.mark.parametrize("cfg", C.MATRIX, ids=str)
def test_cuda_matches_reference(cfg):
    C.check_case(C.build_case(cfg), device=DEV)


EXTRA_CASES = [
    # every head-dim bucket, d_qk != d_v, multiple tiles, combined features
    C.Config(layout="bshd", mask="padding_causal_bottom_right", dims=(256, 128), shape="long", dtype="fp32",
             seqlens="random", window="b", softmax="off-by-one", dropout=0.25, max_logit=True),
    C.Config(layout="bshd", mask="causal", dims=(256, 256), shape="long", dtype="bf16", heads=(4, 2),
             bias="alibi_bh"),
    C.Config(layout="thd", mask="padding", dims=(72, 136), shape="long", dtype="fp16", seqlens="random",
             max_seqlen="none", softmax="learnable", heads=(4, 4)),
    C.Config(layout="bshd", mask="arbitrary", attn_mask_shape="b11s", dims=(128, 128), shape="long",
             dtype="fp32", bias="b11s", dropout=0.25),
    C.Config(layout="bhsd_views", mask="causal_bottom_right", dims=(64, 64), shape="cross_long_q", dtype="fp16",
             bias="111s", max_logit=True),
]


@pytest.mark.parametrize("cfg", [C.normalise(c) for c in EXTRA_CASES], ids=str)
def test_cuda_extra_cases(cfg):
    C.check_case(C.build_case(cfg), device=DEV)


# fp64 at every head-dim bucket, float64-accurate (docs/robustness.md): the scale stays in double and
# the SIMT backward recomputes each row's log-sum-exp in double instead of reading the fp32
# softmax_lse. softmax_lse, max_logit and d_softmax_offset are fp32 by contract (and the ALiBi slopes
# and softmax offset fp32 inputs): those are held to fp32's accuracy.
FP64_CASES = [
    C.Config(layout="bshd", mask="causal", dims=(64, 64), shape="long", dtype="fp64", bias="bhss",
             softmax="learnable", heads=(4, 2), scale=0.3),
    C.Config(layout="thd_gaps", mask="padding_causal", dims=(128, 96), shape="long", dtype="fp64",
             seqlens="random", max_seqlen="given", dropout=0.25, heads=(4, 1), bias="alibi_h"),
    C.Config(layout="sbhd", mask="no_mask", dims=(256, 256), shape="long", dtype="fp64", bias="1hss",
             window="a", softmax="off-by-one", max_logit=True),
]


@pytest.mark.parametrize("cfg", [C.normalise(c) for c in FP64_CASES], ids=str)
def test_cuda_float64(cfg):
    case = C.build_case(cfg)
    out, lse, _, ml, grads = engine_run_cuda(case)
    r64, g64 = C.reference_run(case, torch.float64)
    torch.testing.assert_close(out, r64.out, rtol=1e-12, atol=1e-12)
    v = r64.lse_valid
    torch.testing.assert_close(lse[v].double(), r64.lse[v], rtol=1e-6, atol=1e-6)
    if case.args.return_max_logit:
        f = torch.isfinite(r64.max_logit)
        torch.testing.assert_close(ml[f].double(), r64.max_logit[f], rtol=1e-6, atol=1e-6)
    for n in case.leaves:
        tol = 1e-5 if n == "softmax_offset" else 1e-11
        scale = max(1.0, g64[n].abs().max().item())
        torch.testing.assert_close(grads[n].double(), g64[n].double(), rtol=tol, atol=tol * scale,
                                   msg=lambda m: f"d{n}: {m}")


# ---------------------------------------------------------------------------
# softcap on the tensor-core engine (tc/kernels.list's softcap variant, and the general variant's
# runtime cap), forward and backward against the float64 reference. The scores have standard
# deviation ~1 (or ~8 with scale 8 / sqrt(d), capped at 30 as Gemma 2 caps at 50), so the caps bend
# the largest of them and the backward's factor 1 - tanh^2 is far from 1 there.

ENGINE = C.CUDA_ENGINE
# On a compute-capability 9.0 device the Hopper path takes some softcap calls before tc does:
# there these tests run in a child process with FUSEDATTN_CUDA_ENGINE=sm80 (read once per process).
TC_FIRST = ENGINE == "sm80" or (torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0))
not_simt = pytest.mark.skipif(ENGINE == "simt", reason="FUSEDATTN_CUDA_ENGINE=simt keeps calls off tc")
tc_first = pytest.mark.skipif(not TC_FIRST, reason="the Hopper path comes first here: test_tc_softcap_without_hopper")
TC_SOFTCAP_SHAPE = (2, 200, 260)  # several query and key tiles in every bucket
TC_SOFTCAP_WINDOW = ((70, 40), (100, 0))  # (non-causal, causal): cuts tiles on both sides

# (config, softcap, variant the kernels must be: 1 softcap, 2 general (kargs.h's Variant))
TC_SOFTCAP_CASES = [
    (dict(layout="bshd", mask="causal", heads=(4, 2), dims=(64, 64), dtype="bf16"), 2.0, 1),
    (dict(layout="bshd", mask="causal", window="tc", heads=(4, 1), dims=(128, 128), dtype="fp16"), 1.5, 1),
    (dict(layout="bhsd_views", mask="causal", heads=(4, 2), dims=(128, 128), dtype="bf16",
          scale=8 / math.sqrt(128), max_logit=True), 30.0, 1),
    (dict(layout="thd", mask="padding_causal", seqlens="random", max_seqlen="given", heads=(4, 2), dims=(256, 256),
          dtype="bf16"), 3.0, 1),
    (dict(layout="sbhd", mask="no_mask", window="tc", heads=(4, 2), dims=(192, 128), dtype="fp16",
          softmax="learnable"), 2.0, 1),
    (dict(layout="bshd", mask="causal_bottom_right", window="tc", heads=(4, 2), dims=(80, 80), dtype="fp16",
          softmax="off-by-one"), 2.0, 1),
    (dict(layout="bshd", mask="causal", bias="1hss", heads=(4, 2), dims=(96, 96), dtype="fp16"), 2.0, 2),
    (dict(layout="bshd", mask="causal", window="tc", bias="alibi_bh", dropout=0.25, heads=(4, 2), dims=(64, 64),
          dtype="bf16", max_logit=True), 2.0, 2),
    (dict(layout="thd_gaps", mask="padding_causal", seqlens="random", max_seqlen="given", bias="bhss",
          heads=(4, 1), dims=(256, 256), dtype="bf16"), 1.5, 2),
    (dict(layout="bshd", mask="arbitrary", attn_mask_shape="b1ss", heads=(4, 2), dims=(128, 128), dtype="fp16"),
     2.0, 2),
]


def _tc_softcap_case(monkeypatch, kw, softcap):
    monkeypatch.setitem(C.SHAPES, "tc", TC_SOFTCAP_SHAPE)
    monkeypatch.setitem(C.WINDOWS, "tc", TC_SOFTCAP_WINDOW)
    case = C.build_case(C.normalise(C.Config(shape="tc", **kw)))
    case.args = case.args.replace(softcap=softcap)
    return case


def _tc_kernels(fn):
    """fn() under the profiler; the kargs.h Variant numbers of the tc forward and backward kernels that ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
    names = " ".join(e.name for e in prof.events())
    return ({int(v) for v in re.findall(r"tc::fwd_kernel<[^()]*\(fusedattn::tc::Variant\)(\d)>", names)},
            {int(v) for v in re.findall(r"tc::bwd_kernel<[^()]*\(fusedattn::tc::Variant\)(\d)>", names)}, names)


@not_simt
@tc_first
@pytest.mark.parametrize("kw,softcap,variant", TC_SOFTCAP_CASES,
                         ids=lambda x: "-".join(str(v) for v in x.values()) if isinstance(x, dict) else str(x))
def test_tc_softcap(monkeypatch, kw, softcap, variant):
    """Capped logits on the tensor-core kernels: the softcap variant where the fast kernels take the
    call (causal, windows, padding, GQA, every head-dim bucket), the general one's runtime cap with
    bias and dbias, ALiBi, dropout, a boolean mask; fp16 and bf16."""
    case = _tc_softcap_case(monkeypatch, kw, softcap)
    fwd, bwd, names = _tc_kernels(lambda: C.check_case(case, device=DEV))
    assert fwd == {variant} and bwd == {variant}, names[:800]


@not_simt
@tc_first
def test_tc_softcap_deterministic(monkeypatch):
    """The softcap kernels under torch.use_deterministic_algorithms: twice bitwise equal gradients
    (the turn-taking dQ), matching the float64 reference."""
    kw, softcap, variant = TC_SOFTCAP_CASES[1]
    case = _tc_softcap_case(monkeypatch, kw, softcap)
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        fwd, bwd, names = _tc_kernels(lambda: C.check_case(case, device=DEV))
        first, second = (C.device_run(case, DEV)[4] for _ in range(2))
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    assert fwd == {variant} and bwd == {variant}, names[:800]
    for name in first:
        assert torch.equal(first[name], second[name]), f"d{name} differs between two deterministic runs"


@pytest.mark.skipif(ENGINE in ("simt", "sm80") or TC_FIRST, reason="the tc softcap tests ran in this process")
def test_tc_softcap_without_hopper():
    """test_tc_softcap* in a child process with FUSEDATTN_CUDA_ENGINE=sm80, where the Hopper path
    would take some of their calls."""
    r = C.run_tests_in_child(__file__, {"FUSEDATTN_CUDA_ENGINE": "sm80"}, "tc_softcap and not without_hopper")
    assert r.returncode == 0, f"run with FUSEDATTN_CUDA_ENGINE=sm80 failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


# ---------------------------------------------------------------------------
# CUDA against the CPU engine

TOL = {torch.float64: 1e-9, torch.float32: 3e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def _close(name, a, b, dtype, where=None, allowance=0.0):
    """``allowance``: an exact, documented algorithmic error term both engines may carry (see below)."""
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    if where is not None:
        a, b = a[where], b[where]
    if a.numel() == 0:
        return None
    scale = max(1.0, b.abs().max().item())
    err = (a - b).abs().max().item()
    if not (err <= TOL[dtype] * scale + allowance):
        return f"{name}: max |cuda - cpu| = {err:.3e} > {TOL[dtype] * scale:.1e} + {allowance:.1e}"
    return None


def _cpu_engine_works() -> bool:
    q = torch.randn(1, 4, 1, 8, requires_grad=True)
    try:
        out, *_ = torch.ops.fusedattn.fwd(q, q, q, *([None] * 9), "bshd", "bshd", "no_mask", -1, -1, -1, "vanilla",
                                          1.0, 0.0, -1, -1, False)
        out.sum().backward()
    except (NotImplementedError, RuntimeError):
        return False
    return True


@pytest.mark.parametrize("cfg", C.sample_inputs(), ids=str)
def test_cuda_matches_cpu_engine(cfg):
    if not _cpu_engine_works():
        pytest.skip("the CPU engine is not available")
    case = C.build_case(cfg)
    out_c, lse_c, rng_c, ml_c, g_c = C.engine_run(case)
    out_g, lse_g, rng_g, ml_g, g_g = engine_run_cuda(case)
    dt = case.dtype
    msgs = [_close("out", out_g, out_c, dt)]
    fin = torch.isfinite(lse_c)
    if not torch.equal(fin, torch.isfinite(lse_g)):
        msgs.append("softmax_lse: finite on different rows")
    msgs.append(_close("softmax_lse", lse_g, lse_c, torch.float32 if dt != torch.float64 else dt, where=fin))
    if not torch.equal(rng_c, rng_g):
        msgs.append("rng_state_out differs")
    if case.args.return_max_logit:
        msgs.append(_close("max_logit", ml_g, ml_c, dt, where=torch.isfinite(ml_c)))
    # Each engine's backward reads D = rowsum(dO * O) from its own rounded output
    # (conftest.output_rounding_term): their gradients may each carry that term.
    _, _, rounding = C.reference_run(case, torch.float64, rounding_dtype=dt)
    for n in g_c:
        allowance = 2 * rounding[n].abs().max().item()
        msgs.append(_close("d" + n, g_g[n], g_c[n], dt, allowance=allowance))
    C.assert_matches_reference(msgs)


@pytest.mark.parametrize("layout", ["bshd", "thd"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_mask_equals_cpu_engine(layout, p):
    """q = 0 makes every visible weight 1/s_kv and v = I reads the keep mask back exactly."""
    if not _cpu_engine_works():
        pytest.skip("the CPU engine is not available")
    b, h_q, h_kv, s_q, s_kv = 2, 4, 2, 48, 96
    rng_state = torch.tensor([0x0123_4567_89AB_CDEF, (5 << 32) + 99], dtype=torch.int64)
    q = torch.zeros(b, s_q, h_q, 8)
    k = torch.randn(b, s_kv, h_kv, 8)
    v = torch.eye(s_kv).view(1, s_kv, 1, s_kv).expand(b, s_kv, h_kv, s_kv).contiguous()
    cu = [None, None]
    fmt, mask = "bshd", "no_mask"
    if layout == "thd":
        q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        cu = [torch.tensor([0, s_q, 2 * s_q], dtype=torch.int32), torch.tensor([0, s_kv, 2 * s_kv], dtype=torch.int32)]
        fmt, mask = "thd", "padding"
    outs = []
    for dev in ("cpu", DEV):
        t = [x.to(dev) if x is not None else None for x in (q, k, v, *cu, rng_state)]
        out, *_ = torch.ops.fusedattn.fwd(t[0], t[1], t[2], None, None, None, None, t[3], t[4], None, None, t[5],
                                          fmt, fmt, mask, -1, -1, -1, "vanilla", 1.0, p, -1, -1, False)
        outs.append(out.cpu().double() * (1 - p) * s_kv)
    keep_cpu, keep_gpu = outs
    assert torch.allclose(keep_gpu, keep_gpu.round(), atol=1e-4)
    assert torch.equal(keep_gpu.round(), keep_cpu.round())


# ---------------------------------------------------------------------------
# CUDA graphs and torch.compile


def _graph_case():
    cfg = C.normalise(C.Config(layout="thd_gaps", mask="padding_causal", dims=(64, 64), shape="long",
                               dtype="bf16", seqlens="random", max_seqlen="given", dropout=0.25,
                               softmax="learnable", heads=(4, 2), bias="alibi_h"))
    return C.to_device(C.build_case(cfg), DEV)


def test_cuda_graph_capture_and_replay():
    case = _graph_case()
    static = {n: t.detach().clone().requires_grad_() for n, t in case.leaves.items()}
    dout = case.dout.clone()

    def step():
        for t in static.values():
            t.grad = None
        out, lse, _, _ = C.run_op(case, static)
        out.backward(dout)
        return out, lse, {n: t.grad for n, t in static.items()}

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up the allocator and the kernels outside the capture
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    for t in static.values():
        t.grad = None
    with torch.cuda.graph(g):
        g_out, g_lse, g_grads = step()

    for trial in range(2):
        new = {n: torch.randn_like(t, dtype=torch.float32).to(t.dtype) for n, t in static.items()}
        new_dout = torch.randn_like(dout)
        with torch.no_grad():
            for n, t in static.items():
                t.copy_(new[n])
            dout.copy_(new_dout)
        g.replay()
        torch.cuda.synchronize()
        eager_leaves = {n: t.clone().requires_grad_() for n, t in new.items()}
        e_out, e_lse, _, _ = C.run_op(case, eager_leaves)
        e_out.backward(new_dout)
        assert torch.equal(g_out, e_out), f"trial {trial}: replayed out differs from eager"
        assert torch.equal(g_lse, e_lse), f"trial {trial}: replayed lse differs from eager"
        for n, t in eager_leaves.items():
            # dq (and a reduced dbias) accumulate with atomics: equal up to summation order.
            torch.testing.assert_close(g_grads[n].float(), t.grad.float(), rtol=2e-2, atol=2e-2,
                                       msg=lambda m: f"trial {trial}: d{n}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_compile_fullgraph(dtype):
    from fusedattn._ops import FwdArgs, attention

    torch._dynamo.reset()
    b, s, h_q, h_kv, d = 2, 80, 4, 2, 64
    q = torch.randn(b, s, h_q, d, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, h_kv, d, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(b, s, h_kv, d, device=DEV, dtype=dtype, requires_grad=True)
    bias = torch.randn(1, h_q, s, s, device=DEV, dtype=dtype, requires_grad=True)
    args = FwdArgs(scale=1 / math.sqrt(d), mask_type="causal", softmax_type="off-by-one", return_max_logit=True)

    def f(q, k, v, bias):
        out, ml = attention(q * 1.0, k, v, args, bias=bias)
        return (out.float() ** 2).sum() + ml.sum()

    compiled = torch.compile(f, fullgraph=True)
    loss_c = compiled(q, k, v, bias)
    grads_c = torch.autograd.grad(loss_c, (q, k, v, bias))
    loss_e = f(q, k, v, bias)
    grads_e = torch.autograd.grad(loss_e, (q, k, v, bias))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(loss_c, loss_e, rtol=tol, atol=tol)
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge, rtol=tol, atol=tol)
