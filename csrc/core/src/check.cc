// Validation of one call and the shape rules of its outputs. Every message
// names the offending argument and value, so the Python exception the binding
// raises from it is enough to fix the call.
#include <cmath>
#include <string>

#include "arg_check.h"
#include "fusedattn/cat.h"
#include "fusedattn/api.h"
#include "layout.h"

namespace fusedattn {
namespace {

Status seq_dims(const TensorRef& t, Format f, const char* name, SeqDims* out) {
  const int want = seq_rank(f);
  if (t.ndim != want) {
    return Status::Invalid(cat(name, " must be a ", want, "-D tensor for qkv_format '", format_name(f), "' (",
                               f == Format::kTHD ? "[t, h, d]" : (f == Format::kBSHD ? "[b, s, h, d]" : "[s, b, h, d]"),
                               "); got a ", t.ndim, "-D tensor of shape ", shape_str(t)));
  }
  *out = named_dims(t, f);
  return Status::Ok();
}

// A tensor on another device (the binding marks meta and other non-cpu/cuda
// devices kOther) is rejected here, before any engine reads it.
Status same_device(const TensorRef& t, const TensorRef& q, const char* name) {
  if (t.device != q.device || t.device_index != q.device_index) {
    return Status::Invalid(cat(name, " must be on the same device as q (", device_name(q.device), ":",
                               q.device_index, "); got ", device_name(t.device), ":", t.device_index));
  }
  return Status::Ok();
}

Status check_cu_seqlens(const TensorRef& t, const TensorRef& q, const char* name, int64_t b) {
  if (!t.defined()) return Status::Ok();
  FUSEDATTN_RETURN_IF_ERROR(same_device(t, q, name));
  if (t.dtype != DType::kInt32) return Status::Invalid(cat(name, " must be int32; got ", dtype_name(t.dtype)));
  if (t.ndim != 1 || t.sizes[0] != b + 1 || b < 0) {
    return Status::Invalid(cat(name, " must be a 1-D int32 tensor of size batch + 1 = ", b + 1, "; got shape ",
                               shape_str(t)));
  }
  return check_dense_1d(t, name);
}

// A [b, h, s_q, s_kv] tensor whose dims are either full or 1 (broadcast).
Status check_pair_tensor(const TensorRef& t, const char* name, const int64_t full[4], bool allow_skv_broadcast) {
  static const char* kDims[4] = {"batch", "heads", "s_q", "s_kv"};
  if (t.ndim != 4) {
    return Status::Invalid(cat(name, " must be 4-D [b|1, h|1, s_q|1, s_kv]; got shape ", shape_str(t)));
  }
  for (int i = 0; i < 4; ++i) {
    const bool ok = t.sizes[i] == full[i] || (t.sizes[i] == 1 && (i < 3 || allow_skv_broadcast));
    if (!ok) {
      return Status::Invalid(cat(name, " of shape ", shape_str(t), " does not match [", full[0], ", ", full[1], ", ",
                                 full[2], ", ", full[3], "]: dim ", i, " (", kDims[i], ") must be ", full[i],
                                 i < 3 ? " or 1" : "", "; got ", t.sizes[i]));
    }
  }
  return Status::Ok();
}

// A KV cache read through a page table (inference): k/v are [num_pages,
// page_size, h_kv, d] pools and every sequence's cache length comes from
// cu_seqlens_kv.
Status check_paged_kv(const FwdArgs& args, const FwdInputs& in) {
  const TensorRef& pt = in.page_table;
  FUSEDATTN_RETURN_IF_ERROR(same_device(pt, in.q, "page_table"));
  if (pt.dtype != DType::kInt32 || pt.ndim != 2 || pt.sizes[1] < 1) {
    return Status::Invalid(cat("page_table must be an int32 tensor [b, max_pages_per_seq]; got ", dtype_name(pt.dtype),
                               " ", shape_str(pt)));
  }
  // Engines address a row of the table as page_table[b * stride_b + i].
  if (pt.sizes[1] > 1 && pt.strides[1] != 1) {
    return Status::Invalid(cat("page_table's rows must be contiguous (stride 1 along max_pages_per_seq); got strides [",
                               pt.strides[0], ", ", pt.strides[1], "]"));
  }
  if (args.kv_format != Format::kBSHD) {
    return Status::Invalid(cat("with a page_table, k and v are page pools [num_pages, page_size, h_kv, d]: kv_format "
                               "must be 'bshd'; got '",
                               format_name(args.kv_format), "'"));
  }
  if (!in.cu_seqlens_kv.defined()) {
    return Status::Invalid("a KV cache (page_table) requires cu_seqlens_kv: the cache length of every sequence");
  }
  if (in.cu_seqlens_kv_padded.defined()) {
    return Status::Invalid("cu_seqlens_kv_padded does not apply to a paged KV cache");
  }
  if (in.bias.defined() || in.attn_mask.defined() || args.dropout_p > 0) {
    return Status::Unsupported(
        "core_attention_bias, an arbitrary attention_mask and dropout are not supported with a KV cache (inference); "
        "ALiBi, windows and the softmax types are");
  }
  return Status::Ok();
}

Status check_window(const FwdArgs& args) {
  const int64_t l = args.window_left, r = args.window_right;
  if (l < -1 || r < -1) {
    return Status::Invalid(cat("window_size must hold values >= -1 (-1 = unbounded); got (", l, ", ", r, ")"));
  }
  if (mask_is_causal(args.mask_type)) {
    if (r != -1 && r != 0) {
      return Status::Invalid(cat("window_size=(", l, ", ", r, ") is incompatible with attn_mask_type '",
                                 mask_type_name(args.mask_type),
                                 "': a causal mask admits no keys right of the diagonal, so window_size[1] must be "
                                 "-1 or 0"));
    }
  } else if ((l == -1) != (r == -1)) {
    return Status::Invalid(cat("window_size=(", l, ", ", r, ") is incompatible with attn_mask_type '",
                               mask_type_name(args.mask_type),
                               "': without a causal mask both sides must be -1 (no window) or both >= 0; use a "
                               "causal mask type for a left-only window"));
  }
  return Status::Ok();
}

// 0 is off; a cap must also survive the fp32 engines' conversion (neither 0 nor inf in float).
Status check_softcap(double c) {
  const float f = static_cast<float>(c);
  if (c == 0.0 || (std::isfinite(c) && c > 0.0 && f > 0.f && std::isfinite(f))) return Status::Ok();
  return Status::Invalid(cat("softcap must be 0 (off) or a finite positive value within float32's range; got ", c));
}

Status check_fwd_args(const FwdArgs& args, const FwdInputs& in, Problem* prob) {
  const TensorRef& q = in.q;
  if (!q.defined() || !in.k.defined() || !in.v.defined()) {
    return Status::Invalid("q, k and v are required");
  }
  if (float_dtype_bytes(q.dtype) == 0) {
    return Status::Invalid(cat("q must be float16, bfloat16, float32 or float64; got ", dtype_name(q.dtype)));
  }
  if (q.device != DeviceType::kCPU && q.device != DeviceType::kCUDA) {
    return Status::Unsupported(cat("q is on ", device_name(q.device), "; fusedattn runs on cpu and cuda"));
  }
  for (const auto* t : {&in.k, &in.v}) {
    const char* name = t == &in.k ? "k" : "v";
    if (t->dtype != q.dtype) {
      return Status::Invalid(cat(name, " must have q's dtype (", dtype_name(q.dtype), "); got ", dtype_name(t->dtype)));
    }
    FUSEDATTN_RETURN_IF_ERROR(same_device(*t, q, name));
  }

  SeqDims dq, dk, dv;
  FUSEDATTN_RETURN_IF_ERROR(seq_dims(q, args.q_format, "q", &dq));
  FUSEDATTN_RETURN_IF_ERROR(seq_dims(in.k, args.kv_format, "k", &dk));
  FUSEDATTN_RETURN_IF_ERROR(seq_dims(in.v, args.kv_format, "v", &dv));
  if (dk.b != dv.b || dk.s != dv.s || dk.h != dv.h) {
    return Status::Invalid(cat("k and v must agree in batch, sequence and head dims; got k ", shape_str(in.k),
                               " and v ", shape_str(in.v)));
  }
  if (dq.d != dk.d) {
    return Status::Invalid(cat("q and k must have the same head dim; got q ", dq.d, " and k ", dk.d));
  }
  FUSEDATTN_RETURN_IF_ERROR(check_head_dims(dq.d, dv.d));
  // No heads at all is an empty problem; otherwise h_q is a multiple of h_kv.
  if (!(dq.h == 0 && dk.h == 0) && (dq.h <= 0 || dk.h <= 0 || dq.h % dk.h != 0)) {
    return Status::Invalid(cat("the number of query heads must be a positive multiple of the number of key/value "
                               "heads (GQA/MQA); got h_q=",
                               dq.h, ", h_kv=", dk.h));
  }

  const bool q_thd = args.q_format == Format::kTHD, kv_thd = args.kv_format == Format::kTHD;
  const bool paged = in.page_table.defined();
  if (paged) FUSEDATTN_RETURN_IF_ERROR(check_paged_kv(args, in));
  int64_t b;
  if (paged) {
    // k/v are page pools: the batch comes from q and the page table.
    b = q_thd ? (in.cu_seqlens_q.ndim == 1 ? in.cu_seqlens_q.sizes[0] - 1 : -1) : dq.b;
    if (q_thd && !in.cu_seqlens_q.defined()) return Status::Invalid("q in format 'thd' requires cu_seqlens_q");
    if (in.page_table.sizes[0] != b) {
      return Status::Invalid(cat("page_table must have one row per sequence: shape [", b, ", max_pages_per_seq]; got ",
                                 shape_str(in.page_table)));
    }
  } else if (q_thd && kv_thd) {
    if (!in.cu_seqlens_q.defined() || !in.cu_seqlens_kv.defined()) {
      return Status::Invalid("qkv_format 'thd' requires cu_seqlens_q and cu_seqlens_kv");
    }
    b = in.cu_seqlens_q.ndim == 1 ? in.cu_seqlens_q.sizes[0] - 1 : -1;
  } else if (q_thd) {
    if (!in.cu_seqlens_q.defined()) return Status::Invalid("q in format 'thd' requires cu_seqlens_q");
    b = dk.b;
  } else if (kv_thd) {
    if (!in.cu_seqlens_kv.defined()) return Status::Invalid("k/v in format 'thd' requires cu_seqlens_kv");
    b = dq.b;
  } else {
    if (dq.b != dk.b) {
      return Status::Invalid(cat("q and k/v must have the same batch size; got q ", dq.b, " and k ", dk.b));
    }
    b = dq.b;
  }
  if (b < 0) {  // b = 0 (no sequence) is an empty problem
    return Status::Invalid(cat("cu_seqlens_q must be a 1-D int32 tensor of size batch + 1 >= 1; got shape ",
                               shape_str(in.cu_seqlens_q)));
  }
  FUSEDATTN_RETURN_IF_ERROR(check_cu_seqlens(in.cu_seqlens_q, q, "cu_seqlens_q", b));
  FUSEDATTN_RETURN_IF_ERROR(check_cu_seqlens(in.cu_seqlens_kv, q, "cu_seqlens_kv", b));
  FUSEDATTN_RETURN_IF_ERROR(check_cu_seqlens(in.cu_seqlens_q_padded, q, "cu_seqlens_q_padded", b));
  FUSEDATTN_RETURN_IF_ERROR(check_cu_seqlens(in.cu_seqlens_kv_padded, q, "cu_seqlens_kv_padded", b));
  if (in.cu_seqlens_q_padded.defined() && !q_thd) {
    return Status::Invalid("cu_seqlens_q_padded is only used with qkv_format 'thd' for q");
  }
  if (in.cu_seqlens_kv_padded.defined() && !kv_thd) {
    return Status::Invalid("cu_seqlens_kv_padded is only used with qkv_format 'thd' for k/v");
  }
  // In bshd/sbhd, per-sequence lengths are what the padding mask types mean;
  // given with another mask type they would be silently ignored.
  const bool padding = mask_has_padding(args.mask_type);
  if (!padding && !paged) {
    if (in.cu_seqlens_q.defined() && !q_thd) {
      return Status::Invalid(cat("cu_seqlens_q is given but attn_mask_type '", mask_type_name(args.mask_type),
                                 "' has no padding; use a padding mask type"));
    }
    if (in.cu_seqlens_kv.defined() && !kv_thd) {
      return Status::Invalid(cat("cu_seqlens_kv is given but attn_mask_type '", mask_type_name(args.mask_type),
                                 "' has no padding; use a padding mask type"));
    }
  }

  for (int64_t m : {args.max_seqlen_q, args.max_seqlen_kv}) {
    if (m < -1 || m == 0) return Status::Invalid(cat("max_seqlen_q/max_seqlen_kv must be positive; got ", m));
  }
  const int64_t s_q = q_thd ? (args.max_seqlen_q > 0 ? args.max_seqlen_q : dq.s) : dq.s;
  const int64_t s_kv = paged    ? in.page_table.sizes[1] * dk.s
                       : kv_thd ? (args.max_seqlen_kv > 0 ? args.max_seqlen_kv : dk.s)
                                : dk.s;

  FUSEDATTN_RETURN_IF_ERROR(check_window(args));
  if (!std::isfinite(args.scale)) return Status::Invalid(cat("softmax_scale must be finite; got ", args.scale));
  FUSEDATTN_RETURN_IF_ERROR(check_softcap(args.softcap));
  if (!(args.dropout_p >= 0.0 && args.dropout_p < 1.0)) {
    return Status::Invalid(cat("attention_dropout must be in [0, 1); got ", args.dropout_p));
  }
  if (args.dropout_p > 0.0) {
    const TensorRef& r = in.rng_state;
    if (!r.defined()) return Status::Invalid("rng_state is required when dropout_p > 0");
    if (r.dtype != DType::kInt64 || r.ndim != 1 || r.sizes[0] != 2) {
      return Status::Invalid(cat("rng_state must be an int64 tensor of shape [2] (seed, offset); got ",
                                 dtype_name(r.dtype), " ", shape_str(r)));
    }
    FUSEDATTN_RETURN_IF_ERROR(same_device(r, q, "rng_state"));
    FUSEDATTN_RETURN_IF_ERROR(check_dense_1d(r, "rng_state"));
  }

  // Bias, mask and ALiBi are indexed by positions inside a sequence, so for
  // thd their sequence dims are max_seqlen, which must then be given.
  const int64_t full[4] = {b, dq.h, s_q, s_kv};
  const bool pair_needs_max = (in.bias.defined() || in.attn_mask.defined()) && (q_thd || kv_thd);
  if (pair_needs_max && ((q_thd && args.max_seqlen_q < 0) || (kv_thd && args.max_seqlen_kv < 0))) {
    return Status::Invalid(
        "core_attention_bias / attention_mask with qkv_format 'thd' need max_seqlen_q and max_seqlen_kv: their "
        "last two dims are [max_seqlen_q, max_seqlen_kv]");
  }
  BiasType bias_type = BiasType::kNoBias;
  if (in.bias.defined()) {
    if (in.alibi_slopes.defined()) {
      return Status::Invalid("core_attention_bias and alibi_slopes are exclusive: give one bias type");
    }
    if (in.bias.dtype != q.dtype) {
      return Status::Invalid(cat("core_attention_bias must have q's dtype (", dtype_name(q.dtype), "); got ",
                                 dtype_name(in.bias.dtype)));
    }
    FUSEDATTN_RETURN_IF_ERROR(same_device(in.bias, q, "core_attention_bias"));
    FUSEDATTN_RETURN_IF_ERROR(check_pair_tensor(in.bias, "core_attention_bias", full, false));
    bias_type = BiasType::kPostScaleBias;
  }
  if (in.alibi_slopes.defined()) {
    const TensorRef& a = in.alibi_slopes;
    FUSEDATTN_RETURN_IF_ERROR(same_device(a, q, "alibi_slopes"));
    const bool shape_ok = (a.ndim == 1 && a.sizes[0] == dq.h) || (a.ndim == 2 && a.sizes[0] == b && a.sizes[1] == dq.h);
    if (a.dtype != DType::kFloat32 || !shape_ok) {
      return Status::Invalid(cat("alibi_slopes must be float32 of shape [h_q] = [", dq.h, "] or [b, h_q] = [", b, ", ",
                                 dq.h, "]; got ", dtype_name(a.dtype), " ", shape_str(a)));
    }
    bias_type = BiasType::kAlibi;
  }

  if (args.mask_type == MaskType::kArbitrary) {
    if (!in.attn_mask.defined()) return Status::Invalid("attn_mask_type 'arbitrary' requires attention_mask");
    if (in.attn_mask.dtype != DType::kBool) {
      return Status::Invalid(cat("attention_mask must be a bool tensor (True = masked out); got ",
                                 dtype_name(in.attn_mask.dtype)));
    }
    FUSEDATTN_RETURN_IF_ERROR(same_device(in.attn_mask, q, "attention_mask"));
    FUSEDATTN_RETURN_IF_ERROR(check_pair_tensor(in.attn_mask, "attention_mask", full, true));
  } else if (in.attn_mask.defined()) {
    return Status::Invalid(cat("attention_mask is given but attn_mask_type is '", mask_type_name(args.mask_type),
                               "'; a boolean mask needs attn_mask_type 'arbitrary'"));
  }

  if (args.softmax_type == SoftmaxType::kLearnable) {
    const TensorRef& o = in.softmax_offset;
    if (!o.defined()) return Status::Invalid("softmax_type 'learnable' requires softmax_offset");
    if (o.dtype != DType::kFloat32 || o.ndim != 1 || o.sizes[0] != dq.h) {
      return Status::Invalid(cat("softmax_offset must be float32 of shape [h_q] = [", dq.h, "]; got ",
                                 dtype_name(o.dtype), " ", shape_str(o)));
    }
    FUSEDATTN_RETURN_IF_ERROR(same_device(o, q, "softmax_offset"));
    FUSEDATTN_RETURN_IF_ERROR(check_dense_1d(o, "softmax_offset"));
  } else if (in.softmax_offset.defined()) {
    return Status::Invalid(cat("softmax_offset is only used with softmax_type 'learnable'; got softmax_type '",
                               softmax_type_name(args.softmax_type), "'"));
  }

  Problem p;
  p.b = b;
  p.s_q = s_q;
  p.s_kv = s_kv;
  p.h_q = dq.h;
  p.h_kv = dk.h;
  p.d_qk = dq.d;
  p.d_v = dv.d;
  p.t_q = q_thd ? dq.s : 0;
  p.t_kv = kv_thd ? dk.s : 0;
  p.dtype = q.dtype;
  p.device = q.device;
  p.bias_type = bias_type;
  *prob = p;
  return Status::Ok();
}

}  // namespace

FwdOutputShapes fwd_output_shapes(const FwdArgs& args, const Problem& p) {
  FwdOutputShapes s;
  s.out.dtype = p.dtype;
  s.lse.dtype = DType::kFloat32;
  s.max_logit.dtype = DType::kFloat32;
  switch (args.q_format) {
    case Format::kBSHD: s.out.ndim = 4; s.out.sizes[0] = p.b; s.out.sizes[1] = p.s_q; break;
    case Format::kSBHD: s.out.ndim = 4; s.out.sizes[0] = p.s_q; s.out.sizes[1] = p.b; break;
    case Format::kTHD: s.out.ndim = 3; s.out.sizes[0] = p.t_q; break;
  }
  s.out.sizes[s.out.ndim - 2] = p.h_q;
  s.out.sizes[s.out.ndim - 1] = p.d_v;
  if (args.q_format == Format::kTHD) {
    s.lse.ndim = 2;
    s.lse.sizes[0] = p.h_q;
    s.lse.sizes[1] = p.t_q;
  } else {
    s.lse.ndim = 3;
    s.lse.sizes[0] = p.b;
    s.lse.sizes[1] = p.h_q;
    s.lse.sizes[2] = p.s_q;
  }
  s.max_logit.ndim = 1;
  s.max_logit.sizes[0] = args.return_max_logit ? p.h_q : 0;
  return s;
}

namespace {
Status check_like(const TensorRef& t, const OutputShape& want, const TensorRef& q, const char* name) {
  FUSEDATTN_RETURN_IF_ERROR(same_device(t, q, name));
  bool ok = t.ndim == want.ndim && t.dtype == want.dtype;
  for (int i = 0; ok && i < want.ndim; ++i) ok = t.sizes[i] == want.sizes[i];
  if (!ok) {
    TensorRef w;
    w.ndim = want.ndim;
    for (int i = 0; i < want.ndim; ++i) w.sizes[i] = want.sizes[i];
    return Status::Invalid(cat(name, " must be ", dtype_name(want.dtype), " of shape ", shape_str(w), "; got ",
                               dtype_name(t.dtype), " ", shape_str(t)));
  }
  return Status::Ok();
}

OutputShape shape_of(const TensorRef& t) {
  OutputShape s;
  s.ndim = t.ndim;
  s.dtype = t.dtype;
  for (int i = 0; i < t.ndim && i < 4; ++i) s.sizes[i] = t.sizes[i];
  return s;
}
}  // namespace

Status check_fwd(const FwdArgs& args, const FwdInputs& in, CheckedProblem* prob) {
  prob->valid_ = false;
  FUSEDATTN_RETURN_IF_ERROR(check_fwd_args(args, in, &prob->prob_));
  prob->valid_ = true;
  return Status::Ok();
}

Status check_bwd(const BwdArgs& args, const BwdInputs& in, CheckedProblem* checked) {
  checked->valid_ = false;
  Problem* prob = &checked->prob_;
  if (in.fwd.page_table.defined()) {
    return Status::Unsupported("backward through a KV cache (page_table) is not supported: the cache is for inference");
  }
  FwdArgs fargs = args.fwd;
  fargs.return_max_logit = false;
  // Backward always receives the forward's rng_state (zeros without dropout).
  FUSEDATTN_RETURN_IF_ERROR(check_fwd_args(fargs, in.fwd, prob));
  const FwdOutputShapes s = fwd_output_shapes(fargs, *prob);
  FUSEDATTN_RETURN_IF_ERROR(check_like(in.out, s.out, in.fwd.q, "out"));
  FUSEDATTN_RETURN_IF_ERROR(check_like(in.dout, s.out, in.fwd.q, "dout"));
  FUSEDATTN_RETURN_IF_ERROR(check_like(in.lse, s.lse, in.fwd.q, "softmax_lse"));
  if (args.need_dbias && !in.fwd.bias.defined()) {
    return Status::Invalid("need_dbias is set but no core_attention_bias was given");
  }
  checked->valid_ = true;
  return Status::Ok();
}

BwdOutputShapes bwd_output_shapes(const BwdArgs& args, const BwdInputs& in, const Problem& p) {
  BwdOutputShapes s;
  s.dq = shape_of(in.fwd.q);
  s.dk = shape_of(in.fwd.k);
  s.dv = shape_of(in.fwd.v);
  if (args.need_dbias && in.fwd.bias.defined()) {
    s.dbias = shape_of(in.fwd.bias);
  } else {
    s.dbias.ndim = 1;
    s.dbias.dtype = p.dtype;
  }
  s.d_softmax_offset.ndim = 1;
  s.d_softmax_offset.dtype = DType::kFloat32;
  s.d_softmax_offset.sizes[0] = args.fwd.softmax_type == SoftmaxType::kLearnable ? p.h_q : 0;
  return s;
}

}  // namespace fusedattn
