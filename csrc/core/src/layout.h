// Internal to the core: the named dims and strides of a q/k/v-like tensor in
// its format (bshd, sbhd or thd), shared by the attention call and the
// KV-cache append.
#pragma once

#include <cstdint>

#include "fusedattn/params.h"
#include "fusedattn/types.h"

namespace fusedattn {

// thd has no batch dim: [t, h, d]; bshd and sbhd are 4-D.
inline int seq_rank(Format f) { return f == Format::kTHD ? 3 : 4; }

// Named dims of a q/k/v-like tensor; b is 0 for thd, whose s is the token dim.
struct SeqDims {
  int64_t b = 0, s = 0, h = 0, d = 0;
};

// The caller has checked t.ndim == seq_rank(f).
inline SeqDims named_dims(const TensorRef& t, Format f) {
  switch (f) {
    case Format::kBSHD: return {t.sizes[0], t.sizes[1], t.sizes[2], t.sizes[3]};
    case Format::kSBHD: return {t.sizes[1], t.sizes[0], t.sizes[2], t.sizes[3]};
    case Format::kTHD: return {0, t.sizes[0], t.sizes[1], t.sizes[2]};
  }
  return {};
}

inline SeqTensor seq_tensor(const TensorRef& t, Format f) {
  SeqTensor s;
  s.data = t.data;
  switch (f) {
    case Format::kBSHD: s.stride_b = t.strides[0]; s.stride_s = t.strides[1]; break;
    case Format::kSBHD: s.stride_b = t.strides[1]; s.stride_s = t.strides[0]; break;
    case Format::kTHD: s.stride_b = 0; s.stride_s = t.strides[0]; break;
  }
  s.stride_h = t.strides[t.ndim - 2];
  s.stride_d = t.strides[t.ndim - 1];
  return s;
}

}  // namespace fusedattn
