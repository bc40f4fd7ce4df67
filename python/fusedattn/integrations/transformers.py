"""``attn_implementation="fusedattn"`` for Hugging Face transformers (5.x).

``register()`` adds "fusedattn" to transformers' ``AttentionInterface`` (this module's
``attention_forward``) and to its ``AttentionMaskInterface`` (transformers' own ``sdpa_mask``: a
boolean ``[b, 1, s_q, s_kv]`` mask, True = attend, or None where a plain causal or full mask
suffices). Nothing is registered on import.

One call maps onto the operator as follows (q/k/v arrive as ``[b, h, s, d]`` and reach the
operator as bshd views, without a copy; GQA is native, k/v are not repeated):

* a 4-D mask is the whole truth: padding on either side, sliding windows, packed sequences,
  static-cache slots not written yet, rolling sliding-window caches. Boolean masks become the
  operator's arbitrary mask, float masks an additive bias;
* no mask: top-left causal when the module is causal and ``s_q > 1`` (as transformers' sdpa
  path), with ``sliding_window`` mapped to the operator's window ``(sliding_window - 1, 0)``
  (transformers counts the query's own token in the window); otherwise no mask;
* ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (flash-attention kwargs, e.g. from
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``): the batch-1 packed row goes to
  the operator as thd sequences, causal per sequence, with the window, without reading the
  lengths on the host;
* ``softcap`` (Gemma 2), ``s_aux`` (gpt-oss sinks: the operator's learnable softmax offset, with
  its gradient) and ``dropout`` (applied whenever > 0; transformers passes 0 outside training).
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import _ops
from ..attention import _build_fwd_args
from ..flash_attn_interface import _pad_head_dim, softcap_fields

__all__ = ["NAME", "attention_forward", "register"]

NAME = "fusedattn"


def _window(sliding_window: Optional[int], causal: bool):
    """transformers' causal ``sliding_window`` (keys ``i - sliding_window < j <= i``) as the
    operator's window; None: no window."""
    if sliding_window is None or not causal:
        return None
    return (int(sliding_window) - 1, 0)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      s_aux: Optional[torch.Tensor] = None, is_causal: Optional[bool] = None, **kwargs):
    """transformers' attention-function contract: query ``[b, h_q, s_q, d]``, key/value ``[b, h_kv,
    s_kv, d]`` -> ``(attn_output [b, s_q, h_q, d_v], None)``."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    d_v = value.shape[-1]
    # [b, h, s, d] seen as bshd by the operator's autograd (no transpose nodes); out comes back bshd.
    q, k, v = (_pad_head_dim(t) for t in (query, key, value))
    layout = _ops.Layout(heads_first=True)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** (-0.5)
    tensors = {}
    if s_aux is not None:
        tensors["softmax_offset"] = s_aux.to(torch.float32)
    fmt = "bshd"
    max_q = max_k = None
    window = None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        if q.shape[0] != 1:
            raise ValueError(f"cu_seq_lens_q/cu_seq_lens_k describe sequences packed into one row; the batch has "
                             f"{q.shape[0]} rows")
        fmt = "thd"
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
        layout = _ops.OPERATOR_LAYOUT
        tensors.update(cu_seqlens_q=cu_q.to(torch.int32), cu_seqlens_kv=cu_k.to(torch.int32))
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = max_q if isinstance(max_q, int) else None  # a tensor would need a host read
        max_k = max_k if isinstance(max_k, int) else None
        mask_type = "padding_causal_bottom_right" if causal else "padding"
        window = _window(sliding_window, causal)
    elif attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask_type = "arbitrary"
            tensors["attn_mask"] = ~attention_mask  # transformers: True attends; the operator: True is masked
        else:
            mask_type = "no_mask"
            tensors["bias"] = attention_mask.to(q.dtype)
    elif causal and query.shape[2] > 1:
        mask_type = "causal"
        window = _window(sliding_window, causal)
    else:
        mask_type = "no_mask"
    args = _build_fwd_args(
        q_format=fmt, kv_format=fmt, mask_type=mask_type, window_size=window, bottom_right_diagonal=None,
        softmax_type="learnable" if s_aux is not None else "vanilla", scale=scale, dropout_p=float(dropout),
        max_seqlen_q=max_q, max_seqlen_kv=max_k, return_max_logit=False)
    args = args.replace(**softcap_fields(softcap))
    out, _ = _ops.attention(q, k, v, args, layout=layout, **tensors)
    if out.shape[-1] != d_v:
        out = out[..., :d_v]
    if fmt == "thd":
        out = out.unsqueeze(0)
    return out, None


def register(name: str = NAME) -> str:
    """Make ``attn_implementation=name`` (default "fusedattn") select fusedattn in transformers'
    models; returns the name. Idempotent; affects only models that ask for that name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
