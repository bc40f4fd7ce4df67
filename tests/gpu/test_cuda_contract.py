"""The operator contract on CUDA (skipped cleanly without a GPU).

* torch.library.opcheck of fwd and bwd on CUDA over conftest.sample_inputs()
  (schema, fake vs real incl. strides, autograd registration, AOTAutograd);
* torch.compile(mode="reduce-overhead", fullgraph=True) of DotProductAttention
  forward + backward: no cudagraph skips, correct results across replays with
  fresh inputs;
* deterministic mode (torch.use_deterministic_algorithms): bitwise-reproducible
  gradients from the tensor-core backward, torch's error where no deterministic
  path exists.
"""

from __future__ import annotations

import pytest
import torch

import conftest as C
from fusedattn._ops import FwdArgs, attention

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

CONFIGS = [c for c in C.sample_inputs() if c.dtype != "fp64"]


def _cuda_case(cfg):
    return C.to_device(C.build_case(cfg), "cuda")


@pytest.mark.usefixtures("deterministic_algorithms")
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_fwd_cuda(cfg):
    case = _cuda_case(cfg)
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, case.op_args(),
                          test_utils=C.opcheck_tests(case.dtype, "cuda"))


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_bwd_cuda(cfg):
    case = _cuda_case(cfg)
    out, lse, rng_out, _ = C.run_op(case)
    q, k, v = (t.detach() for t in case.make_qkv(case.leaves))
    opt = [t.detach() if t is not None else None for t in case.op_tensors()[3:11]]
    need_dbias = "bias" in case.leaves
    args = (case.dout, q, k, v, out.detach(), lse, rng_out, *opt, *case.args.op_args(), need_dbias, 0)
    torch.library.opcheck(torch.ops.fusedattn.bwd.default, args)


@pytest.mark.parametrize("mask", ["causal", "padding_causal"])
def test_reduce_overhead_no_cudagraph_skips(mask):
    from torch._dynamo.utils import counters

    from fusedattn import DotProductAttention

    torch._dynamo.reset()
    counters.clear()
    b, s, h, d = 2, 128, 8, 64
    mod = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask).cuda()

    def fwd(q, k, v, cu):
        kw = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu} if mask.startswith("padding") else {}
        return mod(q, k, v, **kw)

    compiled = torch.compile(fwd, mode="reduce-overhead", fullgraph=True)
    for trial in range(4):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        lens = torch.randint(1, s + 1, (b,), device="cuda")
        cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32)
        dout = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
        out = compiled(q, k, v, cu)
        got = [out.detach().clone(), *torch.autograd.grad(out, (q, k, v), dout)]
        qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
        oute = fwd(qe, ke, ve, cu)
        want = [oute.detach(), *torch.autograd.grad(oute, (qe, ke, ve), dout)]
        for g, w in zip(got, want):
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2, msg=lambda m: f"trial {trial}: {m}")
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"]["cudagraph_skips"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])


def _grads(q, k, v, args, dout, **kw):
    out, _ = attention(q, k, v, args, **kw)
    leaves = [q, k, v] + [t for t in kw.values() if t.requires_grad]
    return torch.autograd.grad(out, leaves, dout)


DETERMINISTIC_CASES = {
    # name: (mask, window, h_q, h_kv, extra); s = 640 gives 5+ key tiles per query tile.
    "causal_gqa": ("causal", (-1, 0), 8, 2, None),
    "window": ("no_mask", (200, 50), 4, 4, None),
    "bias_1hss": ("no_mask", (-1, -1), 4, 4, "bias"),
    "learnable": ("causal", (-1, 0), 4, 2, "learnable"),
}


@pytest.mark.parametrize("name", list(DETERMINISTIC_CASES))
def test_deterministic_backward_is_bitwise_reproducible(name):
    """Under torch.use_deterministic_algorithms the tensor-core backward sums dQ (and a
    broadcast dbias, d_softmax_offset) in a fixed order: two runs are bitwise equal, and
    they agree with the default (atomic) backward to rounding. Forced onto the SIMT engine, the
    call raises instead."""
    mask, (wl, wr), h_q, h_kv, extra = DETERMINISTIC_CASES[name]
    b, s, d = 2, 640, 64
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, s, h_q, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k, v = (torch.randn(b, s, h_kv, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
            for _ in range(2))
    dout = torch.randn(b, s, h_q, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kw, softmax = {}, "vanilla"
    if extra == "bias":
        kw["bias"] = torch.randn(1, h_q, s, s, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    if extra == "learnable":
        softmax = "learnable"
        kw["softmax_offset"] = torch.randn(h_q, device="cuda", generator=g).requires_grad_()
    args = FwdArgs(scale=d ** -0.5, mask_type=mask, window_left=wl, window_right=wr, softmax_type=softmax)
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        if C.CUDA_ENGINE == "simt":
            with pytest.raises(RuntimeError, match=C.SIMT_NOT_DETERMINISTIC):
                _grads(q, k, v, args, dout, **kw)
            return
        first = _grads(q, k, v, args, dout, **kw)
        second = _grads(q, k, v, args, dout, **kw)
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    default = _grads(q, k, v, args, dout, **kw)
    for i, (x, y, z) in enumerate(zip(first, second, default)):
        assert torch.isfinite(x).all(), f"gradient {i} has non-finite values"
        assert torch.equal(x, y), f"gradient {i} differs between two deterministic runs"
        torch.testing.assert_close(x.float(), z.float(), rtol=2e-2, atol=2e-2, msg=lambda m: f"gradient {i}: {m}")


def test_deterministic_strict_raises_without_a_deterministic_path():
    """The SIMT engine (float32 here) sums dQ with atomics: strict deterministic mode raises
    torch's usual error instead of returning a non-reproducible gradient."""
    q, k, v = (torch.randn(1, 64, 2, 32, device="cuda", requires_grad=True) for _ in range(3))
    args = FwdArgs(scale=32 ** -0.5)
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="fusedattn::bwd"):
            _grads(q, k, v, args, torch.randn_like(q))
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
