// Logit scaling and the additive terms: s = scale * q.k + bias, with bias a
// post-scale bias tensor (q's dtype, broadcast dims of stride 0) or ALiBi,
// -slope * |j - i - diag| on the mask's diagonal (visibility.h's alibi_distance).
#pragma once

#include <cstdint>
#include <cstdlib>

#include "cpu_convert.h"
#include "cpu_mask.h"
#include "cpu_simd.h"
#include "fusedattn/params.h"

namespace fusedattn {
namespace cpu {

// S holds q.k for rows i0.. and keys j0.. (ncols columns, nj <= ncols of
// them real keys); on return the logits are pending * S with S = scale * q.k
// + bias. Without a bias and with scale > 0 the scaling is left pending
// (returned), so the softmax applies it in the FMA before its exp instead of
// a pass of its own; positive scaling commutes with the row max and masking.
// Columns >= nj are only scaled (they are masked afterwards).
template <class T, class A>
A scale_and_bias_tile(const BiasParams& bp, const Window& w, int64_t b, int64_t h, int64_t i0, int nr, int64_t j0,
                         int nj, int ncols, A scale, A* S, int64_t ld) {
  if (bp.type == BiasType::kPostScaleBias && bp.bias.data != nullptr) {
    const PairTensor& bt = bp.bias;
    const T* base = static_cast<const T*>(bt.data) + b * bt.stride_b + h * bt.stride_h + j0 * bt.stride_j;
    for (int r = 0; r < nr; ++r) {
      A* s = S + r * ld;
      const T* brow = base + (i0 + r) * bt.stride_i;
      for (int c = 0; c < nj; ++c) s[c] = s[c] * scale + static_cast<A>(Elem<T>::load(brow + c * bt.stride_j));
      for (int c = nj; c < ncols; ++c) s[c] *= scale;
    }
    return 1;
  }
  if (bp.type == BiasType::kAlibi && bp.alibi_slopes != nullptr) {
    const A slope = static_cast<A>(bp.alibi_slopes[b * bp.alibi_stride_b + h * bp.alibi_stride_h]);
    for (int r = 0; r < nr; ++r) {
      A* s = S + r * ld;
      for (int c = 0; c < ncols; ++c) s[c] = s[c] * scale - slope * static_cast<A>(w.alibi_distance(i0 + r, j0 + c));
    }
    return 1;
  }
  if (scale > 0) return scale;
  for (int r = 0; r < nr; ++r) row_scale(S + r * ld, ncols, scale);
  return 1;
}

}  // namespace cpu
}  // namespace fusedattn
