"""Attention over a KV cache (page_table) on the GPU (skipped cleanly without one).

The CUDA decode engine (csrc/cuda/decode: split-KV with a combine step, GQA
rows folded into the matmul) and the SIMT engine's paged reads (float32, or
every dtype with FUSEDATTN_CUDA_ENGINE=simt), against

* the float64 reference (tests/reference.py) on the dense cache, with
  FlashAttention's rule (conftest.tol_check), exact zeros and -inf lse at
  padded rows, lse / max_logit within fp32 accuracy;
* the CPU engine on the same paged inputs;

over page sizes 1, 16, 256 and a non-paged cache (page_size = max_seqlen,
page_table = batch indices), ragged cache lengths (an empty one too), GQA /
MQA, head dims 64 / 128 / 256 and d_qk != d_v, fp16 / bf16 / fp32, one and
several queries per sequence (bottom-right causal, windows), thd queries,
prefill chunks, every softmax type, ALiBi and max_logit. Unused pool slots hold
NaN, so a read outside a sequence's pages shows up as NaN.

Also: CUDA graph capture of a decode step replayed with new cache lengths and
queries copied into the same buffers, and copy_to_kv_cache on CUDA against the
CPU engine.

Forced split counts (FUSEDATTN_DECODE_SPLITS, read once per process):
test_decode_forced_splits runs the decode tests of this file again in a child
process with 3 and with 40 splits.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

import pytest
import torch

import conftest as C
import reference as R
from fusedattn._ops import FwdArgs

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.usefixtures("require_cuda_kernel")]

DEV = "cuda"


@dataclasses.dataclass(frozen=True)
class Dec:
    """One KV-cache attention problem."""

    dtype: str = "bf16"
    b: int = 3
    h: tuple = (8, 2)            # (h_q, h_kv)
    dims: tuple = (128, 128)     # (d_qk, d_v)
    page: object = 16            # page size, or "none": non-paged (page_size = max_seqlen)
    s_q: int = 1                 # queries per sequence (bshd dim, or max_seqlen_q for thd)
    lens_kv: tuple = (5, 77, 300)
    lens_q: tuple = None         # None: every sequence has s_q queries (no cu_seqlens_q)
    q_format: str = "bshd"
    mask: str = "padding_causal_bottom_right"
    window: tuple = (-1, -1)
    softmax: str = "vanilla"
    alibi: str = "none"          # none | h | bh
    max_logit: bool = False
    max_pages: int = 0           # page-table width (0: just enough for the longest sequence)
    slot_perm: bool = False      # non-paged: sequence i in cache slot (i + 1) % b (table not arange)

    def __str__(self):
        f = [self.dtype, f"b{self.b}", f"h{self.h[0]}-{self.h[1]}", f"d{self.dims[0]}-{self.dims[1]}",
             f"page{self.page}", f"sq{self.s_q}", self.q_format, self.mask]
        if self.window != (-1, -1):
            f.append(f"w{self.window[0]}_{self.window[1]}")
        if self.softmax != "vanilla":
            f.append(self.softmax)
        if self.slot_perm:
            f.append("slotperm")
        if self.alibi != "none":
            f.append(f"alibi_{self.alibi}")
        if self.max_logit:
            f.append("maxlogit")
        if self.lens_q is not None:
            f.append("ragged_q")
        return "-".join(f)


def _cu(lens, device="cpu"):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)


def build(cfg: Dec, seed: int = 0):
    """Tensors on the CPU: q, dense k/v [b, s_max, h_kv, d], the page pools and table, the op's extras."""
    g = torch.Generator().manual_seed(seed)
    dt = C.DTYPES[cfg.dtype]
    h_q, h_kv = cfg.h
    d_qk, d_v = cfg.dims
    b = cfg.b
    lens_kv = list(cfg.lens_kv)
    assert len(lens_kv) == b
    s_max = max(max(lens_kv), 1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(dt)

    if cfg.q_format == "thd":
        lens_q = list(cfg.lens_q)
        q = rnd(sum(lens_q), h_q, d_qk)
        cu_q = _cu(lens_q)
    else:
        q = rnd(b, cfg.s_q, h_q, d_qk)
        cu_q = _cu(cfg.lens_q) if cfg.lens_q is not None else None
    k_dense = rnd(b, s_max, h_kv, d_qk)
    v_dense = rnd(b, s_max, h_kv, d_v)
    cu_kv = _cu(lens_kv)

    if cfg.page == "none":
        # A non-paged cache [max_batch, max_seqlen, h_kv, d]: one page per sequence.
        ps = s_max
        slot = [(bi + 1) % b if cfg.slot_perm else bi for bi in range(b)]
        pool_k = torch.full((b, s_max, h_kv, d_qk), float("nan"), dtype=dt)
        pool_v = torch.full((b, s_max, h_kv, d_v), float("nan"), dtype=dt)
        for bi, n in enumerate(lens_kv):  # slots past the length stay NaN: never read
            pool_k[slot[bi], :n] = k_dense[bi, :n]
            pool_v[slot[bi], :n] = v_dense[bi, :n]
        table = torch.tensor(slot, dtype=torch.int32).view(b, 1)
    else:
        ps = int(cfg.page)
        pages = max(cfg.max_pages, math.ceil(s_max / ps))
        num_pages = b * pages + 3
        perm = torch.randperm(num_pages, generator=g)[: b * pages].to(torch.int32)
        table = perm.view(b, pages).contiguous()
        pool_k = torch.full((num_pages, ps, h_kv, d_qk), float("nan"), dtype=dt)
        pool_v = torch.full((num_pages, ps, h_kv, d_v), float("nan"), dtype=dt)
        for bi, n in enumerate(lens_kv):
            t = torch.arange(n)
            pg = table[bi, (t // ps)].long()
            pool_k[pg, t % ps] = k_dense[bi, :n]
            pool_v[pg, t % ps] = v_dense[bi, :n]

    extra = {"alibi_slopes": None, "softmax_offset": None}
    if cfg.alibi == "h":
        extra["alibi_slopes"] = torch.rand(h_q, generator=g) * 0.3
    elif cfg.alibi == "bh":
        extra["alibi_slopes"] = torch.rand(b, h_q, generator=g) * 0.3
    if cfg.softmax == "learnable":
        extra["softmax_offset"] = torch.randn(h_q, generator=g)
    args = FwdArgs(scale=1.0 / math.sqrt(d_qk), q_format=cfg.q_format, kv_format="bshd", mask_type=cfg.mask,
                   window_left=cfg.window[0], window_right=cfg.window[1], softmax_type=cfg.softmax,
                   max_seqlen_q=cfg.s_q if cfg.q_format == "thd" else None, return_max_logit=cfg.max_logit)
    return dict(q=q, k_dense=k_dense, v_dense=v_dense, pool_k=pool_k, pool_v=pool_v, table=table, cu_q=cu_q,
                cu_kv=cu_kv, args=args, **extra)


def run_op(t, device):
    """The forward op on `device` over the paged inputs: (out, lse, max_logit) on the CPU."""
    def mv(x):
        return None if x is None else x.to(device)

    a = t["args"]
    out, lse, _rng, ml = torch.ops.fusedattn.fwd(
        mv(t["q"]), mv(t["pool_k"]), mv(t["pool_v"]), None, mv(t["softmax_offset"]), None, mv(t["alibi_slopes"]),
        mv(t["cu_q"]), mv(t["cu_kv"]), None, None, None, *a.op_args(), a.return_max_logit, mv(t["table"]))
    if device != "cpu":
        torch.cuda.synchronize()
    return out.cpu(), lse.cpu(), ml.cpu()


def reference(t, compute_dtype):
    return R.attention_ref(t["q"], t["k_dense"], t["v_dense"], t["args"], alibi_slopes=t["alibi_slopes"],
                           softmax_offset=t["softmax_offset"], cu_seqlens_q=t["cu_q"], cu_seqlens_kv=t["cu_kv"],
                           compute_dtype=compute_dtype)


def check(cfg: Dec, seed: int = 0, with_cpu: bool = True):
    t = build(cfg, seed)
    out, lse, ml = run_op(t, DEV)
    msgs = reference_messages(cfg, t, out, lse, ml)
    if with_cpu:
        msgs += cpu_messages(t, out, lse, run_op(t, "cpu"), C.DTYPES[cfg.dtype])
    C.assert_matches_reference(msgs)


def reference_messages(cfg: Dec, t, out, lse, ml):
    """out / lse / max_logit of a call on the inputs of `t` against the float64 reference: what
    fails, as messages."""
    dt = C.DTYPES[cfg.dtype]
    ref = reference(t, torch.float64)
    ref_lp = reference(t, dt)
    msgs = []
    valid_rows = ref.row_valid  # lse layout
    # out: valid rows by the tolerance rule; padded rows exact zeros (below).
    msgs.append(C.tol_check("out", out, ref.out, ref_lp.out, dt))
    assert torch.isfinite(out).all(), f"{cfg}: non-finite output"
    # lse: fp32, within 1e-3 of the float64 reference where defined.
    good = ref.lse_valid
    if bool(good.any()):
        err = (lse.double()[good] - ref.lse[good]).abs().max().item()
        if not err <= 1e-3 * (1 + ref.lse[good].abs().max().item()):
            msgs.append(f"lse: max error {err:.3e}")
    # rows with no visible key: -inf, or the sink with a non-vanilla softmax; padded rows -inf.
    nokey = valid_rows & ~good
    if bool(nokey.any()):
        if cfg.softmax == "vanilla":
            want = torch.full_like(lse[nokey], float("-inf"))
        elif cfg.softmax == "off-by-one":
            want = torch.zeros_like(lse[nokey])
        else:
            want = t["softmax_offset"].view(1, -1, 1).expand_as(lse)[nokey] if cfg.q_format != "thd" else \
                t["softmax_offset"].view(-1, 1).expand_as(lse)[nokey]
        if not torch.allclose(lse[nokey], want.float()):
            msgs.append("lse of rows without visible keys")
    pad = ~valid_rows
    if cfg.q_format != "thd" and bool(pad.any()):
        if not bool((lse[pad] == float("-inf")).all()):
            msgs.append("lse of padded rows is not -inf")
        out_pad = out.permute(0, 2, 1, 3)[pad]  # [b, s, h, d] -> [b, h, s, d] rows
        if not bool((out_pad == 0).all()):
            msgs.append("padded rows are not zero")
    if cfg.max_logit:
        fin = torch.isfinite(ref.max_logit)
        if bool(fin.any()):
            err = (ml.double()[fin] - ref.max_logit[fin]).abs().max().item()
            if not err <= 1e-3 * (1 + ref.max_logit[fin].abs().max().item()):
                msgs.append(f"max_logit: max error {err:.3e}")
        if not bool((ml[~fin] == float("-inf")).all()):
            msgs.append("max_logit of heads without visible logits is not -inf")
    return msgs


def cpu_messages(t, out, lse, cpu_result, dt):
    """The CUDA call's out / lse against the CPU engine's on the same inputs (within twice the
    tolerance rule's bound: both engines are held to it)."""
    out_c, lse_c = cpu_result[:2]
    ref, ref_lp = reference(t, torch.float64), reference(t, dt)
    msgs = []
    diff = (out.double() - out_c.double()).abs().max().item()
    err_lp = (ref_lp.out.double() - ref.out).abs().max().item()
    lim = 2 * (2 * err_lp + C.EPS[dt] * max(1.0, ref.out.abs().max().item()))
    if not diff <= lim:
        msgs.append(f"CUDA vs CPU engine: max difference {diff:.3e} > {lim:.3e}")
    fin = torch.isfinite(lse_c)
    if not torch.equal(fin, torch.isfinite(lse)) or \
            (bool(fin.any()) and (lse[fin] - lse_c[fin]).abs().max().item() > 1e-3):
        msgs.append("CUDA vs CPU engine: lse differs")
    return msgs


CASES = [
    # one query token, GQA folded rows, ragged cache lengths incl. an empty cache
    Dec(dtype="bf16", b=4, h=(32, 8), dims=(128, 128), page=16, lens_kv=(1, 77, 300, 1030)),
    Dec(dtype="fp16", b=3, h=(8, 2), dims=(64, 64), page=1, lens_kv=(0, 33, 129)),
    Dec(dtype="bf16", b=2, h=(4, 1), dims=(256, 256), page=256, s_q=3, lens_kv=(3, 700)),
    Dec(dtype="bf16", b=3, h=(16, 4), dims=(128, 128), page="none", lens_kv=(64, 200, 9)),
    Dec(dtype="fp16", b=2, h=(8, 8), dims=(128, 128), page="none", s_q=2, mask="padding", lens_kv=(40, 90)),
    # non-paged with sequences in other slots than their index (the one-page entry is read per row)
    Dec(dtype="bf16", b=3, h=(32, 8), dims=(128, 128), page="none", lens_kv=(700, 0, 64), slot_perm=True),
    # several queries per sequence: ragged, bottom-right causal with a window, padded rows
    Dec(dtype="fp16", b=3, h=(8, 2), dims=(128, 128), page=16, s_q=5, lens_q=(5, 1, 3), lens_kv=(20, 140, 65),
        window=(40, 0)),
    Dec(dtype="bf16", b=2, h=(8, 2), dims=(64, 64), page=16, s_q=4, mask="padding_causal", window=(2, 0),
        lens_kv=(30, 17)),
    # softmax types, ALiBi, max_logit
    Dec(dtype="bf16", b=3, h=(8, 2), dims=(128, 128), page=16, softmax="off-by-one", alibi="h",
        lens_kv=(0, 50, 333)),
    Dec(dtype="fp16", b=2, h=(8, 4), dims=(128, 128), page=32, s_q=2, softmax="learnable", alibi="bh",
        max_logit=True, lens_kv=(1, 250)),
    Dec(dtype="bf16", b=2, h=(6, 2), dims=(64, 64), page=16, softmax="learnable", lens_kv=(0, 90), max_logit=True),
    # thd queries (decode batches of 1-4 tokens), max_seqlen_q given
    Dec(dtype="bf16", b=3, h=(8, 2), dims=(64, 64), page=16, q_format="thd", s_q=4, lens_q=(1, 4, 2),
        lens_kv=(4, 60, 19)),
    # prefill chunks against a longer cache (64-row blocks, several chunks)
    Dec(dtype="bf16", b=2, h=(8, 2), dims=(128, 128), page=16, s_q=40, lens_q=(40, 23), lens_kv=(100, 23)),
    Dec(dtype="fp16", b=1, h=(4, 4), dims=(64, 64), page=64, s_q=70, lens_kv=(300,), window=(50, 0)),
    # head dims that fill a bucket partly, d_qk != d_v
    Dec(dtype="fp16", b=2, h=(4, 2), dims=(128, 64), page=16, lens_kv=(10, 130)),
    Dec(dtype="bf16", b=2, h=(4, 1), dims=(96, 96), page=8, s_q=2, lens_kv=(31, 64)),
    # a page table wider than needed (max_seqlen > lengths: splits see short sequences)
    Dec(dtype="bf16", b=2, h=(8, 2), dims=(128, 128), page=16, lens_kv=(5, 40), max_pages=256),
    # float32: the SIMT engine's paged reads
    Dec(dtype="fp32", b=3, h=(8, 2), dims=(64, 64), page=16, s_q=3, lens_kv=(0, 45, 130)),
    Dec(dtype="fp32", b=2, h=(4, 2), dims=(128, 128), page="none", lens_kv=(70, 3), softmax="off-by-one"),
]


@pytest.mark.parametrize("cfg", CASES, ids=str)
def test_decode_matches_reference_and_cpu(cfg):
    check(cfg)


def test_decode_long_context_many_splits():
    # b=1 at 8k context: the split count is at its largest (one sequence, 8 KV heads).
    check(Dec(dtype="bf16", b=1, h=(32, 8), dims=(128, 128), page=16, lens_kv=(8190,)), with_cpu=False)


def test_decode_d256_long():
    check(Dec(dtype="fp16", b=2, h=(8, 2), dims=(256, 256), page=16, lens_kv=(2000, 513)), with_cpu=False)


def test_decode_bad_page_entries_are_clamped():
    """Page-table entries outside the pool (negative, or past its end) read the pool's first / last
    page instead, on the tiles the kernel's start reads and on those its loop reads a tile ahead: the
    output is bitwise that of the same table clamped into the pool, and no read leaves the pool (the
    CPU engine reports such tables; the CUDA engine cannot without a host synchronisation)."""
    g = torch.Generator().manual_seed(11)
    b, h_q, h_kv, d, ps, ctx = 2, 8, 2, 128, 16, 3000
    pages = math.ceil(ctx / ps)
    num_pages = b * pages
    table = torch.randperm(num_pages, generator=g).to(torch.int32).view(b, pages)
    bad = table.clone()
    bad[:, ::7] = -3
    bad[:, 3::11] = num_pages + 1000
    t = dict(q=torch.randn(b, 1, h_q, d, generator=g).to(torch.bfloat16),
             pool_k=torch.randn(num_pages, ps, h_kv, d, generator=g).to(torch.bfloat16),
             pool_v=torch.randn(num_pages, ps, h_kv, d, generator=g).to(torch.bfloat16),
             cu_q=None, cu_kv=_cu([ctx, ctx - 5]), softmax_offset=None, alibi_slopes=None,
             args=FwdArgs(scale=1.0 / math.sqrt(d), q_format="bshd", kv_format="bshd",
                          mask_type="padding_causal_bottom_right"))
    out_bad, lse_bad, _ = run_op(dict(t, table=bad), DEV)
    out_ok, lse_ok, _ = run_op(dict(t, table=bad.clamp(0, num_pages - 1)), DEV)
    assert torch.isfinite(out_bad).all()
    assert torch.equal(out_bad, out_ok) and torch.equal(lse_bad, lse_ok)


def captured(step):
    """step() captured in a CUDA graph, after warm-up calls on a side stream: (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def test_decode_cuda_graph_replay_new_lengths():
    """Capture one decode step; replay it after copying new lengths / queries into the same buffers."""
    cfg = Dec(dtype="bf16", b=4, h=(16, 4), dims=(128, 128), page=16, lens_kv=(100, 200, 300, 400), max_pages=40)
    t = build(cfg, seed=1)
    a = t["args"]
    q = t["q"].to(DEV)
    pk, pv, table, cu_kv = (t[n].to(DEV) for n in ("pool_k", "pool_v", "table", "cu_kv"))
    # Fill the pools with finite data everywhere so that longer lengths read real keys.
    pk.copy_(torch.randn_like(pk, dtype=torch.float32).to(pk.dtype))
    pv.copy_(torch.randn_like(pv, dtype=torch.float32).to(pv.dtype))

    def step():
        return torch.ops.fusedattn.fwd(q, pk, pv, None, None, None, None, None, cu_kv, None, None, None,
                                       *a.op_args(), False, table)

    graph, (static_out, static_lse, _, _) = captured(step)

    for lens in ((1, 640, 17, 333), (600, 0, 64, 65), (100, 200, 300, 400)):
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        cu_kv.copy_(_cu(lens, DEV))
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_lse, _, _ = step()
        torch.cuda.synchronize()
        assert torch.equal(static_out, want_out), f"graph replay differs from eager at lengths {lens}"
        assert torch.equal(static_lse, want_lse)
        # and against the float64 reference on the dense view of the cache
        tt = dict(t)
        tt.update(q=q.cpu(), cu_kv=_cu(lens))
        dense_k = torch.zeros(cfg.b, max(lens), cfg.h[1], cfg.dims[0], dtype=pk.dtype)
        dense_v = torch.zeros(cfg.b, max(lens), cfg.h[1], cfg.dims[1], dtype=pv.dtype)
        pkc, pvc, tab = pk.cpu(), pv.cpu(), table.cpu()
        for bi, n in enumerate(lens):
            tk = torch.arange(n)
            pg = tab[bi, tk // cfg.page].long()
            dense_k[bi, :n] = pkc[pg, tk % cfg.page]
            dense_v[bi, :n] = pvc[pg, tk % cfg.page]
        tt.update(k_dense=dense_k, v_dense=dense_v)
        ref = reference(tt, torch.float64)
        ref_lp = reference(tt, C.DTYPES[cfg.dtype])
        C.assert_matches_reference([C.tol_check("out", static_out.cpu(), ref.out, ref_lp.out, C.DTYPES[cfg.dtype])])


@pytest.mark.parametrize("kind", ["paged", "dense_bf16", "dense_fp32"])
def test_rng_state_output_is_zero_without_dropout_across_replays(kind):
    """Without dropout the op's rng_state output is {0, 0}. On CUDA the engine writes it (the decode
    kernel itself, other engines a memset after their kernels) into an uninitialised buffer, so a
    graph replay must rewrite it: poisoned between replays, it reads 0 again after each. Covers the
    decode engine (paged), the Hopper / tensor-core path (bf16) and the SIMT engine (fp32)."""
    if kind == "paged":
        cfg = Dec(dtype="bf16", b=2, h=(8, 2), dims=(128, 128), page=16, lens_kv=(300, 40), max_pages=24)
        t = build(cfg, seed=3)
        a = t["args"]
        q, pk, pv, table, cu_kv = (t[n].to(DEV) for n in ("q", "pool_k", "pool_v", "table", "cu_kv"))

        def step():
            return torch.ops.fusedattn.fwd(q, pk, pv, None, None, None, None, None, cu_kv, None, None, None,
                                           *a.op_args(), False, table)
    else:
        dtype = torch.bfloat16 if kind == "dense_bf16" else torch.float32
        q, k, v = (torch.randn(2, 64, 4, 128, device=DEV, dtype=dtype) for _ in range(3))
        a = FwdArgs(scale=0.1, mask_type="causal")

        def step():
            return torch.ops.fusedattn.fwd(q, k, v, None, None, None, None, None, None, None, None, None,
                                           *a.op_args(), False)

    graph, (_, _, rng_out, _) = captured(step)
    for _ in range(2):
        rng_out.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        assert rng_out.tolist() == [0, 0], f"{kind}: rng_state output {rng_out.tolist()}"
    _, _, eager_rng, _ = step()
    assert eager_rng.tolist() == [0, 0]


# ---------------------------------------------------------------------------
# Forced split counts: the count is read once per process, so the decode tests above run again
# in a child process with FUSEDATTN_DECODE_SPLITS set: 3 gives uneven and empty splits (and
# one-tile sequences with splits), 40 more splits than a warp has lanes in the combine (its
# second group of 32, a partial batch of loads).


FORCED_CHILD = os.environ.get("FUSEDATTN_DECODE_SPLITS") not in (None, "", "0")
# Launch modes (FUSEDATTN_DECODE_PDL, read once per process): by default on sm_90 the decode
# kernel is a programmatic dependent of the work before it and the combine one of the decode
# kernel; the decode tests run again in a child with plain launches (0) and with the combine's
# programmatic launch only (1), eager and in CUDA graphs (programmatic edges in the captured graph).
PDL_CHILD = os.environ.get("FUSEDATTN_DECODE_PDL") not in (None, "")
not_in_child = pytest.mark.skipif(FORCED_CHILD or PDL_CHILD,
                                  reason="already a child process (or the switches set by the caller)")


@not_in_child
@pytest.mark.parametrize("splits", ["3", "40"])
def test_decode_forced_splits(splits):
    r = C.run_tests_in_child(__file__, {"FUSEDATTN_DECODE_SPLITS": splits},
                             "not forced_splits and not copy_to_kv_cache and not fp32")
    assert r.returncode == 0, f"run with {splits} splits failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert " passed" in r.stdout, r.stdout[-2000:]


@not_in_child
@pytest.mark.parametrize("mode", ["0", "1"])
def test_decode_launch_modes(mode):
    if mode == "1" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    r = C.run_tests_in_child(__file__, {"FUSEDATTN_DECODE_PDL": mode},
                             "not forced_splits and not launch_modes and not copy_to_kv_cache and not fp32")
    assert r.returncode == 0, f"run with FUSEDATTN_DECODE_PDL={mode} failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert " passed" in r.stdout, r.stdout[-2000:]


# ---------------------------------------------------------------------------
# copy_to_kv_cache on CUDA: the same caches as the CPU engine, bit for bit.


def _has_append() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key("fusedattn::copy_to_kv_cache", "CUDA")


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("page", [1, 16, "none"])
def test_copy_to_kv_cache_cuda_matches_cpu(fmt, dtype, page):
    if not _has_append():
        pytest.skip("copy_to_kv_cache has no CUDA kernel in this build")
    dt = C.DTYPES[dtype]
    g = torch.Generator().manual_seed(3)
    b, h, dk, dv = 3, 4, 64, 32
    cached = [0, 17, 40]
    step = [1, 5, 0] if fmt != "thd" else [2, 5, 1]
    s_new = max(step)
    max_len = 64
    if page == "none":
        ps, pages, num_pages = max_len, 1, b
        table = torch.arange(b, dtype=torch.int32).view(b, 1)
    else:
        ps = page
        pages = max_len // ps
        num_pages = b * pages + 2
        table = torch.randperm(num_pages, generator=g)[: b * pages].to(torch.int32).view(b, pages).contiguous()
    kc = torch.randn(num_pages, ps, h, dk, generator=g).to(dt)
    vc = torch.randn(num_pages, ps, h, dv, generator=g).to(dt)
    if fmt == "thd":
        new_k = torch.randn(sum(step) + 2, h, dk, generator=g).to(dt)
        new_v = torch.randn(sum(step) + 2, h, dv, generator=g).to(dt)
    elif fmt == "bshd":
        new_k = torch.randn(b, s_new, h, dk, generator=g).to(dt)
        new_v = torch.randn(b, s_new, h, dv, generator=g).to(dt)
    else:
        new_k = torch.randn(s_new, b, h, dk, generator=g).to(dt)
        new_v = torch.randn(s_new, b, h, dv, generator=g).to(dt)
    cu = _cu(step)
    seqlens = torch.tensor(cached, dtype=torch.int32)

    kc_cpu, vc_cpu = kc.clone(), vc.clone()
    torch.ops.fusedattn.copy_to_kv_cache(new_k, new_v, kc_cpu, vc_cpu, table, cu, seqlens, fmt)
    kc_gpu, vc_gpu = kc.to(DEV), vc.to(DEV)
    torch.ops.fusedattn.copy_to_kv_cache(new_k.to(DEV), new_v.to(DEV), kc_gpu, vc_gpu, table.to(DEV), cu.to(DEV),
                                         seqlens.to(DEV), fmt)
    torch.cuda.synchronize()
    assert torch.equal(kc_gpu.cpu(), kc_cpu)
    assert torch.equal(vc_gpu.cpu(), vc_cpu)
    assert not torch.equal(kc_cpu, kc) or sum(step) == 0


def test_copy_to_kv_cache_cuda_skips_out_of_range():
    """Positions past the page table and pages outside the pool are skipped, never written."""
    if not _has_append():
        pytest.skip("copy_to_kv_cache has no CUDA kernel in this build")
    b, h, d, ps = 2, 2, 16, 4
    kc = torch.zeros(4, ps, h, d, device=DEV)
    vc = torch.zeros(4, ps, h, d, device=DEV)
    table = torch.tensor([[0, 1], [2, 99]], dtype=torch.int32, device=DEV)  # 99: outside the pool
    new = torch.ones(b, 3, h, d, device=DEV)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32, device=DEV)
    seqlens = torch.tensor([7, 3], dtype=torch.int32, device=DEV)  # seq 0: positions 7, 8, 9 (capacity 8)
    torch.ops.fusedattn.copy_to_kv_cache(new, new, kc, vc, table, cu, seqlens, "bshd")
    torch.cuda.synchronize()
    written = kc.sum(dim=(2, 3)) != 0  # [page, slot]
    want = torch.zeros(4, ps, dtype=torch.bool)
    want[1, 3] = True  # seq 0 position 7
    want[2, 3] = True  # seq 1 position 3; positions 4, 5 -> page 99: skipped
    assert torch.equal(written.cpu(), want)


# ---------------------------------------------------------------------------
# KV-cache steps (fwd_kvcache): the decode kernel reads the step's new tokens from new_k / new_v and
# its owner blocks write them into the cache, in the attention launch.


def step_of(t, cfg: Dec, seed: int = 0):
    """The decode problem `t` (build) as a KV-cache step: each sequence's last len_q keys become
    new_k / new_v at its queries' tokens, and their cache slots hold NaN until the step writes them (a
    read of such a slot instead of new_k / new_v shows as NaN). Also the caches the step must leave
    (t's pools) and the cache lengths before it."""
    g = torch.Generator().manual_seed(seed + 100)
    b = cfg.b
    lens_q = list(cfg.lens_q) if cfg.lens_q is not None else [cfg.s_q] * b
    cached = [n - m for n, m in zip(cfg.lens_kv, lens_q)]
    assert min(cached) >= 0
    q, dt = t["q"], t["q"].dtype
    new_k = torch.randn(*q.shape[:-2], cfg.h[1], cfg.dims[0], generator=g).to(dt)  # padded rows: not appended
    new_v = torch.randn(*q.shape[:-2], cfg.h[1], cfg.dims[1], generator=g).to(dt)
    pool_k, pool_v = t["pool_k"].clone(), t["pool_v"].clone()
    ps = pool_k.shape[1]
    starts = [0] + list(itertools.accumulate(lens_q))
    for bi in range(b):
        for i in range(lens_q[bi]):
            pos = cached[bi] + i
            src = (starts[bi] + i,) if cfg.q_format == "thd" else (bi, i)
            new_k[src] = t["k_dense"][bi, pos]
            new_v[src] = t["v_dense"][bi, pos]
            page = int(t["table"][bi, pos // ps])
            pool_k[page, pos % ps] = float("nan")
            pool_v[page, pos % ps] = float("nan")
    return dict(new_k=new_k, new_v=new_v, pool_k=pool_k, pool_v=pool_v,
                cache_seqlens=torch.tensor(cached, dtype=torch.int32))


def run_step_op(t, s, device, table=True):
    """fwd_kvcache on `device` over copies of the step's caches: (out, lse, max_logit, k_cache,
    v_cache) on the CPU. table=False: no page table (the caches' row b is sequence b)."""
    from fusedattn._ops import kv_step

    def mv(x):
        return None if x is None else x.to(device)

    kc, vc = mv(s["pool_k"].clone()), mv(s["pool_v"].clone())
    out, lse, ml = kv_step(mv(t["q"]), mv(s["new_k"]), mv(s["new_v"]), kc, vc, mv(s["cache_seqlens"]), t["args"],
                           page_table=mv(t["table"]) if table else None, cu_seqlens_q=mv(t["cu_q"]),
                           alibi_slopes=mv(t["alibi_slopes"]), softmax_offset=mv(t["softmax_offset"]))
    if device != "cpu":
        torch.cuda.synchronize()
    ml = ml if ml is not None else torch.empty(0)
    return out.cpu(), lse.cpu(), ml.cpu(), kc.cpu(), vc.cpu()


def same_bits(a, b):
    """Bitwise equality that also holds where both hold the same NaN."""
    return a.shape == b.shape and torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                                              b.view(torch.int16 if b.element_size() == 2 else torch.int32))


def check_step(cfg: Dec, table=True, fused=True, seed=0, **arg_changes):
    """The step on the GPU: caches, results against float64 and the CPU operator, and (fused) bitwise
    against the decode kernel over the appended caches. arg_changes: FwdArgs fields Dec has not."""
    t = build(cfg, seed)
    t["args"] = t["args"].replace(**arg_changes)
    s = step_of(t, cfg, seed)
    out, lse, ml, kc, vc = run_step_op(t, s, DEV, table)
    assert same_bits(kc, t["pool_k"]) and same_bits(vc, t["pool_v"]), f"{cfg}: the caches after the step"
    msgs = reference_messages(cfg, t, out, lse, ml)
    cpu = run_step_op(t, s, "cpu", table)
    assert same_bits(cpu[3], t["pool_k"]) and same_bits(cpu[4], t["pool_v"])
    msgs += cpu_messages(t, out, lse, cpu, C.DTYPES[cfg.dtype])
    if fused:
        # The decode kernel over the appended caches (the two-operator path) reads the same keys in the
        # same order: bitwise the same results.
        out2, lse2, _ = run_op(t, DEV)
        if not (torch.equal(out, out2) and torch.equal(lse, lse2)):
            msgs.append(f"the step differs from copy_to_kv_cache + fwd: max {(out - out2).abs().max().item():.3e}")
    C.assert_matches_reference(msgs)


STEP_CASES = [
    # decoding: one new token per sequence, GQA folded rows, a sequence whose cache was empty
    Dec(dtype="bf16", b=4, h=(32, 8), dims=(128, 128), page=16, lens_kv=(1, 77, 300, 1030)),
    Dec(dtype="fp16", b=3, h=(8, 2), dims=(64, 64), page=1, lens_kv=(1, 33, 129)),
    Dec(dtype="bf16", b=2, h=(4, 1), dims=(256, 256), page=256, s_q=3, lens_kv=(3, 700)),
    Dec(dtype="bf16", b=3, h=(16, 4), dims=(128, 128), page="none", lens_kv=(64, 200, 9)),
    Dec(dtype="bf16", b=3, h=(32, 8), dims=(128, 128), page="none", lens_kv=(700, 1, 64), slot_perm=True),
    # several tokens per sequence (ragged, a window), thd steps, a prefill chunk
    Dec(dtype="fp16", b=3, h=(8, 2), dims=(128, 128), page=16, s_q=5, lens_q=(5, 1, 3), lens_kv=(20, 140, 65),
        window=(40, 0)),
    Dec(dtype="bf16", b=3, h=(8, 2), dims=(64, 64), page=16, q_format="thd", s_q=4, lens_q=(1, 4, 2),
        lens_kv=(4, 60, 19)),
    Dec(dtype="bf16", b=2, h=(8, 2), dims=(128, 128), page=16, s_q=40, lens_q=(40, 23), lens_kv=(100, 23)),
    # softmax types, ALiBi, max_logit, d_qk != d_v, a table wider than needed
    Dec(dtype="bf16", b=3, h=(8, 2), dims=(128, 128), page=16, softmax="off-by-one", alibi="h", lens_kv=(1, 50, 333)),
    Dec(dtype="fp16", b=2, h=(8, 4), dims=(128, 128), page=32, s_q=2, softmax="learnable", alibi="bh",
        max_logit=True, lens_kv=(2, 250)),
    Dec(dtype="fp16", b=2, h=(4, 2), dims=(128, 64), page=16, lens_kv=(10, 130)),
    Dec(dtype="bf16", b=2, h=(8, 2), dims=(128, 128), page=16, lens_kv=(5, 40), max_pages=256),
]


@pytest.mark.parametrize("cfg", STEP_CASES, ids=str)
def test_step_appends_in_the_attention_launch(cfg):
    check_step(cfg)


def test_step_without_page_table():
    """Per-sequence caches without a table (sequence b in row b): the decode kernel takes the row
    from the batch index."""
    check_step(Dec(dtype="bf16", b=3, h=(16, 4), dims=(128, 128), page="none", lens_kv=(64, 200, 9)), table=False)


def test_step_long_context_many_splits():
    check_step(Dec(dtype="bf16", b=1, h=(32, 8), dims=(128, 128), page=16, lens_kv=(8190,)))


@pytest.mark.parametrize("case", ["fp32_paged", "fp32_no_table", "bf16_softcap", "bf16_softcap_no_table_causal",
                                  "bf16_strided_new_kv"])
def test_step_unfused(case):
    """Steps the decode engine does not take (float32; softcap; new_k / new_v rows that are not
    16-byte aligned): the append kernel, which writes the key lengths, then the attention's engine;
    without a table the caches are read as bshd rows, also under a mask type without padding (the
    lengths still apply: no engine that ignores them may take the call)."""
    if case == "fp32_paged":
        check_step(Dec(dtype="fp32", b=3, h=(8, 2), dims=(64, 64), page=16, s_q=3, lens_kv=(3, 45, 130)), fused=False)
    elif case == "fp32_no_table":
        check_step(Dec(dtype="fp32", b=2, h=(4, 2), dims=(128, 128), page="none", lens_kv=(70, 3)), table=False,
                   fused=False)
    elif case == "bf16_softcap":
        check_step(Dec(dtype="bf16", b=2, h=(8, 2), dims=(64, 64), page=16, lens_kv=(33, 90)), fused=False,
                   softcap=20.0)
    elif case == "bf16_softcap_no_table_causal":
        check_step(Dec(dtype="bf16", b=2, h=(8, 2), dims=(128, 128), page="none", s_q=2, lens_kv=(130, 64),
                       mask="causal_bottom_right"), table=False, fused=False, softcap=20.0)
    else:
        cfg = Dec(dtype="bf16", b=2, h=(8, 2), dims=(64, 64), page=16, lens_kv=(33, 90))
        t = build(cfg)
        s = step_of(t, cfg)
        # new_k / new_v as views of one buffer with an odd head stride: rows not 16-byte aligned
        for name in ("new_k", "new_v"):
            x = s[name]
            buf = torch.zeros(*x.shape[:-1], x.shape[-1] + 1, dtype=x.dtype)
            buf[..., 1:] = x
            s[name] = buf[..., 1:]
        out, lse, ml, kc, vc = run_step_op(t, s, DEV)
        assert same_bits(kc, t["pool_k"]) and same_bits(vc, t["pool_v"])
        C.assert_matches_reference(reference_messages(cfg, t, out, lse, ml))


def test_step_cuda_graph_replay():
    """One captured step, replayed with new queries, new tokens and cache lengths copied into the same
    buffers: the replay's outputs and caches equal an eager step's (which writes the same slots again)."""
    from fusedattn._ops import kv_step

    cfg = Dec(dtype="bf16", b=3, h=(16, 4), dims=(128, 128), page=16, lens_kv=(100, 200, 300), max_pages=40)
    t = build(cfg, seed=2)
    s = step_of(t, cfg, seed=2)
    q, nk, nv = t["q"].to(DEV), s["new_k"].to(DEV), s["new_v"].to(DEV)
    table, seqlens = t["table"].to(DEV), s["cache_seqlens"].to(DEV)
    kc = torch.randn(t["pool_k"].shape).to(torch.bfloat16).to(DEV)
    vc = torch.randn(t["pool_v"].shape).to(torch.bfloat16).to(DEV)

    def step():
        return kv_step(q, nk, nv, kc, vc, seqlens, t["args"], page_table=table)

    graph, (g_out, g_lse, _) = captured(step)
    for n, lens in enumerate(((1, 639, 17), (600, 0, 64), (99, 199, 299))):
        for x in (q, nk, nv):
            x.copy_(torch.randn(x.shape, device=DEV).to(x.dtype))
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        caches = kc.clone(), vc.clone()
        want_out, want_lse, _ = step()
        torch.cuda.synchronize()
        assert torch.equal(g_out, want_out) and torch.equal(g_lse, want_lse), f"replay {n} differs from eager"
        assert torch.equal(kc, caches[0]) and torch.equal(vc, caches[1])
        for bi, c in enumerate(lens):  # the new token is in its slot
            page = int(t["table"][bi, c // 16])
            assert torch.equal(kc[page, c % 16], nk[bi, 0]) and torch.equal(vc[page, c % 16], nv[bi, 0])


def _kernels(fn):
    """Names of the CUDA kernels one call of fn launches (after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]


@pytest.mark.skipif(C.CUDA_ENGINE == "simt", reason="FUSEDATTN_CUDA_ENGINE=simt keeps calls off the decode engine")
@pytest.mark.parametrize("path", ["op", "flash_attn_with_kvcache", "dot_product_attention",
                                  "dot_product_attention_paged"])
def test_step_is_one_decode_launch(path):
    """A decoding step at batch 1 (context 8192, h 32 / 8, d 128, bf16) launches the decode kernel once,
    then (split keys) its combine, and nothing else: no append kernel, no length arithmetic."""
    from collections import OrderedDict

    import fusedattn
    from fusedattn._ops import kv_step
    from fusedattn.inference import InferenceParams

    b, ctx, h_q, h_kv, d, dt = 1, 8192, 32, 8, 128, torch.bfloat16
    q = torch.randn(b, 1, h_q, d, device=DEV, dtype=dt)
    nk, nv = (torch.randn(b, 1, h_kv, d, device=DEV, dtype=dt) for _ in range(2))
    if path.startswith("dot_product_attention"):
        paged = path.endswith("paged")
        p = InferenceParams(b, ctx, h_kv, d, dt, is_paged=paged, page_size=64 if paged else None, device=DEV)
        p.allocate_memory(1)
        p.pre_step(OrderedDict([(0, ctx - 1)]))
        p.pre_step(OrderedDict([(0, 1)]))
        layer = fusedattn.DotProductAttention(h_q, d, num_gqa_groups=h_kv, qkv_format="bshd",
                                              attn_mask_type="padding_causal", layer_number=1)

        def fn():
            return layer(q, nk, nv, inference_params=p)
    else:
        kc, vc = (torch.randn(b, ctx, h_kv, d, device=DEV, dtype=dt) for _ in range(2))
        seqlens = torch.full((b,), ctx - 1, dtype=torch.int32, device=DEV)
        if path == "op":
            args = FwdArgs(scale=d ** -0.5, mask_type="padding_causal_bottom_right")

            def fn():
                return kv_step(q, nk, nv, kc, vc, seqlens, args)
        else:
            def fn():
                return fusedattn.flash_attn_with_kvcache(q, kc, vc, nk, nv, cache_seqlens=seqlens, causal=True)
    names = _kernels(fn)
    decode = [n for n in names if "decode_kernel" in n]
    others = [n for n in names if "decode_kernel" not in n and "decode_combine_kernel" not in n]
    assert len(decode) == 1 and not others, names
    assert sum("decode_combine_kernel" in n for n in names) <= 1, names
