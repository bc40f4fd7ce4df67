"""KV cache: InferenceParams, the copy_to_kv_cache operator and attention through a page table.

* every step of a decoding scenario (ragged prefill, 1-token steps, a sequence
  leaving and another joining with its own prefill) matches a float64
  reference of full attention over each sequence's prefix, paged and
  non-paged, with q in bshd (padded), sbhd and thd;
* paged equals non-paged;
* torch.compile(fullgraph=True) decoding equals eager at every step, with no
  recompile after the first decode step (and on CUDA, mode="reduce-overhead"
  with no cudagraph skips);
* bad use raises a clear exception and leaves the caches and bookkeeping as
  they were;
* torch.library.opcheck of the append operator (mutated arguments).

The numerics, operator and compile tests run on CPU, and on CUDA as well when
a device is present (or FUSEDATTN_TEST_DEVICE=cuda); the bookkeeping and
bad-use tests run on conftest.DEVICE (FUSEDATTN_TEST_DEVICE, default CPU).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
from torch._dynamo.utils import counters

import fusedattn._ops  # noqa: F401  (loads the operators)
from fusedattn._ops import FwdArgs
from fusedattn import DotProductAttention
from fusedattn.inference import InferenceParams, KVCacheFullError
from conftest import DEVICE, ON_CUDA, tol_check

DEVICES = ["cpu"]
if torch.cuda.is_available() or ON_CUDA:
    DEVICES.append(DEVICE if ON_CUDA else "cuda")

H, H_KV, D_K, D_V = 4, 2, 32, 16
MAX_BATCH, MAX_SEQ, PAGE = 3, 16, 4

# seq_id -> new tokens, step by step: a ragged prefill, decoding, sequence 1
# leaving while sequence 3 joins with a 6-token prefill, decoding again.
SCENARIO = [
    OrderedDict([(0, 5), (1, 3), (2, 7)]),
    OrderedDict([(0, 1), (1, 1), (2, 1)]),
    OrderedDict([(0, 1), (1, 1), (2, 1)]),
    OrderedDict([(0, 1), (2, 1), (3, 6)]),
    OrderedDict([(0, 1), (2, 1), (3, 1)]),
    OrderedDict([(0, 1), (2, 1), (3, 1)]),
]


def make_params(paged: bool, device, dtype=torch.float32, qkv_format="bshd", total_num_pages=9, **kw):
    # 9 pages of 4 < 3 sequences x 16 tokens: freed pages must be reused.
    return InferenceParams(MAX_BATCH, MAX_SEQ, H_KV, D_K, dtype, head_dim_v=D_V, is_paged=paged,
                           page_size=PAGE if paged else None, total_num_pages=total_num_pages if paged else None,
                           qkv_format=qkv_format, max_ctx_len=8 if qkv_format == "thd" else None,
                           device=device, **kw)


def make_layers(n_layers: int, qkv_format: str):
    return [DotProductAttention(H, (D_K, D_V), num_gqa_groups=H_KV, qkv_format=qkv_format,
                                attn_mask_type="padding_causal", layer_number=i + 1) for i in range(n_layers)]


def step_inputs(step: OrderedDict, fmt: str, n_layers: int, dtype, device, gen):
    """Per layer: (q, k, v) of the step in ``fmt`` (bshd/sbhd padded to the longest step)."""
    lens = list(step.values())
    b, s, t = len(lens), max(lens), sum(lens)

    def rnd(heads, d):
        shape = {"bshd": (b, s, heads, d), "sbhd": (s, b, heads, d), "thd": (t, heads, d)}[fmt]
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    return [(rnd(H, D_K), rnd(H_KV, D_K), rnd(H_KV, D_V)) for _ in range(n_layers)]


def rows(x: torch.Tensor, fmt: str, lens, i: int) -> torch.Tensor:
    """Sequence i's first lens[i] rows of a bshd/sbhd/thd tensor: [n, ...]."""
    if fmt == "bshd":
        return x[i, : lens[i]]
    if fmt == "sbhd":
        return x[: lens[i], i]
    start = sum(lens[:i])
    return x[start:start + lens[i]]


def attention_ref(q, k, v, dtype):
    """Full attention of the n new queries over the whole prefix (bottom-right causal), in ``dtype``."""
    n, L = q.shape[0], k.shape[0]
    g = H // H_KV
    qq = q.to(dtype).transpose(0, 1)
    kk = k.to(dtype).repeat_interleave(g, 1).transpose(0, 1)
    vv = v.to(dtype).repeat_interleave(g, 1).transpose(0, 1)
    s = (qq @ kk.transpose(1, 2)) * (1.0 / math.sqrt(D_K))
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(L, device=q.device)[None]
    s = s.masked_fill(j > i + (L - n), float("-inf"))
    return (s.softmax(-1) @ vv).transpose(0, 1).reshape(n, H * D_V)


class Run:
    """Drives a scenario through eager layers, keeping every sequence's prefix for the reference."""

    def __init__(self, params, layers, fmt, fn=None):
        self.params, self.layers, self.fmt = params, layers, fmt
        self.fn = fn or (lambda inputs, p: [m(q, k, v, inference_params=p)
                                            for m, (q, k, v) in zip(layers, inputs)])
        self.prefix = {}  # (layer, seq_id) -> (k, v) so far

    def step(self, step, inputs):
        self.params.pre_step(step)
        outs = self.fn(inputs, self.params)
        lens = list(step.values())
        for layer, (q, k, v) in enumerate(inputs):
            for i, sid in enumerate(step):
                pk, pv = self.prefix.get((layer, sid), (k[:0].reshape(0, H_KV, D_K), v[:0].reshape(0, H_KV, D_V)))
                self.prefix[(layer, sid)] = (torch.cat([pk, rows(k, self.fmt, lens, i)]),
                                             torch.cat([pv, rows(v, self.fmt, lens, i)]))
        for key in [key for key in self.prefix if key[1] not in step]:
            del self.prefix[key]
        return outs

    def check(self, step, inputs, outs, dtype):
        lens = list(step.values())
        msgs = []
        for layer, ((q, _, _), out) in enumerate(zip(inputs, outs)):
            want_shape = {"bshd": (len(lens), max(lens), H * D_V), "sbhd": (max(lens), len(lens), H * D_V),
                          "thd": (sum(lens), H * D_V)}[self.fmt]
            assert tuple(out.shape) == want_shape
            for i, sid in enumerate(step):
                k, v = self.prefix[(layer, sid)]
                qi = rows(q, self.fmt, lens, i)
                ref64 = attention_ref(qi, k, v, torch.float64)
                ref_lp = attention_ref(qi, k, v, dtype)
                msgs.append(tol_check(f"layer {layer} seq {sid}", rows(out, self.fmt, lens, i), ref64, ref_lp, dtype))
            if self.fmt != "thd":  # padded query rows are zeros
                pad = torch.ones(out.shape[:2], dtype=torch.bool)
                for i in range(len(lens)):
                    pad[(i, slice(0, lens[i])) if self.fmt == "bshd" else (slice(0, lens[i]), i)] = False
                assert torch.equal(out[pad.to(out.device)], torch.zeros_like(out[pad.to(out.device)]))
        msgs = [m for m in msgs if m]
        assert not msgs, "\n".join(msgs)


# ---------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_decoding_matches_reference(paged, fmt, device):
    dtype = torch.float32
    layers = make_layers(2, fmt)
    params = make_params(paged, device, qkv_format=fmt)
    for n in (1, 2):
        params.allocate_memory(n)
    run = Run(params, layers, fmt)
    gen = torch.Generator().manual_seed(1)
    for step in SCENARIO:
        inputs = step_inputs(step, fmt, 2, dtype, device, gen)
        outs = run.step(step, inputs)
        run.check(step, inputs, outs, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decoding_matches_reference_low_precision(dtype, device):
    layers = make_layers(1, "bshd")
    params = make_params(True, device, dtype=dtype)
    params.allocate_memory(1)
    run = Run(params, layers, "bshd")
    gen = torch.Generator().manual_seed(2)
    for step in SCENARIO:
        inputs = step_inputs(step, "bshd", 1, dtype, device, gen)
        outs = run.step(step, inputs)
        run.check(step, inputs, outs, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_equals_nonpaged(device):
    layers = make_layers(2, "bshd")
    runs = []
    for paged in (False, True):
        p = make_params(paged, device)
        for n in (1, 2):
            p.allocate_memory(n)
        runs.append(Run(p, layers, "bshd"))
    gen = torch.Generator().manual_seed(3)
    for step in SCENARIO:
        inputs = step_inputs(step, "bshd", 2, torch.float32, device, gen)
        a, b = (r.step(step, inputs) for r in runs)
        for x, y in zip(a, b):
            if device == "cpu":  # same keys in the same order: the same arithmetic
                assert torch.equal(x, y)
            else:
                torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", ["plain", "window", "alibi", "off-by-one", "mqa", "fp16"])
def test_paged_forward_equals_contiguous(feature, device):
    """The forward op through a (shuffled) page table equals it on the gathered contiguous cache."""
    from fusedattn._ops import FwdArgs, attention

    gen = torch.Generator().manual_seed(6)
    dtype = torch.float16 if feature == "fp16" else torch.float32
    h_kv = 1 if feature == "mqa" else H_KV
    b, s_q, ps, max_pages = 3, 3, 4, 4
    lens_q, lens_kv = [3, 1, 2], [9, 1, 16]
    perm = torch.randperm(b * max_pages, generator=gen).to(torch.int32)
    page_table = perm.view(b, max_pages)
    k_pool = torch.randn(b * max_pages, ps, h_kv, D_K, generator=gen).to(dtype)
    v_pool = torch.randn(b * max_pages, ps, h_kv, D_V, generator=gen).to(dtype)
    q = torch.randn(b, s_q, H, D_K, generator=gen).to(dtype)
    k_flat = k_pool[page_table.long()].reshape(b, max_pages * ps, h_kv, D_K)
    v_flat = v_pool[page_table.long()].reshape(b, max_pages * ps, h_kv, D_V)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    window = (5, 0) if feature == "window" else (-1, 0)
    args = FwdArgs(scale=0.3, mask_type="padding_causal_bottom_right", window_left=window[0], window_right=0,
                   softmax_type="off-by-one" if feature == "off-by-one" else "vanilla")
    slopes = torch.rand(H, generator=gen) if feature == "alibi" else None
    t = lambda x: x.to(device) if x is not None else None
    kw = dict(cu_seqlens_q=t(cu(lens_q)), cu_seqlens_kv=t(cu(lens_kv)), alibi_slopes=t(slopes))
    paged, _ = attention(t(q), t(k_pool), t(v_pool), args, page_table=t(page_table), **kw)
    flat, _ = attention(t(q), t(k_flat), t(v_flat), args, **kw)
    if device == "cpu":
        assert torch.equal(paged, flat)
    else:
        torch.testing.assert_close(paged, flat, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_layers_have_their_own_caches(device):
    """The same k/v appended to layer 1 only changes layer 1's cache."""
    p = make_params(True, device)
    p.allocate_memory(1)
    p.allocate_memory(2)
    p.pre_step(OrderedDict([(0, 2)]))
    k = torch.randn(1, 2, H_KV, D_K, device=device)
    v = torch.randn(1, 2, H_KV, D_V, device=device)
    p.step(1, k, v, "bshd")
    k1, v1 = p.cache_manager.cache[1]
    k2, v2 = p.cache_manager.cache[2]
    page = p.get_page_table()[0, 0].item()
    assert torch.equal(k1[page, :2], k[0]) and torch.equal(v1[page, :2], v[0])
    assert not k2.any() and not v2.any()


# ---------------------------------------------------------------------------
# The append operator


def _scatter_ref(new_k, new_v, k_cache, v_cache, page_table, cu, cache_seqlens, fmt):
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    ps = k_cache.shape[1]
    for b in range(page_table.shape[0]):
        n = int(cu[b + 1] - cu[b])
        for i in range(n):
            pos = int(cache_seqlens[b]) + i
            page, slot = int(page_table[b, pos // ps]), pos % ps
            src = {"bshd": (b, i), "sbhd": (i, b), "thd": (int(cu[b]) + i,)}[fmt]
            k_cache[page, slot] = new_k[src]
            v_cache[page, slot] = new_v[src]
    return k_cache, v_cache


def append_case(fmt, device, dtype=torch.float32, strided=False):
    """3 sequences, pages of 4, lengths before/after crossing page boundaries."""
    gen = torch.Generator().manual_seed(4)
    lens, cached = [3, 0, 5], [2, 7, 4]
    b, s, t = 3, max(lens), sum(lens) + 1
    shape = {"bshd": (b, s), "sbhd": (s, b), "thd": (t,)}[fmt]
    if strided:  # k and v as views of one packed buffer: any strides
        kv = torch.randn(*shape, H_KV, 2, D_K, generator=gen).to(dtype)
        new_k, new_v = kv[..., 0, :], kv[..., 1, :]
    else:
        new_k = torch.randn(*shape, H_KV, D_K, generator=gen).to(dtype)
        new_v = torch.randn(*shape, H_KV, D_V, generator=gen).to(dtype)
    dv = new_v.shape[-1]
    k_cache = torch.randn(10, 4, H_KV, D_K, generator=gen).to(dtype)
    v_cache = torch.randn(10, 4, H_KV, dv, generator=gen).to(dtype)
    page_table = torch.tensor([[7, 2, 0], [1, 4, 8], [9, 3, 5]], dtype=torch.int32)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    seqlens = torch.tensor(cached, dtype=torch.int32)
    args = [new_k, new_v, k_cache, v_cache, page_table, cu, seqlens]
    return [a.to(device) for a in args] + [fmt]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "packed_kv"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_append_op_writes_the_right_slots(fmt, strided, device):
    args = append_case(fmt, device, strided=strided)
    want_k, want_v = _scatter_ref(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    torch.ops.fusedattn.copy_to_kv_cache(*args)
    assert torch.equal(args[2].cpu(), want_k)
    assert torch.equal(args[3].cpu(), want_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_opcheck_copy_to_kv_cache(fmt, device):
    torch.library.opcheck(torch.ops.fusedattn.copy_to_kv_cache.default, append_case(fmt, device))


@pytest.mark.parametrize("device", DEVICES)
def test_append_op_compiles_inplace(device):
    """Under torch.compile the op stays in the graph and writes the caches in place."""
    args = append_case("bshd", device)
    want_k, want_v = _scatter_ref(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])

    def fn(new_k, new_v, k_cache, v_cache, pt, cu, sl):
        torch.ops.fusedattn.copy_to_kv_cache(new_k, new_v, k_cache, v_cache, pt, cu, sl, "bshd")
        return k_cache.sum()

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend="aot_eager")(*args[:-1])
    assert torch.equal(args[2].cpu(), want_k) and torch.equal(args[3].cpu(), want_v)


# ---------------------------------------------------------------------------
# Compiled decoding


def _compiled_decoding(paged, device, mode=None, backend="inductor"):
    layers = make_layers(2, "bshd")

    def model(inputs, p):
        return [m(q, k, v, inference_params=p) for m, (q, k, v) in zip(layers, inputs)]

    eager_p, comp_p = make_params(paged, device), make_params(paged, device)
    for p in (eager_p, comp_p):
        for n in (1, 2):
            p.allocate_memory(n)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend=backend, mode=mode)
    gen = torch.Generator().manual_seed(5)
    steps = [SCENARIO[0]] + [SCENARIO[1]] * 5  # prefill, then 5 one-token steps of the same batch
    graphs = []
    for n, step in enumerate(steps):
        inputs = step_inputs(step, "bshd", 2, torch.float32, device, gen)
        eager_p.pre_step(step)
        comp_p.pre_step(step)
        want = model(inputs, eager_p)
        got = compiled(inputs, comp_p)
        for layer, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), f"step {n} layer {layer}: compiled != eager (max diff {(g - w).abs().max()})"
        graphs.append(counters["stats"]["unique_graphs"])
    for layer in (1, 2):
        for a, b in zip(eager_p.cache_manager.cache[layer], comp_p.cache_manager.cache[layer]):
            assert torch.equal(a, b)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    # prefill and the first decode step compile; later decode steps reuse the graph
    assert graphs[2:] == [graphs[1]] * (len(graphs) - 2), f"recompiled while decoding: {graphs}"
    return counters


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_compiled_decoding_matches_eager_without_recompiles(paged, device):
    _compiled_decoding(paged, device)


@pytest.mark.skipif(len(DEVICES) < 2, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_cudagraph_decoding_matches_eager(paged):
    c = _compiled_decoding(paged, DEVICES[-1], mode="reduce-overhead")
    assert not c["inductor"]["cudagraph_skips"], dict(c["inductor"])


# ---------------------------------------------------------------------------
# Bad use: a clear exception, and nothing changed


def _snapshot(p: InferenceParams):
    m = p.cache_manager
    return dict(
        sequences=dict(p.sequences), batch=p.batch_size, mgr_sequences=dict(m.sequences),
        pages={k: list(v) for k, v in m.pages.items()}, free=list(m.free_pages),
        buffers=[b.clone() for b in (p.cu_seqlens_q, p.cu_seqlens_kv, p.pre_step_seqlens, m.page_table,
                                     m.cache_seqlens)],
        caches={n: tuple(t.clone() for t in kv) for n, kv in m.cache.items()},
    )


def _assert_unchanged(p, snap):
    now = _snapshot(p)
    for key in ("sequences", "batch", "mgr_sequences", "pages", "free"):
        assert now[key] == snap[key], key
    for a, b in zip(now["buffers"], snap["buffers"]):
        assert torch.equal(a, b)
    for n in snap["caches"]:
        for a, b in zip(now["caches"][n], snap["caches"][n]):
            assert torch.equal(a, b)


def _started(paged, device, **kw):
    p = make_params(paged, device, **kw)
    p.allocate_memory(1)
    p.pre_step(OrderedDict([(0, 5), (1, 3)]))
    p.step(1, torch.randn(2, 5, H_KV, D_K, device=device), torch.randn(2, 5, H_KV, D_V, device=device), "bshd")
    return p


@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
@pytest.mark.parametrize("bad, exc, match", [
    (OrderedDict([(0, 12), (1, 1)]), ValueError, "past max_sequence_length"),
    ([(0, 1), (0, 1)], ValueError, "duplicate seq_id"),
    (OrderedDict([(0, 0), (1, 1)]), ValueError, "positive int"),
    (OrderedDict([(0, 1), (1, 1), (2, 1), (3, 1)]), ValueError, "max_batch_size"),
    (OrderedDict(), ValueError, "at least one sequence"),
    ([([1], 1)], TypeError, "hashable"),
], ids=["past_max_seqlen", "duplicate", "zero_len", "too_many", "empty", "unhashable"])
def test_bad_pre_step_leaves_state(paged, bad, exc, match):
    p = _started(paged, DEVICE)
    snap = _snapshot(p)
    with pytest.raises(exc, match=match):
        p.pre_step(bad)
    _assert_unchanged(p, snap)


def test_page_pool_exhausted_leaves_state():
    p = _started(True, DEVICE, total_num_pages=4)  # 2 + 1 pages in use, 1 free
    snap = _snapshot(p)
    with pytest.raises(KVCacheFullError, match="KV cache is full"):
        p.pre_step(OrderedDict([(0, 1), (1, 1), (2, 8)]))  # the newcomer needs 2 pages
    _assert_unchanged(p, snap)
    # a finished sequence's pages are released first, so the same newcomer fits without it
    p.pre_step(OrderedDict([(0, 1), (2, 8)]))
    assert p.sequences == OrderedDict([(0, 6), (2, 8)])


@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_release_unknown_seq_id(paged):
    p = _started(paged, DEVICE)
    snap = _snapshot(p)
    with pytest.raises(KeyError, match="unknown seq_id 7"):
        p.release(7)
    _assert_unchanged(p, snap)


@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
@pytest.mark.parametrize("what", ["dtype", "heads", "head_dim_k", "head_dim_v", "batch", "short", "format"])
def test_bad_step_leaves_cache(paged, what):
    p = _started(paged, DEVICE)
    p.pre_step(OrderedDict([(0, 1), (1, 2)]))
    snap = _snapshot(p)
    b, s, h, dk, dv, dtype, fmt = 2, 2, H_KV, D_K, D_V, torch.float32, "bshd"
    match = {"dtype": "dtype", "heads": "heads", "head_dim_k": "head dims", "head_dim_v": "head dims",
             "batch": "batch", "short": "positions per sequence", "format": "qkv_format"}[what]
    if what == "dtype":
        dtype = torch.float16
    elif what == "heads":
        h = H_KV + 1
    elif what == "head_dim_k":
        dk = D_K * 2
    elif what == "head_dim_v":
        dv = D_V * 2
    elif what == "batch":
        b = 3
    elif what == "short":
        s = 1
    else:
        fmt = "bhsd"
    with pytest.raises(ValueError, match=match):
        p.step(1, torch.randn(b, s, h, dk, dtype=dtype, device=DEVICE), torch.randn(b, s, h, dv, dtype=dtype,
                                                                                  device=DEVICE), fmt)
    _assert_unchanged(p, snap)


def test_step_before_pre_step():
    p = make_params(True, DEVICE)
    p.allocate_memory(1)
    with pytest.raises(RuntimeError, match="before pre_step"):
        p.step(1, torch.randn(1, 1, H_KV, D_K, device=DEVICE), torch.randn(1, 1, H_KV, D_V, device=DEVICE), "bshd")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("what, match", [
    ("past_capacity", "page table holds"),
    ("bad_page", "outside the page pool"),
    ("negative_len", "non-decreasing"),
    ("step_too_long", "does not fit"),
])
def test_append_op_rejects_bad_data_before_writing(what, match, device):
    if device != "cpu":
        pytest.skip("data-dependent checks run on the CPU engine; CUDA skips such tokens without a host sync")
    args = append_case("bshd", device)
    if what == "past_capacity":
        args[6] = torch.tensor([2, 7, 8], dtype=torch.int32)  # 8 + 5 > 3 pages x 4
    elif what == "bad_page":
        args[4] = args[4].clone()
        args[4][2, 2] = 10  # sequence 2 reaches its third page
    elif what == "negative_len":
        args[5] = torch.tensor([0, 3, 2, 8], dtype=torch.int32)
    else:
        args[5] = torch.tensor([0, 3, 3, 9], dtype=torch.int32)  # 6 tokens, new_k holds 5
    k0, v0 = args[2].clone(), args[3].clone()
    with pytest.raises(ValueError, match=match):
        torch.ops.fusedattn.copy_to_kv_cache(*args)
    assert torch.equal(args[2], k0) and torch.equal(args[3], v0)


@pytest.mark.parametrize("what, match", [
    ("cache_dtype", "must have new_k's dtype"),
    ("cache_heads", "heads and head dims"),
    ("page_table_rows", "page_table must be an int32 tensor of shape \\[3, max_pages_per_seq\\]"),
    ("cu_len", "cu_new_lens must be an int32 tensor of shape \\[4\\]"),
    ("seqlens_dtype", "cache_seqlens must be an int32"),
    ("format", "qkv_format"),
])
def test_append_op_argument_errors(what, match):
    args = append_case("bshd", DEVICE)
    if what == "cache_dtype":
        args[2] = args[2].double()
    elif what == "cache_heads":
        args[2], args[3] = args[2][:, :, :1], args[3][:, :, :1]
    elif what == "page_table_rows":
        args[4] = args[4][:2]
    elif what == "cu_len":
        args[5] = args[5][:3]
    elif what == "seqlens_dtype":
        args[6] = args[6].long()
    else:
        args[7] = "bhsd"
    with pytest.raises(ValueError, match=match):
        torch.ops.fusedattn.copy_to_kv_cache(*args)


def test_inference_rejects_arbitrary_mask():
    p = make_params(True, DEVICE)
    p.allocate_memory(1)
    p.pre_step(OrderedDict([(0, 2)]))
    m = DotProductAttention(H, (D_K, D_V), num_gqa_groups=H_KV, qkv_format="bshd", attn_mask_type="arbitrary",
                            layer_number=1)
    q = torch.randn(1, 2, H, D_K, device=DEVICE)
    with pytest.raises(ValueError, match="not supported with inference_params"):
        m(q, torch.randn(1, 2, H_KV, D_K, device=DEVICE), torch.randn(1, 2, H_KV, D_V, device=DEVICE),
          inference_params=p)


def test_constructor_errors():
    with pytest.raises(ValueError, match="num_heads_kv, head_dim_k and dtype are required"):
        InferenceParams(2, 16)
    with pytest.raises(ValueError, match="requires page_size"):
        InferenceParams(2, 16, 2, 32, torch.float32, is_paged=True, device="cpu")
    with pytest.raises(ValueError, match="max_ctx_len is required"):
        InferenceParams(2, 16, 2, 32, torch.float32, qkv_format="thd", device="cpu")


def test_reset_forgets_sequences():
    p = _started(True, DEVICE)
    p.reset()
    assert p.batch_size == 0 and not p.sequences
    assert p.cache_manager.free_pages == list(range(p.total_num_pages))
    p.pre_step(OrderedDict([(5, 2)]))
    assert p.sequences == OrderedDict([(5, 2)])


def test_pages_are_allocated_on_demand_and_reused():
    """The scenario's bookkeeping: pages as sequences grow; the leaver's pages go to others."""
    p = make_params(True, DEVICE)
    m = p.cache_manager
    p.pre_step(SCENARIO[0])  # 5, 3, 7 tokens: 2 + 1 + 2 pages
    assert m.pages == {0: [0, 1], 1: [2], 2: [3, 4]}
    p.pre_step(SCENARIO[1])  # 6, 4, 8: no new page
    p.pre_step(SCENARIO[2])  # 7, 5, 9: sequences 1 and 2 cross a page boundary
    assert m.pages == {0: [0, 1], 1: [2, 5], 2: [3, 4, 6]} and m.free_pages == [7, 8]
    p.pre_step(SCENARIO[3])  # 1 leaves (pages 2 and 5 freed), 3 joins with 6 tokens
    assert m.pages == {0: [0, 1], 2: [3, 4, 6], 3: [7, 8]} and m.free_pages == [2, 5]
    p.pre_step(SCENARIO[4])  # sequence 0 reaches 9 tokens: it gets sequence 1's old page
    assert m.pages[0] == [0, 1, 2]
    assert p.get_page_table().tolist() == [[0, 1, 2, 0], [3, 4, 6, 0], [7, 8, 0, 0]]
    assert p.cu_seqlens_kv.tolist() == [0, 9, 20, 27] and p.cu_seqlens_q.tolist() == [0, 1, 2, 3]
    assert p.pre_step_seqlens.tolist() == [8, 10, 6]


# ---------------------------------------------------------------------------
# A failing step: nothing written, pre_step undone, and the natural retry is correct


def _layer_call_inputs(what, step_b, step_s):
    """A DotProductAttention for layer 1 and its (q, k, v, kwargs) for a step of ``step_b`` sequences of
    ``step_s`` tokens, made wrong in one way."""
    d = 12 if what == "head_dim" else D_K
    mod = DotProductAttention(H, d if what == "head_dim" else (D_K, D_V), num_gqa_groups=H_KV, qkv_format="bshd",
                              attn_mask_type="padding_causal", layer_number=1,
                              attention_dropout=0.5 if what == "dropout" else 0.0)
    b = step_b + 1 if what == "q_batch" else step_b
    q = torch.randn(b, step_s, H, d, device=DEVICE)
    k = torch.randn(step_b, step_s, H_KV, d, device=DEVICE)
    v = torch.randn(step_b, step_s, H_KV, d if what == "head_dim" else D_V, device=DEVICE)
    kw = {}
    if what == "bias":
        kw = dict(core_attention_bias_type="post_scale_bias",
                  core_attention_bias=torch.zeros(1, H, step_s, 16, device=DEVICE))
    return mod, q, k, v, kw


@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
@pytest.mark.parametrize("what, exc, match", [
    ("q_batch", ValueError, r"query_layer has batch 3 but pre_step set up 2 sequences"),
    ("head_dim", NotImplementedError, r"head dims"),
    ("bias", NotImplementedError, r"core_attention_bias.*KV cache"),
    ("dropout", NotImplementedError, r"dropout.*KV cache"),
])
def test_failing_layer_writes_nothing_and_undoes_pre_step(paged, what, exc, match):
    d = 12 if what == "head_dim" else D_K
    p = InferenceParams(MAX_BATCH, MAX_SEQ, H_KV, d, torch.float32, head_dim_v=d if what == "head_dim" else D_V,
                        is_paged=paged, page_size=PAGE if paged else None, device=DEVICE)
    p.allocate_memory(1)
    before = _snapshot(p)
    p.pre_step(OrderedDict([(0, 2), (1, 2)]))
    mod, q, k, v, kw = _layer_call_inputs(what, 2, 2)
    with pytest.raises(exc, match=match):
        mod(q, k, v, inference_params=p, **kw)
    _assert_unchanged(p, before)
    with pytest.raises(RuntimeError, match="before pre_step"):
        p.step(1, k, v, "bshd")  # the failed step is over: its metadata is gone


@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
def test_retry_after_a_failed_step_is_correct(paged):
    """Layer 2 fails after layer 1 appended; pre_step again with the same step and the right inputs
    gives the reference answer (no slot that was never written is attended to)."""
    dtype, fmt = torch.float32, "bshd"
    layers = make_layers(2, fmt)
    params = make_params(paged, DEVICE)
    for n in (1, 2):
        params.allocate_memory(n)
    run = Run(params, layers, fmt)
    gen = torch.Generator().manual_seed(5)
    first = SCENARIO[0]
    inputs = step_inputs(first, fmt, 2, dtype, DEVICE, gen)
    run.check(first, inputs, run.step(first, inputs), dtype)
    step = SCENARIO[1]
    inputs = step_inputs(step, fmt, 2, dtype, DEVICE, gen)
    params.pre_step(step)
    layers[0](*inputs[0], inference_params=params)
    q, k, v = inputs[1]
    with pytest.raises(ValueError, match="batch"):
        layers[1](q, k[:2], v[:2], inference_params=params)
    run.check(step, inputs, run.step(step, inputs), dtype)
    for step in SCENARIO[2:4]:
        inputs = step_inputs(step, fmt, 2, dtype, DEVICE, gen)
        run.check(step, inputs, run.step(step, inputs), dtype)


@pytest.mark.parametrize("what, match", [
    ("cu_new_lens", r"cu_new_lens must be contiguous"),
    ("cache_seqlens", r"cache_seqlens must be contiguous"),
    ("k_cache", r"k_cache must not be an expanded view"),
    ("v_cache", r"v_cache must not be an expanded view"),
    ("meta", r"cache_seqlens must be on new_k's device"),
])
def test_append_op_rejects_strided_and_expanded(what, match):
    args = append_case("bshd", DEVICE)
    if what in ("cu_new_lens", "cache_seqlens"):
        i = 5 if what == "cu_new_lens" else 6
        t = args[i]
        buf = torch.full((2 * t.numel(),), 99, dtype=t.dtype, device=t.device)
        buf[::2] = t
        args[i] = buf[::2]
    elif what in ("k_cache", "v_cache"):
        i = 2 if what == "k_cache" else 3
        args[i] = args[i][:1].expand_as(args[i])
    else:
        args[6] = args[6].to("meta")
    snap = [a.clone() for a in args[2:4]]
    with pytest.raises(ValueError, match=match):
        torch.ops.fusedattn.copy_to_kv_cache(*args)
    if what not in ("k_cache", "v_cache"):
        assert all(torch.equal(a, b) for a, b in zip(args[2:4], snap))


# ---------------------------------------------------------------------------
# The step operator (fwd_kvcache): append, then attend, in one call


def _cumulative(lens, device="cpu"):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)


def step_case(fmt, cache, device, dtype=torch.float32, ragged=True):
    """Three sequences holding 5 / 0 / 9 cached tokens take steps of 2 / 3 / 1 tokens (ragged: bshd/sbhd
    padded to 3, with cu_seqlens_q) or 3 each. ``cache``: "paged" (pages of 4 in a shuffled pool),
    "rows" (per-sequence caches in shuffled rows, a [b, 1] table) or "no_table" (row b, no table).
    Every slot of the caches holds random values, so a read past a sequence shows in the output."""
    gen = torch.Generator().manual_seed(6)
    cached, lens = [5, 0, 9], ([2, 3, 1] if ragged else [3, 3, 3])
    b, s, cap = 3, max(lens), 16

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    tok = {"bshd": (b, s), "sbhd": (s, b), "thd": (sum(lens) + 1,)}[fmt]  # thd: a spare token at the end
    q, new_k, new_v = rnd(*tok, H, D_K), rnd(*tok, H_KV, D_K), rnd(*tok, H_KV, D_V)
    cu_q = _cumulative(lens) if (ragged or fmt == "thd") else None
    if cache == "paged":
        ps, pages = 4, cap // 4
        table = torch.randperm(b * pages + 2, generator=gen)[: b * pages].to(torch.int32).view(b, pages).contiguous()
        k_cache, v_cache = rnd(b * pages + 2, ps, H_KV, D_K), rnd(b * pages + 2, ps, H_KV, D_V)
    else:
        table = torch.tensor([[2], [0], [3]], dtype=torch.int32) if cache == "rows" else None
        rows = 4 if cache == "rows" else b
        k_cache, v_cache = rnd(rows, cap, H_KV, D_K), rnd(rows, cap, H_KV, D_V)
    args = FwdArgs(scale=1.0 / math.sqrt(D_K), q_format=fmt, kv_format="bshd", mask_type="padding_causal_bottom_right",
                   max_seqlen_q=s if fmt == "thd" else None)
    mv = lambda x: None if x is None else x.to(device)  # noqa: E731
    return dict(q=mv(q), new_k=mv(new_k), new_v=mv(new_v), k_cache=mv(k_cache), v_cache=mv(v_cache),
                page_table=mv(table), cache_seqlens=mv(torch.tensor(cached, dtype=torch.int32)), cu_q=mv(cu_q),
                cached=cached, lens=lens, args=args, fmt=fmt)


def run_step(c, **kw):
    """fwd_kvcache on the case's caches (mutated): (out, lse)."""
    out, lse, _ = fusedattn._ops.kv_step(c["q"], c["new_k"], c["new_v"], c["k_cache"], c["v_cache"],
                                         c["cache_seqlens"], c["args"], page_table=c["page_table"],
                                         cu_seqlens_q=c["cu_q"], **kw)
    return out, lse


def append_then_attend(c, **kw):
    """copy_to_kv_cache then the forward op over the appended caches (the two-operator path), on
    clones of the caches: (out, lse, k_cache, v_cache)."""
    dev = c["q"].device
    b = len(c["lens"])
    k_cache, v_cache = c["k_cache"].clone(), c["v_cache"].clone()
    table = c["page_table"] if c["page_table"] is not None else torch.arange(b, dtype=torch.int32,
                                                                              device=dev).view(b, 1)
    cu_new = c["cu_q"] if c["cu_q"] is not None else _cumulative([max(c["lens"])] * b, dev)
    fusedattn._ops.copy_to_kv_cache(c["new_k"], c["new_v"], k_cache, v_cache, table, cu_new, c["cache_seqlens"],
                                    c["fmt"])
    cu_kv = _cumulative([n + m for n, m in zip(c["cached"], c["lens"])], dev)
    kw = {k: v for k, v in kw.items() if v is not None}
    out, lse, _, _ = torch.ops.fusedattn.fwd(
        c["q"], k_cache, v_cache, None, kw.get("softmax_offset"), None, kw.get("alibi_slopes"), c["cu_q"], cu_kv,
        None, None, None, *c["args"].op_args(), False, table)
    return out, lse, k_cache, v_cache


def _seq_rows(x, fmt, lens, i):
    return rows(x, fmt, lens, i) if fmt != "thd" else x[sum(lens[:i]):sum(lens[:i]) + lens[i]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", ["paged", "rows", "no_table"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_step_op_equals_append_then_attention(fmt, cache, device):
    """fwd_kvcache writes the caches as copy_to_kv_cache does and returns what the forward op returns over
    the appended caches: bitwise where both run the same engine the same way (the same arithmetic on
    the same keys); and the output matches full attention in float64 over each sequence's keys."""
    c = step_case(fmt, cache, device)
    want_out, want_lse, want_k, want_v = append_then_attend(c)
    out, lse = run_step(c)
    assert torch.equal(c["k_cache"], want_k) and torch.equal(c["v_cache"], want_v)
    if device == "cpu" or cache != "no_table":
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    else:  # float32 on CUDA: the SIMT engine, reading rows without a table against a one-page table
        torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    lens, cached = c["lens"], c["cached"]
    table = c["page_table"].cpu() if c["page_table"] is not None else torch.arange(3).view(3, 1)
    ps = c["k_cache"].shape[1]
    msgs = []
    for i in range(3):
        pos = torch.arange(cached[i] + lens[i])
        pages = table[i, pos // ps].long()
        k = c["k_cache"].cpu()[pages, pos % ps]
        v = c["v_cache"].cpu()[pages, pos % ps]
        qi = _seq_rows(c["q"].cpu(), fmt, lens, i)
        ref = attention_ref(qi, k, v, torch.float64)
        msgs.append(tol_check(f"seq {i}", _seq_rows(out.cpu(), fmt, lens, i).flatten(-2), ref,
                              attention_ref(qi, k, v, torch.float32), torch.float32))
    assert not [m for m in msgs if m], msgs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", ["uniform", "alibi", "learnable", "window", "max_logit", "causal_no_table"])
def test_step_op_features(feature, device):
    """Uniform steps without cu_seqlens_q, ALiBi, a learnable softmax offset, a sliding window,
    max_logit, and a mask type without padding over caches without a table (the key lengths still
    come from cache_seqlens): the step equals the two-operator path."""
    c = step_case("bshd", "no_table" if feature == "causal_no_table" else "paged", device,
                  ragged=feature not in ("uniform", "causal_no_table"))
    if feature == "causal_no_table":
        c["args"] = c["args"].replace(mask_type="causal_bottom_right")
    kw = {}
    if feature == "alibi":
        kw["alibi_slopes"] = torch.rand(H, generator=torch.Generator().manual_seed(1)).to(device)
    elif feature == "learnable":
        c["args"] = c["args"].replace(softmax_type="learnable")
        kw["softmax_offset"] = torch.randn(H, generator=torch.Generator().manual_seed(2)).to(device)
    elif feature == "window":
        c["args"] = c["args"].replace(window_left=4, window_right=0)
    want_out, want_lse, want_k, want_v = append_then_attend(c, **kw)
    if feature == "max_logit":
        c["args"] = c["args"].replace(return_max_logit=True)
        out, lse, max_logit = fusedattn._ops.kv_step(c["q"], c["new_k"], c["new_v"], c["k_cache"], c["v_cache"],
                                                     c["cache_seqlens"], c["args"], page_table=c["page_table"],
                                                     cu_seqlens_q=c["cu_q"])
        assert max_logit.shape == (H,) and torch.isfinite(max_logit).all()
    else:
        out, lse = run_step(c, **kw)
    assert torch.equal(c["k_cache"], want_k) and torch.equal(c["v_cache"], want_v)
    if device == "cpu" or feature != "causal_no_table":
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    else:  # float32 on CUDA: the SIMT engine, reading rows without a table against a one-page table
        torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("what, exc, match", [
    ("past_capacity", ValueError, r"would grow to 17 tokens"),
    ("bad_page_below", ValueError, r"page_table\[2, 0\] = 99 is outside the page pool"),
    ("cu_q_decreasing", ValueError, r"cu_seqlens_q must be non-negative and non-decreasing"),
    ("thd_past_max_seqlen_q", ValueError, r"more than max_seqlen_q \(2\)"),
    ("cu_seqlens_kv", ValueError, r"takes no cu_seqlens_kv"),
    ("new_k_tokens", ValueError, r"new_k and new_v must have q's batch and sequence dims"),
    ("new_k_dtype", ValueError, r"new_k must have q's dtype"),
    ("cache_heads", ValueError, r"heads and head dims must match new_k/new_v"),
    ("no_table_rows", ValueError, r"without a page_table, k_cache holds one row per sequence"),
    ("dropout", NotImplementedError, r"dropout"),
    ("head_dim", NotImplementedError, r"head dims must be multiples of 8"),
])
def test_step_op_errors_leave_caches_untouched(what, exc, match):
    """Every error, on arguments or on the lengths and pages the CPU engine reads (also the pages below
    the new tokens, which only the attention reads), is raised before anything is written."""
    c = step_case("thd" if what == "thd_past_max_seqlen_q" else "bshd",
                  "no_table" if what == "no_table_rows" else "paged", "cpu")
    extra = {}
    if what == "past_capacity":
        c["cache_seqlens"] = torch.tensor([5, 0, 16], dtype=torch.int32)
    elif what == "bad_page_below":
        c["page_table"] = c["page_table"].clone()
        c["page_table"][2, 0] = 99
    elif what == "cu_q_decreasing":
        c["cu_q"] = torch.tensor([0, 2, 1, 3], dtype=torch.int32)
    elif what == "thd_past_max_seqlen_q":
        c["args"] = c["args"].replace(max_seqlen_q=2)
    elif what == "new_k_tokens":
        c["new_k"], c["new_v"] = c["new_k"][:, :2], c["new_v"][:, :2]
    elif what == "new_k_dtype":
        c["new_k"], c["new_v"] = c["new_k"].double(), c["new_v"].double()
    elif what == "cache_heads":
        c["k_cache"], c["v_cache"] = c["k_cache"][:, :, :1].clone(), c["v_cache"][:, :, :1].clone()
    elif what == "no_table_rows":
        c["k_cache"], c["v_cache"] = c["k_cache"][:2].clone(), c["v_cache"][:2].clone()
    elif what == "dropout":
        c["args"] = c["args"].replace(dropout_p=0.1)
    elif what == "head_dim":
        c["q"], c["new_k"] = c["q"][..., :12].clone(), c["new_k"][..., :12].clone()
        c["k_cache"] = c["k_cache"][..., :12].clone()
    k0, v0 = c["k_cache"].clone(), c["v_cache"].clone()
    with pytest.raises(exc, match=match):
        if what == "cu_seqlens_kv":
            torch.ops.fusedattn.fwd_kvcache(
                c["q"], c["new_k"], c["new_v"], c["k_cache"], c["v_cache"], c["cache_seqlens"], c["page_table"],
                None, None, None, None, c["cu_q"], _cumulative([7, 3, 10]), None, None, *c["args"].op_args(), False)
        else:
            run_step(c, **extra)
    assert torch.equal(c["k_cache"], k0) and torch.equal(c["v_cache"], v0)


def _opcheck_case(fmt, cache, device):
    c = step_case(fmt, cache, device)
    return (c["q"], c["new_k"], c["new_v"], c["k_cache"], c["v_cache"], c["cache_seqlens"], c["page_table"], None,
            None, None, None, c["cu_q"], None, None, None, *c["args"].op_args(), False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt, cache", [("bshd", "paged"), ("thd", "rows"), ("sbhd", "no_table")])
def test_opcheck_fwd_kvcache(fmt, cache, device):
    torch.library.opcheck(torch.ops.fusedattn.fwd_kvcache.default, _opcheck_case(fmt, cache, device))


def test_step_fake_takes_the_schema_arguments():
    import inspect

    params = inspect.signature(fusedattn._ops._fwd_kvcache_fake).parameters
    assert tuple(params) == tuple(a.name for a in torch.ops.fusedattn.fwd_kvcache.default._schema.arguments)


@pytest.mark.parametrize("device", DEVICES)
def test_step_op_compiles_in_one_graph(device):
    """Two decoding steps through fwd_kvcache under torch.compile(fullgraph=True): no graph break,
    the outputs and the caches bitwise those of eager calls."""
    c_eager, c_comp = step_case("bshd", "paged", device), step_case("bshd", "paged", device)

    def two_steps(q, new_k, new_v, k_cache, v_cache, cache_seqlens, page_table, cu_q):
        outs = []
        for n in range(2):
            out, _, _ = fusedattn._ops.kv_step(q, new_k * (n + 1), new_v, k_cache, v_cache, cache_seqlens + 3 * n,
                                               c_eager["args"], page_table=page_table, cu_seqlens_q=cu_q)
            outs.append(out)
        return outs

    names = ("q", "new_k", "new_v", "k_cache", "v_cache", "cache_seqlens", "page_table", "cu_q")
    want = two_steps(*(c_eager[n] for n in names))
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(two_steps, fullgraph=True)(*(c_comp[n] for n in names))
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(c_comp["k_cache"], c_eager["k_cache"]) and torch.equal(c_comp["v_cache"], c_eager["v_cache"])
