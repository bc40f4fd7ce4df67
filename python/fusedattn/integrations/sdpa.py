"""fusedattn as a flash-attention provider of ``torch.nn.functional.scaled_dot_product_attention``.

torch (>= 2.10) lets a library replace the kernels behind SDPA's flash backend:
``torch.nn.attention.register_flash_attention_impl(name, register_fn=...)`` records a provider and
``activate_flash_attention_impl(name)`` calls its ``register_fn``, which overrides aten's flash
operators for a dispatch key (FA3 and FA4 plug in that way, on CUDA). ``register()`` records
"fusedattn"; ``activated()`` is a context manager that activates it and restores the previous
state. Nothing is registered or activated on import.

Once active, these aten operators run fusedattn's operator (forward and backward):

* CUDA: ``_scaled_dot_product_flash_attention`` (+ backward), what F.scaled_dot_product_attention
  calls when it picks the flash backend (fp16/bf16, no attn_mask), and ``_flash_attention_forward``
  (+ backward, + ``_flash_attention_forward_no_dropout_inplace``), what
  ``torch.nn.attention.varlen.varlen_attn`` calls (varlen, windows, seqused_k, block_table);
* CPU: ``_scaled_dot_product_flash_attention_for_cpu`` (+ backward), SDPA's CPU flash backend
  (any float dtype, attn_mask as an additive bias, no dropout).

A call fusedattn does not take (``support_reason`` says why) runs torch's own kernel, fetched
with ``torch.library.get_kernel`` before the override. The forward and the backward of one call
decide from the same arguments, so they always run on the same side. SDPA picks its backend
before any of this: calls it sends to another backend (math, memory-efficient, cuDNN) are
untouched; activation puts the flash backend first in SDPA's priority order (torch prefers cuDNN
on some GPUs) and deactivation restores the order.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Dict, List, Optional

import torch

from .. import _ops
from ..attention import _build_fwd_args
from ..flash_attn_interface import flash_args

__all__ = ["NAME", "activated", "register", "support_reason"]

NAME = "fusedattn"

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def support_reason(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float,
                   head_dim: int = -1, cpu_op: bool = False) -> Optional[str]:
    """Why fusedattn does not take a flash call (torch's kernel runs it then), or None.

    ``head_dim`` is the heads dim of the tensors (-3 for SDPA's [b, h, s, d], -2 for flash's
    [b, s, h, d] / [t, h, d]). The arguments are ones the forward and the backward both see."""
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype}"
    d_qk, d_v = query.shape[-1], value.shape[-1]
    if d_qk % 8 or d_v % 8 or max(d_qk, d_v) > 256:
        return f"head dims {d_qk}/{d_v} (fusedattn: multiples of 8 up to 256)"
    if query.shape[head_dim] % key.shape[head_dim]:
        return f"{query.shape[head_dim]} query heads for {key.shape[head_dim]} key heads"
    if cpu_op and dropout_p > 0:
        return "dropout in the CPU flash operator (its backward receives no RNG state)"
    return None


# ---------------------------------------------------------------------------
# Tensors in torch's flash layouts <-> the operator's


def _like(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` with the strides of ``torch.empty_like(like)``, what torch's meta functions
    declare for these outputs (compiled graphs check them): itself when they agree, else a copy."""
    target = torch.empty_like(like)
    if target.stride() == result.stride():
        return result
    return target.copy_(result)


def _rng(dropout_p: float, device) -> torch.Tensor:
    """The operator's (seed, offset): drawn with dropout; zeros (unused) without."""
    if dropout_p > 0:
        return _ops.draw_rng_state(device)
    return torch.zeros(2, dtype=torch.int64, device=device)


def _sdpa_inputs(attn_mask, is_causal: bool, s_kv: int, dtype):
    """(mask_type, bias, boolean mask) for SDPA's is_causal / attn_mask (top-left causal, as SDPA)."""
    bias = mask = None
    mask_type = "causal" if is_causal else "no_mask"
    if attn_mask is not None:
        m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        if m.dtype == torch.bool:  # (SDPA itself never pairs one with is_causal; the operator rejects it)
            mask = ~m  # SDPA: True takes part; the operator: True is masked out
            mask_type = "causal" if is_causal else "arbitrary"
        else:
            bias = m.to(dtype)
            if bias.shape[-1] == 1:
                bias = bias.expand(*bias.shape[:-1], s_kv)
    return mask_type, bias, mask


def _sdpa_call(query, key, value, dropout_p, is_causal, attn_mask, scale):
    """FwdArgs and optional inputs of an SDPA-layout ([b, h, s, d]) call."""
    mask_type, bias, mask = _sdpa_inputs(attn_mask, is_causal, key.shape[-2], query.dtype)
    scale = scale if scale is not None else query.shape[-1] ** (-0.5)
    args = _build_fwd_args(q_format="bshd", kv_format="bshd", mask_type=mask_type, window_size=None,
                           bottom_right_diagonal=None, softmax_type="vanilla", scale=float(scale),
                           dropout_p=float(dropout_p), max_seqlen_q=None, max_seqlen_kv=None, return_max_logit=False)
    optionals = (bias, None, mask, None, None, None, None, None)
    return args, optionals


def _sdpa_forward(query, key, value, dropout_p, is_causal, attn_mask, scale):
    """(out [b, h, s_q, d_v] in query's strides, lse fp32 [b, h, s_q], rng_state int64 [2])."""
    args, optionals = _sdpa_call(query, key, value, dropout_p, is_causal, attn_mask, scale)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse, rng, _ = _ops._fwd_op(args, None, _rng(dropout_p, query.device), q, k, v, optionals)
    return _like(out.transpose(1, 2), query), lse, rng


def _sdpa_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale, rng):
    """dq, dk, dv as [b, h, s, d] views of the operator's contiguous bshd gradients."""
    args, optionals = _sdpa_call(query, key, value, dropout_p, is_causal, attn_mask, scale)
    q, k, v, o, do = (t.transpose(1, 2) for t in (query, key, value, out, grad_out))
    lse = logsumexp.to(torch.float32).contiguous()
    dq, dk, dv, _, _ = _ops._bwd_op(args, do, q, k, v, o, lse, rng, optionals, False)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


# ---------------------------------------------------------------------------
# The overrides (registered with with_keyset=True: the keyset goes to torch's kernel on fallback)

_ORIGINAL: Dict[str, "torch._C._SafeKernelFunction"] = {}


def _fallback(op: str, keyset, *args, **kwargs):
    return _ORIGINAL[op].call_boxed(keyset, *args, **kwargs)


def _sdpa_flash_cpu(keyset, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if support_reason(query, key, value, dropout_p, -3, cpu_op=True) is not None:
        return _fallback("_scaled_dot_product_flash_attention_for_cpu", keyset, query, key, value, dropout_p,
                         is_causal, attn_mask=attn_mask, scale=scale)
    out, lse, _ = _sdpa_forward(query, key, value, dropout_p, is_causal, attn_mask, scale)
    b, h, s_q = lse.shape
    acc = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    # torch's CPU kernel returns logsumexp as a [b, h, s_q] view of [b, s_q, h] memory, in the accumulation dtype.
    lse_torch = torch.empty((b, s_q, h), dtype=acc, device=query.device).transpose(1, 2)
    return out, lse_torch.copy_(lse)


def _sdpa_flash_cpu_backward(keyset, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                             attn_mask=None, scale=None):
    if support_reason(query, key, value, dropout_p, -3, cpu_op=True) is not None:
        return _fallback("_scaled_dot_product_flash_attention_for_cpu_backward", keyset, grad_out, query, key, value,
                         out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    rng = torch.zeros(2, dtype=torch.int64, device=query.device)
    return _sdpa_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale, rng)


def _no_debug_mask(return_debug_mask: bool) -> None:
    if return_debug_mask:
        raise NotImplementedError(
            "return_debug_mask=True: the fusedattn flash-attention provider does not materialise the attention "
            "probabilities (restore torch's implementation with torch.nn.attention.restore_flash_attention_impl())")


def _sdpa_flash_cuda(keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                     scale=None):
    if support_reason(query, key, value, dropout_p, -3) is not None:
        return _fallback("_scaled_dot_product_flash_attention", keyset, query, key, value, dropout_p, is_causal,
                         return_debug_mask, scale=scale)
    _no_debug_mask(return_debug_mask)
    out, lse, rng = _sdpa_forward(query, key, value, dropout_p, is_causal, None, scale)
    seed, offset = rng.view(torch.uint64), torch.empty((), dtype=torch.uint64, device=query.device)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, query.shape[2], key.shape[2], seed, offset, debug


def _sdpa_flash_cuda_backward(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                              max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    if support_reason(query, key, value, dropout_p, -3) is not None:
        return _fallback("_scaled_dot_product_flash_attention_backward", keyset, grad_out, query, key, value, out,
                         logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                         philox_offset, scale=scale)
    grads = _sdpa_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, None, scale,
                           philox_seed.view(torch.int64))
    return tuple(_like(g, t) for g, t in zip(grads, (query, key, value)))


def _flash_call(query, key, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale, window_size_left,
                window_size_right, seqused_k=None, block_table=None):
    """FwdArgs, optional inputs and page table of an aten flash call (flash-attn's conventions)."""
    varlen = cum_seq_q is not None
    cu_k, key_offsets = cum_seq_k, None
    if seqused_k is not None:  # only the first seqused_k[i] keys of sequence i take part
        cu_k = torch.nn.functional.pad(seqused_k.cumsum(0), (1, 0)).to(torch.int32)
        key_offsets = cum_seq_k if block_table is None else None
    fmt = "thd" if varlen else "bshd"
    window = (-1 if window_size_left is None else window_size_left, -1 if window_size_right is None else window_size_right)
    args = flash_args(q_format=fmt, kv_format="bshd" if block_table is not None else fmt, causal=is_causal,
                      window_size=window, lengths=varlen or seqused_k is not None,
                      scale=scale if scale is not None else query.shape[-1] ** (-0.5), dropout_p=dropout_p,
                      max_seqlen_q=max_q if varlen else None, max_seqlen_k=max_k if varlen else None)
    cu_q = cum_seq_q
    if cu_q is None and seqused_k is not None:  # dense q with per-sequence key counts: every query row counts
        b, s_q = query.shape[0], query.shape[1]
        cu_q = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32, device=query.device)
    optionals = (None, None, None, None, cu_q, cu_k, None, key_offsets)
    return args, optionals


def _flash_forward_impl(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale,
                        window_size_left, window_size_right, seqused_k, alibi_slopes, block_table):
    args, optionals = _flash_call(query, key, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale,
                                  window_size_left, window_size_right, seqused_k, block_table)
    if alibi_slopes is not None:
        optionals = optionals[:3] + (alibi_slopes.to(torch.float32),) + optionals[4:]
    out, lse, rng, _ = _ops._fwd_op(args, block_table, _rng(dropout_p, query.device), query, key, value, optionals)
    return out, lse, rng


def _flash_forward(keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                   return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None, seqused_k=None,
                   alibi_slopes=None, block_table=None, num_splits=None):
    if support_reason(query, key, value, dropout_p, -2) is not None:
        return _fallback("_flash_attention_forward", keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                         dropout_p, is_causal, return_debug_mask, scale=scale, window_size_left=window_size_left,
                         window_size_right=window_size_right, seqused_k=seqused_k, alibi_slopes=alibi_slopes,
                         block_table=block_table, num_splits=num_splits)
    _no_debug_mask(return_debug_mask)
    out, lse, rng = _flash_forward_impl(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                        scale, window_size_left, window_size_right, seqused_k, alibi_slopes,
                                        block_table)
    return (_like(out, query), lse, rng.view(torch.uint64), torch.empty((), dtype=torch.uint64, device=query.device),
            torch.empty(0, dtype=query.dtype, device=query.device))


def _flash_forward_inplace(keyset, out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                           return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                           seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    if support_reason(query, key, value, dropout_p, -2) is not None:
        return _fallback("_flash_attention_forward_no_dropout_inplace", keyset, out, query, key, value, cum_seq_q,
                         cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale=scale,
                         window_size_left=window_size_left, window_size_right=window_size_right, seqused_k=seqused_k,
                         alibi_slopes=alibi_slopes, block_table=block_table, num_splits=num_splits)
    _no_debug_mask(return_debug_mask)
    result, lse, _ = _flash_forward_impl(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                         scale, window_size_left, window_size_right, seqused_k, alibi_slopes,
                                         block_table)
    out.copy_(result)
    return lse


def _flash_backward(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                    dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                    window_size_right=None):
    if support_reason(query, key, value, dropout_p, -2) is not None:
        return _fallback("_flash_attention_backward", keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q,
                         cum_seq_k, max_q, max_k, dropout_p, is_causal, rng_state, unused, scale=scale,
                         window_size_left=window_size_left, window_size_right=window_size_right)
    # As torch's own kernel, the backward does not see alibi_slopes, seqused_k or block_table.
    args, optionals = _flash_call(query, key, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale,
                                  window_size_left, window_size_right)
    dq, dk, dv, _, _ = _ops._bwd_op(args, grad_out, query, key, value, out, logsumexp.contiguous(),
                                    rng_state.view(torch.int64), optionals, False)
    return tuple(_like(g, t) for g, t in zip((dq, dk, dv), (query, key, value)))


# op name -> (dispatch key, implementation)
_OVERRIDES = {
    "_scaled_dot_product_flash_attention_for_cpu": ("CPU", _sdpa_flash_cpu),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ("CPU", _sdpa_flash_cpu_backward),
    "_scaled_dot_product_flash_attention": ("CUDA", _sdpa_flash_cuda),
    "_scaled_dot_product_flash_attention_backward": ("CUDA", _sdpa_flash_cuda_backward),
    "_flash_attention_forward": ("CUDA", _flash_forward),
    "_flash_attention_forward_no_dropout_inplace": ("CUDA", _flash_forward_inplace),
    "_flash_attention_backward": ("CUDA", _flash_backward),
}


def overridden_ops() -> List[str]:
    """The aten operators this torch build has kernels for and activation overrides."""
    return [op for op, (key, _) in _OVERRIDES.items()
            if hasattr(torch.ops.aten, op) and torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key)]


class _Handle:
    """What torch's registry keeps while fusedattn is active; ``remove()`` restores torch's kernels and
    SDPA's backend priority."""

    def __init__(self, library: torch.library.Library, priority: Optional[List[int]]):
        self.library = library
        self.priority = priority

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None
        if self.priority is not None:
            torch._C._set_sdp_priority_order(self.priority)
            self.priority = None


def _flash_first() -> Optional[List[int]]:
    """Put SDPA's flash backend first in its priority order (torch prefers cuDNN on some GPUs, e.g.
    sm_90, so an active provider would otherwise never be called there); returns the previous order,
    None where this torch has no priority order."""
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    if get is None or not hasattr(torch._C, "_set_sdp_priority_order"):
        return None
    if torch.cuda.is_available():
        # torch may settle its CUDA order (cuDNN first on sm_90) at a process's first CUDA SDPA call,
        # which would undo a reorder made before it: one backend choice on a tiny tensor makes that
        # call happen first.
        t = torch.zeros(1, 1, 1, 8, device="cuda", dtype=torch.float16)
        torch._fused_sdp_choice(t, t, t)
    previous = [int(b) for b in get()]
    flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    torch._C._set_sdp_priority_order([flash] + [b for b in previous if b != flash])
    return previous


def _install() -> _Handle:
    """torch's register_fn contract: override the kernels, return a handle that undoes it."""
    ops = overridden_ops()
    for op in ops:  # torch's kernels, fetched before they are overridden
        _ORIGINAL[op] = torch.library.get_kernel(f"aten::{op}", _OVERRIDES[op][0])
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # overriding torch's kernels is the point; torch warns about it once
        warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
        for op in ops:
            key, fn = _OVERRIDES[op]
            lib.impl(op, fn, key, with_keyset=True)
    return _Handle(lib, _flash_first())


def _registry():
    try:
        from torch.nn.attention import _registry
    except ImportError:
        _registry = None
    if _registry is None or not hasattr(_registry, "register_flash_attention_impl"):
        raise NotImplementedError(
            f"torch {torch.__version__} has no flash-attention provider registry "
            "(torch.nn.attention.register_flash_attention_impl, torch >= 2.10)")
    return _registry


def register() -> str:
    """Record "fusedattn" as a flash-attention provider in torch's registry (nothing is overridden
    until ``torch.nn.attention.activate_flash_attention_impl("fusedattn")`` or ``activated()``);
    returns the name."""
    _registry().register_flash_attention_impl(NAME, register_fn=_install)
    return NAME


@contextlib.contextmanager
def activated():
    """Run the block with fusedattn behind SDPA's flash backend; the provider active before (torch's
    own, or another one) is active again afterwards."""
    reg = _registry()
    register()
    previous = reg.current_flash_attention_impl()
    reg.activate_flash_attention_impl(NAME)
    try:
        yield
    finally:
        reg.restore_flash_attention_impl(_raise_warn=False)
        if previous is not None:
            reg.activate_flash_attention_impl(previous)
