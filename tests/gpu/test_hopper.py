"""The Hopper (sm_90a) forward path: numerics against a float64 reference for every
shape class it takes (head dims 64/128/256, causal or not, GQA, equal and unequal
lengths, tails shorter than a tile, bshd/sbhd/packed strides), and proof from the
profiler that such calls run its kernel. Skipped without a compute-capability 9.0 GPU."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import conftest as C
from fusedattn._ops import FwdArgs, attention

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs a compute-capability 9.0 GPU"),
    pytest.mark.usefixtures("require_cuda_kernel"),
]

# The tuned dispatch (csrc/cuda/hopper/tuning.h) picks the persistent kernel up to s_kv = 1024 at d = 64,
# causal d = 128 / 256 up to 8192 and non-causal d = 128 / 256 at every length, the three-consumer one
# beyond 1024 at d = 64, the one-tile ("v2") kernel for causal d = 128 / 256 beyond 8192. Every variant also runs forced on all of them
# (test_hopper_forward_forced_variant).
# FUSEDATTN_CUDA_ENGINE=simt or sm80 (scripts/gpu_check.sh's second engine pass) keeps calls off the
# Hopper kernels: the numerics tests still hold, the tests of which kernel runs do not apply.
HOPPER_ENGINE = C.CUDA_ENGINE not in ("simt", "sm80")
needs_hopper_engine = pytest.mark.skipif(not HOPPER_ENGINE, reason="FUSEDATTN_CUDA_ENGINE keeps calls off Hopper")

SHAPES = [(1, 1), (17, 17), (200, 200), (130, 300), (300, 130), (1024, 1024), (2200, 2200), (300, 2300)]


def _inputs(layout, b, s_q, s_kv, h_q, h_kv, d, dtype, gen):
    def make(s, h):
        if layout == "bshd":
            return torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen)
        if layout == "sbhd":
            return torch.randn(s, b, h, d, device="cuda", dtype=dtype, generator=gen)
        raise AssertionError(layout)

    if layout == "bs2hd":  # k and v packed in one tensor: strided views
        q = torch.randn(b, s_q, h_q, d, device="cuda", dtype=dtype, generator=gen)
        kv = torch.randn(b, s_kv, 2, h_kv, d, device="cuda", dtype=dtype, generator=gen)
        return q, kv[:, :, 0], kv[:, :, 1], "bshd"
    return make(s_q, h_q), make(s_kv, h_kv), make(s_kv, h_kv), layout


def _reference(q, k, v, fmt, causal, scale):
    """float64 attention, top-left causal; out in q's format, lse [b, h_q, s_q]."""
    if fmt == "sbhd":
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))  # [b, h, s, d]
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(q.shape[2], device=q.device).view(-1, 1)
        j = torch.arange(k.shape[2], device=q.device).view(1, -1)
        s = s.masked_fill(j > i, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ v
    out = out.transpose(1, 2)
    return (out.transpose(0, 1) if fmt == "sbhd" else out), lse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bs2hd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("s_q,s_kv", SHAPES)
def test_hopper_forward_matches_reference(s_q, s_kv, d, causal, layout, dtype):
    gen = torch.Generator(device="cuda").manual_seed(s_q * 7 + s_kv + d)
    q, k, v, fmt = _inputs(layout, 2, s_q, s_kv, 4, 2, d, dtype, gen)
    scale = 1 / math.sqrt(d)
    args = FwdArgs(scale=scale, q_format=fmt, kv_format=fmt, mask_type="causal" if causal else "no_mask")
    out, lse, _, _ = torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, None, None, None, None, None,
                                             *args.op_args(), False)
    ref, ref_lse = _reference(q, k, v, fmt, causal, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    # Output rounding (one ulp of the dtype) plus fp32 accumulation and the
    # rounded P of the second matmul: 1e-2 for bf16, 2e-3 for fp16.
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_hopper_forward_matches_reference_many_tiles_per_cta(d, causal):
    """b = 8, 32 query heads (GQA 4), s = 512: 1,024 query tiles, about 8 per CTA of the persistent
    kernel (which tuning.h picks for every case here): its Q slots, K/V rings and ping-pong turns
    carried across many tiles."""
    gen = torch.Generator(device="cuda").manual_seed(d + causal)
    q, k, v, fmt = _inputs("bshd", 8, 512, 512, 32, 8, d, torch.bfloat16, gen)
    scale = 1 / math.sqrt(d)
    args = FwdArgs(scale=scale, mask_type="causal" if causal else "no_mask")
    out, lse, _, _ = torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, None, None, None, None, None,
                                             *args.op_args(), False)
    ref, ref_lse = _reference(q, k, v, fmt, causal, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("profile,s", [("rise_fast", 1024), ("rise_slow", 4096), ("fall", 2048), ("jump", 2048)])
def test_hopper_forward_matches_reference_rising_scores(profile, s, d, causal, dtype):
    """Scores whose row maxima move across the key tiles. After a row's first tile the kernels
    exponentiate against its reference max without a row max of the tile, and take the slow path
    (S issued again, full online softmax) when some partial row sum of the warpgroup exceeds 2^15;
    there the reference moves only when the tile's max exceeds it by more than 8 in log2
    (kV2MaxSlack), and O is rescaled only then. Keys scaled by a ramp from 1 to 7, scores of standard
    deviation 4 x the ramp (a float64 model of the kept-max rule, d = 128): at s = 1k a row moves its
    reference in 5 of its 8 key tiles, at s = 4k in 7.5 of 32, with the falling ramp in 1.5 of 16
    (the first tile, then rarely). "jump": keys [s/2, s/2 + 96) scaled by 15 (scores of standard
    deviation 60 there, ~200 above the reference in log2), so the fast path's exponentials overflow
    to inf in the tiles that hold them, and the tiles after them underflow to 0 against the moved
    reference."""
    gen = torch.Generator(device="cuda").manual_seed(s + d + causal)
    q = torch.randn(1, s, 2, d, device="cuda", generator=gen)
    k = torch.randn(1, s, 1, d, device="cuda", generator=gen)
    v = torch.randn(1, s, 1, d, device="cuda", generator=gen)
    ramp = torch.linspace(1, 7, s, device="cuda")
    if profile == "fall":
        ramp = ramp.flip(0)
    if profile == "jump":
        ramp = torch.ones(s, device="cuda")
        ramp[s // 2:s // 2 + 96] = 15
    q, k, v = q.to(dtype), (k * ramp.view(1, s, 1, 1)).to(dtype), v.to(dtype)
    scale = 4 / math.sqrt(d)
    args = FwdArgs(scale=scale, mask_type="causal" if causal else "no_mask")
    out, lse, _, _ = torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, None, None, None, None, None,
                                             *args.op_args(), False)
    ref, ref_lse = _reference(q, k, v, "bshd", causal, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    # |lse| reaches ~100 here: fp32 score sums carry ~1e-7 of it.
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-3)


# FUSEDATTN_HOPPER_FWD forces one forward variant (read once per process, as the library reads it).
FORCED_FWD = os.environ.get("FUSEDATTN_HOPPER_FWD", "") not in ("", "auto")
# The forward kernel is one template, fwd_sm90_kernel<FwdConfig<T, D, consumer warpgroups, ...>,
# OneTileScheduler<...> | PersistentScheduler<...>>: a variant is its consumer count and scheduler.
VARIANT_OF = {("2", "OneTile"): "v2", ("2", "Persistent"): "persistent", ("3", "OneTile"): "three_consumer",
              ("3", "Persistent"): "three_consumer_persistent"}


def _forward_variants(names):
    """The forward variants whose kernels appear in the profiler's kernel names."""
    found = re.findall(r"fwd_sm90_kernel<[^<>]*FwdConfig<[^,]+,\s*\d+,\s*(\d+),.*?(OneTile|Persistent)Scheduler",
                       names)
    return {VARIANT_OF[f] for f in found}


def _forward_kernels(q, k, v, args):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        attention(q, k, v, args)
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


def _reference_by_head(q, k, v, causal, scale):
    """_reference for bshd inputs one (batch, query head) at a time: long sequences in float64 without
    a [b, h, s, s] score tensor."""
    b, s_q, h_q, _ = q.shape
    group = h_q // k.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float64, device=q.device)
    for bi in range(b):
        for h in range(h_q):
            o, l = _reference(q[bi:bi + 1, :, h:h + 1], k[bi:bi + 1, :, h // group:h // group + 1],
                              v[bi:bi + 1, :, h // group:h // group + 1], "bshd", causal, scale)
            out[bi, :, h] = o[0, :, 0]
            lse[bi, h] = l[0, 0]
    return out, lse


@needs_hopper_engine
@pytest.mark.skipif(FORCED_FWD, reason="FUSEDATTN_HOPPER_FWD forces one variant")
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).multi_processor_count != 132,
                    reason="the schedules expected here are tuning.h's model for 132 SMs (H100 / H200 SXM)")
@pytest.mark.parametrize("d,s,b,h,sched", [(128, 512, 32, 16, 2), (256, 4096, 4, 8, 2), (256, 8192, 2, 8, 1)])
def test_hopper_forward_causal_schedule(d, s, b, h, sched):
    """Causal calls on the persistent kernel take the tile schedule tuning.h's balance model picks
    (the kernel's last template argument: 1 snake, 2 snake head-major; at d = 256, s = 8k head-major
    would leave the busiest CTA 1.53x the mean), and both schedules match the float64 reference."""
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v, _ = _inputs("bshd", b, s, s, h, h // 2, d, torch.bfloat16, gen)
    scale = 1 / math.sqrt(d)
    args = FwdArgs(scale=scale, mask_type="causal")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out, lse, _, _ = torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, None, None, None, None, None,
                                                 *args.op_args(), False)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "fwd_sm90_kernel" in e.name]
    # The scheduler's arguments are <CAUSAL, ORDER> (tile_scheduler.cuh's kTilesSnake = 1, kTilesSnakeHeadMajor = 2).
    assert names and all(re.search(rf"PersistentScheduler<true,\s*{sched}>", n) for n in names), names[:3]
    ref, ref_lse = _reference_by_head(q, k, v, True, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-3)


@needs_hopper_engine
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("where", ["q", "k"])
def test_hopper_nan_reaches_the_rows_that_see_it(where, d, causal):
    """A NaN score reaches its row's output and lse instead of making the row look empty: the lazy
    maximum's vote fails on it, the slow path's row maximum keeps it (max.NaN) and the epilogue carries
    a NaN sum into out and lse. A NaN in query row 70 (head 1) poisons that row; a NaN in key 150 (head
    0) every row of the head that sees it (causally rows >= 150). Every other row matches the float64
    reference, as does dq outside the NaN query row, whose dq is NaN."""
    gen = torch.Generator(device="cuda").manual_seed(d + causal)
    q = torch.randn(1, 300, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, 300, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    if where == "q":
        q[0, 70, 1, 5] = float("nan")
    else:
        k[0, 150, 0, 3] = float("nan")
    q.requires_grad_()
    scale = 1 / math.sqrt(d)
    args = FwdArgs(scale=scale, mask_type="causal" if causal else "no_mask")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out, lse, _, _ = torch.ops.fusedattn.fwd(q.detach(), k, v, None, None, None, None, None, None, None, None,
                                                 None, *args.op_args(), False)
        torch.cuda.synchronize()
    assert "fwd_sm90" in " ".join(e.name for e in prof.events())
    ref, ref_lse = _reference(q.detach(), k, v, "bshd", causal, scale)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(lse.isnan(), ref_lse.isnan())
    rows = ref.isnan().any(-1)  # [b, s, h]
    assert rows.any() and not rows.all()
    torch.testing.assert_close(out.double()[~rows], ref[~rows], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double()[~ref_lse.isnan()], ref_lse[~ref_lse.isnan()], rtol=0, atol=1e-3)
    if where == "q" and HOPPER_BWD:
        dout = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen)
        (dq,) = torch.autograd.grad(attention(q, k, v, args)[0], (q,), dout)
        q64 = q.detach().double().requires_grad_()
        (want,) = torch.autograd.grad(_reference(q64, k, v, "bshd", causal, scale)[0], (q64,), dout.double())
        nan_row = torch.zeros_like(rows)
        nan_row[0, 70, 1] = True
        assert dq[nan_row].isnan().all()
        got, want = dq[~nan_row].double(), want[~nan_row]
        assert torch.isfinite(got).all()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, f"dq outside the NaN row: relative error {err:.2e}"


@needs_hopper_engine
def test_hopper_kernel_runs_for_eligible_calls():
    """A bf16 causal d=128 call launches an sm_90a kernel; a call it declines (dropout) does not."""
    q, k, v = (torch.randn(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    taken = _forward_kernels(q, k, v, FwdArgs(scale=0.1, mask_type="causal"))
    declined = _forward_kernels(q, k, v, FwdArgs(scale=0.1, mask_type="causal", dropout_p=0.1))
    assert "fwd_sm90" in taken, taken[:500]
    assert "fwd_sm90" not in declined


@needs_hopper_engine
@pytest.mark.skipif(FORCED_FWD, reason="FUSEDATTN_HOPPER_FWD forces one variant")
@pytest.mark.parametrize("d,s,causal,variant", [
    (64, 512, False, "three_consumer_persistent"), (64, 1024, True, "persistent"),
    (64, 2048, True, "three_consumer_persistent"), (64, 2048, False, "three_consumer_persistent"),
    (64, 4096, False, "three_consumer"), (64, 4096, True, "three_consumer"), (128, 1024, False, "persistent"), (128, 1024, True, "persistent"),
    (128, 4096, False, "persistent"), (128, 16384, False, "persistent"), (128, 8192, True, "persistent"),
    (128, 16384, True, "v2"), (256, 8192, False, "persistent"), (256, 16384, False, "persistent"),
    (256, 512, True, "persistent"), (256, 16384, True, "v2"),
])
def test_hopper_forward_dispatch_follows_tuning(d, s, causal, variant):
    """The variant csrc/cuda/hopper/tuning.h picks for this shape is the kernel that runs."""
    q, k, v = (torch.randn(1, s, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    names = _forward_kernels(q, k, v, FwdArgs(scale=0.1, mask_type="causal" if causal else "no_mask"))
    assert _forward_variants(names) == {variant}, names[:500]


@needs_hopper_engine
@pytest.mark.skipif(FORCED_FWD, reason="already the child process (or a variant set by the caller)")
@pytest.mark.parametrize("variant", ["v2", "persistent", "three_consumer", "three_consumer_persistent"])
def test_hopper_forward_forced_variant(variant):
    """Every forward variant on every shape of the reference test (the three-consumer ones run at d = 64
    and leave the other head dims to the tuned choice), in a child process with FUSEDATTN_HOPPER_FWD set;
    the child also checks that the forced kernel is the one that runs."""
    r = C.run_tests_in_child(__file__, {"FUSEDATTN_HOPPER_FWD": variant},
                             "forward_matches_reference or forced_kernel_runs")
    assert r.returncode == 0, f"run with FUSEDATTN_HOPPER_FWD={variant} failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert " passed" in r.stdout and " skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


@needs_hopper_engine
@pytest.mark.parametrize("var,value", [("FUSEDATTN_HOPPER_FWD", "persistant"), ("FUSEDATTN_HOPPER_CAUSAL_CHUNK", "two")])
def test_hopper_bad_switch_raises(var, value):
    """A misspelt FUSEDATTN_HOPPER_FWD or a malformed FUSEDATTN_HOPPER_CAUSAL_CHUNK is an error naming the
    variable at the first Hopper forward, not a silent fallback (the backward checks the chunk the same
    way, sm90.cu's run_bwd_kernels). In a child process: the library reads both once."""
    script = (
        "import pytest, torch\n"
        "from fusedattn._ops import FwdArgs, attention\n"
        "q, k, v = (torch.randn(1, 256, 2, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))\n"
        f"with pytest.raises(ValueError, match='{var}={value}'):\n"
        "    attention(q, k, v, FwdArgs(scale=0.1, mask_type='causal'))\n"
        "print('ok')\n"
    )
    env = dict(os.environ, **{var: value})
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@needs_hopper_engine
@pytest.mark.skipif(not FORCED_FWD, reason="runs in test_hopper_forward_forced_variant's child")
@pytest.mark.parametrize("s", [512, 4096])  # tuned: persistent at 512, three-consumer at 4096
def test_hopper_forward_forced_kernel_runs(s):
    """The forced kernel runs where the tuned choice would be another one (d = 64: each variant
    differs from the tuned choice at one of these lengths)."""
    variant = os.environ["FUSEDATTN_HOPPER_FWD"]
    q, k, v = (torch.randn(1, s, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    names = _forward_kernels(q, k, v, FwdArgs(scale=0.1, mask_type="causal"))
    assert variant in _forward_variants(names), names[:500]


# ---------------------------------------------------------------------------
# The Hopper backward is on unless FUSEDATTN_HOPPER_BWD=0 (read once per process, as the
# library reads it).
# (the values of fusedattn/overrides.h: on / 1 / unset, or off / 0)
HOPPER_BWD = os.environ.get("FUSEDATTN_HOPPER_BWD", "") in ("", "on", "1")
needs_hopper_bwd = pytest.mark.skipif(not HOPPER_BWD, reason="FUSEDATTN_HOPPER_BWD=0")


def _reference_grads(q, k, v, dout, causal, scale):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, _ = _reference(*leaves, "bshd", causal, scale)
    return torch.autograd.grad(out, leaves, dout.double())


def _grads_with_kernels(q, k, v, dout, causal, scale):
    out, _ = attention(q, k, v, FwdArgs(scale=scale, mask_type="causal" if causal else "no_mask"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
    return grads, " ".join(e.name for e in prof.events())


@needs_hopper_bwd
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("s", [1, 17, 150, 200, 1024])  # 150: an odd count of d = 256 key tiles (3)
@pytest.mark.parametrize("h_kv", [4, 2])
def test_hopper_backward_matches_reference(s, d, causal, dtype, h_kv):
    gen = torch.Generator(device="cuda").manual_seed(s + d + h_kv)
    q = torch.randn(2, s, 4, d, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    k, v = (torch.randn(2, s, h_kv, d, device="cuda", dtype=dtype, generator=gen).requires_grad_() for _ in range(2))
    dout = torch.randn(2, s, 4, d, device="cuda", dtype=dtype, generator=gen)
    scale = 1 / math.sqrt(d)
    out, _ = attention(q, k, v, FwdArgs(scale=scale, mask_type="causal" if causal else "no_mask"))
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = _reference_grads(q, k, v, dout, causal, scale)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), f"{name} has non-finite values"
        # Relative Frobenius error; the CPU engine gets ~2e-3 (bf16) with the same rounded P and dS.
        # The floor (rms 1e-3) covers s = 1, where the reference dq and dk are exactly 0 (one
        # visible key: dS = dP - D = 0) and any kernel leaves rounding noise of its summation order.
        floor = 1e-3 * math.sqrt(w.numel())
        err = ((g.double() - w).norm() / w.norm().clamp_min(floor)).item()
        assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), f"{name}: relative error {err:.2e}"


def _strided_leaf(layout, b, s, h, d, gen):
    """A bshd-shaped leaf whose storage is bhsd (what Hugging Face passes after rotary) or bshd."""
    if layout == "bhsd":
        t = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    else:
        t = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    return t.requires_grad_()


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("s_q,s_kv", [(200, 200), (130, 300), (300, 130), (17, 1)])
@pytest.mark.parametrize("layout", ["bhsd", "bs2hd"])
def test_hopper_backward_strided_inputs_and_unequal_lengths(layout, s_q, s_kv, d, causal):
    """q/k/v and dout stored [b, h, s, d] (views), k/v packed in one tensor, and s_q != s_kv (top-left
    causal) run on the Hopper backward, whose tensor maps and preprocess take the inputs' strides (no
    copy of dout), and match the float64 reference."""
    gen = torch.Generator(device="cuda").manual_seed(s_q * 3 + s_kv + d)
    q = _strided_leaf("bhsd" if layout == "bhsd" else "bshd", 2, s_q, 4, d, gen)
    if layout == "bhsd":
        k, v = (_strided_leaf("bhsd", 2, s_kv, 2, d, gen) for _ in range(2))
    else:
        kv = torch.randn(2, s_kv, 2, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        k, v = kv[:, :, 0], kv[:, :, 1]
    if layout == "bhsd":
        dout = torch.randn(2, 4, s_q, d, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    else:
        dout = torch.randn(2, s_q, 4, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1 / math.sqrt(d)
    got, names = _grads_with_kernels(q, k, v, dout, causal, scale)
    assert "bwd_sm90" in names, names[:500]
    assert "direct_copy" not in names, names[:500]
    want = _reference_grads(q, k, v, dout, causal, scale)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), f"{name} has non-finite values"
        floor = 1e-3 * math.sqrt(w.numel())
        err = ((g.double() - w).norm() / w.norm().clamp_min(floor)).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


@needs_hopper_bwd
def test_hopper_backward_misaligned_dout_falls_back():
    """A contiguous dout view 2 bytes off a 16-byte boundary cannot feed the Hopper backward's TMA and
    vector loads: the call goes to the sm80-class backward and still matches the reference."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    buf = torch.randn(2 * 128 * 4 * 64 + 1, device="cuda", dtype=torch.bfloat16, generator=gen)
    dout = buf[1:].view(2, 128, 4, 64)
    assert dout.is_contiguous() and dout.data_ptr() % 16 != 0
    scale = 0.125
    got, names = _grads_with_kernels(q, k, v, dout, True, scale)
    assert "bwd_sm90" not in names
    want = _reference_grads(q, k, v, dout, True, scale)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = ((g.double() - w).norm() / w.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("d,kernel", [(64, "bwd_sm90_kernel"), (128, "bwd_sm90_kernel"), (256, "bwd_sm90_d256_kernel")])
def test_hopper_backward_kernel_runs(d, kernel):
    q, k, v = (torch.randn(2, 256, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    _, names = _grads_with_kernels(q, k, v, torch.randn_like(q), True, 0.1)
    assert kernel in names, names[:500]


@needs_hopper_bwd
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("s", [200, 1000])
def test_hopper_backward_deterministic(s, d, causal):
    """Under torch.use_deterministic_algorithms (strict) the backward's gradients are bitwise equal
    across runs and match the float64 reference; at d = 64 / 128 the Hopper kernel whose dQ
    reduce-adds take turns runs, at d = 256 (no deterministic variant) the sm80-class backward takes the
    call. Forced onto the SIMT engine, the call raises instead."""
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q = torch.randn(2, s, 4, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(2, s, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(2))
    dout = torch.randn(2, s, 4, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1 / math.sqrt(d)
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        if C.CUDA_ENGINE == "simt":
            with pytest.raises(RuntimeError, match=C.SIMT_NOT_DETERMINISTIC):
                _grads_with_kernels(q, k, v, dout, causal, scale)
            return
        first, names = _grads_with_kernels(q, k, v, dout, causal, scale)
        second, _ = _grads_with_kernels(q, k, v, dout, causal, scale)
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    if HOPPER_ENGINE:
        det_kernel = "bwd_sm90_det_kernel" in names
        assert det_kernel == (d != 256) and ("bwd_sm90" in names) == (d != 256), names[:500]
    want = _reference_grads(q, k, v, dout, causal, scale)
    for name, x, y, w in zip(("dq", "dk", "dv"), first, second, want):
        assert torch.isfinite(x).all(), f"{name} has non-finite values"
        assert torch.equal(x, y), f"{name} differs between two deterministic runs"
        err = ((x.double() - w).norm() / w.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


@needs_hopper_bwd
def test_hopper_backward_first_cuda_work_of_the_autograd_thread():
    """A fresh process whose first backward is the Hopper one: autograd's device thread has made no
    CUDA runtime call yet, so it has no current context when the backward encodes its tensor maps
    (a driver call). Found by compute-sanitizer running this file's backward tests alone. The child
    reports whether the thread really had no context when the backward began (a hook on `out` runs
    there just before it) and whether the backward's buffers came from the caching allocator's
    reserve (a cudaMalloc on that thread would create the context before the encode, hiding the
    bug): the small pool is warmed first, and if either condition fails the test skips."""
    script = (
        "import ctypes, torch\n"
        "from fusedattn._ops import FwdArgs, attention\n"
        "cu = ctypes.CDLL('libcuda.so.1')\n"
        "seen = []\n"
        "def hook(grad):\n"
        "    ctx = ctypes.c_void_p()\n"
        "    cu.cuCtxGetCurrent(ctypes.byref(ctx))\n"
        "    seen.append(ctx.value)\n"
        # Blocks of <= 1 MB (all of the backward's buffers here) come from the small pool: reserve
        # 32 MB of it on this thread so that the backward needs no cudaMalloc.
        "warm = [torch.empty(1 << 20, dtype=torch.uint8, device='cuda') for _ in range(32)]\n"
        "del warm\n"
        "q, k, v = (torch.randn(2, 200, 4, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)"
        " for _ in range(3))\n"
        "out, _ = attention(q, k, v, FwdArgs(scale=0.125, mask_type='no_mask'))\n"
        "out.register_hook(hook)\n"
        "segments = torch.cuda.memory_stats()['segment.all.allocated']\n"
        "dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))\n"
        "grew = torch.cuda.memory_stats()['segment.all.allocated'] != segments\n"
        "assert all(bool(torch.isfinite(g).all()) for g in (dq, dk, dv))\n"
        "print('ok', 'no-context' if seen == [None] and not grew else 'had-context')\n"
    )
    env = {key: val for key, val in os.environ.items() if key != "FUSEDATTN_CUDA_ENGINE"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
    if "had-context" in proc.stdout:
        pytest.skip("autograd's thread had a CUDA context or allocated memory before the encode: the case this "
                    "test covers did not arise")


# The causal tile-order test's child: forward outputs at s = 1300 (d = 64: the three-consumer kernel,
# whose 192-row tiles give 7 per group; d = 128 / 256: the persistent kernel unless FUSEDATTN_HOPPER_FWD
# says otherwise) and backward grads at s = 700, all causal, with 5 (batch, kv head) groups (b = 5, two
# query heads on one KV head), so chunks of 3 leave a shorter last chunk of 2.
_CHUNK_CHILD = (
    "import math, sys, torch\n"
    "from fusedattn._ops import FwdArgs, attention\n"
    "res = {}\n"
    "for d in (64, 128, 256):\n"
    "    gen = torch.Generator(device='cuda').manual_seed(d)\n"
    "    args = FwdArgs(scale=1 / math.sqrt(d), mask_type='causal')\n"
    "    fq = torch.randn(5, 1300, 2, d, device='cuda', dtype=torch.bfloat16, generator=gen)\n"
    "    fk, fv = (torch.randn(5, 1300, 1, d, device='cuda', dtype=torch.bfloat16, generator=gen) for _ in range(2))\n"
    "    fout, _ = attention(fq, fk, fv, args)\n"
    "    q = torch.randn(5, 700, 2, d, device='cuda', dtype=torch.bfloat16, generator=gen).requires_grad_()\n"
    "    k, v = (torch.randn(5, 700, 1, d, device='cuda', dtype=torch.bfloat16, generator=gen).requires_grad_()\n"
    "            for _ in range(2))\n"
    "    dout = torch.randn(5, 700, 2, d, device='cuda', dtype=torch.bfloat16, generator=gen)\n"
    "    out, _ = attention(q, k, v, args)\n"
    "    res[d] = [fout.cpu()] + [g.cpu() for g in torch.autograd.grad(out, (q, k, v), dout)]\n"
    "torch.save(res, sys.argv[1])\n"
)


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.skipif(FORCED_FWD, reason="FUSEDATTN_HOPPER_FWD set by the caller")
def test_hopper_causal_chunk_order(tmp_path):
    """Causal v2 / three-consumer forwards and the backward deal their CTAs in chunks of groups,
    tile-major inside a chunk (tile_scheduler.cuh's chunked_tile; FUSEDATTN_HOPPER_CAUSAL_CHUNK sets the chunk,
    1 = group by group). The order changes when a CTA runs, not what it computes: with chunks of 1, 3
    (a shorter last chunk) and the tuned choice, the forward outputs, dk and dv are bitwise equal (dq,
    fp32 reduce-adds in whatever order they land, need not be), and every run, v2 forced with chunks
    of 3 among them, matches the float64 reference."""
    runs = {}
    for chunk, fwd in (("1", ""), ("3", ""), ("auto", ""), ("3", "v2")):
        path = tmp_path / f"grads_{chunk}_{fwd}.pt"
        env = dict(os.environ, FUSEDATTN_HOPPER_CAUSAL_CHUNK=chunk, FUSEDATTN_HOPPER_FWD=fwd)
        proc = subprocess.run([sys.executable, "-c", _CHUNK_CHILD, str(path)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"FUSEDATTN_HOPPER_CAUSAL_CHUNK={chunk} FWD={fwd}:\n{proc.stderr[-3000:]}"
        runs[(chunk, fwd)] = torch.load(path)
    for d in (64, 128, 256):
        gen = torch.Generator(device="cuda").manual_seed(d)
        scale = 1 / math.sqrt(d)
        fq = torch.randn(5, 1300, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        fk, fv = (torch.randn(5, 1300, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        q = torch.randn(5, 700, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(5, 700, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        dout = torch.randn(5, 700, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        want = [_reference(fq, fk, fv, "bshd", True, scale)[0]] + list(_reference_grads(q, k, v, dout, True, scale))
        for key, res in runs.items():
            for name, g, w in zip(("out", "dq", "dk", "dv"), res[d], want):
                assert torch.isfinite(g).all(), f"d={d} {key}: {name} has non-finite values"
                err = ((g.double().cuda() - w).norm() / w.norm()).item()
                assert err < 1e-2, f"d={d} {key}: {name} relative error {err:.2e}"
            if key[1] == "":
                for i, name in ((0, "out"), (2, "dk"), (3, "dv")):
                    assert torch.equal(res[d][i], runs[("1", "")][d][i]), f"d={d}: {name} with chunk {key[0]} differs"


# ---------------------------------------------------------------------------
# The Hopper support list: csrc/cuda/hopper/kernels.list, the instantiations, which are what the Hopper
# path takes (sm90.cu looks calls up in the table generated from it). Every line gets calls that must
# run its kernel, forward and backward, and match the float64 reference by FlashAttention's rule
# (conftest.check_case: out, lse, every gradient, padded rows zero).
def _kernel_rows():
    spec = importlib.util.spec_from_file_location("hopper_gen_kernels", C.REPO / "csrc/cuda/hopper/gen_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.parse()


KERNEL_ROWS = _kernel_rows()


def _dims(entry, softcap=False):
    """(dtype, d_qk, d_v) of the list's lines of an entry (with softcap or without)."""
    return sorted({(r.dtype, r.d_qk, r.d_v) for r in KERNEL_ROWS if r.entry == entry and r.softcap == softcap})


# Calls for the general kernels (features.h): mask type, (non-causal, causal) window, bottom_right_diagonal,
# (b, s_q, s_kv), softmax type. Windows cut tiles off either side of a query tile's key range and leave
# tiles inside it whole; the bottom-right cases have s_q != s_kv, one with query tiles that see no key at
# all; the sink logits of off-by-one and learnable softmax join the normaliser (gpt-oss: learnable
# sinks, windows of 128 on alternate layers), where rows without a visible key get lse = the sink.
GENERAL_CALLS = {
    "causal_window": ("causal", ((-1, -1), (100, 0)), None, (2, 300, 300), "vanilla"),
    "sliding": ("no_mask", ((70, 150), (70, 0)), None, (2, 260, 400), "vanilla"),
    "bottom_right_long_kv": ("causal_bottom_right", ((-1, -1), (-1, 0)), None, (2, 200, 450), "vanilla"),
    "bottom_right_window_long_q": ("causal_bottom_right", ((-1, -1), (64, 0)), None, (2, 450, 200), "vanilla"),
    "bottom_right_sliding": ("no_mask", ((30, 30), (30, 0)), True, (2, 300, 180), "vanilla"),
    "learnable_window": ("causal", ((-1, -1), (128, 0)), None, (2, 400, 400), "learnable"),
    "learnable_causal": ("causal", ((-1, -1), (-1, 0)), None, (2, 300, 300), "learnable"),
    "off_by_one_long_q": ("causal_bottom_right", ((-1, -1), (-1, 0)), None, (2, 330, 140), "off-by-one"),
}


# Head dims below their tile's (80, 96 on the tile of 128; 192, 192 / 128 on that of 256) run on the
# general kernels with no window too (Phi-2: d = 80 causal; DeepSeek MLA prefill: 192 / 128 causal).
GENERAL_CALLS["causal"] = ("causal", ((-1, -1), (-1, 0)), None, (2, 300, 300), "vanilla")
TILE_DIMS = (64, 128, 256)


def _general_params():
    """(dtype, d_qk, d_v, call) for every fwd_general line: bf16 on the tiles' head dims with every
    call, the others with three (a window, a bottom-right diagonal, a learnable sink) and plain causal
    attention where their head dims make the call general (kept short: the float64 reference runs on
    the CPU)."""
    out = []
    for dtype, d_qk, d_v in _dims("fwd_general"):
        square = d_qk == d_v and d_qk in TILE_DIMS
        if dtype == "bf16" and square:
            calls = [c for c in GENERAL_CALLS if c != "causal"]
        else:
            calls = ["causal_window", "bottom_right_window_long_q", "learnable_window"] + ([] if square else ["causal"])
        out += [(dtype, d_qk, d_v, c) for c in calls]
    return out


def _case(monkeypatch, dtype, dims, mask, windows, brd, shape, softmax="vanilla", softcap=0.0, heads=(4, 2),
          layout="bshd", lengths=None, max_seqlen=None):
    """A conftest case; `lengths` = (q lengths, kv lengths or None for the same) per sequence for
    per-sequence-length layouts and padding masks, `max_seqlen` as conftest.Config's (thd)."""
    monkeypatch.setitem(C.SHAPES, "hopper", shape)
    monkeypatch.setitem(C.WINDOWS, "hopper", windows)
    if lengths is not None:
        lq, lk = lengths
        lk = lq if lk is None else lk
        monkeypatch.setattr(C, "_lengths", lambda cfg, b, s_q, s_kv, rng: (list(lq), list(lk)))
    cfg = C.normalise(C.Config(layout=layout, mask=mask, window="hopper", brd=brd, heads=heads, dims=dims,
                               shape="hopper", dtype=dtype, softmax=softmax,
                               seqlens="random" if lengths is not None else None, max_seqlen=max_seqlen))
    case = C.build_case(cfg)
    if softcap:
        case.args = case.args.replace(softcap=softcap)
    return case


def _check_with_kernels(case):
    """check_case on the GPU; the names of the CUDA kernels it ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        C.check_case(case, device="cuda")
    return " ".join(e.name for e in prof.events())


def _check_deterministic(case):
    """Under torch.use_deterministic_algorithms: check_case on the GPU, then two more runs whose
    gradients must be bitwise equal; the names of the CUDA kernels check_case ran."""
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        names = _check_with_kernels(case)
        first, second = (C.device_run(case, "cuda")[4] for _ in range(2))
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    for name in first:
        assert torch.equal(first[name], second[name]), f"d{name} differs between two deterministic runs"
    return names


def _features_of(names, kernel):
    """The features.h mask kinds (Features<k>) of the named kernel in the profiler's kernel names."""
    return {int(k) for k in re.findall(rf"{kernel}<[^()]*?Features<(\d)[,>]", names)}


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("dtype,d_qk,d_v,call", _general_params())
def test_hopper_general_kernels(monkeypatch, dtype, d_qk, d_v, call):
    """Every general line of the support list (fwd_general, bwd_general) on sliding windows, bottom-right
    diagonals, softmax sinks and head dims below the tile's: the general kernels (Features<2, ...>) run
    forward and backward, key tiles outside a query tile's window skipped, and the results
    (d_softmax_offset too; only d_v columns of out and dv, d_qk of dq and dk) match the float64
    reference."""
    assert ("bwd_general", dtype, d_qk, d_v) in {(r.entry, r.dtype, r.d_qk, r.d_v) for r in KERNEL_ROWS}
    names = _check_with_kernels(_case(monkeypatch, dtype, (d_qk, d_v), *GENERAL_CALLS[call]))
    bwd_kernel = "bwd_sm90_d256_kernel" if max(d_qk, d_v) > 128 else "bwd_sm90_kernel"
    assert _features_of(names, "fwd_sm90_kernel") == {2} and _features_of(names, bwd_kernel) == {2}, names[:800]


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("call,consumers", [("learnable_window", 2), ("causal_window", 2), ("learnable_causal", 3)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_hopper_general_consumers_by_band(monkeypatch, dtype, call, consumers):
    """d = 64: the general forward runs two consumer warpgroups (128-row tiles) on a narrow band, where
    three's 192-row tiles would compute a third key tile per row, and three on long rows (tuning.h's
    general_fwd_consumers); either matches the float64 reference."""
    names = _check_with_kernels(_case(monkeypatch, dtype, (64, 64), *GENERAL_CALLS[call]))
    got = {int(n) for n in re.findall(r"fwd_sm90_kernel<[^()]*?FwdConfig<[^,<>]+, 64, (\d),", names)}
    assert got == {consumers}, names[:800]


# Softcap lines: scores of standard deviation ~1 (scale 1 / sqrt(d)) capped at 2 or 3, so the cap bites
# on the largest of them (the backward's factor 1 - tanh^2 far from 1), with a window or causal.
SOFTCAP_CALLS = {
    "window": ("causal", ((-1, -1), (100, 0)), None, (2, 300, 300), "vanilla", 2.0),
    "causal_learnable": ("causal", ((-1, -1), (-1, 0)), None, (2, 300, 300), "learnable", 3.0),
    "sliding_long_kv": ("no_mask", ((70, 150), (70, 0)), None, (2, 260, 400), "vanilla", 2.0),
}


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("call", list(SOFTCAP_CALLS))
@pytest.mark.parametrize("dtype,d_qk,d_v", _dims("fwd_general", softcap=True))
def test_hopper_softcap_kernels(monkeypatch, dtype, d_qk, d_v, call):
    """The softcap lines of the support list: logits capped as softcap tanh(scale q.k / softcap)
    before the masks in the general kernels (the capped scores feed the lazy maximum, and the d = 256
    backward's second consumer recovers tanh from P), forward and backward, against the float64
    reference."""
    assert ("bwd_general", dtype, d_qk, d_v, True) in {(r.entry, r.dtype, r.d_qk, r.d_v, r.softcap) for r in KERNEL_ROWS}
    names = _check_with_kernels(_case(monkeypatch, dtype, (d_qk, d_v), *SOFTCAP_CALLS[call]))
    bwd_kernel = "bwd_sm90_d256_kernel" if max(d_qk, d_v) > 128 else "bwd_sm90_kernel"
    assert re.search(r"fwd_sm90_kernel<[^()]*Features<2, \d+, \d+, true, false>", names), names[:800]
    assert re.search(rf"{bwd_kernel}<[^()]*Features<2, \d+, \d+, true, false>", names), names[:800]


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("dtype,d_qk,d_v,softcap",
                         [(*dims, 0.0) for dims in _dims("bwd_general_deterministic")]
                         + [(*dims, 2.0) for dims in _dims("bwd_general_deterministic", softcap=True)])
def test_hopper_general_deterministic(monkeypatch, dtype, d_qk, d_v, softcap):
    """The bwd_general_deterministic lines, with and without softcap: under
    torch.use_deterministic_algorithms the general backward whose dQ reduce-adds take turns runs (its
    turn order follows the window's tile ranges), twice bitwise equal (d_softmax_offset too, summed in
    a fixed order) and matching the float64 reference."""
    mask, windows, brd, _, _ = GENERAL_CALLS["causal_window"]
    case = _case(monkeypatch, dtype, (d_qk, d_v), mask, windows, brd, (2, 700, 700), "learnable", softcap)
    names = _check_deterministic(case)
    assert _features_of(names, "bwd_sm90_det_kernel") == {2}, names[:800]


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype,d_qk,d_v", _dims("fwd_one_tile"))
def test_hopper_plain_kernels(monkeypatch, dtype, d_qk, d_v, causal):
    """The plain lines of the support list (their forward variants are forced one by one in
    test_hopper_forward_forced_variant): a call without a window runs the plain kernels (Features<0>,
    or <1> causally) forward and backward, also with a bottom-right diagonal when s_q = s_kv, and
    matches the float64 reference."""
    mask = "causal_bottom_right" if causal else "no_mask"
    names = _check_with_kernels(_case(monkeypatch, dtype, (d_qk, d_v), mask, ((-1, -1), (-1, 0)), None,
                                      (2, 200, 200)))
    bwd_kernel = "bwd_sm90_d256_kernel" if d_qk == 256 else "bwd_sm90_kernel"
    want = {1 if causal else 0}
    assert _features_of(names, "fwd_sm90_kernel") == want and _features_of(names, bwd_kernel) == want, names[:800]


# ---------------------------------------------------------------------------
# Per-sequence lengths (features.h's VARLEN; hopper/varlen.cuh): the varlen lines of the support list
# (fwd_varlen, bwd_varlen, bwd_varlen_deterministic) on thd, with and without cu_seqlens_*_padded gaps,
# and on padding masks in bshd. Each call's sequences have unequal lengths off the 128-row tiles, and
# most have an empty one and one of a single token; check_case checks out, lse, every gradient and the
# exact zeros of the rows no sequence owns (bshd padding, thd gaps and tails).
# name: layout, mask, (non-causal, causal) window, bottom_right_diagonal, (b, s_q, s_kv), (q lengths,
# kv lengths or None), max_seqlen (thd), softmax, heads.
VARLEN_CALLS = {
    # packed causal training: documents of 300, 1, 0, 129 and 64 tokens
    "thd_causal": ("thd", "padding_causal", ((-1, -1), (-1, 0)), None, (5, 300, 300),
                   ([300, 1, 0, 129, 64], None), "given", "vanilla", (4, 2)),
    # cu_seqlens_*_padded gaps and a tail; s_q != s_kv per sequence, a sequence without queries and one
    # without keys (whose rows get zeros and lse -inf)
    "thd_gaps_causal": ("thd_gaps", "padding_causal", ((-1, -1), (-1, 0)), None, (4, 200, 150),
                        ([200, 37, 0, 140], [150, 60, 9, 0]), "given", "vanilla", (4, 2)),
    # no max_seqlen (the grid spans the token dim; most tiles skipped), no causal mask, MQA
    "thd_no_mask_no_max": ("thd", "padding", ((-1, -1), (-1, 0)), None, (3, 257, 300),
                           ([130, 257, 17], [300, 5, 128]), "none", "vanilla", (4, 1)),
    # packed qkv (one tensor, strided views), max_seqlen rounded up
    "th3d_causal": ("th3d", "padding_causal", ((-1, -1), (-1, 0)), None, (3, 260, 260),
                    ([260, 33, 129], None), "rounded", "vanilla", (4, 4)),
    # learnable sinks over gaps
    "thd_gaps_learnable": ("thd_gaps", "padding_causal", ((-1, -1), (-1, 0)), None, (3, 300, 300),
                           ([300, 2, 150], None), "given", "learnable", (4, 2)),
    # bshd with a padding mask: causal, a sequence without queries or keys
    "bshd_padding_causal": ("bshd", "padding_causal", ((-1, -1), (-1, 0)), None, (3, 300, 300),
                            ([300, 0, 77], [300, 5, 77]), None, "vanilla", (4, 2)),
    # bshd padding without causality, s_q != s_kv, a one-token sequence, off-by-one sinks
    "bshd_padding": ("bshd", "padding", ((-1, -1), (-1, 0)), None, (2, 256, 200), ([129, 1], [1, 200]), None,
                     "off-by-one", (4, 2)),
    # q thd, k / v bshd with a padding mask
    "thd_bshd": ("thd_bshd", "padding_causal", ((-1, -1), (-1, 0)), None, (3, 100, 250),
                 ([100, 0, 37], [250, 30, 37]), "given", "vanilla", (4, 2)),
}


def _varlen_case(monkeypatch, dtype, d_qk, d_v, call):
    layout, mask, windows, brd, shape, lengths, max_seqlen, softmax, heads = VARLEN_CALLS[call]
    return _case(monkeypatch, dtype, (d_qk, d_v), mask, windows, brd, shape, softmax, 0.0, heads, layout, lengths,
                 max_seqlen)


def _varlen_params():
    """(dtype, d_qk, d_v, call) for every fwd_varlen line: bf16 with every call, fp16 with three."""
    out = []
    for dtype, d_qk, d_v in _dims("fwd_varlen"):
        calls = list(VARLEN_CALLS) if dtype == "bf16" else ["thd_causal", "thd_gaps_causal", "bshd_padding_causal"]
        out += [(dtype, d_qk, d_v, c) for c in calls]
    return out


def _assert_varlen_kernels(names, d_qk, d_v, det=False):
    """The forward ran the varlen scheduler on the varlen features, and so did the backward."""
    assert re.search(r"fwd_sm90_kernel<[^()]*VarlenScheduler<\d+>, [^()]*Features<2, \d+, \d+, false, true>", names), \
        names[:800]
    bwd = "bwd_sm90_det_kernel" if det else "bwd_sm90_d256_kernel" if max(d_qk, d_v) > 128 else "bwd_sm90_kernel"
    assert re.search(rf"{bwd}<[^()]*Features<2, \d+, \d+, false, true>", names), names[:800]
    assert "varlen_prologue_kernel" in names, names[:800]


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("dtype,d_qk,d_v,call", _varlen_params())
def test_hopper_varlen_kernels(monkeypatch, dtype, d_qk, d_v, call):
    """Every fwd_varlen / bwd_varlen line of the support list on thd (with and without padded offsets,
    packed qkv, no max_seqlen), bshd with padding masks and q thd with k / v bshd, causal or not, sinks,
    GQA / MQA: the varlen kernels run forward and backward and match the float64 reference, with exact
    zeros where no sequence owns a row."""
    assert ("bwd_varlen", dtype, d_qk, d_v) in {(r.entry, r.dtype, r.d_qk, r.d_v) for r in KERNEL_ROWS}
    names = _check_with_kernels(_varlen_case(monkeypatch, dtype, d_qk, d_v, call))
    _assert_varlen_kernels(names, d_qk, d_v)


@needs_hopper_engine
@pytest.mark.parametrize("mask,windows", [("padding_causal", ((-1, -1), (64, 0))),
                                          ("padding_causal_bottom_right", ((-1, -1), (-1, 0)))],
                         ids=["window", "bottom_right"])
def test_hopper_varlen_declines_windows_and_bottom_right(monkeypatch, mask, windows):
    """Per-sequence lengths with a window or a bottom-right diagonal (which the general kernels fail on
    the H200) run the sm80-class kernels, correctly."""
    case = _case(monkeypatch, "bf16", (128, 128), mask, windows, None, (4, 200, 150), "vanilla", 0.0, (4, 2),
                 "thd_gaps", ([200, 37, 0, 140], [150, 60, 9, 0]), "given")
    names = _check_with_kernels(case)
    assert "sm90" not in names and "varlen_prologue" not in names, names[:800]


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("call", ["thd_gaps_learnable", "bshd_padding_causal"])
@pytest.mark.parametrize("dtype,d_qk,d_v", _dims("bwd_varlen_deterministic"))
def test_hopper_varlen_deterministic(monkeypatch, dtype, d_qk, d_v, call):
    """The bwd_varlen_deterministic lines: under torch.use_deterministic_algorithms the varlen backward
    whose dQ reduce-adds take turns per sequence runs, twice bitwise equal (d_softmax_offset too) and
    matching the float64 reference; sequences of 700 and 400 tokens give several key tiles per query
    tile."""
    layout, mask, windows, brd, _, _, max_seqlen, softmax, heads = VARLEN_CALLS[call]
    lengths = ([700, 129, 0, 400], None) if layout.startswith("thd") else ([700, 0, 400], [700, 5, 400])
    case = _case(monkeypatch, dtype, (d_qk, d_v), mask, windows, brd, (len(lengths[0]), 700, 700), softmax, 0.0,
                 heads, layout, lengths, max_seqlen)
    _assert_varlen_kernels(_check_deterministic(case), d_qk, d_v, det=True)


@needs_hopper_engine
@needs_hopper_bwd
@pytest.mark.parametrize("layout", ["thd_gaps", "th3d", "bshd"])
def test_hopper_varlen_unowned_rows_are_never_read(monkeypatch, layout):
    """Rows no sequence owns (thd gaps and tails, bshd padding) may hold anything, NaN included: each
    sequence's tensor maps end at its length, so neither they nor dout's are read, and the results match
    the float64 reference with exact zeros there."""
    call = "thd_gaps_learnable" if layout == "thd_gaps" else "th3d_causal" if layout == "th3d" else \
        "bshd_padding_causal"
    case = _varlen_case(monkeypatch, "bf16", 128, 128, call)
    with torch.no_grad():
        for name, t in case.leaves.items():
            side = case.q_side if name in ("q", "qkv") else case.kv_side if name in ("k", "v", "kv") else None
            if side is not None:
                t[~side.valid()] = float("nan")
        case.dout[~case.q_side.valid()] = float("nan")
    _assert_varlen_kernels(_check_with_kernels(case), 128, 128)


@needs_hopper_engine
@needs_hopper_bwd
def test_hopper_varlen_packed_training():
    """Packed causal training at d = 128, GQA 4 / 2: six documents of 700, 512, 3, 385, 128 and 250
    tokens in one thd batch (several query tiles per document, many tiles per CTA of the persistent
    grid), forward and backward against the float64 reference."""
    gen = torch.Generator(device="cuda").manual_seed(8)
    lens = [700, 512, 3, 385, 128, 250]
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
    t = int(cu[-1])
    q = torch.randn(t, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(t, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(2))
    dout = torch.randn(t, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1 / math.sqrt(128)
    args = FwdArgs(scale=scale, q_format="thd", kv_format="thd", mask_type="padding_causal", max_seqlen_q=max(lens),
                   max_seqlen_kv=max(lens))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out, _ = attention(q, k, v, args, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        got = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
    _assert_varlen_kernels(" ".join(e.name for e in prof.events()), 128, 128)
    for i, n in enumerate(lens):
        a, b = int(cu[i]), int(cu[i + 1])
        seq = [x[a:b].unsqueeze(0) for x in (q, k, v)]
        ref, _ = _reference(*seq, "bshd", True, scale)
        torch.testing.assert_close(out[a:b].double(), ref[0], rtol=1e-2, atol=1e-2)
        want = _reference_grads(*seq, dout[a:b].unsqueeze(0), True, scale)
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            g = g[a:b].double()
            floor = 1e-3 * math.sqrt(w.numel())
            err = ((g - w[0]).norm() / w[0].norm().clamp_min(floor)).item()
            assert err < 1e-2, f"document {i} ({n} tokens): {name} relative error {err:.2e}"


@needs_hopper_engine
def test_hopper_varlen_sbhd_padding_forward():
    """sbhd with a padding mask runs the varlen forward (its maps take sbhd's strides): out and lse match
    the float64 reference per sequence, zeros and lse -inf in the padded rows."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    lens = [200, 1, 0, 77]
    q = torch.randn(200, 4, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(200, 4, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    cu = torch.tensor([0, 200, 201, 201, 278], dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(128)
    args = FwdArgs(scale=scale, q_format="sbhd", kv_format="sbhd", mask_type="padding_causal")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out, lse, _, _ = torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, cu, cu, None, None, None,
                                                 *args.op_args(), False)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events())
    assert re.search(r"fwd_sm90_kernel<[^()]*VarlenScheduler", names), names[:800]
    for bi, n in enumerate(lens):
        ref, ref_lse = _reference(q[:n, bi:bi + 1], k[:n, bi:bi + 1], v[:n, bi:bi + 1], "sbhd", True, scale)
        torch.testing.assert_close(out[:n, bi:bi + 1].double(), ref, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(lse[bi, :, :n].double(), ref_lse[0], rtol=0, atol=1e-3)
        assert torch.equal(out[n:, bi], torch.zeros_like(out[n:, bi])), f"sequence {bi}: padded rows not zero"
        assert (lse[bi, :, n:] == float("-inf")).all(), f"sequence {bi}: padded rows' lse not -inf"


# The tests above that take each entry's lines: (entry, with softcap) -> the (dtype, d_qk, d_v) they run.
def _tested_lines():
    general = {(d, q, v) for d, q, v, _ in _general_params()}
    varlen = {(d, q, v) for d, q, v, _ in _varlen_params()}
    one_tile = set(_dims("fwd_one_tile"))
    return {
        ("fwd_one_tile", False): one_tile, ("bwd", False): one_tile,
        ("fwd_general", False): general, ("bwd_general", False): general,
        ("fwd_general", True): set(_dims("fwd_general", softcap=True)),
        ("bwd_general", True): set(_dims("fwd_general", softcap=True)),
        ("bwd_general_deterministic", False): set(_dims("bwd_general_deterministic")),
        ("bwd_general_deterministic", True): set(_dims("bwd_general_deterministic", softcap=True)),
        ("fwd_varlen", False): varlen, ("bwd_varlen", False): varlen,
        ("bwd_varlen_deterministic", False): set(_dims("bwd_varlen_deterministic")),
    }


def test_hopper_every_list_line_is_tested():
    """Every line of kernels.list gets calls in the tests above (the forward variants' own lines in the
    forced-variant and dispatch tests, the deterministic plain backward in test_hopper_backward_deterministic):
    a new line without a test fails here."""
    tested = _tested_lines()
    own = ("fwd_persistent", "fwd_three_consumer", "fwd_three_consumer_persistent", "bwd_deterministic")
    missing = [r for r in KERNEL_ROWS
               if r.entry not in own and (r.dtype, r.d_qk, r.d_v) not in tested.get((r.entry, r.softcap), set())]
    assert not missing, missing
