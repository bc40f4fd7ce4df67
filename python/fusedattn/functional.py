"""Functional entry points: torch's SDPA contract, and DotProductAttention as a function."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _checks, _ops
from ._gate import eager_fallback_gate, needs_eager
from .attention import MaskArg, _attention_forward, _build_fwd_args, _default_scale, _unpack_packed_qkv

_HEADS_FIRST = _ops.Layout(heads_first=True, out_heads_first=True)

__all__ = ["scaled_dot_product_attention", "dot_product_attention"]


def _to_4d(x: torch.Tensor) -> torch.Tensor:
    return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape)) if x.dim() < 4 else x


def _check_sdpa_inputs(query, key, value, attn_mask, enable_gqa) -> None:
    """torch's checks of an SDPA call, in the caller's terms (bhsd shapes, query/key/value,
    attn_mask), before the operator sees bshd views under its own argument names. RuntimeError,
    as torch raises."""
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(f"scaled_dot_product_attention: query, key and value must have the same dtype; got "
                           f"{query.dtype}, {key.dtype} and {value.dtype}")
    if not (query.device == key.device == value.device):
        raise RuntimeError(f"scaled_dot_product_attention: query, key and value must be on the same device; got "
                           f"{query.device}, {key.device} and {value.device}")
    if key.shape[:-1] != value.shape[:-1]:
        raise RuntimeError(f"scaled_dot_product_attention: key {tuple(key.shape)} and value {tuple(value.shape)} "
                           f"must agree in batch, heads and sequence length")
    if query.shape[:-3] != key.shape[:-3]:
        raise RuntimeError(f"scaled_dot_product_attention: query {tuple(query.shape)} and key {tuple(key.shape)} "
                           f"must have the same batch size")
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"scaled_dot_product_attention: query {tuple(query.shape)} and key {tuple(key.shape)} "
                           f"must have the same head dim")
    h_q, h_kv = query.shape[-3], key.shape[-3]
    if h_q != h_kv and not enable_gqa:
        raise RuntimeError(
            f"scaled_dot_product_attention: query has {h_q} heads but key/value have {h_kv}; pass enable_gqa=True "
            f"for grouped-query attention")
    if h_kv != 0 and h_q % h_kv != 0 or (h_kv == 0) != (h_q == 0):
        raise RuntimeError(f"scaled_dot_product_attention: the number of key/value heads must divide the number of "
                           f"query heads; got query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                           f"{tuple(value.shape)}")
    if attn_mask is None:
        return
    if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
        raise RuntimeError(  # torch's words
            f"Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
            f"{attn_mask.dtype} and  query.dtype: {query.dtype} instead.")
    if attn_mask.device != query.device:
        raise RuntimeError(f"scaled_dot_product_attention: attn_mask must be on query's device ({query.device}); "
                           f"got {attn_mask.device}")
    full = tuple(query.shape[:-1]) + (key.shape[-2],)
    try:
        ok = attn_mask.dim() <= len(full) and torch.broadcast_shapes(attn_mask.shape, full) == full
    except RuntimeError:
        ok = False
    if not ok:
        raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape {tuple(attn_mask.shape)} cannot be "
                           f"broadcast to {full}")


@eager_fallback_gate(when=needs_eager)
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on fusedattn's operator.

    query ``[b, h_q, s_q, d_qk]``, key ``[b, h_kv, s_kv, d_qk]``, value
    ``[b, h_kv, s_kv, d_v]`` (or the same without ``b``); returns
    ``[b, h_q, s_q, d_v]``. The tensors reach the operator as bshd views
    (``transpose(1, 2)``, no copy), and the output is the transposed view of
    the operator's bshd output.

    attn_mask: bool (True = takes part, torch's convention) or of query's dtype
    (added to the scaled scores, with gradient), broadcastable to
    ``[b, h_q, s_q, s_kv]``; any other dtype raises, as in torch.
    is_causal: top-left aligned causal mask, as in torch. dropout_p applies
    whenever it is > 0 (torch's functional contract: no training flag).
    """
    if attn_mask is not None and is_causal:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(
            "fusedattn.scaled_dot_product_attention takes 4-D [b, h, s, d] (or 3-D [h, s, d]) "
            f"query/key/value of the same rank, got shapes {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}")
    _check_sdpa_inputs(query, key, value, attn_mask, enable_gqa)
    dropout_p = _checks.dropout("dropout_p", dropout_p)
    if scale is not None:
        _checks.finite("scale", _checks.real("scale", scale))
    unbatched = query.dim() == 3
    if unbatched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)

    bias = mask = None
    mask_type = "causal" if is_causal else "no_mask"
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = _to_4d(~attn_mask)  # torch: True takes part; the operator: True is masked out
            mask_type = "arbitrary"
        else:
            bias = _to_4d(attn_mask)
            if bias.shape[-1] == 1:
                # The operator broadcasts a bias over b, h and s_q but wants s_kv
                # whole; a stride-0 expand is no copy.
                bias = bias.expand(*bias.shape[:-1], key.shape[-2])

    if scale is None:
        scale = _default_scale(query.shape[-1])
    args = _build_fwd_args(
        q_format="bshd", kv_format="bshd", mask_type=mask_type, window_size=None,
        bottom_right_diagonal=None, softmax_type="vanilla", scale=scale, dropout_p=dropout_p,
        max_seqlen_q=None, max_seqlen_kv=None, return_max_logit=False,
    )
    out, _ = _ops.attention(query, key, value, args, bias=bias, attn_mask=mask, layout=_HEADS_FIRST)
    return out.squeeze(0) if unbatched else out


@eager_fallback_gate(when=needs_eager)
def dot_product_attention(
    query_layer: Optional[torch.Tensor] = None,
    key_layer: Optional[torch.Tensor] = None,
    value_layer: Optional[torch.Tensor] = None,
    attention_mask: MaskArg = None,
    *,
    qkv_format: str = "bshd",
    attn_mask_type: str = "no_mask",
    window_size: Optional[Tuple[int, int]] = None,
    bottom_right_diagonal: Optional[bool] = None,
    softmax_scale: Optional[float] = None,
    dropout_p: float = 0.0,
    softmax_type: str = "vanilla",
    softmax_offset: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    core_attention_bias_type: str = "no_bias",
    core_attention_bias: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_max_logit: bool = False,
    softcap: float = 0.0,
    qkv_layer: Optional[torch.Tensor] = None,
    kv_layer: Optional[torch.Tensor] = None,
    qkv_interleave_dim: int = -3,
):
    """``DotProductAttention.forward`` as a function, without a module.

    Same arguments and output (heads merged) as the module; what the module
    holds comes in as arguments: ``softmax_scale`` (default ``1/sqrt(d_qk)``),
    ``dropout_p`` (applied whenever > 0), ``softmax_type`` and, for
    ``"learnable"``, ``softmax_offset`` (fp32 ``[h_q]``), ``softcap`` (0: off; else the scaled
    scores become ``softcap * tanh(s / softcap)`` before bias, ALiBi and masks). Defaults differ from
    the module's where a function has no reason to copy them: ``qkv_format="bshd"``
    and ``attn_mask_type="no_mask"``.
    """
    query_layer, key_layer, value_layer = _unpack_packed_qkv(
        qkv_layer, kv_layer, query_layer, key_layer, value_layer, qkv_format, qkv_interleave_dim)
    return _attention_forward(
        query_layer, key_layer, value_layer,
        qkv_format=qkv_format, attn_mask_type=attn_mask_type, attention_mask=attention_mask,
        window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
        softmax_scale=softmax_scale, dropout_p=dropout_p, softmax_type=softmax_type,
        softmax_offset=softmax_offset,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        core_attention_bias_type=core_attention_bias_type,
        core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
        return_max_logit=return_max_logit, softcap=softcap,
    )
