"""The operators' Python side: args objects, fake implementations and autograd.

The operator library registers ``torch.ops.fusedattn.fwd``, ``torch.ops.fusedattn.bwd``,
``torch.ops.fusedattn.copy_to_kv_cache`` and ``torch.ops.fusedattn.fwd_kvcache`` (argument lists in
csrc/binding/op_spec.h). Every non-tensor setting of a call lives in one frozen ``FwdArgs``; the op
call, its fake implementation and its backward are all built from that one object, so they cannot
disagree about a call.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

_LIB_DIR = Path(__file__).resolve().parent
# The operator library uses torch's stable ABI as of this version (CMakeLists.txt: TORCH_TARGET_VERSION).
_MIN_TORCH = (2, 10)


def _load_library() -> None:
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < _MIN_TORCH:
        raise ImportError(f"fusedattn needs torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]} (its operators use torch's "
                          f"stable ABI of that version); this is torch {torch.__version__}")
    candidates = sorted(_LIB_DIR.glob("_C*.so"))
    if not candidates:
        raise ImportError(
            f"fusedattn's operator library (_C.so) was not found in {_LIB_DIR}; "
            "install a fusedattn wheel, or build one with `pip install --no-build-isolation .`"
        )
    torch.ops.load_library(str(candidates[0]))


_load_library()


# ---------------------------------------------------------------------------
# Errors. An operator's C++ exception reaches Python as RuntimeError; the core's two kinds carry
# their kind as the message's prefix (csrc/binding/bridge.h). The op-call wrappers below raise them
# as ValueError / NotImplementedError with the same message, so every Python entry point does;
# direct torch.ops.fusedattn.* calls (and compiled graphs, which call the operators directly) see
# the RuntimeError.
_ERROR_KINDS = (("fusedattn: invalid argument: ", ValueError),
                ("fusedattn: unsupported configuration: ", NotImplementedError))


def _call(op, *args):
    """op(*args), its error raised with the Python kind its message names."""
    try:
        return op(*args)
    except RuntimeError as e:
        msg = str(e)
        for prefix, kind in _ERROR_KINDS:
            if msg.startswith(prefix):
                raise kind(msg) from None
        raise


def deterministic_mode() -> int:
    """torch.use_deterministic_algorithms as the bwd operator takes it: 0 off, 1 on, 2 on with
    warn_only (the stable ABI cannot read torch's global; torch.compile guards on it)."""
    if not torch.are_deterministic_algorithms_enabled():
        return 0
    return 2 if torch.is_deterministic_algorithms_warn_only_enabled() else 1


@dataclass(frozen=True)
class FwdArgs:
    """Every non-tensor setting of one forward call (see csrc/core/include/fusedattn/attn_args.h).

    ``window_left/right`` use TransformerEngine's convention (-1 = unbounded);
    ``bottom_right_diagonal=None`` takes the mask type's default.
    ``max_seqlen_q/kv`` matter only for thd and may be left None: nothing on the op
    path then reads cu_seqlens on the host. ``softcap`` > 0 caps the scaled scores as
    ``softcap * tanh(s / softcap)`` before bias, ALiBi and masks (0: off).
    """

    scale: float
    q_format: str = "bshd"
    kv_format: str = "bshd"
    mask_type: str = "no_mask"
    window_left: int = -1
    window_right: int = -1
    bottom_right_diagonal: Optional[bool] = None
    softmax_type: str = "vanilla"
    dropout_p: float = 0.0
    softcap: float = 0.0
    max_seqlen_q: Optional[int] = None
    max_seqlen_kv: Optional[int] = None
    return_max_logit: bool = False

    def op_args(self) -> tuple:
        """The op schema's settings in schema order (SETTINGS; tests/test_contract.py checks the order)."""
        brd = -1 if self.bottom_right_diagonal is None else int(bool(self.bottom_right_diagonal))
        return (
            self.q_format,
            self.kv_format,
            self.mask_type,
            int(self.window_left),
            int(self.window_right),
            brd,
            self.softmax_type,
            float(self.scale),
            float(self.softcap),
            float(self.dropout_p),
            -1 if self.max_seqlen_q is None else self.max_seqlen_q,
            -1 if self.max_seqlen_kv is None else self.max_seqlen_kv,
        )

    @classmethod
    def from_op_values(cls, values: dict, return_max_logit=False) -> "FwdArgs":
        """The args of an op call from its settings by name (the inverse of op_args)."""
        brd = values["bottom_right_diagonal"]
        return cls(
            scale=values["scale"],
            q_format=values["q_format"],
            kv_format=values["kv_format"],
            mask_type=values["mask_type"],
            window_left=values["window_left"],
            window_right=values["window_right"],
            bottom_right_diagonal=None if brd < 0 else bool(brd),
            softmax_type=values["softmax_type"],
            dropout_p=values["dropout_p"],
            softcap=values["softcap"],
            max_seqlen_q=None if _is_minus_one(values["max_seqlen_q"]) else values["max_seqlen_q"],
            max_seqlen_kv=None if _is_minus_one(values["max_seqlen_kv"]) else values["max_seqlen_kv"],
            return_max_logit=return_max_logit,
        )

    def replace(self, **changes) -> "FwdArgs":
        return dataclasses.replace(self, **changes)



def _is_minus_one(x) -> bool:
    return isinstance(x, int) and x == -1


# The operators' argument lists, read from the registered schemas (csrc/binding/op_spec.h writes
# them once): positions below are derived, never counted by hand.
def _schema_names(op) -> tuple:
    return tuple(a.name for a in op.default._schema.arguments)


def _settings_of(op) -> tuple:
    """Names of the op's non-tensor arguments, in schema order."""
    tensor = torch._C.OptionalType.ofTensor()
    return tuple(a.name for a in op.default._schema.arguments if not a.type.isSubtypeOf(tensor))


FWD_ARGUMENTS = _schema_names(torch.ops.fusedattn.fwd)
BWD_ARGUMENTS = _schema_names(torch.ops.fusedattn.bwd)
# The settings FwdArgs.op_args() returns: every non-tensor argument but the op's own last flag
# (fwd: return_max_logit, bwd: need_dbias).
SETTINGS = _settings_of(torch.ops.fusedattn.fwd)[:-1]
# Optional tensor inputs of both operators, in schema order after q, k, v.
OPTIONAL_INPUTS = FWD_ARGUMENTS[3:FWD_ARGUMENTS.index("rng_state")]


def draw_rng_state(device: torch.device) -> torch.Tensor:
    """(seed, offset) for the counter-based dropout, drawn by an ordinary torch random op.

    Being a plain torch op, it follows torch.manual_seed, is functionalised by
    torch.compile and is captured by CUDA graphs (philox seed/offset of the graph).
    """
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)


# ---------------------------------------------------------------------------
# Fake implementations: the same shape rules as fwd_output_shapes /
# bwd_output_shapes in csrc/core/src/check.cc, with symbolic sizes kept symbolic.
# A meta tensor among real ones sends the whole call here (the Meta dispatch key
# wins), so the fakes check what the core's same_device checks, with its words:
# otherwise the call would return uninitialised tensors on q's device.


def _check_devices(ref, where, named):
    for name, t in named:
        if t is not None and t.device != ref.device:
            raise ValueError(f"fusedattn: {name} must be on {where} ({ref.device}); got {t.device}")


_FWD_TENSOR_NAMES = ("k", "v", "core_attention_bias", "softmax_offset", "attention_mask", "alibi_slopes",
                     "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "rng_state")


def _out_shapes(q, v, q_format: str):
    d_v = v.shape[-1]
    if q_format == "thd":
        t_q, h_q = q.shape[0], q.shape[1]
        return (t_q, h_q, d_v), (h_q, t_q), h_q
    if q_format == "sbhd":
        s_q, b, h_q = q.shape[0], q.shape[1], q.shape[2]
        return (s_q, b, h_q, d_v), (b, h_q, s_q), h_q
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    return (b, s_q, h_q, d_v), (b, h_q, s_q), h_q


@torch.library.register_fake("fusedattn::fwd")
def _fwd_fake(q, k, v, bias, softmax_offset, attn_mask, alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
              cu_seqlens_q_padded, cu_seqlens_kv_padded, rng_state, q_format, kv_format, mask_type,
              window_left, window_right, bottom_right_diagonal, softmax_type, scale, softcap, dropout_p,
              max_seqlen_q, max_seqlen_kv, return_max_logit, page_table=None):
    _check_devices(q, "the same device as q", zip(_FWD_TENSOR_NAMES + ("page_table",),
                               (k, v, bias, softmax_offset, attn_mask, alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
                                cu_seqlens_q_padded, cu_seqlens_kv_padded, rng_state, page_table)))
    out_shape, lse_shape, h_q = _out_shapes(q, v, q_format)
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape, dtype=torch.float32)
    rng = q.new_empty((2,), dtype=torch.int64)
    max_logit = q.new_empty((h_q,) if return_max_logit else (0,), dtype=torch.float32)
    return out, lse, rng, max_logit


@torch.library.register_fake("fusedattn::bwd")
def _bwd_fake(dout, q, k, v, out, softmax_lse, rng_state, bias, softmax_offset, attn_mask,
              alibi_slopes, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
              q_format, kv_format, mask_type, window_left, window_right, bottom_right_diagonal,
              softmax_type, scale, softcap, dropout_p, max_seqlen_q, max_seqlen_kv, need_dbias, deterministic):
    _check_devices(q, "the same device as q", zip(("dout", "out", "softmax_lse") + _FWD_TENSOR_NAMES,
                               (dout, out, softmax_lse, k, v, bias, softmax_offset, attn_mask, alibi_slopes,
                                cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, rng_state)))
    dq = q.new_empty(q.shape)
    dk = k.new_empty(k.shape)
    dv = v.new_empty(v.shape)
    if need_dbias and bias is not None:
        dbias = bias.new_empty(bias.shape)
    else:
        dbias = q.new_empty((0,))
    h_q = q.shape[1] if q_format == "thd" else q.shape[2]
    d_off = q.new_empty((h_q,) if softmax_type == "learnable" else (0,), dtype=torch.float32)
    return dq, dk, dv, dbias, d_off


# ---------------------------------------------------------------------------
# Autograd. q, k, v and out are saved by reference (save_for_backward keeps the
# very tensors, no copies), together with lse and rng_state.

_FWD_SETTINGS_AT = FWD_ARGUMENTS.index(SETTINGS[0])
_FWD_PAGE_TABLE_AT = FWD_ARGUMENTS.index("page_table")


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[0:3]
    optionals = inputs[3:3 + len(OPTIONAL_INPUTS)]
    values = dict(zip(SETTINGS, inputs[_FWD_SETTINGS_AT:_FWD_SETTINGS_AT + len(SETTINGS)]))
    args = FwdArgs.from_op_values(values, return_max_logit=inputs[_FWD_SETTINGS_AT + len(SETTINGS)])
    out, lse, rng_state_out, max_logit = output
    ctx.mark_non_differentiable(lse, rng_state_out, max_logit)
    ctx.save_for_backward(q, k, v, out, lse, rng_state_out, *optionals)
    ctx.fwd_args = args
    ctx.paged = len(inputs) > _FWD_PAGE_TABLE_AT and inputs[_FWD_PAGE_TABLE_AT] is not None


def _grads(ctx, dout, q, k, v, out, lse, rng_state, optionals, needs_grad):
    """dq, dk, dv, dbias, d_softmax_offset (None where not needed) of one forward call;
    ``needs_grad`` is needs_input_grad over (q, k, v, *OPTIONAL_INPUTS)."""
    if ctx.paged:
        raise NotImplementedError(
            "fusedattn: backward through a KV cache (page_table) is not supported: the cache is for inference")
    bias, softmax_offset = optionals[0], optionals[1]
    args: FwdArgs = ctx.fwd_args
    need_dbias = bias is not None and needs_grad[3]
    # A gradient that reaches here broadcast (stride 0, e.g. from out.sum()) or without a unit head-dim
    # stride would send the CUDA backward to its slow SIMT engine, and eager and compiled runs apart
    # (AOTAutograd hands the backward dense tangents). Other strides (a dout stored [b, h, s, d] seen
    # in bshd) reach the kernels as they are: the engines take any 16-byte row layout.
    if dout.stride(-1) != 1 or 0 in dout.stride():
        dout = dout.contiguous()
    create_graph = torch.is_grad_enabled()
    with torch._C._AutoDispatchBelowAutograd():  # the bwd operator has no autograd: skip its fallback
        dq, dk, dv, dbias, d_off = _bwd_op(args, dout, q, k, v, out, lse, rng_state, optionals, need_dbias)
    d_off = d_off.to(softmax_offset.dtype) if softmax_offset is not None and needs_grad[4] else None
    grads = (dq, dk, dv, (dbias if need_dbias else None), d_off)
    if create_graph:  # the gradients must not pass for constants of q, k, v, dout
        return _NoDoubleBackward.apply(q, k, v, dout, *grads)
    return grads


class _NoDoubleBackward(torch.autograd.Function):
    """The identity on the first backward's gradients; differentiating them raises (the bwd
    operator has no derivative), so double backward never silently sees zeros."""

    @staticmethod
    def forward(ctx, q, k, v, dout, *grads):
        return tuple(g.view_as(g) if g is not None else None for g in grads)

    @staticmethod
    def backward(ctx, *_):
        raise NotImplementedError(
            "fusedattn: double backward (a derivative of attention's gradients, e.g. gradgradcheck or "
            "create_graph=True followed by a second backward through them) is not supported")


def _backward(ctx, dout, _dlse, _drng, _dmax_logit):
    q, k, v, out, lse, rng_state, *optionals = ctx.saved_tensors
    grads = list(_grads(ctx, dout, q, k, v, out, lse, rng_state, optionals, ctx.needs_input_grad))
    grads.extend([None] * (len(ctx.needs_input_grad) - len(grads)))
    return tuple(grads)


torch.library.register_autograd("fusedattn::fwd", _backward, setup_context=_setup_context)


@dataclass(frozen=True)
class Layout:
    """Where the caller keeps the heads: q, k, v given (``heads_first``) and out wanted
    (``out_heads_first``) as [b, h, s, d] while the operator, in bshd, sees their
    transpose(1, 2) views (no copy)."""

    heads_first: bool = False
    out_heads_first: bool = False

    def operator_view(self, q, k, v):
        return (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) if self.heads_first else (q, k, v)

    def user_out(self, out):
        return out.transpose(1, 2) if self.out_heads_first else out

    def operator_out(self, dout):
        return dout.transpose(1, 2) if self.out_heads_first else dout

    def user_grads(self, grads):
        """(dq, dk, dv, *rest) from the operator's layout to the caller's."""
        if not self.heads_first:
            return grads
        return (*(g.transpose(1, 2) if g is not None else None for g in grads[:3]), *grads[3:])


OPERATOR_LAYOUT = Layout()


def attention(q, k, v, args: FwdArgs, *, bias=None, softmax_offset=None, attn_mask=None,
              alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None,
              cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, page_table=None,
              layout: Layout = OPERATOR_LAYOUT):
    """Differentiable attention over q/k/v in their formats (heads not merged).

    With ``page_table`` (int32 ``[b, max_pages_per_seq]``), k and v are KV-cache
    page pools ``[num_pages, page_size, h_kv, d]`` and ``cu_seqlens_kv`` holds the
    cache lengths (inference only: no backward). ``layout`` takes bshd calls whose
    tensors the caller keeps [b, h, s, d].

    Returns ``(out, max_logit)``: out in q's format with head dim d_v, and the
    per-head max logit ``[h_q]`` (fp32) when ``args.return_max_logit``, else None.
    """
    rng_state = draw_rng_state(q.device) if args.dropout_p > 0 else None
    optionals = (bias, softmax_offset, attn_mask, alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
                 cu_seqlens_q_padded, cu_seqlens_kv_padded)
    # Under torch.compile the operator's own autograd registration is traced (Dynamo cannot trace an
    # autograd.Function given one tensor twice, as self-attention's q, k, v often are). Eager calls
    # that need gradients take _Attention, the others call the kernel below the Autograd key: both
    # skip the registration's Python wrapper, which only redispatches (lower host cost).
    compiling = torch.compiler.is_compiling()
    if not compiling and torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                         for t in (q, k, v, *optionals)):
        out, max_logit = _Attention.apply(args, page_table, rng_state, layout, q, k, v, *optionals)
    else:
        with contextlib.nullcontext() if compiling else torch._C._AutoDispatchBelowAutograd():
            out, _lse, _rng, max_logit = _fwd_op(args, page_table, rng_state, *layout.operator_view(q, k, v),
                                                 optionals)
            out = layout.user_out(out)
    return out, (max_logit if args.return_max_logit else None)


def _fwd_op(args: FwdArgs, page_table, rng_state, q, k, v, optionals):
    """torch.ops.fusedattn.fwd in schema order: (out, lse, rng_state_out, max_logit)."""
    extra = () if page_table is None else (page_table,)
    return _call(torch.ops.fusedattn.fwd, q, k, v, *optionals, rng_state, *args.op_args(), args.return_max_logit,
                 *extra)


def _bwd_op(args: FwdArgs, dout, q, k, v, out, lse, rng_state, optionals, need_dbias: bool):
    """torch.ops.fusedattn.bwd in schema order, in this thread's deterministic mode:
    (dq, dk, dv, dbias, d_softmax_offset)."""
    return _call(torch.ops.fusedattn.bwd, dout, q, k, v, out, lse, rng_state, *optionals, *args.op_args(),
                 need_dbias, deterministic_mode())


class _Attention(torch.autograd.Function):
    """attention()'s autograd: the same forward and backward as the operator's own
    registration (register_autograd above), without the per-call cost torch's generic
    wrapper adds (it rebuilds the 25-argument schema's defaults on every call, about half
    of a small call's host time). The backward's kernels wait for the host to reach them,
    so host time per step is GPU idle time on short sequences. With ``layout.heads_first``
    the [b, h, s, d] inputs are seen as bshd here, not by autograd: no transpose node in the
    graph and none to run in the backward."""

    @staticmethod
    def forward(ctx, args, page_table, rng_state, layout, q, k, v, *optionals):
        ctx.set_materialize_grads(False)  # no zeros made for max_logit's (never used) gradient
        with torch._C._AutoDispatchBelowAutograd():  # this Function is the call's autograd
            q, k, v = layout.operator_view(q, k, v)
            out, lse, rng_out, max_logit = _fwd_op(args, page_table, rng_state, q, k, v, optionals)
            user_out = layout.user_out(out)
        ctx.mark_non_differentiable(max_logit)
        ctx.save_for_backward(q, k, v, out, lse, rng_out, *optionals)
        ctx.fwd_args = args
        ctx.paged = page_table is not None
        ctx.layout = layout
        return user_out, max_logit

    @staticmethod
    def backward(ctx, dout, _dmax_logit):
        needs = ctx.needs_input_grad[4:]  # after args, page_table, rng_state, layout
        if dout is None:  # out took no part in what was differentiated
            return (None,) * len(ctx.needs_input_grad)
        q, k, v, out, lse, rng_state, *optionals = ctx.saved_tensors
        layout = ctx.layout
        grads = _grads(ctx, layout.operator_out(dout), q, k, v, out, lse, rng_state, optionals, needs)
        return (None, None, None, None, *layout.user_grads(grads), *([None] * (len(needs) - len(grads))))


# ---------------------------------------------------------------------------
# KV-cache append (csrc/core/include/fusedattn/kv_cache.h). The op mutates its
# cache arguments (schema: Tensor(a!) k_cache, Tensor(b!) v_cache) and returns
# nothing, so under torch.compile it is functionalised and re-inplaced by
# Inductor: the append stays inside the graph, and CUDA graphs replay it.


@torch.library.register_fake("fusedattn::copy_to_kv_cache")
def _copy_to_kv_cache_fake(new_k, new_v, k_cache, v_cache, page_table, cu_new_lens, cache_seqlens,
                           qkv_format):
    _check_devices(new_k, "new_k's device",
                   zip(("new_v", "k_cache", "v_cache", "page_table", "cu_new_lens", "cache_seqlens"),
                       (new_v, k_cache, v_cache, page_table, cu_new_lens, cache_seqlens)))
    return None


def copy_to_kv_cache(new_k, new_v, k_cache, v_cache, page_table, cu_new_lens, cache_seqlens,
                     qkv_format: str = "bshd") -> None:
    """Write one step's new keys/values into the caches, in place.

    Token i of sequence b (``cu_new_lens[b+1] - cu_new_lens[b]`` tokens; thd:
    rows from ``cu_new_lens[b]``) goes to cache position ``cache_seqlens[b] + i``,
    i.e. page ``page_table[b, pos // page_size]``, slot ``pos % page_size``.
    """
    _call(torch.ops.fusedattn.copy_to_kv_cache, new_k, new_v, k_cache, v_cache, page_table, cu_new_lens,
          cache_seqlens, qkv_format)


# ---------------------------------------------------------------------------
# A KV-cache step (kv_cache.h): fwd_kvcache appends new_k / new_v to the caches (mutated: Tensor(a!)
# k_cache, Tensor(b!) v_cache) and attends q over them; on the GPU's decode engine in one launch.
# Inference only: it has no autograd.


@torch.library.register_fake("fusedattn::fwd_kvcache")
def _fwd_kvcache_fake(q, new_k, new_v, k_cache, v_cache, cache_seqlens, page_table, bias, softmax_offset, attn_mask,
                      alibi_slopes, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                      q_format, kv_format, mask_type, window_left, window_right, bottom_right_diagonal, softmax_type,
                      scale, softcap, dropout_p, max_seqlen_q, max_seqlen_kv, return_max_logit):
    _check_devices(q, "the same device as q",
                   zip(("new_k", "new_v", "k_cache", "v_cache", "cache_seqlens", "page_table") + _FWD_TENSOR_NAMES[2:-1],
                       (new_k, new_v, k_cache, v_cache, cache_seqlens, page_table, bias, softmax_offset, attn_mask,
                        alibi_slopes, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)))
    out_shape, lse_shape, h_q = _out_shapes(q, v_cache, q_format)
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape, dtype=torch.float32)
    max_logit = q.new_empty((h_q,) if return_max_logit else (0,), dtype=torch.float32)
    return out, lse, max_logit


def kv_step(q, new_k, new_v, k_cache, v_cache, cache_seqlens, args: FwdArgs, *, page_table=None, cu_seqlens_q=None,
            alibi_slopes=None, softmax_offset=None):
    """Append one step's keys/values to the caches (in place) and attend q over them.

    new_k / new_v have q's format and tokens (sequence b appends its ``len_q(b)`` tokens: from
    ``cu_seqlens_q``, else the sequence dim) at cache positions ``cache_seqlens[b] + i``; the caches are
    page pools read through ``page_table``, or per-sequence caches ``[>= b, s_cache, h_kv, d]`` without
    one. q attends over keys ``[0, cache_seqlens[b] + len_q(b))``. Returns ``(out, softmax_lse,
    max_logit)``: out in q's format with head dim d_v; max_logit ``[h_q]`` when
    ``args.return_max_logit``, else None.
    """
    out, lse, max_logit = _call(
        torch.ops.fusedattn.fwd_kvcache, q, new_k, new_v, k_cache, v_cache, cache_seqlens, page_table, None,
        softmax_offset, None, alibi_slopes, cu_seqlens_q, None, None, None, *args.op_args(), args.return_max_logit)
    return out, lse, (max_logit if args.return_max_logit else None)
