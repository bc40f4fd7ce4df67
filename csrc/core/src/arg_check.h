// Argument rules the attention call (check.cc) and the KV-cache append
// (kv_cache.cc) share, so that each is stated once.
#pragma once

#include <cstdint>

#include "fusedattn/cat.h"
#include "fusedattn/types.h"

namespace fusedattn {

// Every engine reads a 1-D argument (cu_seqlens, lengths, offsets,
// rng_state) as a dense array: a strided or expanded view would be read as if
// it were contiguous.
inline Status check_dense_1d(const TensorRef& t, const char* name) {
  if (t.defined() && t.ndim == 1 && t.sizes[0] > 1 && t.strides[0] != 1) {
    return Status::Invalid(cat(name, " must be contiguous (a 1-D tensor of stride 1); got stride ", t.strides[0]));
  }
  return Status::Ok();
}

// Head dims the attention engines take; 0 (no features) is an empty problem.
inline Status check_head_dims(int64_t d_qk, int64_t d_v) {
  constexpr int64_t kMaxHeadDim = 256;
  for (int64_t d : {d_qk, d_v}) {
    if (d < 0 || (d > 0 && (d % 8 != 0 || d > kMaxHeadDim))) {
      return Status::Unsupported(cat("head dims must be multiples of 8 in [8, ", kMaxHeadDim, "] (or 0); got d_qk=",
                                     d_qk, ", d_v=", d_v));
    }
  }
  return Status::Ok();
}

}  // namespace fusedattn
