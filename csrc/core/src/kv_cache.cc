// KV-cache append and step (fusedattn/kv_cache.h): validation, params and the CPU engine. The CPU
// engine reads the step's lengths and the page table first and rejects a bad step before writing
// anything, so a failed call leaves the caches as they were.
#include "fusedattn/kv_cache.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "arg_check.h"
#include "fusedattn/cat.h"
#include "layout.h"

namespace fusedattn {
namespace {

Status same_device(const TensorRef& t, const TensorRef& ref, const char* name) {
  if (t.device != ref.device || t.device_index != ref.device_index) {
    return Status::Invalid(cat(name, " must be on new_k's device (", device_name(ref.device), ":", ref.device_index,
                               "); got ", device_name(t.device), ":", t.device_index));
  }
  return Status::Ok();
}

Status new_dims(const TensorRef& t, Format f, const char* name, SeqDims* out) {
  const int want = seq_rank(f);
  if (t.ndim != want) {
    return Status::Invalid(cat(name, " must be a ", want, "-D tensor for qkv_format '", format_name(f), "' (",
                               f == Format::kTHD ? "[t, h_kv, d]" : (f == Format::kBSHD ? "[b, s, h_kv, d]" : "[s, b, h_kv, d]"),
                               "); got shape ", shape_str(t)));
  }
  *out = named_dims(t, f);
  return Status::Ok();
}

SeqTensor cache_tensor(const TensorRef& t) {
  SeqTensor s;
  s.data = t.data;
  s.stride_b = t.strides[0];
  s.stride_s = t.strides[1];
  s.stride_h = t.strides[2];
  s.stride_d = t.strides[3];
  return s;
}

Status check_int32(const TensorRef& t, const TensorRef& ref, const char* name, const char* shape, int ndim,
                   const int64_t* sizes, bool optional = false) {
  if (!t.defined()) return optional ? Status::Ok() : Status::Invalid(cat(name, " is required"));
  FUSEDATTN_RETURN_IF_ERROR(same_device(t, ref, name));
  bool ok = t.dtype == DType::kInt32 && t.ndim == ndim;
  for (int i = 0; ok && i < ndim; ++i) ok = sizes[i] < 0 ? t.sizes[i] >= 1 : t.sizes[i] == sizes[i];
  if (!ok) {
    return Status::Invalid(cat(name, " must be an int32 tensor of shape ", shape, "; got ", dtype_name(t.dtype), " ",
                               shape_str(t)));
  }
  return ndim == 1 ? check_dense_1d(t, name) : Status::Ok();
}

// The caches are written in place: a dim of stride 0 (an expand()ed view)
// would make several slots one memory location.
Status check_writable_cache(const TensorRef& t, const char* name) {
  for (int i = 0; i < t.ndim; ++i) {
    if (t.sizes[i] > 1 && t.strides[i] == 0) {
      return Status::Invalid(cat(name, " must not be an expanded view (stride 0 at dim ", i, " of shape ",
                                 shape_str(t), "): it is written in place"));
    }
  }
  return Status::Ok();
}

// Copies one token's head vectors (h x d elements) between strided rows.
void copy_token(const char* src, const SeqTensor& s, char* dst, const SeqTensor& t, int64_t h, int64_t d,
                int64_t es) {
  for (int64_t hh = 0; hh < h; ++hh) {
    const char* sp = src + hh * s.stride_h * es;
    char* dp = dst + hh * t.stride_h * es;
    if (s.stride_d == 1 && t.stride_d == 1) {
      std::memcpy(dp, sp, static_cast<size_t>(d * es));
    } else {
      for (int64_t i = 0; i < d; ++i) std::memcpy(dp + i * t.stride_d * es, sp + i * s.stride_d * es, es);
    }
  }
}

}  // namespace

Status check_kv_append(const KvAppendArgs& a) {
  const TensorRef& nk = a.new_k;
  if (!nk.defined() || !a.new_v.defined() || !a.k_cache.defined() || !a.v_cache.defined()) {
    return Status::Invalid("new_k, new_v, k_cache and v_cache are required");
  }
  if (float_dtype_bytes(nk.dtype) == 0) {
    return Status::Invalid(cat("new_k must be float16, bfloat16, float32 or float64; got ", dtype_name(nk.dtype)));
  }
  if (nk.device != DeviceType::kCPU && nk.device != DeviceType::kCUDA) {
    return Status::Unsupported(cat("new_k is on ", device_name(nk.device), "; fusedattn runs on cpu and cuda"));
  }
  for (const auto* t : {&a.new_v, &a.k_cache, &a.v_cache}) {
    const char* name = t == &a.new_v ? "new_v" : (t == &a.k_cache ? "k_cache" : "v_cache");
    if (t->dtype != nk.dtype) {
      return Status::Invalid(cat(name, " must have new_k's dtype (", dtype_name(nk.dtype), "); got ",
                                 dtype_name(t->dtype), ": the cache dtype must match the layer's keys and values"));
    }
    FUSEDATTN_RETURN_IF_ERROR(same_device(*t, nk, name));
  }

  SeqDims dk, dv;
  FUSEDATTN_RETURN_IF_ERROR(new_dims(nk, a.new_format, "new_k", &dk));
  FUSEDATTN_RETURN_IF_ERROR(new_dims(a.new_v, a.new_format, "new_v", &dv));
  if (dk.b != dv.b || dk.s != dv.s || dk.h != dv.h) {
    return Status::Invalid(cat("new_k and new_v must agree in batch, sequence and head dims; got new_k ",
                               shape_str(nk), " and new_v ", shape_str(a.new_v)));
  }
  for (const auto* t : {&a.k_cache, &a.v_cache}) {
    if (t->ndim != 4) {
      return Status::Invalid(cat(t == &a.k_cache ? "k_cache" : "v_cache",
                                 " must be a 4-D page pool [num_pages, page_size, h_kv, d]; got shape ", shape_str(*t)));
    }
  }
  const TensorRef &kc = a.k_cache, &vc = a.v_cache;
  if (kc.sizes[0] != vc.sizes[0] || kc.sizes[1] != vc.sizes[1] || kc.sizes[2] != vc.sizes[2]) {
    return Status::Invalid(cat("k_cache and v_cache must agree in num_pages, page_size and h_kv; got k_cache ",
                               shape_str(kc), " and v_cache ", shape_str(vc)));
  }
  if (kc.sizes[0] < 1 || kc.sizes[1] < 1) {
    return Status::Invalid(cat("k_cache must hold at least one page of at least one slot; got shape ", shape_str(kc)));
  }
  if (kc.sizes[2] != dk.h || kc.sizes[3] != dk.d || vc.sizes[3] != dv.d) {
    return Status::Invalid(cat("the caches' heads and head dims must match new_k/new_v: k_cache ", shape_str(kc),
                               " and v_cache ", shape_str(vc), " vs h_kv=", dk.h, ", d_k=", dk.d, ", d_v=", dv.d));
  }
  FUSEDATTN_RETURN_IF_ERROR(check_writable_cache(kc, "k_cache"));
  FUSEDATTN_RETURN_IF_ERROR(check_writable_cache(vc, "v_cache"));
  // A cache is appended to for attention to read it: a head dim attention cannot take fails here, before
  // anything is written, not in the attention call after the append.
  FUSEDATTN_RETURN_IF_ERROR(check_head_dims(dk.d, dv.d));

  int64_t b = dk.b;
  if (a.new_format == Format::kTHD) {
    const TensorRef& c = a.cu_new_lens;
    b = c.defined() && c.ndim == 1 ? c.sizes[0] - 1 : -1;
  }
  if (b < 1) {
    return Status::Invalid(cat("a KV-cache append needs at least one sequence; got batch ", b,
                               a.new_format == Format::kTHD ? cat(" (from ", a.cu_new_lens_name, ")") : std::string(" (from new_k)")));
  }
  const int64_t cu_sizes[1] = {b + 1}, sl_sizes[1] = {b}, pt_sizes[2] = {b, -1};
  const std::string cu_shape = cat("[", b + 1, "] (batch + 1)"), sl_shape = cat("[", b, "] (batch)"),
                    pt_shape = cat("[", b, ", max_pages_per_seq]");
  // Without cu_new_lens every sequence appends the sequence dim's tokens; thd has no such dim.
  FUSEDATTN_RETURN_IF_ERROR(check_int32(a.cu_new_lens, nk, a.cu_new_lens_name, cu_shape.c_str(), 1, cu_sizes,
                                        a.new_format != Format::kTHD));
  FUSEDATTN_RETURN_IF_ERROR(check_int32(a.cache_seqlens, nk, "cache_seqlens", sl_shape.c_str(), 1, sl_sizes));
  FUSEDATTN_RETURN_IF_ERROR(check_int32(a.page_table, nk, "page_table", pt_shape.c_str(), 2, pt_sizes, true));
  if (!a.page_table.defined()) {
    if (kc.sizes[0] < b) {
      return Status::Invalid(cat("without a page_table, k_cache holds one row per sequence: it needs at least ", b,
                                 " rows for the batch of ", b, "; got shape ", shape_str(kc)));
    }
    return Status::Ok();
  }
  // Engines address a row of the table as page_table[b * stride_b + i].
  if (a.page_table.sizes[1] > 1 && a.page_table.strides[1] != 1) {
    return Status::Invalid(cat("page_table's rows must be contiguous (stride 1 along max_pages_per_seq); got strides [",
                               a.page_table.strides[0], ", ", a.page_table.strides[1], "]"));
  }
  return Status::Ok();
}

Status make_kv_append_params(const KvAppendArgs& a, KvAppendParams* p) {
  FUSEDATTN_RETURN_IF_ERROR(check_kv_append(a));
  *p = KvAppendParams{};
  const bool thd = a.new_format == Format::kTHD;
  p->new_is_thd = thd;
  p->b = thd ? a.cu_new_lens.sizes[0] - 1 : (a.new_format == Format::kBSHD ? a.new_k.sizes[0] : a.new_k.sizes[1]);
  p->s_new = thd ? a.new_k.sizes[0] : (a.new_format == Format::kBSHD ? a.new_k.sizes[1] : a.new_k.sizes[0]);
  p->h_kv = a.k_cache.sizes[2];
  p->d_k = a.k_cache.sizes[3];
  p->d_v = a.v_cache.sizes[3];
  p->dtype = a.new_k.dtype;
  p->new_k = seq_tensor(a.new_k, a.new_format);
  p->new_v = seq_tensor(a.new_v, a.new_format);
  p->k_cache = cache_tensor(a.k_cache);
  p->v_cache = cache_tensor(a.v_cache);
  const bool table = a.page_table.defined();
  p->paged.page_table = table ? static_cast<const int32_t*>(a.page_table.data) : nullptr;
  p->paged.stride_b = table ? a.page_table.strides[0] : 0;
  p->paged.max_pages = table ? a.page_table.sizes[1] : 1;
  p->paged.page_size = a.k_cache.sizes[1];
  p->paged.num_pages = a.k_cache.sizes[0];
  p->cu_new_lens = a.cu_new_lens.defined() ? static_cast<const int32_t*>(a.cu_new_lens.data) : nullptr;
  p->cu_new_lens_name = a.cu_new_lens_name;
  p->cache_seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  p->capacity = p->paged.max_pages * p->paged.page_size;
  return Status::Ok();
}

namespace {

// The device data of an append, every sequence checked before the first write. `attended`: the
// step's attention also reads the pages below the new tokens, whose entries are checked too.
Status check_append_data(const KvAppendParams& p, bool attended) {
  const PagedKV& pk = p.paged;
  const int32_t* cu = p.cu_new_lens;
  for (int64_t b = 0; b < p.b; ++b) {
    const int64_t start = cu != nullptr ? cu[b] : 0, len = kv_new_len(p, b), cached = p.cache_seqlens[b];
    if (start < 0 || len < 0) {
      const char* n = p.cu_new_lens_name;
      return Status::Invalid(cat(n, " must be non-negative and non-decreasing; got ", n, "[", b, "] = ", start, ", ",
                                 n, "[", b + 1, "] = ", start + len));
    }
    if (p.new_is_thd ? start + len > p.s_new : len > p.s_new) {
      return Status::Invalid(cat("sequence ", b, "'s step of ", len, " tokens does not fit new_k/new_v: ",
                                 p.new_is_thd ? cat(p.cu_new_lens_name, " ends past the token dim ") : std::string("the sequence dim is "),
                                 p.s_new));
    }
    if (cached < 0) {
      return Status::Invalid(cat("cache_seqlens[", b, "] must be >= 0; got ", cached));
    }
    if (cached + len > p.capacity) {
      return Status::Invalid(cat("sequence ", b, " would grow to ", cached + len, " tokens (cache_seqlens = ", cached,
                                 " + ", len, " new) but its page table holds ", p.capacity, " (", pk.max_pages,
                                 " pages of ", pk.page_size, ")"));
    }
    const int64_t from = attended ? 0 : cached, end = cached + len;  // positions whose pages are used
    const int64_t last_page = end > from ? (end - 1) / pk.page_size : -1;
    for (int64_t pg = from / pk.page_size; pk.page_table != nullptr && pg <= last_page; ++pg) {
      const int64_t page = pk.page_table[b * pk.stride_b + pg];
      if (page < 0 || page >= pk.num_pages) {
        return Status::Invalid(cat("page_table[", b, ", ", pg, "] = ", page, " is outside the page pool [0, ",
                                   pk.num_pages, ")"));
      }
    }
  }
  return Status::Ok();
}

void copy_new_tokens(const KvAppendParams& p) {
  const PagedKV& pk = p.paged;
  const int64_t es = float_dtype_bytes(p.dtype);
  for (int64_t b = 0; b < p.b; ++b) {
    const int64_t len = kv_new_len(p, b), cached = p.cache_seqlens[b];
    const int64_t row0 = p.new_is_thd ? p.cu_new_lens[b] : 0;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t pos = cached + i;
      const int64_t page = kv_page_of(pk, b, pos), slot = pos % pk.page_size;
      const int64_t src_k = b * p.new_k.stride_b + (row0 + i) * p.new_k.stride_s;
      const int64_t src_v = b * p.new_v.stride_b + (row0 + i) * p.new_v.stride_s;
      const int64_t dst_k = page * p.k_cache.stride_b + slot * p.k_cache.stride_s;
      const int64_t dst_v = page * p.v_cache.stride_b + slot * p.v_cache.stride_s;
      copy_token(static_cast<const char*>(p.new_k.data) + src_k * es, p.new_k,
                 static_cast<char*>(p.k_cache.data) + dst_k * es, p.k_cache, p.h_kv, p.d_k, es);
      copy_token(static_cast<const char*>(p.new_v.data) + src_v * es, p.new_v,
                 static_cast<char*>(p.v_cache.data) + dst_v * es, p.v_cache, p.h_kv, p.d_v, es);
    }
  }
}

// What check_fwd is shown for a step: the key lengths it derives have cu_seqlens_kv's shape, and
// per-sequence caches are pools of one page per sequence ([b, 1] table). Neither has data: the
// params keep null pointers there (KvStepParams).
FwdInputs shaped_attention_inputs(const FwdArgs& args, const KvStepInputs& in) {
  FwdInputs a = in.attn;
  const TensorRef& q = a.q;
  int64_t b = -1;
  if (q.ndim == seq_rank(args.q_format)) {
    b = args.q_format == Format::kTHD ? (a.cu_seqlens_q.ndim == 1 ? a.cu_seqlens_q.sizes[0] - 1 : -1)
                                      : named_dims(q, args.q_format).b;
  }
  const auto shape_only = [&](int ndim, int64_t s0, int64_t s1) {
    TensorRef t;
    t.dtype = DType::kInt32;
    t.device = q.device;
    t.device_index = q.device_index;
    t.ndim = ndim;
    t.sizes[0] = s0;
    t.sizes[1] = s1;
    t.strides[0] = ndim == 2 ? s1 : 1;
    t.strides[1] = 1;
    return t;
  };
  a.cu_seqlens_kv = shape_only(1, b + 1, 0);
  if (!a.page_table.defined()) a.page_table = shape_only(2, b, 1);
  return a;
}

KvAppendArgs append_args(const FwdArgs& args, const KvStepInputs& in) {
  KvAppendArgs a;
  a.new_format = args.q_format;
  a.new_k = in.new_k;
  a.new_v = in.new_v;
  a.k_cache = in.attn.k;
  a.v_cache = in.attn.v;
  a.page_table = in.attn.page_table;
  a.cu_new_lens = in.attn.cu_seqlens_q;
  a.cu_new_lens_name = "cu_seqlens_q";
  a.cache_seqlens = in.cache_seqlens;
  return a;
}

}  // namespace

Status run_kv_append_cpu(const KvAppendParams& p) {
  FUSEDATTN_RETURN_IF_ERROR(check_append_data(p, false));
  copy_new_tokens(p);
  return Status::Ok();
}

Status check_kv_step(const FwdArgs& args, const KvStepInputs& in, CheckedProblem* prob) {
  const FwdInputs& a = in.attn;
  if (a.cu_seqlens_kv.defined() || a.cu_seqlens_kv_padded.defined() || a.cu_seqlens_q_padded.defined()) {
    return Status::Invalid(
        "fwd_kvcache takes no cu_seqlens_kv, cu_seqlens_q_padded or cu_seqlens_kv_padded: sequence b's keys are its "
        "cache_seqlens[b] cached tokens and its new tokens, which sit where its queries sit");
  }
  if (!in.new_k.defined() || !in.new_v.defined()) return Status::Invalid("new_k and new_v are required");
  // new_k against q first, then the caches against new_k (the append's check), then the attention's
  // check, whose k and v are the caches: each mismatch is reported under the names the caller used.
  for (const TensorRef* t : {&in.new_k, &in.new_v}) {
    const char* name = t == &in.new_k ? "new_k" : "new_v";
    if (a.q.defined() && (t->dtype != a.q.dtype || t->device != a.q.device || t->device_index != a.q.device_index)) {
      return Status::Invalid(cat(name, " must have q's dtype and device (", dtype_name(a.q.dtype), " on ",
                                 device_name(a.q.device), ":", a.q.device_index, "); got ", dtype_name(t->dtype),
                                 " on ", device_name(t->device), ":", t->device_index));
    }
  }
  FUSEDATTN_RETURN_IF_ERROR(check_kv_append(append_args(args, in)));
  FUSEDATTN_RETURN_IF_ERROR(check_fwd(args, shaped_attention_inputs(args, in), prob));
  // The step's tokens are the queries': new_k / new_v have q's batch and sequence (token) dims.
  const SeqDims dq = named_dims(a.q, args.q_format), dk = named_dims(in.new_k, args.q_format);
  if (dk.b != dq.b || dk.s != dq.s) {
    return Status::Invalid(cat("new_k and new_v must have q's batch and ",
                               args.q_format == Format::kTHD ? "token" : "sequence",
                               " dims (a step appends the queries' own keys and values); got new_k ",
                               shape_str(in.new_k), " and q ", shape_str(a.q)));
  }
  return Status::Ok();
}

Status make_kv_step_params(const FwdArgs& args, const KvStepInputs& in, const CheckedProblem& prob,
                           const FwdOutputs& out, KvStepParams* p) {
  *p = KvStepParams{};
  FUSEDATTN_RETURN_IF_ERROR(make_fwd_params(args, shaped_attention_inputs(args, in), prob, out, &p->attn));
  if (p->attn.paged.page_table == nullptr) p->attn.paged.stride_b = 0;
  return make_kv_append_params(append_args(args, in), &p->append);
}

Status run_kv_step_cpu(const KvStepParams& p, const Executor& exec) {
  const KvAppendParams& ap = p.append;
  FUSEDATTN_RETURN_IF_ERROR(check_append_data(ap, true));
  // thd queries are also bounded by max_seqlen_q (the attention's s_q), which the append does not know.
  for (int64_t b = 0; b < ap.b; ++b) {
    if (kv_new_len(ap, b) > p.attn.prob.s_q) {
      return Status::Invalid(cat("cu_seqlens_q gives sequence ", b, " the length ", kv_new_len(ap, b),
                                 ", more than max_seqlen_q (", p.attn.prob.s_q, ")"));
    }
  }
  std::vector<int32_t> cu_kv(static_cast<size_t>(ap.b + 1), 0);
  for (int64_t b = 0; b < ap.b; ++b) {
    const int64_t next = cu_kv[b] + kv_step_len(ap.cache_seqlens[b], kv_new_len(ap, b));
    if (next > std::numeric_limits<int32_t>::max()) {
      return Status::Invalid(cat("the step's keys over all sequences exceed 2^31 - 1 (at sequence ", b, ")"));
    }
    cu_kv[b + 1] = static_cast<int32_t>(next);
  }
  copy_new_tokens(ap);
  FwdParams attn = p.attn;
  attn.seqlens.cu_seqlens_kv = cu_kv.data();
  return run_fwd_cpu(attn, exec);
}

}  // namespace fusedattn
