"""fusedattn under torch.compile and torch.export.

* DotProductAttention and fusedattn.scaled_dot_product_attention compile with
  fullgraph=True, forward and backward, with zero graph breaks, and give the
  eager numbers (bitwise with the aot_eager backend, which runs the same ops);
* dynamic=True compiles once for several sequence lengths;
* torch.export of a small model built on DotProductAttention works and runs;
* the eager-fallback gate: with fusedattn.config.force_eager, a compiled call
  graph-breaks and warns with the reason (same numbers); under fullgraph=True
  compilation fails with an error that names the reason.

Inputs are made on the CPU and run on conftest.DEVICE (FUSEDATTN_TEST_DEVICE).
On CUDA, gradients accumulated with atomics may differ between two runs in
their last bits (conftest.rerun_tol); everything else is compared exactly.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from torch._dynamo.utils import counters

import fusedattn
from fusedattn import DotProductAttention
from fusedattn._gate import FORCE_EAGER_REASON
from conftest import (DPA_LAYOUTS, MATRIX, build_case, dpa_kwargs, dpa_module, module_on_device, on_device, rerun_tol,
                      sample_inputs, to_device)

COMPILE_CONFIGS = sample_inputs(
    features=("layout", "mask", "window", "bias", "softmax", "dropout", "heads", "dims", "max_logit", "max_seqlen",
              "dtype"),
    pool=[c for c in MATRIX if c.layout in DPA_LAYOUTS and c.shape != "long" and max(c.dims) <= 128])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def _run_dpa(fn, mod, case, leaves, seed=1234):
    torch.manual_seed(seed)  # dropout draws its rng_state from torch's generator
    res = fn(mod, leaves)
    out, max_logit = (res if isinstance(res, tuple) else (res, None))
    dout = case.dout.flatten(-2)
    out.backward(dout)
    grads = {n: t.grad for n, t in leaves.items() if n != "softmax_offset"}
    if mod.softmax_offset is not None:
        grads["softmax_offset"] = mod.softmax_offset.grad
    return out, max_logit, grads


def _dpa_call(mod, leaves, case):
    return mod(**dpa_kwargs(case, leaves))


@pytest.mark.parametrize("cfg", COMPILE_CONFIGS, ids=str)
def test_dpa_compiles_fullgraph_and_matches_eager(cfg):
    case = to_device(build_case(cfg))
    mod_e = dpa_module(case)
    mod_c = copy.deepcopy(mod_e)

    def fn(mod, leaves):
        return _dpa_call(mod, leaves, case)

    eager = _run_dpa(fn, mod_e, case, case.clone_leaves())
    compiled_fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    comp = _run_dpa(compiled_fn, mod_c, case, case.clone_leaves())
    assert graph_breaks() == 0, dict(counters["graph_break"])
    torch.testing.assert_close(comp[0], eager[0], rtol=0, atol=0)
    if cfg.max_logit:
        torch.testing.assert_close(comp[1], eager[1], rtol=0, atol=0)
    for n in eager[2]:
        assert comp[2][n] is not None, f"no gradient for {n} under compile"
        torch.testing.assert_close(comp[2][n], eager[2][n], **rerun_tol(n), msg=f"d{n}")


INDUCTOR_CONFIGS = [
    c for c in COMPILE_CONFIGS if c.layout in ("bshd", "thd_gaps", "sbh3d") and c.dropout == 0
][:3]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", INDUCTOR_CONFIGS, ids=str)
def test_dpa_compiles_with_inductor(cfg):
    case = to_device(build_case(cfg))
    mod_e = dpa_module(case)
    mod_c = copy.deepcopy(mod_e)

    def fn(mod, leaves):
        return _dpa_call(mod, leaves, case)

    eager = _run_dpa(fn, mod_e, case, case.clone_leaves())
    comp = _run_dpa(torch.compile(fn, fullgraph=True), mod_c, case, case.clone_leaves())
    assert graph_breaks() == 0
    # Inductor may hand the op differently strided (materialised) inputs; the results may not move
    # beyond rounding.
    tol = dict(rtol=1e-5, atol=1e-5) if case.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(comp[0], eager[0], **tol)
    for n in eager[2]:
        torch.testing.assert_close(comp[2][n], eager[2][n], **tol, msg=f"d{n}")


def test_dpa_module_compiles_with_inductor_smoke():
    """The default backend (Inductor) on a plain module call, forward and backward."""
    torch.manual_seed(0)
    mod = DotProductAttention(4, 32, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")
    q = on_device(torch.randn(2, 24, 4, 32)).requires_grad_()
    k = on_device(torch.randn(2, 24, 2, 32)).requires_grad_()
    v = on_device(torch.randn(2, 24, 2, 32)).requires_grad_()
    ref = mod(q, k, v)
    ref.sum().backward()
    g_ref = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    cmod = torch.compile(mod, fullgraph=True)
    out = cmod(q, k, v)
    out.sum().backward()
    assert graph_breaks() == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip((q.grad, k.grad, v.grad), g_ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


SDPA_CASES = [
    dict(mask=None, causal=False, gqa=False, scale=None),
    dict(mask="bool", causal=False, gqa=False, scale=0.3),
    dict(mask="float", causal=False, gqa=True, scale=None),
    dict(mask=None, causal=True, gqa=True, scale=0.2),
]


@pytest.mark.parametrize("kw", SDPA_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_sdpa_compiles_fullgraph_and_matches_eager(kw):
    torch.manual_seed(0)
    b, h_q, s_q, s_kv, d = 2, 4, 12, 20, 32
    h_kv = 2 if kw["gqa"] else h_q
    q = torch.randn(b, h_q, s_q, d)
    k = torch.randn(b, h_kv, s_kv, d)
    v = torch.randn(b, h_kv, s_kv, d)
    mask = None
    if kw["mask"] == "bool":
        mask = torch.rand(b, 1, s_q, s_kv) > 0.3
    elif kw["mask"] == "float":
        mask = torch.randn(1, h_q, s_q, s_kv, requires_grad=True)
    q, k, v, mask = on_device((q, k, v, mask))

    def fn(q, k, v, mask):
        return fusedattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kw["causal"],
                                                      scale=kw["scale"], enable_gqa=kw["gqa"])

    def run(f):
        ins = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None
               for t in (q, k, v, mask)]
        out = f(*ins)
        out.backward(torch.ones_like(out))
        return out, [t.grad for t in ins if t is not None and t.requires_grad]

    out_e, g_e = run(fn)
    out_c, g_c = run(torch.compile(fn, fullgraph=True, backend="aot_eager"))
    assert graph_breaks() == 0
    torch.testing.assert_close(out_c, out_e, rtol=0, atol=0)
    for name, a, b_ in zip(("q", "k", "v", "bias"), g_c, g_e):  # the float mask is a broadcast bias
        torch.testing.assert_close(a, b_, **rerun_tol(name))


# ---------------------------------------------------------------------------
# Dynamic shapes


def test_dynamic_compiles_once_over_sequence_lengths():
    torch.manual_seed(0)
    mod = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="sbhd", attn_mask_type="causal")
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cmod = torch.compile(mod, backend=cnt, dynamic=True, fullgraph=True)
    frames = []
    for s in (8, 13, 32, 57):
        q = on_device(torch.randn(s, 2, 4, 16)).requires_grad_()
        k = on_device(torch.randn(s, 2, 2, 16)).requires_grad_()
        v = on_device(torch.randn(s, 2, 2, 16)).requires_grad_()
        out = cmod(q, k, v)
        assert out.shape == (s, 2, 4 * 16)
        out.sum().backward()
        ref = mod(q, k, v)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        frames.append(cnt.frame_count)
    _assert_compiled_once(frames)


def _assert_compiled_once(frames):
    # One graph for every length, and no backend call after the first length. (The count after the
    # first call may exceed 1: Dynamo restarts the analysis of a frame once when it specialises the
    # float arguments (scale, dropout_p) that dynamic=True first traced as symbols.)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert all(f == frames[0] for f in frames), f"recompiled: backend calls after each length {frames}"
    assert graph_breaks() == 0


def test_dynamic_thd_compiles_once_over_token_counts():
    torch.manual_seed(0)
    mod = DotProductAttention(2, 16, qkv_format="thd", attn_mask_type="padding_causal")
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def fn(q, k, v, cu, max_s):
        return mod(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max_s, max_seqlen_kv=max_s)

    cfn = torch.compile(fn, backend=cnt, dynamic=True, fullgraph=True)
    frames = []
    for lens in ([3, 5], [7, 2, 9], [4, 4, 4, 11]):
        t = sum(lens)
        cu = on_device(torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32))
        q, k, v = (on_device(torch.randn(t, 2, 16)).requires_grad_() for _ in range(3))
        out = cfn(q, k, v, cu, max(lens))
        out.sum().backward()
        torch.testing.assert_close(out, fn(q, k, v, cu, max(lens)), rtol=0, atol=0)
        frames.append(cnt.frame_count)
    _assert_compiled_once(frames)


# ---------------------------------------------------------------------------
# torch.export


class TinyAttentionBlock(torch.nn.Module):
    def __init__(self, hidden=64, heads=4, gqa=2):
        super().__init__()
        self.heads, self.gqa, self.d = heads, gqa, hidden // heads
        self.q = torch.nn.Linear(hidden, hidden)
        self.kv = torch.nn.Linear(hidden, 2 * gqa * self.d)
        self.attn = DotProductAttention(heads, self.d, num_gqa_groups=gqa, qkv_format="bshd",
                                        attn_mask_type="causal", softmax_type="learnable")
        self.o = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d)
        kv = self.kv(x).view(b, s, 2, self.gqa, self.d)
        return self.o(self.attn(q, kv[:, :, 0], kv[:, :, 1]))


def test_torch_export_runs():
    torch.manual_seed(0)
    model = TinyAttentionBlock().eval()
    with torch.no_grad():
        model.attn.softmax_offset.uniform_(-1, 1)
    model = module_on_device(model)
    x = on_device(torch.randn(2, 10, 64))
    s = torch.export.Dim("s", min=2, max=256)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {1: s}})
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("fusedattn.fwd" in t for t in targets), targets
    for length in (10, 33):
        x = on_device(torch.randn(2, length, 64))
        torch.testing.assert_close(ep.module()(x), model(x), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# The eager-fallback gate


@pytest.fixture
def force_eager(monkeypatch):
    monkeypatch.setattr(fusedattn.config, "force_eager", True)


def _gate_inputs():
    torch.manual_seed(0)
    mod = DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = (on_device(torch.randn(2, 9, 2, 16)).requires_grad_() for _ in range(3))
    return mod, q, k, v


def test_force_eager_warns_graph_breaks_and_matches(force_eager):
    mod, q, k, v = _gate_inputs()

    def fn(q, k, v):
        return torch.sin(mod(q, k, v)) * 2

    ref = fn(q, k, v)
    ref.sum().backward()
    g_ref = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    cfn = torch.compile(fn, backend="aot_eager")
    with pytest.warns(UserWarning, match="falling back to eager execution under torch.compile") as rec:
        out = cfn(q, k, v)
    assert any(FORCE_EAGER_REASON in str(w.message) for w in rec)
    out.sum().backward()
    assert graph_breaks() >= 1
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for name, g, r in zip("qkv", (q.grad, k.grad, v.grad), g_ref):
        torch.testing.assert_close(g, r, **rerun_tol(name))


def test_force_eager_sdpa_warns(force_eager):
    q, k, v = (on_device(torch.randn(1, 2, 5, 16)) for _ in range(3))
    cfn = torch.compile(lambda q, k, v: fusedattn.scaled_dot_product_attention(q, k, v, is_causal=True),
                        backend="aot_eager")
    with pytest.warns(UserWarning, match="falling back to eager"):
        out = cfn(q, k, v)
    assert graph_breaks() >= 1
    torch.testing.assert_close(out, fusedattn.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=0, atol=0)


def test_force_eager_fullgraph_raises_with_reason(force_eager):
    mod, q, k, v = _gate_inputs()
    cfn = torch.compile(lambda q, k, v: mod(q, k, v), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=FORCE_EAGER_REASON.replace(".", r"\.")):
        cfn(q, k, v)


def test_no_warning_without_force_eager():
    mod, q, k, v = _gate_inputs()
    cfn = torch.compile(lambda q, k, v: mod(q, k, v), backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfn(q, k, v)
    assert graph_breaks() == 0


def test_force_eager_flip_recompiles(monkeypatch):
    """config.force_eager is guarded: flipping it after a compile takes effect."""
    mod, q, k, v = _gate_inputs()
    cfn = torch.compile(lambda q, k, v: mod(q, k, v), backend="aot_eager")
    cfn(q, k, v)
    assert graph_breaks() == 0
    monkeypatch.setattr(fusedattn.config, "force_eager", True)
    with pytest.warns(UserWarning, match="falling back to eager"):
        cfn(q, k, v)
    assert graph_breaks() >= 1
