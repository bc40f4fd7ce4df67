"""Dense, float64-capable reference of fusedattn's attention semantics.

Pure torch and deliberately plain: one Python loop over the sequences of a
batch, every sequence computed as a dense [h, len_q, len_kv] score matrix. It
shares no code with the engine; the semantics it implements are the ones
documented in csrc/core/include/fusedattn/params.h and philox.h:

* a sequence b covers query positions [0, len_q) and key positions
  [0, len_kv); lengths come from cu_seqlens when given (thd, or bshd/sbhd with
  a padding mask), else from the tensors; thd tokens of sequence b live at
  ``(cu_seqlens_*_padded or cu_seqlens_*)[b] + position``;
* key j is visible to query i iff the window admits it (``j >= i + diag - wl``
  when wl >= 0, ``j <= i + diag + wr`` when wr >= 0, diag = len_kv - len_q when
  bottom-right aligned, else 0; causal types mean wr = 0) and, for the
  arbitrary mask type, ``attn_mask[b, h, i, j]`` (broadcast) is False;
* logits ``s = scale * q.k + bias[b, h, i, j]`` (broadcast) or
  ``- slope[(b,) h] * |j - i - diag|`` for ALiBi; with ``softcap`` > 0, ``scale * q.k``
  is first capped to ``softcap * tanh(scale * q.k / softcap)`` (flash-attn's order);
* off-by-one / learnable softmax add a sink logit (0 / softmax_offset[h]) to
  the normaliser only;
* rows with no visible key, padded rows and thd gaps give zero output (and so
  zero gradients);
* dropout keeps element (b, h, i, j) iff its Philox4x32-10 draw is >= the
  threshold; kept probabilities are scaled by 1 / (1 - p).

Called with ``compute_dtype=torch.float64`` it is the ground truth; called with
the inputs' own dtype it is "torch math attention in that dtype", the yardstick
of the tolerance rule (FlashAttention's: the engine's error may be at most twice
that of plain torch in the same dtype, plus a small eps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

MASK32 = 0xFFFFFFFF

# ---------------------------------------------------------------------------
# Philox4x32-10, vectorised on int64 tensors (every value kept in [0, 2^32)).

_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo32(a: int, b: torch.Tensor):
    """(hi, lo) 32-bit halves of the 64-bit product a * b (a a constant, b in [0, 2^32)).

    The product does not fit a signed int64, so a is split into 16-bit halves:
    a*b = ah*b*2^16 + al*b with both partial products below 2^48.
    """
    ah, al = a >> 16, a & 0xFFFF
    x = b * al  # < 2^48
    y = b * ah  # < 2^48
    lo = (x + ((y & 0xFFFF) << 16)) & MASK32
    hi = (y + (x >> 16)) >> 16
    return hi & MASK32, lo


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on broadcastable int64 tensors holding uint32 values."""
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(
        *[torch.as_tensor(t, dtype=torch.int64) & MASK32 for t in (c0, c1, c2, c3, k0, k1)])
    for _ in range(10):
        hi0, lo0 = _mulhilo32(_PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(_PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _PHILOX_W0) & MASK32
        k1 = (k1 + _PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """uint32 threshold below which a draw drops its element.

    The engine receives p as a C float (DropoutParams::p), so p is rounded to
    float32 first, exactly as philox.h's dropout_threshold sees it.
    """
    t = float(np.float32(p)) * 4294967296.0
    return 0xFFFFFFFF if t >= 4294967295.0 else int(math.floor(t))


def split_rng_state(rng_state) -> tuple[int, int]:
    """(seed, offset) as Python ints from an int64 [2] tensor or a pair."""
    if isinstance(rng_state, torch.Tensor):
        seed, offset = (int(x) for x in rng_state.tolist())
    else:
        seed, offset = (int(x) for x in rng_state)
    return seed, offset


def dropout_draws(seed: int, offset: int, bh, i, j) -> torch.Tensor:
    """The 32-bit draw of element (bh, i, j) (broadcastable int64 tensors)."""
    s = seed & 0xFFFFFFFFFFFFFFFF
    o = offset & 0xFFFFFFFFFFFFFFFF
    k0 = s & MASK32
    k1 = (s >> 32) ^ (o >> 32)
    j = torch.as_tensor(j, dtype=torch.int64)
    words = philox4x32_10(j >> 2, i, bh, o & MASK32, k0, k1)
    w = torch.stack(words, dim=-1)
    return torch.gather(w, -1, (j & 3).expand(w.shape[:-1]).unsqueeze(-1)).squeeze(-1)


def dropout_keep_mask(rng_state, p: float, b: int, h_q: int, len_q: int, len_kv: int) -> torch.Tensor:
    """Bool [h_q, len_q, len_kv]: which elements of sequence b the dropout keeps."""
    seed, offset = split_rng_state(rng_state)
    h = torch.arange(h_q, dtype=torch.int64).view(-1, 1, 1)
    i = torch.arange(len_q, dtype=torch.int64).view(1, -1, 1)
    j = torch.arange(len_kv, dtype=torch.int64).view(1, 1, -1)
    draws = dropout_draws(seed, offset, b * h_q + h, i, j)
    return draws >= dropout_threshold(p)


# ---------------------------------------------------------------------------
# Attention.

CAUSAL_TOP_LEFT = ("causal", "padding_causal")
CAUSAL_BOTTOM_RIGHT = ("causal_bottom_right", "padding_causal_bottom_right")
PADDING_MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")


def resolve_diagonal(mask_type: str, bottom_right_diagonal: Optional[bool]) -> bool:
    """TransformerEngine's bottom_right_diagonal rule (causal types force their own)."""
    if mask_type in CAUSAL_TOP_LEFT:
        return False
    if mask_type in CAUSAL_BOTTOM_RIGHT:
        return True
    return True if bottom_right_diagonal is None else bool(bottom_right_diagonal)


def resolve_window(mask_type: str, window_left: int, window_right: int) -> tuple[int, int]:
    if mask_type in CAUSAL_TOP_LEFT + CAUSAL_BOTTOM_RIGHT:
        return window_left, 0
    return window_left, window_right


def visible_mask(len_q: int, len_kv: int, window_left: int, window_right: int, bottom_right: bool) -> torch.Tensor:
    """Bool [len_q, len_kv]: the window part of visibility (explicit masks come on top)."""
    diag = len_kv - len_q if bottom_right else 0
    i = torch.arange(len_q).view(-1, 1)
    j = torch.arange(len_kv).view(1, -1)
    vis = torch.ones(len_q, len_kv, dtype=torch.bool)
    if window_left >= 0:
        vis &= j >= i + diag - window_left
    if window_right >= 0:
        vis &= j <= i + diag + window_right
    return vis


@dataclass
class Seqlens:
    """Per-sequence lengths and (thd) token offsets of one side (q or kv)."""

    b: int
    lens: list
    offsets: Optional[list]  # thd token offsets; None for bshd/sbhd


def seqlens_of(t: torch.Tensor, fmt: str, cu_seqlens, cu_seqlens_padded, other_b: Optional[int] = None) -> Seqlens:
    if fmt == "thd":
        cu = [int(x) for x in cu_seqlens.tolist()]
        lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
        offs = [int(x) for x in (cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens).tolist()][:-1]
        return Seqlens(len(lens), lens, offs)
    b, s = (t.shape[0], t.shape[1]) if fmt == "bshd" else (t.shape[1], t.shape[0])
    if cu_seqlens is not None:
        cu = [int(x) for x in cu_seqlens.tolist()]
        lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
    else:
        lens = [s] * b
    return Seqlens(b, lens, None)


def _seq_rows(t: torch.Tensor, fmt: str, sl: Seqlens, bi: int) -> torch.Tensor:
    """[len, h, d] rows of sequence bi (a differentiable view)."""
    n = sl.lens[bi]
    if fmt == "thd":
        o = sl.offsets[bi]
        return t[o:o + n]
    if fmt == "bshd":
        return t[bi, :n]
    return t[:n, bi]


def _row_index(fmt: str, sl: Seqlens, bi: int):
    n = sl.lens[bi]
    if fmt == "thd":
        o = sl.offsets[bi]
        return (slice(o, o + n),)
    if fmt == "bshd":
        return (bi, slice(0, n))
    return (slice(0, n), bi)


def _pair_slice(t: torch.Tensor, bi: int, h_q: int, len_q: int, len_kv: int) -> torch.Tensor:
    """[h_q, len_q, len_kv] of a [b|1, h|1, s_q|1, s_kv|1] tensor for sequence bi."""
    x = t[bi if t.shape[0] > 1 else 0]
    x = x[:, :len_q] if x.shape[1] > 1 else x
    x = x[:, :, :len_kv] if x.shape[2] > 1 else x
    return x.expand(h_q, len_q, len_kv)


@dataclass
class RefOutput:
    out: torch.Tensor        # q's format with d_v, zeros at padded rows / gaps
    lse: torch.Tensor        # fp32-layout like the op's ([b, h, s_q] or [h, t_q]), compute dtype
    lse_valid: torch.Tensor  # bool, where lse is defined (a valid row with >= 1 visible key)
    max_logit: torch.Tensor  # [h_q], compute dtype (-inf for a head with no visible logit)
    row_valid: torch.Tensor  # bool like lse: a real (non-padded) query row
    lse_graph: torch.Tensor  # lse still attached to the autograd graph (0 where undefined)


def attention_ref(q, k, v, args, *, bias=None, softmax_offset=None, attn_mask=None, alibi_slopes=None,
                  cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
                  rng_state=None, compute_dtype=torch.float64) -> RefOutput:
    """Attention as fusedattn defines it, in ``compute_dtype``, differentiable.

    ``args`` is a fusedattn ``FwdArgs`` (or anything with its fields). q, k, v
    and bias/softmax_offset may require grad; gradients reach them through
    plain autograd.
    """
    dt = compute_dtype
    qc, kc, vc = q.to(dt), k.to(dt), v.to(dt)
    q_fmt, kv_fmt = args.q_format, args.kv_format
    slq = seqlens_of(q, q_fmt, cu_seqlens_q, cu_seqlens_q_padded)
    slk = seqlens_of(k, kv_fmt, cu_seqlens_kv, cu_seqlens_kv_padded)
    b = slq.b if q_fmt == "thd" else slk.b if kv_fmt == "thd" else slq.b
    h_q, d_v = q.shape[-2], v.shape[-1]
    h_kv = k.shape[-2]
    group = h_q // h_kv

    bottom_right = resolve_diagonal(args.mask_type, args.bottom_right_diagonal)
    wl, wr = resolve_window(args.mask_type, args.window_left, args.window_right)
    p_drop = float(args.dropout_p)
    if args.softmax_type == "vanilla":
        sink = None
    elif args.softmax_type == "off-by-one":
        sink = torch.zeros(h_q, dtype=dt)
    else:
        sink = softmax_offset.to(dt)

    out_shape = tuple(q.shape[:-1]) + (d_v,)
    out = torch.zeros(out_shape, dtype=dt)
    if q_fmt == "thd":
        lse = torch.full((h_q, q.shape[0]), float("nan"), dtype=dt)
    else:
        s_q = q.shape[1] if q_fmt == "bshd" else q.shape[0]
        lse = torch.full((b, h_q, s_q), float("nan"), dtype=dt)
    lse_valid = torch.zeros(lse.shape, dtype=torch.bool)
    row_valid = torch.zeros(lse.shape, dtype=torch.bool)
    max_logit = torch.full((h_q,), float("-inf"), dtype=dt)
    lse_graph = torch.zeros(lse.shape, dtype=dt)

    for bi in range(b):
        lq, lk = slq.lens[bi], slk.lens[bi]
        qb = _seq_rows(qc, q_fmt, slq, bi)  # [lq, h_q, d]
        kb = _seq_rows(kc, kv_fmt, slk, bi).repeat_interleave(group, dim=1)  # [lk, h_q, d]
        vb = _seq_rows(vc, kv_fmt, slk, bi).repeat_interleave(group, dim=1)
        scores = torch.einsum("ihd,jhd->hij", qb, kb) * args.scale  # [h, lq, lk]
        softcap = float(getattr(args, "softcap", 0.0))
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        diag = lk - lq if bottom_right else 0
        if bias is not None:
            scores = scores + _pair_slice(bias.to(dt), bi, h_q, lq, lk)
        if alibi_slopes is not None:
            slopes = alibi_slopes[bi] if alibi_slopes.dim() == 2 else alibi_slopes
            dist = (torch.arange(lk).view(1, -1) - torch.arange(lq).view(-1, 1) - diag).abs()
            scores = scores - slopes.to(dt).view(-1, 1, 1) * dist.to(dt)
        vis = visible_mask(lq, lk, wl, wr, bottom_right).expand(h_q, lq, lk)
        if attn_mask is not None:
            vis = vis & ~_pair_slice(attn_mask, bi, h_q, lq, lk)
        row_ok = vis.any(-1)  # [h, lq]

        if lq > 0 and lk > 0 and bool(vis.any()):
            ml = torch.where(vis, scores.detach(), torch.tensor(float("-inf"), dtype=dt)).amax(dim=(1, 2))
            max_logit = torch.maximum(max_logit, ml)

        # Masked logits -> -inf; rows with nothing visible get finite dummies
        # (their output is zeroed below), so no NaN reaches autograd.
        neg_inf = torch.tensor(float("-inf"), dtype=dt)
        s_in = torch.where(vis, scores, neg_inf)
        s_in = torch.where(row_ok.unsqueeze(-1), s_in, torch.zeros((), dtype=dt))
        if sink is not None:
            sink_col = sink.view(h_q, 1, 1).expand(h_q, lq, 1)
            probs = torch.softmax(torch.cat([s_in, sink_col], dim=-1), dim=-1)[..., :lk]
            row_lse = torch.logsumexp(torch.cat([s_in, sink_col], dim=-1), dim=-1)
        else:
            probs = torch.softmax(s_in, dim=-1)
            row_lse = torch.logsumexp(s_in, dim=-1)
        probs = torch.where(row_ok.unsqueeze(-1), probs, torch.zeros((), dtype=dt))
        if p_drop > 0:
            keep = dropout_keep_mask(rng_state, p_drop, bi, h_q, lq, lk)
            probs = torch.where(keep, probs / (1.0 - p_drop), torch.zeros((), dtype=dt))
        ob = torch.einsum("hij,jhd->ihd", probs, vb)  # [lq, h_q, d_v]
        out[_row_index(q_fmt, slq, bi)] = ob

        # lse / validity in the op's lse layout.
        if q_fmt == "thd":
            o = slq.offsets[bi]
            lse[:, o:o + lq] = row_lse.detach()
            lse_graph[:, o:o + lq] = torch.where(row_ok, row_lse, torch.zeros((), dtype=dt))
            lse_valid[:, o:o + lq] = row_ok
            row_valid[:, o:o + lq] = True
        else:
            lse[bi, :, :lq] = row_lse.detach()
            lse_graph[bi, :, :lq] = torch.where(row_ok, row_lse, torch.zeros((), dtype=dt))
            lse_valid[bi, :, :lq] = row_ok
            row_valid[bi, :, :lq] = True
    return RefOutput(out=out, lse=lse, lse_valid=lse_valid, max_logit=max_logit, row_valid=row_valid,
                     lse_graph=lse_graph)


def sdpa_seen_only(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """torch's SDPA contract ([b, h, s, d], top-left causal, bool or additive attn_mask) in which each
    query row reads only what it sees: the logits of its visible keys (the others are -inf whatever
    q . k is there) and the values of those keys. Differentiable; its NaN positions (output and
    gradients) are where a NaN reaches through the (row, key) pairs a row sees, the least the CUDA
    engines propagate (docs/robustness.md). Rows that see no key are zeros."""
    # Every (row, key) pair is gated by torch.where, whose backward gives the other branch an exact 0:
    # a product with a zero (0 * NaN) never carries a NaN from a pair a row does not see.
    s_q, s_kv = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    zero = torch.zeros((), dtype=q.dtype)
    vis = torch.ones(s_q, s_kv, dtype=torch.bool)
    if is_causal:
        vis = vis.tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        vis = vis & attn_mask
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (s_q, s_kv)
    vis = vis.expand(shape)
    k_rows = torch.where(vis.unsqueeze(-1), k.unsqueeze(-3), zero)  # [b, h, s_q, s_kv, d]: row i's keys
    v_rows = torch.where(vis.unsqueeze(-1), v.unsqueeze(-3), zero)
    scores = (q.unsqueeze(-2) * k_rows).sum(-1) * scale
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        scores = scores + torch.where(vis, attn_mask, zero)
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
    probs = torch.where(vis, probs, zero)  # rows that see no key: zeros
    return (probs.unsqueeze(-1) * v_rows).sum(-2)
