// Visibility on the CPU: fusedattn/visibility.h's rule per sequence (Window), the key / row ranges a
// tile of rows / keys touches (windows give each row a contiguous key range, which lets the engine
// skip whole key tiles and apply the window to a tile with two fills per row), and the tile masking.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu_simd.h"
#include "fusedattn/params.h"
#include "fusedattn/visibility.h"

namespace fusedattn {
namespace cpu {

using Window = Visibility<int64_t>;

inline Window window_of(const MaskParams& m, int64_t len_q, int64_t len_kv) {
  return Window::make(m.window_left, m.window_right, m.bottom_right, len_q, len_kv);
}

// Key range [lo, hi) seen by any row of [i0, i1) (i1 > i0); lo/hi are monotone in i.
inline void keys_for_rows(const Window& w, int64_t i0, int64_t i1, int64_t* lo, int64_t* hi) {
  *lo = w.key_lo(i0);
  *hi = w.key_hi(i1 - 1);
}
// Row range [lo, hi) that sees any key of [j0, j1) (j1 > j0).
inline void rows_for_keys(const Window& w, int64_t j0, int64_t j1, int64_t* lo, int64_t* hi) {
  *lo = w.row_lo(j0);
  *hi = w.row_hi(j1 - 1);
}

// Sets the invisible entries of the logits tile S (rows i0.., keys j0..,
// ncols columns, row stride ld) to -inf. Columns past len_kv count as
// invisible. `mask` is the explicit mask (data null when absent) of (b, h).
template <class A>
void mask_tile(const Window& w, const PairTensor& mask, int64_t b, int64_t h, int64_t i0, int nr, int64_t j0,
               int ncols, A* S, int64_t ld) {
  const A ninf = neg_inf<A>();
  const uint8_t* mbase =
      mask.data ? static_cast<const uint8_t*>(mask.data) + b * mask.stride_b + h * mask.stride_h : nullptr;
  for (int r = 0; r < nr; ++r) {
    const int64_t i = i0 + r;
    A* s = S + r * ld;
    const int lo = static_cast<int>(std::min<int64_t>(std::max<int64_t>(w.key_lo(i) - j0, 0), ncols));
    const int hi = static_cast<int>(std::min<int64_t>(std::max<int64_t>(w.key_hi(i) - j0, lo), ncols));
    for (int c = 0; c < lo; ++c) s[c] = ninf;
    for (int c = hi; c < ncols; ++c) s[c] = ninf;
    if (mbase) {
      const uint8_t* mrow = mbase + i * mask.stride_i + j0 * mask.stride_j;
      for (int c = lo; c < hi; ++c) {
        if (mrow[c * mask.stride_j]) s[c] = ninf;
      }
    }
  }
}

}  // namespace cpu
}  // namespace fusedattn
