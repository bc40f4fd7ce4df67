"""DotProductAttention: a drop-in for TransformerEngine's ``DotProductAttention``.

The module only resolves defaults: every setting of a call ends up in one frozen
``FwdArgs`` (``_build_fwd_args``) and the tensors go to ``_ops.attention``, a real
torch operator with a fake implementation and autograd. Nothing here reads a
tensor's values on the host, so a call traces under
``torch.compile(fullgraph=True)`` without a graph break.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch.nn.parameter import Parameter

from . import _checks, _ops
from ._gate import eager_fallback_gate, needs_eager
from ._ops import FwdArgs

__all__ = ["DotProductAttention"]

ATTN_TYPES = ("self", "cross")
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
# The core's mask types and TransformerEngine's aliases of them, as the core's table holds them
# (csrc/core/src/types.cc; tests/test_contract.py fails when they differ). The operator resolves
# aliases itself; Python names a call's mask canonically for its own routing (padding tensors, the KV
# cache's mask) and keeps it so in the module's attn_mask_type, as TransformerEngine does.
MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
              "arbitrary")
MASK_ALIASES = {"padding,causal": "padding_causal", "causal,padding": "padding_causal",
                "causal_padding": "padding_causal"}
# Masks whose diagonal TransformerEngine pins to one corner whatever
# bottom_right_diagonal says.
_TOP_LEFT_MASKS = ("causal", "padding_causal")
_BOTTOM_RIGHT_MASKS = ("causal_bottom_right", "padding_causal_bottom_right")
CAUSAL_MASK_TYPES = _TOP_LEFT_MASKS + _BOTTOM_RIGHT_MASKS

MaskArg = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor], None]


# ---------------------------------------------------------------------------
# Settings: strings and numbers in, one FwdArgs out.


def canonical_mask_type(attn_mask_type: str) -> str:
    """The mask type an alias stands for (MASK_ALIASES); other strings pass through, and the
    operator rejects unknown ones."""
    return MASK_ALIASES.get(attn_mask_type, attn_mask_type)


def _default_scale(d_qk) -> float:
    """1 / sqrt(d_qk); with d_qk = 0 every q.k is 0, so any finite scale gives torch's result."""
    return 1.0 / math.sqrt(d_qk) if d_qk > 0 else 1.0


def _build_fwd_args(
    *,
    q_format: str,
    kv_format: str,
    mask_type: str,
    window_size: Optional[Tuple[int, int]],
    bottom_right_diagonal: Optional[bool],
    softmax_type: str,
    scale: float,
    dropout_p: float,
    max_seqlen_q: Optional[int],
    max_seqlen_kv: Optional[int],
    return_max_logit: bool,
    softcap: float = 0.0,
) -> FwdArgs:
    """Resolve every default of one call into the frozen FwdArgs the operator takes.

    A window passes through unchanged (checked to be two ints), None as (-1, -1):
    the operator gives causal masks their right side of 0, as TransformerEngine's
    ``check_set_window_size`` does, and rejects the combinations TransformerEngine
    rejects. max_seqlen
    only means something for thd (for bshd/sbhd the operator reads the sequence
    dims), so it is dropped there and the shapes stay symbolic under
    torch.compile.
    """
    window_size = _checks.window_size(window_size) or (-1, -1)
    return FwdArgs(
        scale=scale,
        q_format=q_format,
        kv_format=kv_format,
        mask_type=mask_type,
        window_left=window_size[0],
        window_right=window_size[1],
        # None: the core applies TransformerEngine's rule (causal types force their own diagonal).
        bottom_right_diagonal=bottom_right_diagonal,
        softmax_type=softmax_type,
        dropout_p=float(dropout_p),
        max_seqlen_q=max_seqlen_q if q_format == "thd" else None,
        max_seqlen_kv=max_seqlen_kv if kv_format == "thd" else None,
        return_max_logit=bool(return_max_logit),
        softcap=_checks.softcap("softcap", softcap),
    )


# ---------------------------------------------------------------------------
# Tensor inputs: packed layouts, padding masks, bias and ALiBi.


def _unpack_packed_qkv(qkv_layer, kv_layer, query_layer, key_layer, value_layer,
                       qkv_format: str, qkv_interleave_dim: int):
    """q/k/v as ``select()`` views of a packed buffer (no copy; the operator takes
    any strides). Without a packed input the three tensors come back as given."""
    if qkv_layer is None and kv_layer is None:
        if query_layer is None or key_layer is None or value_layer is None:
            raise ValueError(
                "query_layer, key_layer and value_layer are required unless a packed input "
                "(qkv_layer, or query_layer with kv_layer) is given")
        return query_layer, key_layer, value_layer
    if qkv_layer is not None and kv_layer is not None:
        raise ValueError("qkv_layer and kv_layer are mutually exclusive")
    if qkv_interleave_dim not in (-3, -2):
        raise ValueError(
            f"qkv_interleave_dim must be -3 (e.g. bs3hd) or -2 (e.g. bsh3d), got {qkv_interleave_dim}")

    if qkv_layer is not None:
        if query_layer is not None or key_layer is not None or value_layer is not None:
            raise ValueError(
                "qkv_layer packs Q, K and V: query_layer, key_layer and value_layer must be None")
        rank = 4 if qkv_format == "thd" else 5
        if qkv_layer.dim() != rank:
            raise ValueError(
                f"qkv_layer must be {rank}-D for qkv_format={qkv_format!r}, got shape "
                f"{tuple(qkv_layer.shape)}")
        return _split_packed(qkv_layer, "qkv_layer", 3, qkv_interleave_dim)

    if query_layer is None:
        raise ValueError("kv_layer packs only K and V: query_layer is required with it")
    if key_layer is not None or value_layer is not None:
        raise ValueError("kv_layer packs K and V: key_layer and value_layer must be None")
    if kv_layer.dim() != query_layer.dim() + 1:
        raise ValueError(
            f"kv_layer must have one more dimension than query_layer, got shapes "
            f"{tuple(kv_layer.shape)} and {tuple(query_layer.shape)}")
    return (query_layer,) + _split_packed(kv_layer, "kv_layer", 2, qkv_interleave_dim)


def _split_packed(packed: torch.Tensor, name: str, n: int, dim: int):
    """The ``n`` tensors packed along ``dim`` (qkv_interleave_dim) of ``packed``."""
    if packed.shape[dim] != n:
        raise ValueError(
            f"{name} must have size {n} at dim {dim} (qkv_interleave_dim), "
            f"got shape {tuple(packed.shape)}")
    return tuple(packed.select(dim, i) for i in range(n))


def cu_seqlens_from_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """int32 ``[b + 1]`` cumulative lengths from a ``[b, 1, 1, s]`` bool mask
    (True = padded), on the mask's device with device ops only (no host sync).

    Like TransformerEngine, it counts the unmasked positions of each row, so the
    padding is assumed to sit at the end of each sequence.
    """
    seqlens = mask.logical_not().reshape(mask.shape[0], -1).sum(dim=-1)
    return F.pad(seqlens.cumsum(0), (1, 0)).to(torch.int32)


def default_alibi_slopes(num_heads: int, device) -> torch.Tensor:
    """The ALiBi paper's slopes for ``num_heads`` heads (TransformerEngine's
    ``get_alibi`` default), fp32 ``[num_heads]``, built on ``device`` (no host copy)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, 1 + n, device=device))
    if n < num_heads:
        extra = torch.pow(2.0 ** (-4.0 / n),
                          torch.arange(1, 1 + 2 * (num_heads - n), 2, device=device))
        slopes = torch.cat([slopes, extra])
    return slopes.to(torch.float32)


def _bias_inputs(bias_type: str, bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                 q: torch.Tensor, scale: float):
    """Map TransformerEngine's (bias type, bias, slopes) onto the operator's
    (post-scale bias, alibi slopes) inputs."""
    if bias_type not in BIAS_TYPES:
        raise ValueError(f"core_attention_bias_type must be one of {BIAS_TYPES}, got {bias_type!r}")
    if alibi_slopes is not None and bias_type != "alibi":
        raise ValueError(
            f"alibi_slopes needs core_attention_bias_type='alibi', got {bias_type!r}")
    if bias_type == "no_bias":
        if bias is not None:
            raise ValueError(
                "core_attention_bias is given but core_attention_bias_type is 'no_bias'; "
                "use 'post_scale_bias' (or 'pre_scale_bias')")
        return None, None
    if bias_type == "alibi":
        if bias is not None:
            raise ValueError("core_attention_bias must be None when core_attention_bias_type is 'alibi'")
        h_q = q.shape[-2]
        slopes = alibi_slopes if alibi_slopes is not None else default_alibi_slopes(h_q, q.device)
        return None, slopes.to(torch.float32)
    if bias is None:
        raise ValueError(f"core_attention_bias is required for core_attention_bias_type={bias_type!r}")
    if bias.dim() < 4:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if bias_type == "pre_scale_bias":
        # softmax((QK^T + B) * scale) == softmax(QK^T * scale + B * scale): a
        # pre-scale bias is a post-scale bias scaled once (its gradient follows).
        bias = bias * scale
    return bias.to(q.dtype), None


def _mask_inputs(mask_type: str, attention_mask: MaskArg, cu_seqlens_q, cu_seqlens_kv, q_dims=None, kv_dims=None):
    """(attn_mask, cu_seqlens_q, cu_seqlens_kv) for the operator.

    Padding masks: cu_seqlens win when given; otherwise ``attention_mask`` (one
    ``[b,1,1,s_q]`` tensor for self-attention, or a ``(mask_q, mask_kv)`` pair)
    is turned into cu_seqlens on the device. "arbitrary": ``attention_mask`` is
    the bool mask itself (True = masked out), broadcastable to [b, h, s_q, s_kv].
    For other masks ``attention_mask`` is ignored, as in TransformerEngine.
    ``q_dims`` / ``kv_dims``: (batch, sequence) of query_layer / key_layer (None for thd).
    """
    if attention_mask is None:
        return None, cu_seqlens_q, cu_seqlens_kv
    if mask_type == "arbitrary":
        if isinstance(attention_mask, (tuple, list)):
            raise ValueError("attn_mask_type='arbitrary' takes one attention_mask tensor, not a tuple")
        mask = attention_mask
        if mask.dim() < 4:
            mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        return mask, cu_seqlens_q, cu_seqlens_kv
    if "padding" in mask_type:
        if isinstance(attention_mask, (tuple, list)):
            if len(attention_mask) != 2:
                raise ValueError("attention_mask as a tuple must be (mask_q, mask_kv)")
            mask_q, mask_kv = attention_mask
        else:
            mask_q = mask_kv = attention_mask
        # A padding mask's last dim is the sequence it pads: one mask for both
        # sides only fits self-attention (TransformerEngine takes a pair for
        # cross-attention); a mismatch would silently drop or invent keys.
        for name, layer, m, dims in (("query", "query_layer", mask_q, q_dims),
                                     ("key/value", "key_layer", mask_kv, kv_dims)):
            if dims is None:
                continue
            if m.shape[-1] != dims[1]:
                raise ValueError(
                    f"attention_mask for the {name} side has {m.shape[-1]} positions but the {name} sequence has "
                    f"{dims[1]}; for cross-attention pass attention_mask=(mask_q, mask_kv)")
            if m.dim() < 2 or m.shape[0] != dims[0]:
                raise ValueError(
                    f"attention_mask for the {name} side has batch {m.shape[0] if m.dim() > 1 else 1} but "
                    f"{layer} has batch {dims[0]}; a padding mask is [b, 1, 1, s]")
        if cu_seqlens_q is None:
            cu_seqlens_q = cu_seqlens_from_padding_mask(mask_q)
        if cu_seqlens_kv is None:
            cu_seqlens_kv = cu_seqlens_from_padding_mask(mask_kv)
    return None, cu_seqlens_q, cu_seqlens_kv


def _batch_seq_dims(t: torch.Tensor, fmt: str):
    """(batch, sequence) dims of a bshd/sbhd tensor (None for thd, whose sequences come from cu_seqlens)."""
    if fmt == "thd":
        return None
    return (t.shape[1], t.shape[0]) if fmt == "sbhd" else (t.shape[0], t.shape[1])


def _dense(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The operator reads 1-D arguments as dense arrays and rejects strided views; a caller's view
    is copied (a no-op for the usual contiguous tensor)."""
    return None if t is None else t.contiguous()


def _kv_cache_mask_type(mask_type: str) -> str:
    """The mask of an attention call over a KV cache: always per-sequence lengths
    (padding), and causal aligned to the bottom right, where the new tokens are.
    TransformerEngine asserts a padding mask and turns padding_causal into
    padding_causal_bottom_right; the unambiguous others map the same way."""
    if mask_type in ("no_mask", "padding"):
        return "padding"
    if mask_type in CAUSAL_MASK_TYPES:
        return "padding_causal_bottom_right"
    raise ValueError(f"attn_mask_type {mask_type!r} is not supported with inference_params (KV cache); use "
                     f"'padding_causal' (decoding) or 'padding'")


def _check_kv_cache_call(bias_type: str, dropout_p: float) -> None:
    """What attention over a KV cache does not take (the operator says the same; said here, it
    comes before the cache append writes anything)."""
    if bias_type in ("pre_scale_bias", "post_scale_bias"):
        raise NotImplementedError(
            f"core_attention_bias_type={bias_type!r} is not supported with inference_params (KV cache); "
            f"ALiBi is")
    if dropout_p > 0:
        raise NotImplementedError(
            f"attention dropout ({dropout_p}) is not supported with inference_params (KV cache): the cache is for "
            f"inference (call module.eval())")



# ---------------------------------------------------------------------------
# One call, shared by the module and the functional form.


def _run_attention(q, k, v, args: FwdArgs, tensors: Dict[str, Optional[torch.Tensor]],
                   checkpoint: bool):
    if not checkpoint:
        return _ops.attention(q, k, v, args, **tensors)
    # The operator keeps only q, k, v, out and lse for backward; recomputing
    # drops out and lse until backward. Non-reentrant checkpoint replays the
    # RNG state, so a recomputed dropout draws the same seed.
    names = tuple(tensors)

    def run(q, k, v, *values):
        return _ops.attention(q, k, v, args, **dict(zip(names, values)))

    return torch.utils.checkpoint.checkpoint(
        run, q, k, v, *tensors.values(), use_reentrant=False, preserve_rng_state=True)


def _attention_forward(
    query_layer, key_layer, value_layer, *,
    qkv_format: str,
    attn_mask_type: str,
    attention_mask: MaskArg = None,
    window_size: Optional[Tuple[int, int]] = None,
    bottom_right_diagonal: Optional[bool] = None,
    softmax_scale: Optional[float] = None,
    dropout_p: float = 0.0,
    softmax_type: str = "vanilla",
    softmax_offset: Optional[torch.Tensor] = None,
    cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    core_attention_bias_type: str = "no_bias",
    core_attention_bias: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_max_logit: bool = False,
    softcap: float = 0.0,
    checkpoint_core_attention: bool = False,
    kv_format: Optional[str] = None,
    page_table: Optional[torch.Tensor] = None,
    new_kv: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
):
    """Unpacked q/k/v in; output with heads merged (``[..., h_q * d_v]``) out.

    ``kv_format`` defaults to ``qkv_format``; with ``page_table`` k/v are KV-cache
    page pools (kv_format 'bshd') and ``cu_seqlens_kv`` the cache lengths. ``new_kv``
    ``(new_k, new_v, cache_seqlens)``: a KV-cache step (``fwd_kvcache``), which appends
    new_k / new_v to the pools k / v first; the key lengths follow from cache_seqlens."""
    mask_type = canonical_mask_type(_checks.string("attn_mask_type", attn_mask_type))
    dropout_p = _checks.dropout("dropout_p", dropout_p)
    if softmax_scale is not None:
        scale = _checks.real("softmax_scale", softmax_scale)
    else:
        scale = _default_scale(query_layer.shape[-1])
    args = _build_fwd_args(
        q_format=qkv_format, kv_format=qkv_format if kv_format is None else kv_format, mask_type=mask_type,
        window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
        softmax_type=softmax_type, scale=scale, dropout_p=dropout_p,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        return_max_logit=return_max_logit, softcap=softcap,
    )
    kv_fmt = qkv_format if kv_format is None else kv_format
    attn_mask, cu_seqlens_q, cu_seqlens_kv = _mask_inputs(
        mask_type, attention_mask, cu_seqlens_q, cu_seqlens_kv, q_dims=_batch_seq_dims(query_layer, qkv_format),
        kv_dims=None if page_table is not None else _batch_seq_dims(key_layer, kv_fmt))
    bias, slopes = _bias_inputs(core_attention_bias_type, core_attention_bias, alibi_slopes,
                                query_layer, scale)
    if softmax_offset is not None:
        # A module cast to bf16 casts the offset too; the operator wants fp32.
        softmax_offset = softmax_offset.to(torch.float32)
    tensors = dict(
        bias=bias, softmax_offset=_dense(softmax_offset), attn_mask=attn_mask, alibi_slopes=slopes,
        cu_seqlens_q=_dense(cu_seqlens_q), cu_seqlens_kv=_dense(cu_seqlens_kv),
        cu_seqlens_q_padded=_dense(cu_seqlens_q_padded), cu_seqlens_kv_padded=_dense(cu_seqlens_kv_padded),
    )
    if new_kv is not None:
        out, _lse, max_logit = _ops.kv_step(
            query_layer, *new_kv[:2], key_layer, value_layer, new_kv[2], args, page_table=page_table,
            cu_seqlens_q=tensors["cu_seqlens_q"], alibi_slopes=slopes, softmax_offset=tensors["softmax_offset"])
    else:
        if page_table is not None:
            tensors["page_table"] = page_table
        out, max_logit = _run_attention(query_layer, key_layer, value_layer, args, tensors,
                                        checkpoint_core_attention)
    out = out.flatten(-2)  # [..., h, d_v] -> [..., h * d_v]: a view of the contiguous output
    if return_max_logit:
        return out, max_logit.to(out.dtype)
    return out


# ---------------------------------------------------------------------------
# The module.


class DotProductAttention(torch.nn.Module):
    r"""Scaled dot-product attention, TransformerEngine-compatible.

    Same constructor and ``forward`` arguments as
    ``transformer_engine.pytorch.DotProductAttention``; see docs/api.md for the
    supported values and the choices made where TransformerEngine is ambiguous.
    Tensor-, sequence- and context-parallel settings are accepted only at their
    single-device defaults (anything else raises NotImplementedError).
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: Union[int, Tuple[int, int]],
        num_gqa_groups: Optional[int] = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        bottom_right_diagonal: Optional[bool] = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Optional[Callable] = None,
        tp_group: Optional[Any] = None,
        layer_number: Optional[int] = None,
        attention_type: str = "self",
        cp_group: Optional[Any] = None,
        cp_global_ranks: Optional[List[int]] = None,
        cp_stream: Optional[Any] = None,
        cp_comm_type: str = "p2p",
        softmax_scale: Optional[float] = None,
        softmax_type: str = "vanilla",
        return_max_logit: Optional[bool] = False,
        name: Optional[str] = None,
        softcap: float = 0.0,
    ) -> None:
        super().__init__()
        if tp_size != 1 or tp_group is not None:
            raise NotImplementedError(
                f"fusedattn.DotProductAttention does not support tensor parallelism yet "
                f"(tp_size={tp_size}, tp_group={tp_group!r}); shard heads outside the module")
        if sequence_parallel:
            raise NotImplementedError(
                "fusedattn.DotProductAttention does not support sequence_parallel=True yet")
        attention_dropout = _checks.dropout("attention_dropout", attention_dropout)
        if attention_dropout > 0 and get_rng_state_tracker is not None:
            raise NotImplementedError(
                "fusedattn.DotProductAttention does not support attention dropout under an RNG "
                "states tracker (get_rng_state_tracker) yet: its dropout seed comes from torch's "
                "default generator on q's device")
        if attention_type not in ATTN_TYPES:
            raise ValueError(f"attention_type must be one of {ATTN_TYPES}, got {attention_type!r}")
        if cp_comm_type not in CP_COMM_TYPES:
            raise ValueError(f"cp_comm_type must be one of {CP_COMM_TYPES}, got {cp_comm_type!r}")
        self._check_no_context_parallel(cp_group, cp_global_ranks, cp_stream)

        self.num_attention_heads = _checks.positive_int("num_attention_heads", num_attention_heads)
        self.num_gqa_groups = (num_attention_heads if num_gqa_groups is None
                               else _checks.positive_int("num_gqa_groups", num_gqa_groups))
        if num_attention_heads % self.num_gqa_groups != 0:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_gqa_groups "
                f"({self.num_gqa_groups})")
        self.tp_size = 1
        self.tp_group = None
        self.sequence_parallel = False
        self.num_gqa_groups_per_partition = self.num_gqa_groups
        if isinstance(kv_channels, int):
            d_qk = d_v = kv_channels
        elif isinstance(kv_channels, (tuple, list)) and len(kv_channels) == 2:
            d_qk, d_v = kv_channels
        else:
            raise ValueError(f"kv_channels must be an int or a pair (d_qk, d_v), got {kv_channels!r}")
        self.hidden_size_per_attention_head_k = _checks.positive_int("kv_channels", d_qk)
        self.hidden_size_per_attention_head_v = _checks.positive_int("kv_channels", d_v)
        self.softmax_scale = (1.0 / math.sqrt(d_qk) if softmax_scale is None
                              else float(_checks.real("softmax_scale", softmax_scale)))

        self.qkv_format = _checks.string("qkv_format", qkv_format)
        self.attn_mask_type = canonical_mask_type(_checks.string("attn_mask_type", attn_mask_type))
        # Kept as given (None = the mask type's default, resolved per call): a
        # forward that overrides the mask type then gets that mask's default window.
        self.window_size = _checks.window_size(window_size)
        self.bottom_right_diagonal = bottom_right_diagonal
        self.attention_dropout = attention_dropout
        self.attention_type = attention_type
        self.layer_number = 1 if layer_number is None else layer_number
        self.get_rng_state_tracker = get_rng_state_tracker
        self.cp_group = None
        self.cp_global_ranks = None
        self.cp_stream = None
        self.cp_comm_type = cp_comm_type
        self.return_max_logit = bool(return_max_logit)
        self.name = name
        # Logit softcapping (Gemma 2; not a TransformerEngine argument): softcap * tanh(s / softcap).
        self.softcap = _checks.softcap("softcap", softcap)

        self.softmax_type = _checks.string("softmax_type", softmax_type)
        if softmax_type == "learnable":
            # alpha_h of exp(S) / (exp(alpha_h) + sum exp(S)), zero-initialised like TE.
            self.softmax_offset = Parameter(torch.zeros(num_attention_heads, dtype=torch.float32))
        else:
            # off-by-one is the operator's own softmax type: no tensor needed.
            self.softmax_offset = None

    @staticmethod
    def _check_no_context_parallel(cp_group, cp_global_ranks, cp_stream) -> None:
        if cp_group is not None or cp_global_ranks is not None or cp_stream is not None:
            raise NotImplementedError(
                "fusedattn.DotProductAttention does not support context parallelism yet "
                "(cp_group, cp_global_ranks and cp_stream must be None)")

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream,
                                   cp_comm_type: str = "p2p") -> None:
        """TransformerEngine API; only the no-context-parallelism call is supported."""
        self._check_no_context_parallel(cp_group, cp_global_ranks, cp_stream)
        if cp_comm_type not in CP_COMM_TYPES:
            raise ValueError(f"cp_comm_type must be one of {CP_COMM_TYPES}, got {cp_comm_type!r}")
        self.cp_comm_type = cp_comm_type

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # TransformerEngine checkpoints carry FP8 metadata under `_extra_state`
        # keys (also `fused_attention._extra_state` from TE 1.6/1.7); fusedattn
        # has no FP8 state, so they are dropped rather than reported unexpected.
        for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("_extra_state")]:
            state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return (f"num_attention_heads={self.num_attention_heads}, "
                f"num_gqa_groups={self.num_gqa_groups}, "
                f"kv_channels=({self.hidden_size_per_attention_head_k}, "
                f"{self.hidden_size_per_attention_head_v}), qkv_format={self.qkv_format!r}, "
                f"attn_mask_type={self.attn_mask_type!r}, softmax_type={self.softmax_type!r}, "
                f"attention_dropout={self.attention_dropout}")

    @eager_fallback_gate(when=needs_eager)
    def forward(
        self,
        query_layer: Optional[torch.Tensor] = None,
        key_layer: Optional[torch.Tensor] = None,
        value_layer: Optional[torch.Tensor] = None,
        attention_mask: MaskArg = None,
        qkv_format: Optional[str] = None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        cu_seqlens_kv: Optional[torch.Tensor] = None,
        cu_seqlens_q_padded: Optional[torch.Tensor] = None,
        cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
        bottom_right_diagonal: Optional[bool] = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[torch.Tensor] = None,
        alibi_slopes: Optional[torch.Tensor] = None,
        fast_zero_fill: bool = True,
        inference_params: Optional[Any] = None,
        pad_between_seqs: Optional[bool] = None,
        fp8_output: Optional[bool] = False,
        bf16_backward: Optional[bool] = False,
        num_splits: Optional[int] = 1,
        score_mod: Optional[Callable] = None,
        score_mod_bprop: Optional[Callable] = None,
        score_mod_tensors: Optional[Dict[str, torch.Tensor]] = None,
        score_mod_bprop_tensors: Optional[Dict[str, torch.Tensor]] = None,
        qkv_layer: Optional[torch.Tensor] = None,
        kv_layer: Optional[torch.Tensor] = None,
        qkv_interleave_dim: int = -3,
    ):
        """Attention over q/k/v in ``qkv_format``; returns ``[s, b, h*d_v]``,
        ``[b, s, h*d_v]`` or ``[t, h*d_v]`` (and ``max_logit [h]`` in the output's
        dtype when ``return_max_logit``). Arguments as in TransformerEngine;
        ``fast_zero_fill``, ``pad_between_seqs``, ``bf16_backward`` and
        ``num_splits`` are accepted and have no effect (padded positions are
        always zero, gaps between sequences follow from cu_seqlens_*_padded)."""
        del fast_zero_fill, pad_between_seqs, bf16_backward, num_splits
        if fp8_output:
            raise NotImplementedError("fusedattn.DotProductAttention does not support FP8 (fp8_output=True)")
        if (score_mod is not None or score_mod_bprop is not None or score_mod_tensors is not None
                or score_mod_bprop_tensors is not None):
            raise NotImplementedError("fusedattn.DotProductAttention does not support score_mod")

        qkv_format = self.qkv_format if qkv_format is None else qkv_format
        query_layer, key_layer, value_layer = _unpack_packed_qkv(
            qkv_layer, kv_layer, query_layer, key_layer, value_layer, qkv_format,
            qkv_interleave_dim)
        self._check_head_dims(query_layer, key_layer, value_layer)

        if inference_params is not None:
            return self._forward_with_kv_cache(
                query_layer, key_layer, value_layer, inference_params, qkv_format=qkv_format,
                attn_mask_type=self.attn_mask_type if attn_mask_type is None else attn_mask_type,
                window_size=self.window_size if window_size is None else window_size,
                core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
                alibi_slopes=alibi_slopes)

        return _attention_forward(
            query_layer, key_layer, value_layer,
            qkv_format=qkv_format,
            attn_mask_type=self.attn_mask_type if attn_mask_type is None else attn_mask_type,
            attention_mask=attention_mask,
            window_size=self.window_size if window_size is None else window_size,
            bottom_right_diagonal=(self.bottom_right_diagonal if bottom_right_diagonal is None
                                   else bottom_right_diagonal),
            softmax_scale=self.softmax_scale,
            dropout_p=self.attention_dropout if self.training else 0.0,
            softmax_type=self.softmax_type,
            softmax_offset=self.softmax_offset,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            return_max_logit=self.return_max_logit,
            softcap=self.softcap,
            checkpoint_core_attention=checkpoint_core_attention,
        )

    def _forward_with_kv_cache(self, query_layer, key_layer, value_layer, inference_params, *, qkv_format,
                               attn_mask_type, window_size, core_attention_bias_type, core_attention_bias,
                               alibi_slopes):
        """Prefill or decode against the KV cache (TransformerEngine's inference path).

        ``inference_params.step`` appends this layer's new keys/values to its cache
        (in place, inside the graph); attention then reads q against the whole
        cache through the page table, with the step's cu_seqlens (the caller's
        cu_seqlens and attention_mask are superseded, as in TransformerEngine).
        Causal masks become bottom-right aligned (the new tokens are the last of
        each sequence): padding_causal -> padding_causal_bottom_right.

        What the cache cannot take is rejected before the append writes anything; if
        the step fails anyway (eagerly), ``inference_params.abort_step()`` undoes its
        ``pre_step``, so that calling ``pre_step`` again retries the step."""
        if not (hasattr(inference_params, "step") and hasattr(inference_params, "get_page_table")):
            raise TypeError(f"inference_params must be a fusedattn.inference.InferenceParams, got "
                            f"{type(inference_params).__name__}")
        step = (query_layer, key_layer, value_layer, inference_params, qkv_format, attn_mask_type, window_size,
                core_attention_bias_type, core_attention_bias, alibi_slopes)
        if torch.compiler.is_compiling():
            return self._kv_cache_step(*step)
        try:
            return self._kv_cache_step(*step)
        except BaseException:
            abort = getattr(inference_params, "abort_step", None)
            if abort is not None:
                abort()
            raise

    def _kv_cache_step(self, query_layer, key_layer, value_layer, inference_params, qkv_format, attn_mask_type,
                       window_size, core_attention_bias_type, core_attention_bias, alibi_slopes):
        mask_type = _kv_cache_mask_type(canonical_mask_type(_checks.string("attn_mask_type", attn_mask_type)))
        dropout_p = self.attention_dropout if self.training else 0.0
        _check_kv_cache_call(core_attention_bias_type, dropout_p)
        _checks.window_size(window_size)
        check_query = getattr(inference_params, "check_query", None)
        if check_query is not None:
            check_query(query_layer, qkv_format)
        # fwd_kvcache appends and attends in one operator; a cache manager of the caller's own appends
        # in its step(), then attention reads the cache.
        # `is not None`, not the bound method's truth value, which Dynamo before torch 2.13 cannot branch on.
        kv_step = getattr(inference_params, "kv_step", None)
        fused = None
        if kv_step is not None:
            fused = kv_step(self.layer_number, query_layer, key_layer, value_layer, qkv_format)
        if fused is not None:
            k_cache, v_cache, page_table, cu_q, cu_kv = (fused.k_cache, fused.v_cache, fused.page_table,
                                                         fused.cu_seqlens_q, None)
            new_kv = (key_layer, value_layer, fused.cache_seqlens)
        else:
            k_cache, v_cache, cu_q, cu_kv, _max_kv, _fmt = inference_params.step(
                self.layer_number, key_layer, value_layer, qkv_format)
            page_table, new_kv = inference_params.get_page_table(), None
        return _attention_forward(
            query_layer, k_cache, v_cache,
            qkv_format=qkv_format, kv_format="bshd", page_table=page_table, new_kv=new_kv,
            attn_mask_type=mask_type,
            window_size=window_size,
            bottom_right_diagonal=True,
            softmax_scale=self.softmax_scale,
            dropout_p=dropout_p,
            softmax_type=self.softmax_type,
            softmax_offset=self.softmax_offset,
            cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
            max_seqlen_q=getattr(inference_params, "max_ctx_len", None) if qkv_format == "thd" else None,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            return_max_logit=self.return_max_logit,
            softcap=self.softcap,
        )

    def _check_head_dims(self, query_layer, key_layer, value_layer) -> None:
        # What the module was built for; the operator checks q/k/v against each other.
        built = (
            (query_layer.shape[-2], self.num_attention_heads, "query_layer has {} heads", "num_attention_heads={}"),
            (query_layer.shape[-1], self.hidden_size_per_attention_head_k, "query_layer has head_dim {}",
             "kv_channels {}"),
            (key_layer.shape[-1], self.hidden_size_per_attention_head_k, "key_layer has head_dim {}", "kv_channels {}"),
            (value_layer.shape[-1], self.hidden_size_per_attention_head_v, "value_layer has head_dim {}",
             "head_dim_v {}"),
            (key_layer.shape[-2], self.num_gqa_groups_per_partition, "key_layer/value_layer have {} heads",
             "num_gqa_groups={}"),
        )
        for got, want, what, setting in built:
            if got != want:
                raise ValueError(f"{what.format(got)}, but the module was built with {setting.format(want)}")
