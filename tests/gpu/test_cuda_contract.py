"""The operator contract on CUDA (skipped cleanly without a GPU).

* torch.library.opcheck of fwd and bwd on CUDA over conftest.sample_inputs()
  (schema, fake vs real incl. strides, autograd registration, AOTAutograd);
* torch.compile(mode="reduce-overhead", fullgraph=True) of DotProductAttention
  forward + backward: no cudagraph skips, correct results across replays with
  fresh inputs.
"""

from __future__ import annotations

import pytest
import torch

import conftest as C

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

CONFIGS = [c for c in C.sample_inputs() if c.dtype != "fp64"]


def _cuda_case(cfg):
    return C.to_device(C.build_case(cfg), "cuda")


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_fwd_cuda(cfg):
    case = _cuda_case(cfg)
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, case.op_args())


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_bwd_cuda(cfg):
    case = _cuda_case(cfg)
    out, lse, rng_out, _ = C.run_op(case)
    q, k, v = (t.detach() for t in case.make_qkv(case.leaves))
    opt = [t.detach() if t is not None else None for t in case.op_tensors()[3:11]]
    need_dbias = "bias" in case.leaves
    args = (case.dout, q, k, v, out.detach(), lse, rng_out, *opt, *case.args.op_args(), need_dbias)
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
