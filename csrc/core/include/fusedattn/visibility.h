// The one visibility rule, shared by every engine (the CPU engine with I = int64_t, the CUDA kernels
// with I = int): key j of a sequence with lengths (len_q, len_kv) is visible to its query i iff
//   i < len_q,  j < len_kv,
//   wl < 0  or  j >= i + diag - wl,      wr < 0  or  j <= i + diag + wr,
//   diag = bottom_right ? len_kv - len_q : 0,
// and, with an explicit boolean mask, !mask[b, h, i, j] (checked apart). Causal mask types arrive as
// wr = 0 (make_fwd_params). ALiBi's distance |j - i - diag| uses the same diagonal.
// Windows are clamped once, in make_fwd_params (clamp_window): a side wider than s_q + s_kv
// constrains nothing and becomes -1. Hence, when s_q + s_kv < kMaxPositionSum32, every expression
// below stays inside int32: kernels that compute positions in int state that bound as a limit.
#pragma once

#include <cstdint>

#include "fusedattn/host_device.h"

namespace fusedattn {

constexpr int64_t kMaxPositionSum32 = int64_t{1} << 30;

// A window side after the clamp: -1 (unbounded) when negative or wider than `reach` (s_q + s_kv, at
// least len_q + len_kv of any sequence: no |j - i - diag| of a sequence exceeds it).
FUSEDATTN_HD int64_t clamp_window(int64_t w, int64_t reach) { return w < 0 || w > reach ? -1 : w; }

template <class I>
struct Visibility {
  I len_q, len_kv, diag, wl, wr;

  FUSEDATTN_HD static Visibility make(I wl, I wr, bool bottom_right, I len_q, I len_kv) {
    return Visibility{len_q, len_kv, bottom_right ? len_kv - len_q : I(0), wl, wr};
  }

  FUSEDATTN_HD bool in_window(I i, I j) const {
    return (wl < 0 || j >= i + diag - wl) && (wr < 0 || j <= i + diag + wr);
  }
  // Key j for row i by key length and window (the row's own bound i < len_q not checked).
  FUSEDATTN_HD bool key_visible(I i, I j) const { return j < len_kv && in_window(i, j); }
  FUSEDATTN_HD bool visible(I i, I j) const { return i < len_q && key_visible(i, j); }

  // Keys row i sees: [key_lo(i), key_hi(i)) with key_lo >= 0 and key_hi <= len_kv; empty when
  // key_hi <= key_lo (either may then lie outside [0, len_kv]). Both grow with i.
  FUSEDATTN_HD I key_lo(I i) const { return wl >= 0 ? max0(i + diag - wl) : I(0); }
  FUSEDATTN_HD I key_hi(I i) const { return wr >= 0 ? min_of(i + diag + wr + 1, len_kv) : len_kv; }
  // Rows that see key j: [row_lo(j), row_hi(j)), row_lo >= 0, row_hi <= len_q, the same way.
  FUSEDATTN_HD I row_lo(I j) const { return wr >= 0 ? max0(j - diag - wr) : I(0); }
  FUSEDATTN_HD I row_hi(I j) const { return wl >= 0 ? min_of(j - diag + wl + 1, len_q) : len_q; }
  // The window as bounds on j - i: visible iff offset_lo() <= j - i <= offset_hi() (and j < len_kv).
  // Unbounded sides are +-2^30 (I = int) or +-2^62: far outside any j - i.
  FUSEDATTN_HD I offset_lo() const { return wl >= 0 ? diag - wl : -kFar; }
  FUSEDATTN_HD I offset_hi() const { return wr >= 0 ? diag + wr : kFar; }

  // Whether keys [j0, j0 + nc) (j0 >= 0) are all visible to every row of [i0, i1] by key length and
  // window: the first row bounds them on the right, the last on the left.
  FUSEDATTN_HD bool keys_all_visible(I i0, I i1, I j0, I nc) const {
    return j0 + nc <= len_kv && (wr < 0 || j0 + nc - 1 <= i0 + diag + wr) && (wl < 0 || j0 >= i1 + diag - wl);
  }
  // Whether the whole tile [i0, i0 + nr) x [j0, j0 + nc) is visible (rows inside the sequence too).
  FUSEDATTN_HD bool tile_all_visible(I i0, I nr, I j0, I nc) const {
    return i0 + nr <= len_q && keys_all_visible(i0, i0 + nr - 1, j0, nc);
  }

  FUSEDATTN_HD I alibi_distance(I i, I j) const {
    const I d = j - i - diag;
    return d < 0 ? -d : d;
  }

 private:
  static constexpr I kFar = static_cast<I>(sizeof(I) >= 8 ? int64_t{1} << 62 : int64_t{1} << 30);
  FUSEDATTN_HD static I max0(I x) { return x > 0 ? x : I(0); }
  FUSEDATTN_HD static I min_of(I x, I y) { return x < y ? x : y; }
};

}  // namespace fusedattn
