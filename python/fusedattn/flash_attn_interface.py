"""flash-attn's Python API (flash_attn 2.8) and torch's ``varlen_attn`` on fusedattn's operators.

Same names, argument order, defaults, layouts and return values as
``flash_attn.flash_attn_interface``: ``flash_attn_func``, ``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func``, their ``varlen`` forms and ``flash_attn_with_kvcache``; plus
``varlen_attn`` with the signature of ``torch.nn.attention.varlen.varlen_attn``. Every call
is one ``torch.ops.fusedattn.fwd`` (with its autograd), and a ``flash_attn_with_kvcache`` step's
append and attention are one ``torch.ops.fusedattn.fwd_kvcache`` (one launch on the GPU's decode
engine): torch.compile traces them without graph breaks and CUDA graphs capture them. What differs
from flash-attn is listed in docs/integrations.md.

flash-attn's conventions, mapped onto the operator's: ``causal`` and ``window_size`` are
aligned to the bottom-right corner (query i of a sequence sees keys up to
``i + s_k - s_q + window_size[1]``); -1 is an unbounded side; ALiBi adds
``-slope * |i + s_k - s_q - j|``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from . import _ops
from ._ops import FwdArgs
from .attention import _build_fwd_args

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "varlen_attn",
    "AuxRequest",
]

# A window side this wide constrains no sequence: the operator wants both sides of a
# non-causal window bounded or both unbounded, flash-attn allows one of each.
_UNBOUNDED = 1 << 30

_FWD_FIELDS = frozenset(f.name for f in dataclasses.fields(FwdArgs))


def softcap_fields(softcap: Optional[float]) -> dict:
    """The FwdArgs fields for logit softcapping ``softcap * tanh(s / softcap)``; {} when off
    (None or <= 0, flash-attn's convention). The one place the setting reaches the operator."""
    if softcap is None or softcap <= 0.0:
        return {}
    if "softcap" not in _FWD_FIELDS:
        raise NotImplementedError(
            f"softcap={softcap}: this fusedattn build's operator has no logit softcapping "
            "(FwdArgs has no 'softcap' setting)")
    return {"softcap": float(softcap)}


def flash_args(*, q_format: str, kv_format: str, causal: bool, window_size, lengths: bool, scale: float,
               dropout_p: float = 0.0, max_seqlen_q=None, max_seqlen_k=None, softcap=None) -> FwdArgs:
    """The FwdArgs of a flash-attn-style call: ``causal`` and ``window_size`` (flash-attn's, -1 =
    unbounded) aligned to the bottom-right corner. ``lengths``: sequences have their own lengths
    (varlen, KV cache), so the mask type carries padding."""
    left, right = (int(w) for w in window_size)
    pad = "padding_" if lengths else ""
    if causal:  # flash-attn: causal sets window_size[1] = 0
        mask_type, window = pad + "causal_bottom_right", (left, 0)
    elif left == -1 and right == -1:
        mask_type, window = ("padding" if lengths else "no_mask"), (-1, -1)
    else:
        mask_type = "padding" if lengths else "no_mask"
        window = (_UNBOUNDED if left == -1 else left, _UNBOUNDED if right == -1 else right)
    args = _build_fwd_args(q_format=q_format, kv_format=kv_format, mask_type=mask_type, window_size=window,
                           bottom_right_diagonal=True, softmax_type="vanilla", scale=float(scale),
                           dropout_p=float(dropout_p), max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_k,
                           return_max_logit=False)
    return args.replace(**softcap_fields(softcap))


def _pad_head_dim(t: torch.Tensor) -> torch.Tensor:
    """flash-attn pads head dims to a multiple of 8 (zeros change no score); so does this API."""
    d = t.shape[-1]
    return t if d % 8 == 0 else F.pad(t, [0, 8 - d % 8])


def _check_deterministic(deterministic: bool, tensors) -> None:
    if not deterministic or torch.are_deterministic_algorithms_enabled():
        return
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if needs_grad and any(t is not None and t.is_cuda for t in tensors):
        raise NotImplementedError(
            "deterministic=True: fusedattn's CUDA backward is made deterministic by "
            "torch.use_deterministic_algorithms(True), not per call; enable it (the CPU engine is always "
            "deterministic)")


def _attention(q, k, v, *, q_format: str, dropout_p: float, softmax_scale, causal: bool, window_size,
               softcap, alibi_slopes, deterministic: bool, return_lse: bool, cu_seqlens_q=None,
               cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, page_table=None, key_offsets=None):
    """One flash-attn call on the operator: (out, softmax_lse or None). ``key_offsets``: where each
    sequence's keys start in thd k/v when that is not ``cu_seqlens_k`` (cu_seqlens_kv_padded)."""
    _check_deterministic(deterministic, (q, k, v))
    d_v = v.shape[-1]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** (-0.5)
    args = flash_args(q_format=q_format, kv_format="bshd" if page_table is not None else q_format, causal=causal,
                      window_size=window_size, lengths=cu_seqlens_q is not None or page_table is not None,
                      scale=scale, dropout_p=dropout_p, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                      softcap=softcap)
    q, k, v = _pad_head_dim(q), _pad_head_dim(k), _pad_head_dim(v)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.to(torch.float32)
    if return_lse:
        rng_state = _ops.draw_rng_state(q.device) if dropout_p > 0 else None
        optionals = (None, None, None, alibi_slopes, cu_seqlens_q, cu_seqlens_k, None, key_offsets)
        out, lse, _, _ = _ops._fwd_op(args, page_table, rng_state, q, k, v, optionals)
    else:
        out, _ = _ops.attention(q, k, v, args, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_kv=cu_seqlens_k, cu_seqlens_kv_padded=key_offsets, page_table=page_table)
        lse = None
    if out.shape[-1] != d_v:
        out = out[..., :d_v]
    return out, lse


def _returns(out, lse, dropout_p: float, return_attn_probs: bool):
    """flash-attn's return value: out, or (out, softmax_lse, S_dmask).

    flash-attn itself returns S_dmask = None without dropout; fusedattn never materialises
    the probabilities, so with dropout it cannot return them."""
    if not return_attn_probs:
        return out
    if dropout_p > 0:
        raise NotImplementedError(
            "return_attn_probs=True with dropout_p > 0: fusedattn does not return S_dmask (the dropped "
            "attention probabilities); with dropout_p=0 it returns (out, softmax_lse, None) as flash-attn does")
    return out, lse, None


def _check_dropout_probs(dropout_p: float, return_attn_probs: bool) -> None:
    _returns(None, None, dropout_p, return_attn_probs)


# ---------------------------------------------------------------------------
# Padded batches: q (b, s_q, h, d), k/v (b, s_k, h_k, d)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's ``flash_attn_func``: q ``(b, s_q, h, d)``, k/v ``(b, s_k, h_k, d)`` (GQA/MQA when
    ``h_k`` divides ``h``) -> out ``(b, s_q, h, d_v)``; with ``return_attn_probs`` ``(out, softmax_lse
    (b, h, s_q) fp32, None)``. ``causal`` and ``window_size`` are aligned to the bottom-right corner;
    ``dropout_p`` applies whenever > 0 (flash-attn's contract: pass 0.0 in evaluation)."""
    _check_dropout_probs(dropout_p, return_attn_probs)
    out, lse = _attention(q, k, v, q_format="bshd", dropout_p=dropout_p, softmax_scale=softmax_scale,
                          causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                          deterministic=deterministic, return_lse=return_attn_probs)
    return _returns(out, lse, dropout_p, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """``flash_attn_func`` on qkv ``(b, s, 3, h, d)``; q, k, v are views of it (no copy) and the
    gradient comes back in qkv's layout."""
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """``flash_attn_func`` with kv ``(b, s_k, 2, h_k, d)``."""
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


# ---------------------------------------------------------------------------
# Packed sequences: q (total_q, h, d), k/v (total_k, h_k, d), cu_seqlens int32 (b + 1)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn's ``flash_attn_varlen_func``: sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``
    of q and ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k/v; out ``(total_q, h, d_v)``, softmax_lse
    ``(h, total_q)``. With ``block_table`` (int32 ``(b, max_blocks)``), k/v are page pools
    ``(num_blocks, block_size, h_k, d)`` and ``cu_seqlens_k`` the cumulative key lengths
    (inference: no backward)."""
    _check_dropout_probs(dropout_p, return_attn_probs)
    out, lse = _attention(q, k, v, q_format="thd", dropout_p=dropout_p, softmax_scale=softmax_scale,
                          causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                          deterministic=deterministic, return_lse=return_attn_probs, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                          page_table=block_table)
    return _returns(out, lse, dropout_p, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """``flash_attn_varlen_func`` on qkv ``(total, 3, h, d)`` with one ``cu_seqlens``."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """``flash_attn_varlen_func`` with kv ``(total_k, 2, h_k, d)``."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


# ---------------------------------------------------------------------------
# Decoding against a KV cache the caller owns


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary embedding of the first ``2 * cos.shape[-1]`` channels of x ``(b, s, h, d)``; cos/sin
    ``(b, s, rotary_dim / 2)`` already gathered at each token's position."""
    rd = 2 * cos.shape[-1]
    cos, sin = cos.unsqueeze(2).to(x.dtype), sin.unsqueeze(2).to(x.dtype)
    rot, rest = x[..., :rd], x[..., rd:]
    if interleaved:  # pairs (0, 1), (2, 3), ...
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:  # GPT-NeoX: pairs (i, i + rd / 2)
        x1, x2 = rot[..., : rd // 2], rot[..., rd // 2:]
        rot = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rot, rest), dim=-1)


def _cumulative(lens: torch.Tensor) -> torch.Tensor:
    """int32 ``[b + 1]`` running sum of ``lens`` ``[b]``, on the device."""
    return F.pad(lens.cumsum(0), (1, 0)).to(torch.int32)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None,
                            num_splits=0, return_softmax_lse=False):
    """flash-attn's ``flash_attn_with_kvcache``: appends k/v (when given) to the caller's caches in
    place at positions ``cache_seqlens[b]...`` and attends q over each sequence's
    ``cache_seqlens[b] + s_new`` keys. When k/v have q's batch and sequence dims (a decoding step),
    the append and the attention are one operator (``fusedattn::fwd_kvcache``; one kernel launch
    and the split-KV combine on the GPU).

    Caches are ``(b_cache, s_cache, h_k, d)`` (row ``cache_batch_idx[b]`` of sequence b, default b)
    or, with ``block_table`` (int32 ``(b, max_blocks)``), page pools ``(num_blocks, block_size, h_k,
    d)`` of any block size. ``cache_leftpad`` (int32 ``(b,)``, non-paged only): sequence b's cache
    starts at that position. Rotary (``rotary_cos/sin (seqlen_ro, rotary_dim / 2)``) rotates the new
    k at positions ``cache_seqlens[b] + i`` and q at the same positions when causal or windowed, else
    all at ``cache_seqlens[b]``. ``num_splits`` is accepted and ignored (the split-KV decode kernel
    picks its own). Returns out ``(b, s_q, h, d_v)``, or ``(out, softmax_lse (b, h, s_q))``.
    Inference only: no backward. Nothing here reads a tensor on the host.
    """
    del num_splits
    b, s_q = q.shape[0], q.shape[1]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must have a contiguous last dimension (stride 1)")
    # The caches are attended in place: their head dims follow the operator's rule (no padded copy).
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        d = cache.shape[-1]
        if d % 8 != 0 or not 8 <= d <= 256:
            raise NotImplementedError(f"flash_attn_with_kvcache: {name} has head dim {d}; fusedattn attends over "
                                      f"caches whose head dims are multiples of 8 in [8, 256]")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new keys and values to append)")
    if k is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens is required when k and v are appended (where each sequence's new tokens go)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None and k is None:
        raise ValueError("rotary_cos/rotary_sin need the new k and v: the rotary embedding applies to appended keys")
    paged = block_table is not None
    if paged and cache_batch_idx is not None:
        raise ValueError("cache_batch_idx does not apply to a paged KV cache (block_table)")
    if paged and cache_leftpad is not None:
        raise ValueError("cache_leftpad does not apply to a paged KV cache (block_table)")
    device = q.device
    s_new = 0 if k is None else k.shape[1]

    # The new tokens at the queries' positions (s_new == s_q): one operator appends and attends.
    step = k is not None and k.shape[:2] == q.shape[:2] and v.shape[:2] == q.shape[:2]

    if cache_seqlens is None:  # every sequence is the whole cache (or its blocks)
        full = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        cache_seqlens = torch.full((b,), full, dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=device)
    cache_seqlens = cache_seqlens.to(torch.int32)

    # Every cache form is a page pool read through a page table.
    if paged:
        k_pool, v_pool, page_table = k_cache, v_cache, block_table
        start = cache_seqlens
    elif cache_leftpad is None:
        # Sequence b's cache row: cache_batch_idx[b], else b (the step operator needs no table for it).
        if cache_batch_idx is not None:
            page_table = cache_batch_idx.to(torch.int32).view(b, 1)
        elif step:
            page_table = None
        else:
            page_table = torch.arange(b, dtype=torch.int32, device=device).view(b, 1)
        k_pool, v_pool = k_cache, v_cache
        start = cache_seqlens
    else:
        # A cache starting at cache_leftpad[b]: pages of one slot each, so the table can start anywhere.
        s_cache = k_cache.shape[1]
        rows = (cache_batch_idx.to(torch.int64) if cache_batch_idx is not None
                else torch.arange(b, dtype=torch.int64, device=device))
        slots = torch.arange(s_cache, dtype=torch.int64, device=device)
        page_table = (rows.view(b, 1) * s_cache + cache_leftpad.to(torch.int64).view(b, 1) + slots).clamp_(
            max=k_cache.shape[0] * s_cache - 1).to(torch.int32)
        k_pool = k_cache.view(-1, 1, *k_cache.shape[2:])
        v_pool = v_cache.view(-1, 1, *v_cache.shape[2:])
        start = cache_seqlens - cache_leftpad.to(torch.int32)

    if rotary_cos is not None:
        steps = torch.arange(s_new, device=device)
        pos = cache_seqlens.long().view(b, 1) + steps.view(1, -1)  # (b, s_new)
        k = _apply_rotary(k, rotary_cos[pos], rotary_sin[pos], rotary_interleaved)
        rotate_q_per_token = causal or tuple(window_size) != (-1, -1)
        q_pos = cache_seqlens.long().view(b, 1) + (torch.arange(s_q, device=device).view(1, -1)
                                                   if rotate_q_per_token else torch.zeros(1, s_q, dtype=torch.long,
                                                                                          device=device))
        q = _apply_rotary(q, rotary_cos[q_pos], rotary_sin[q_pos], rotary_interleaved)

    if step:
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** (-0.5)
        args = flash_args(q_format="bshd", kv_format="bshd", causal=causal, window_size=window_size, lengths=True,
                          scale=scale, softcap=softcap)
        out, lse, _ = _ops.kv_step(q, k, v, k_pool, v_pool, start, args, page_table=page_table,
                                   alibi_slopes=None if alibi_slopes is None else alibi_slopes.to(torch.float32))
        return (out, lse) if return_softmax_lse else out
    if k is not None:
        cu_new = torch.arange(0, (b + 1) * s_new, s_new, dtype=torch.int32, device=device)
        _ops.copy_to_kv_cache(k, v, k_pool, v_pool, page_table, cu_new, start, "bshd")
    lens_k = start + s_new
    cu_q = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32, device=device)
    out, lse = _attention(q, k_pool, v_pool, q_format="bshd", dropout_p=0.0, softmax_scale=softmax_scale,
                          causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                          deterministic=False, return_lse=return_softmax_lse, cu_seqlens_q=cu_q,
                          cu_seqlens_k=_cumulative(lens_k), page_table=page_table)
    return (out, lse) if return_softmax_lse else out


# ---------------------------------------------------------------------------
# torch.nn.attention.varlen.varlen_attn


class AuxRequest(NamedTuple):
    """torch.nn.attention.varlen.AuxRequest: which auxiliary outputs ``varlen_attn`` returns."""

    lse: bool = False


def varlen_attn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
                cu_seq_k: Optional[torch.Tensor], max_q: int, max_k: int, *, return_aux: Optional[AuxRequest] = None,
                scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                seqused_k: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
                num_splits: Optional[int] = None):
    """``torch.nn.attention.varlen.varlen_attn`` on fusedattn: query ``(T_q, H_q, D)``, key/value
    ``(T_k, H_kv, D)`` (or page pools with ``block_table``, which needs ``seqused_k``). Causal is
    ``window_size == (-1, 0)``; ``(W, 0)`` is causal with a window of W keys back (flash-attn's
    bottom-right convention). ``seqused_k[i]``: only the first that many keys of sequence i take part.
    Returns out ``(T_q, H_q, D_v)``, or ``(out, lse)`` with ``return_aux=AuxRequest(lse=True)``; lse
    is ``(H_q, T_q)`` fp32, the layout torch's own kernel returns. ``num_splits`` is accepted and
    ignored (fusedattn's results do not depend on the batch composition)."""
    del num_splits
    h_q = query.shape[1]
    h_k = key.shape[2] if block_table is not None else key.shape[1]
    if not enable_gqa and h_q != h_k:
        raise ValueError(f"Expect query and key/value to have the same number of heads but got Hq={h_q} and "
                         f"Hkv={h_k}. Try setting enable_gqa=True for GQA.")
    if enable_gqa and h_q % h_k != 0:
        raise ValueError(f"Expect number of query heads to be a multiple of kv heads for GQA but got Hq={h_q} "
                         f"and Hkv={h_k}.")
    window_size = tuple(int(w) for w in window_size)
    if len(window_size) != 2:
        raise ValueError(f"window_size must have length 2, got {len(window_size)}")
    causal = window_size == (-1, 0)
    cu_k_offsets = None
    if block_table is not None:
        if seqused_k is None:
            raise ValueError("block_table requires seqused_k: the number of valid keys of every sequence")
        cu_k = _cumulative(seqused_k)
    elif seqused_k is not None:
        if cu_seq_k is None:
            raise ValueError("seqused_k needs cu_seq_k: where each sequence's keys start")
        cu_k, cu_k_offsets = _cumulative(seqused_k), cu_seq_k
    else:
        if cu_seq_k is None:
            raise ValueError("cu_seq_k is required without block_table")
        cu_k = cu_seq_k
    want_lse = return_aux is not None and return_aux.lse
    out, lse = _attention(query, key, value, q_format="thd", dropout_p=0.0, softmax_scale=scale, causal=causal,
                          window_size=window_size, softcap=None, alibi_slopes=None, deterministic=False,
                          return_lse=want_lse, cu_seqlens_q=cu_seq_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                          max_seqlen_k=max_k, page_table=block_table, key_offsets=cu_k_offsets)
    return (out, lse) if want_lse else out
