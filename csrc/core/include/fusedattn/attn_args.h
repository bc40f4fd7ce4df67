// The public contract of one attention call, in the CUTLASS order:
//   Args + Inputs  --check_fwd-->  Problem  --output shapes-->  caller allocates
//   --make_fwd_params-->  FwdParams  --run_fwd-->  results.
// The binding fills FwdArgs/FwdInputs from the operator's arguments and never
// interprets them itself, so every rule lives here once.
#pragma once

#include "fusedattn/types.h"

namespace fusedattn {

// Every non-tensor setting of a forward call. Mirrors the Python FwdArgs (the binding fills it by
// name from the operator arguments of csrc/binding/op_spec.h).
struct FwdArgs {
  Format q_format = Format::kBSHD;
  Format kv_format = Format::kBSHD;
  MaskType mask_type = MaskType::kNoMask;
  int64_t window_left = -1;   // -1: unbounded
  int64_t window_right = -1;  // -1: unbounded
  int bottom_right_diagonal = -1;  // -1: the mask type's default (TransformerEngine's rule)
  SoftmaxType softmax_type = SoftmaxType::kVanilla;
  double scale = 1.0;
  double softcap = 0.0;  // > 0: logits capped to (-softcap, softcap) (params.h's FwdParams::softcap)
  double dropout_p = 0.0;
  int64_t max_seqlen_q = -1;   // thd only; -1: not given
  int64_t max_seqlen_kv = -1;
  bool return_max_logit = false;
};

struct BwdArgs {
  FwdArgs fwd;
  bool need_dbias = false;
  // Sum dQ, a broadcast dbias and d_softmax_offset in a fixed order, so equal
  // inputs give bitwise-equal gradients (the binding sets it from
  // torch.use_deterministic_algorithms). The CPU engine always is.
  bool deterministic = false;
};

// The tensors of a forward call. Optional ones are absent (ndim == -1).
struct FwdInputs {
  TensorRef q, k, v;
  TensorRef bias;            // post-scale bias [b|1, h|1, s_q|1, s_kv], q's dtype
  TensorRef softmax_offset;  // learnable softmax: fp32 [h_q]
  TensorRef attn_mask;       // arbitrary mask: bool, 4-D, broadcastable to [b, h_q, s_q, s_kv]; true = masked out
  TensorRef alibi_slopes;    // fp32 [h_q] or [b, h_q]
  TensorRef cu_seqlens_q, cu_seqlens_kv;                // int32 [b + 1]
  TensorRef cu_seqlens_q_padded, cu_seqlens_kv_padded;  // int32 [b + 1], thd only
  TensorRef rng_state;       // int64 [2] (seed, offset); required when dropout_p > 0
  // KV cache: with a page table, k and v are page pools [num_pages, page_size,
  // h_kv, d] and sequence b's key t lives in page page_table[b, t / page_size],
  // slot t % page_size. A non-paged cache [max_batch, max_seqlen, h_kv, d] is
  // the case page_size = max_seqlen with page_table = batch indices [b, 1].
  TensorRef page_table;      // int32 [b, max_pages_per_seq]
};

struct BwdInputs {
  FwdInputs fwd;
  TensorRef dout, out, lse;
};

// Problem dimensions derived from the inputs. For bshd/sbhd, s_q/s_kv are the
// tensors' sequence dims. For thd they are max_seqlen when given, else the
// token counts (an upper bound that needs no host synchronisation).
struct Problem {
  int64_t b = 0, s_q = 0, s_kv = 0, h_q = 0, h_kv = 0, d_qk = 0, d_v = 0;
  int64_t t_q = 0, t_kv = 0;  // thd token dims (0 otherwise)
  DType dtype = DType::kOther;
  DeviceType device = DeviceType::kCPU;
  BiasType bias_type = BiasType::kNoBias;
};

struct OutputShape {
  int ndim = 0;
  int64_t sizes[4] = {};
  DType dtype = DType::kOther;
};

struct FwdOutputShapes {
  OutputShape out;        // q's format with d_v, contiguous
  OutputShape lse;        // fp32: [b, h_q, s_q]; thd: [h_q, t_q]
  OutputShape max_logit;  // fp32 [h_q], or [0] when not asked
};

struct BwdOutputShapes {
  OutputShape dq, dk, dv;     // contiguous in q's / kv's format
  OutputShape dbias;          // bias's shape and dtype, or [0]
  OutputShape d_softmax_offset;  // fp32 [h_q] for the learnable softmax, or [0]
};

struct FwdOutputs {
  TensorRef out, lse, max_logit;
};

struct BwdOutputs {
  TensorRef dq, dk, dv, dbias, d_softmax_offset;
};

}  // namespace fusedattn
