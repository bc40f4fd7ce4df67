// The one place where engine parameters are filled from a validated call.
#include "fusedattn/api.h"
#include "fusedattn/visibility.h"
#include "layout.h"

namespace fusedattn {
namespace {

// Broadcast dims read with stride 0, whatever stride the tensor reports.
PairTensor pair_tensor(const TensorRef& t) {
  PairTensor p;
  if (!t.defined() || t.ndim != 4) return p;
  p.data = t.data;
  for (int i = 0; i < 4; ++i) p.sizes[i] = t.sizes[i];
  p.stride_b = t.sizes[0] == 1 ? 0 : t.strides[0];
  p.stride_h = t.sizes[1] == 1 ? 0 : t.strides[1];
  p.stride_i = t.sizes[2] == 1 ? 0 : t.strides[2];
  p.stride_j = t.sizes[3] == 1 ? 0 : t.strides[3];
  return p;
}

template <typename T>
const T* ptr(const TensorRef& t) {
  return t.defined() ? static_cast<const T*>(t.data) : nullptr;
}

void fill_common(const FwdArgs& args, const FwdInputs& in, const Problem& prob, FwdParams* p) {
  p->prob = prob;
  p->q_format = args.q_format;
  p->kv_format = args.kv_format;
  p->q = seq_tensor(in.q, args.q_format);
  p->k = seq_tensor(in.k, args.kv_format);
  p->v = seq_tensor(in.v, args.kv_format);

  SeqlenParams& sl = p->seqlens;
  sl.q_is_thd = args.q_format == Format::kTHD;
  sl.kv_is_thd = args.kv_format == Format::kTHD;
  sl.cu_seqlens_q = ptr<int32_t>(in.cu_seqlens_q);
  sl.cu_seqlens_kv = ptr<int32_t>(in.cu_seqlens_kv);
  if (sl.q_is_thd) sl.offsets_q = in.cu_seqlens_q_padded.defined() ? ptr<int32_t>(in.cu_seqlens_q_padded) : sl.cu_seqlens_q;
  if (sl.kv_is_thd) {
    sl.offsets_kv = in.cu_seqlens_kv_padded.defined() ? ptr<int32_t>(in.cu_seqlens_kv_padded) : sl.cu_seqlens_kv;
  }

  if (in.page_table.defined()) {
    PagedKV& pk = p->paged;
    pk.page_table = ptr<int32_t>(in.page_table);
    pk.stride_b = in.page_table.strides[0];
    pk.max_pages = in.page_table.sizes[1];
    pk.page_size = in.k.sizes[1];
    pk.num_pages = in.k.sizes[0];
  }

  // Windows in visibility.h's form: causal types are window_right = 0, and a side wider than both
  // sequences together constrains nothing (clamp_window: the one clamp, so kernels can use int32).
  MaskParams& m = p->mask;
  const int64_t reach = prob.s_q + prob.s_kv;
  m.window_left = clamp_window(args.window_left, reach);
  m.window_right = mask_is_causal(args.mask_type) ? 0 : clamp_window(args.window_right, reach);
  // TransformerEngine's rule: top-left causal types force top-left alignment,
  // bottom-right ones force bottom-right, the others default to bottom-right.
  if (args.mask_type == MaskType::kCausal || args.mask_type == MaskType::kPaddingCausal) {
    m.bottom_right = false;
  } else if (args.mask_type == MaskType::kCausalBottomRight || args.mask_type == MaskType::kPaddingCausalBottomRight) {
    m.bottom_right = true;
  } else {
    m.bottom_right = args.bottom_right_diagonal < 0 ? mask_default_bottom_right(args.mask_type)
                                                    : args.bottom_right_diagonal != 0;
  }
  if (args.mask_type == MaskType::kArbitrary) m.mask = pair_tensor(in.attn_mask);

  BiasParams& b = p->bias;
  b.type = prob.bias_type;
  if (b.type == BiasType::kPostScaleBias) b.bias = pair_tensor(in.bias);
  if (b.type == BiasType::kAlibi) {
    const TensorRef& a = in.alibi_slopes;
    b.alibi_slopes = ptr<float>(a);
    b.alibi_stride_b = a.ndim == 2 ? a.strides[0] : 0;
    b.alibi_stride_h = a.strides[a.ndim - 1];
  }

  p->softmax.type = args.softmax_type;
  p->softmax.offset = args.softmax_type == SoftmaxType::kLearnable ? ptr<float>(in.softmax_offset) : nullptr;
  p->dropout.p = static_cast<float>(args.dropout_p);
  p->dropout.rng_state = args.dropout_p > 0 ? ptr<int64_t>(in.rng_state) : nullptr;
  p->scale = args.scale;
  p->softcap = args.softcap;
}

void set_lse(const TensorRef& lse, Format q_format, float** data, int64_t* sb, int64_t* sh, int64_t* ss) {
  *data = static_cast<float*>(lse.data);
  if (q_format == Format::kTHD) {
    *sb = 0;
    *sh = lse.strides[0];
    *ss = lse.strides[1];
  } else {
    *sb = lse.strides[0];
    *sh = lse.strides[1];
    *ss = lse.strides[2];
  }
}

}  // namespace

Status make_fwd_params(const FwdArgs& args, const FwdInputs& in, const CheckedProblem& checked, const FwdOutputs& out,
                       FwdParams* p) {
  if (!checked.valid()) return Status::Invalid("make_fwd_params: the call was not validated by check_fwd");
  const Problem& prob = checked.get();
  *p = FwdParams{};
  fill_common(args, in, prob, p);
  p->out = seq_tensor(out.out, args.q_format);
  set_lse(out.lse, args.q_format, &p->lse, &p->lse_stride_b, &p->lse_stride_h, &p->lse_stride_s);
  p->max_logit = args.return_max_logit && out.max_logit.defined() ? static_cast<float*>(out.max_logit.data) : nullptr;
  return Status::Ok();
}

Status make_bwd_params(const BwdArgs& args, const BwdInputs& in, const CheckedProblem& checked, const BwdOutputs& out,
                       BwdParams* p) {
  if (!checked.valid()) return Status::Invalid("make_bwd_params: the call was not validated by check_bwd");
  const Problem& prob = checked.get();
  *p = BwdParams{};
  FwdParams& f = p->fwd;
  fill_common(args.fwd, in.fwd, prob, &f);
  // Backward reads the saved rng_state even when it was drawn for p == 0.
  f.dropout.rng_state = static_cast<const int64_t*>(in.fwd.rng_state.data);
  f.out = seq_tensor(in.out, args.fwd.q_format);
  set_lse(in.lse, args.fwd.q_format, &f.lse, &f.lse_stride_b, &f.lse_stride_h, &f.lse_stride_s);
  p->dout = seq_tensor(in.dout, args.fwd.q_format);
  p->dq = seq_tensor(out.dq, args.fwd.q_format);
  p->dk = seq_tensor(out.dk, args.fwd.kv_format);
  p->dv = seq_tensor(out.dv, args.fwd.kv_format);
  p->deterministic = args.deterministic;
  if (args.need_dbias && out.dbias.defined() && out.dbias.ndim == 4) {
    p->dbias.data = out.dbias.data;
    for (int i = 0; i < 4; ++i) p->dbias.sizes[i] = out.dbias.sizes[i];
    p->dbias.stride_b = out.dbias.strides[0];
    p->dbias.stride_h = out.dbias.strides[1];
    p->dbias.stride_i = out.dbias.strides[2];
    p->dbias.stride_j = out.dbias.strides[3];
  }
  if (args.fwd.softmax_type == SoftmaxType::kLearnable) {
    p->d_softmax_offset = static_cast<float*>(out.d_softmax_offset.data);
  }
  return Status::Ok();
}

}  // namespace fusedattn
