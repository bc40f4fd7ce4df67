// Engine-facing parameters: raw pointers and 64-bit strides (in elements) per
// named dimension, filled in exactly one place (make_fwd_params /
// make_bwd_params in params.cc). Engines read only these structs.
#pragma once

#include <cstdint>

#include "fusedattn/attn_args.h"

namespace fusedattn {

// A [b, s, h, d]-like tensor addressed by named strides. For thd the token
// dim plays the role of s and stride_b is 0: a row's token index is the
// sequence's start offset plus its position in the sequence.
struct SeqTensor {
  void* data = nullptr;
  int64_t stride_b = 0, stride_s = 0, stride_h = 0, stride_d = 0;
};

// A [b, h, s_q, s_kv]-like tensor (bias, boolean mask, dbias); broadcast dims
// have stride 0 on inputs. `sizes` are the tensor's own sizes (needed to
// reduce dbias over broadcast dims).
struct PairTensor {
  void* data = nullptr;
  int64_t sizes[4] = {};
  int64_t stride_b = 0, stride_h = 0, stride_i = 0, stride_j = 0;
};

// Per-sequence extents. A sequence b covers query positions [0, len_q(b)) and
// key positions [0, len_kv(b)); its rows start at token start_q(b) of the
// token dim (0 for bshd/sbhd).
struct SeqlenParams {
  const int32_t* cu_seqlens_q = nullptr;   // null: every sequence has length s_q
  const int32_t* cu_seqlens_kv = nullptr;  // null: every sequence has length s_kv
  const int32_t* offsets_q = nullptr;      // thd token offsets (cu_seqlens_q_padded or cu_seqlens_q)
  const int32_t* offsets_kv = nullptr;
  bool q_is_thd = false, kv_is_thd = false;
};

// Visibility of keys to queries: fusedattn/visibility.h's rule, with these windows (already clamped
// there, causal mask types as window_right = 0), the diagonal they are aligned to, and an optional
// explicit mask (true = masked out).
struct MaskParams {
  int64_t window_left = -1, window_right = -1;
  bool bottom_right = false;
  PairTensor mask;  // bool (1 byte per element); data null when absent
};

// Post-scale bias and ALiBi: added to scale * q.k before the softmax.
// ALiBi adds -slope * |j - i - diag| (visibility.h's alibi_distance).
struct BiasParams {
  BiasType type = BiasType::kNoBias;
  PairTensor bias;  // q's dtype
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride_b = 0, alibi_stride_h = 1;
};

// Off-by-one and learnable softmax add one sink logit per row that takes part
// in the normaliser and contributes no value: 0 for off-by-one, offset[h] for
// learnable.
struct SoftmaxParams {
  SoftmaxType type = SoftmaxType::kVanilla;
  const float* offset = nullptr;  // [h_q], learnable only
};

// Counter-based dropout (see philox.h). Elements are dropped with probability
// p and kept ones scaled by 1 / (1 - p).
struct DropoutParams {
  float p = 0.f;
  const int64_t* rng_state = nullptr;  // (seed, offset) on the tensors' device
};

// Paged K/V (see FwdInputs::page_table). When page_table is set, k and v's
// stride_b is the page stride and stride_s the slot stride: key t of sequence
// b is at page page_table[b * stride_b + t / page_size], slot t % page_size.
struct PagedKV {
  const int32_t* page_table = nullptr;
  int64_t stride_b = 0;
  int64_t page_size = 0;
  int64_t max_pages = 0;
  int64_t num_pages = 0;
};

struct FwdParams {
  Problem prob;
  Format q_format = Format::kBSHD, kv_format = Format::kBSHD;
  SeqTensor q, k, v, out;
  // softmax log-sum-exp, fp32, addressed like a row: (b, h, token)
  float* lse = nullptr;
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;
  float* max_logit = nullptr;  // [h_q] or null
  SeqlenParams seqlens;
  PagedKV paged;
  MaskParams mask;
  BiasParams bias;
  SoftmaxParams softmax;
  DropoutParams dropout;
  // Kept in double: the fp64 engines compute in double, the others convert once.
  double scale = 1.0;
  // Logit soft-capping (Gemma 2, flash-attn's softcap), 0: off. As in flash-attn, the cap applies
  // to the scaled scores and comes before the bias, ALiBi and the masks:
  //   s = softcap * tanh(scale * q.k / softcap) + bias,  ds/d(scale q.k) = 1 - tanh^2(.)
  double softcap = 0.0;
  // Where the engine writes {0, 0}, the op's rng_state output of a call without dropout, or null.
  // The CUDA engine takes it so that no separate fill kernel precedes the attention kernels (a
  // decode step is a few microseconds; the decode kernel writes it itself).
  int64_t* rng_out_zero = nullptr;
};

struct BwdParams {
  FwdParams fwd;     // q, k, v, out, lse, mask, bias, ... as in the forward
  SeqTensor dout;    // may have any strides
  SeqTensor dq, dk, dv;
  PairTensor dbias;  // bias's own shape, contiguous; data null when not needed
  float* d_softmax_offset = nullptr;  // [h_q] fp32, learnable only
  bool deterministic = false;         // BwdArgs::deterministic
};

// The default diagonal alignment of a mask type (TransformerEngine's
// bottom_right_diagonal rule) and whether it is causal.
bool mask_is_causal(MaskType m);
bool mask_has_padding(MaskType m);
bool mask_default_bottom_right(MaskType m);

}  // namespace fusedattn
