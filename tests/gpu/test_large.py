"""Tensors past 32-bit indexing on the GPU: forward and backward against a chunked float64 reference.

* q, k, v, out and the gradients with more than 2^31 elements (many short sequences);
* an s_q x s_kv plane of more than 2^31 elements (one long sequence), with a post-scale bias over
  the whole plane and its gradient.

Each engine that takes bf16 runs them: the default dispatch (on an H200 the Hopper kernels for the
plain and causal masks, the tensor-core engine for the padding mask and the bias; scripts/gpu_check.sh
repeats tests/gpu with FUSEDATTN_CUDA_ENGINE=simt for the SIMT engine). The reference recomputes
selected batches / query rows in float64, chunk by chunk, so it never holds a [s_q, s_kv] matrix of
the full problem.
"""

from __future__ import annotations

import math

import pytest
import torch

from fusedattn._ops import FwdArgs, attention

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

GIB = 1 << 30


def _need_memory(gib):
    torch.cuda.empty_cache()  # blocks the caching allocator holds from earlier tests count as free
    free, _ = torch.cuda.mem_get_info()
    if free < gib * GIB:
        pytest.skip(f"needs {gib} GiB of free GPU memory")


def _rel(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def _ref_rows(q, k, v, dout, scale, causal, bias=None):
    """float64 out and gradients of one (batch, head) for the query rows q holds (all keys), and the
    contributions of those rows to dk, dv (and dbias rows). q [m, d], k/v [n, d], dout [m, d]."""
    q, k, v, dout = (t.double().requires_grad_() for t in (q, k, v, dout))
    s = (q @ k.T) * scale
    if bias is not None:
        bias = bias.double().requires_grad_()
        s = s + bias
    if causal:
        m, n = s.shape
        i = torch.arange(m, device=s.device).view(-1, 1)
        j = torch.arange(n, device=s.device).view(1, -1)
        s = s.masked_fill(j > i, float("-inf"))
    out = torch.softmax(s, dim=-1) @ v
    leaves = (q, k, v) + ((bias,) if bias is not None else ())
    grads = torch.autograd.grad(out, leaves, dout.double())
    return out.detach(), grads


@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
def test_more_than_2_31_elements_per_tensor(mask):
    """b * s * h * d > 2^31: many sequences of 512 tokens (with a padding mask: cu_seqlens of full
    lengths, which Hopper declines); the first, a middle and the last batch entries checked (the
    indices past 2^31 elements are the last ones)."""
    b, s, h, d = 4100, 512, 8, 128
    assert b * s * h * d > 2**31
    _need_memory(60)
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    scale = 1 / math.sqrt(d)
    causal = mask == "causal"
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda") if mask == "padding" else None
    out, _ = attention(q, k, v, FwdArgs(scale=scale, mask_type=mask), cu_seqlens_q=cu, cu_seqlens_kv=cu)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t).all()
    for bi in (0, b // 2, b - 1):
        for hi in (0, h - 1):
            want_out, (wq, wk, wv) = _ref_rows(q[bi, :, hi], k[bi, :, hi], v[bi, :, hi], dout[bi, :, hi], scale, causal)
            assert _rel(out[bi, :, hi], want_out) < 1e-2
            for name, g, w in (("dq", dq, wq), ("dk", dk, wk), ("dv", dv, wv)):
                err = _rel(g[bi, :, hi], w)
                assert err < 2e-2, f"{name} batch {bi} head {hi}: relative error {err:.2e}"


def test_more_than_2_31_elements_in_the_score_plane():
    """s_q * s_kv > 2^31 with a bias over the whole plane (bf16, 8 GiB) and its gradient: query rows
    spread over the sequence checked in float64, dk / dv / dbias accumulated over row chunks."""
    s, d = 49152, 64
    assert s * s > 2**31
    _need_memory(70)
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v, dout = (torch.randn(1, s, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    bias = (0.5 * torch.randn(1, 1, s, s, device="cuda", dtype=torch.bfloat16, generator=gen))
    for t in (q, k, v, bias):
        t.requires_grad_()
    scale = 1 / math.sqrt(d)
    args = FwdArgs(scale=scale, mask_type="no_mask")
    out, _ = attention(q, k, v, args, bias=bias)
    dq, dk, dv, dbias = torch.autograd.grad(out, (q, k, v, bias), dout)
    assert torch.isfinite(out).all() and torch.isfinite(dbias).all()
    q2, k2, v2, do2 = (t[0, :, 0] for t in (q, k, v, dout))
    want_dk = torch.zeros(s, d, dtype=torch.float64, device="cuda")
    want_dv = torch.zeros_like(want_dk)
    chunk = 2048
    for r0 in range(0, s, chunk):
        rows = slice(r0, r0 + chunk)
        want_out, (wq, wk, wv, wb) = _ref_rows(q2[rows], k2, v2, do2[rows], scale, False, bias=bias[0, 0, rows])
        want_dk += wk
        want_dv += wv
        if r0 in (0, s // 2, s - chunk):  # rows at the start, middle and end of the plane
            assert _rel(out[0, rows, 0], want_out) < 1e-2
            assert _rel(dq[0, rows, 0], wq) < 2e-2
            assert _rel(dbias[0, 0, rows], wb) < 2e-2
    assert _rel(dk[0, :, 0], want_dk) < 2e-2
    assert _rel(dv[0, :, 0], want_dv) < 2e-2
