// Visibility of keys to queries inside one sequence: the sliding window
// (causal is window_right = 0) aligned to the top-left or bottom-right
// diagonal, the sequence lengths, and an optional explicit boolean mask.
// Windows give each row a contiguous key range, which lets the engine skip
// whole key tiles and apply the window to a tile with two fills per row.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu_simd.h"
#include "fusedattn/params.h"

namespace fusedattn {
namespace cpu {

struct Window {
  int64_t len_q = 0, len_kv = 0, diag = 0;
  int64_t wl = -1, wr = -1;  // < 0: unbounded

  static Window make(const MaskParams& m, int64_t len_q, int64_t len_kv) {
    Window w;
    w.len_q = len_q;
    w.len_kv = len_kv;
    w.diag = m.bottom_right ? len_kv - len_q : 0;
    // A window wider than both sequences constrains nothing; dropping it also
    // keeps i + diag +- w far from overflow.
    const int64_t reach = len_q + len_kv + 1;
    w.wl = m.window_left >= 0 && m.window_left <= reach ? m.window_left : -1;
    w.wr = m.window_right >= 0 && m.window_right <= reach ? m.window_right : -1;
    return w;
  }

  // Keys visible to row i by window and length: [key_lo(i), key_hi(i)), possibly empty.
  int64_t key_lo(int64_t i) const { return wl >= 0 ? std::min(std::max<int64_t>(0, i + diag - wl), len_kv) : 0; }
  int64_t key_hi(int64_t i) const { return wr >= 0 ? std::max<int64_t>(0, std::min(len_kv, i + diag + wr + 1)) : len_kv; }
  // Rows that see key j: [row_lo(j), row_hi(j)).
  int64_t row_lo(int64_t j) const { return wr >= 0 ? std::min(std::max<int64_t>(0, j - diag - wr), len_q) : 0; }
  int64_t row_hi(int64_t j) const { return wl >= 0 ? std::max<int64_t>(0, std::min(len_q, j - diag + wl + 1)) : len_q; }
};

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

// Whether every (row, key) of the tile is visible, so masking can be skipped.
inline bool tile_all_visible(const Window& w, bool explicit_mask, int64_t i0, int nr, int64_t j0, int ncols) {
  return !explicit_mask && w.key_lo(i0 + nr - 1) <= j0 && w.key_hi(i0) >= j0 + ncols;
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
