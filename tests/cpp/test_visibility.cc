// fusedattn/visibility.h against the rule written out element by element: the ranges, the tile
// tests and the offset form every engine uses agree with it for every small shape, window and
// diagonal, in int and int64_t; clamp_window never changes what is visible.
#include <cstdint>

#include "attn_test_util.h"
#include "fusedattn/visibility.h"

namespace {

using namespace fusedattn;

// The rule as params.h / visibility.h state it.
bool rule(int64_t i, int64_t j, int64_t lq, int64_t lk, int64_t wl, int64_t wr, bool br) {
  const int64_t diag = br ? lk - lq : 0;
  return i >= 0 && i < lq && j >= 0 && j < lk && (wl < 0 || j >= i + diag - wl) && (wr < 0 || j <= i + diag + wr);
}

template <class I>
void check_shape(int64_t lq, int64_t lk, int64_t wl, int64_t wr, bool br) {
  const auto v = Visibility<I>::make(static_cast<I>(wl), static_cast<I>(wr), br, static_cast<I>(lq), static_cast<I>(lk));
  for (int64_t i = 0; i < lq; ++i) {
    int64_t lo = lk, hi = 0;
    for (int64_t j = 0; j < lk; ++j) {
      const bool want = rule(i, j, lq, lk, wl, wr, br);
      CHECK_MSG(v.visible(static_cast<I>(i), static_cast<I>(j)) == want, "lq %lld lk %lld w (%lld, %lld) br %d i %lld j %lld",
                (long long)lq, (long long)lk, (long long)wl, (long long)wr, br, (long long)i, (long long)j);
      const int64_t off = j - i;
      CHECK((off >= v.offset_lo() && off <= v.offset_hi()) == want);
      if (want) {
        lo = std::min(lo, j);
        hi = std::max(hi, j + 1);
      }
    }
    if (hi > lo) {  // visible keys form one interval
      CHECK(v.key_lo(static_cast<I>(i)) == lo && v.key_hi(static_cast<I>(i)) == hi);
    } else {
      CHECK(v.key_hi(static_cast<I>(i)) <= v.key_lo(static_cast<I>(i)));
    }
  }
  for (int64_t j = 0; j < lk; ++j) {
    int64_t lo = lq, hi = 0;
    for (int64_t i = 0; i < lq; ++i) {
      if (rule(i, j, lq, lk, wl, wr, br)) {
        lo = std::min(lo, i);
        hi = std::max(hi, i + 1);
      }
    }
    if (hi > lo) {
      CHECK(v.row_lo(static_cast<I>(j)) == lo && v.row_hi(static_cast<I>(j)) == hi);
    } else {
      CHECK(v.row_hi(static_cast<I>(j)) <= v.row_lo(static_cast<I>(j)));
    }
  }
  // Tiles, including ones that reach past the sequence.
  for (int64_t i0 = 0; i0 < lq + 2; i0 += 2)
    for (int64_t nr = 1; nr <= 3; ++nr)
      for (int64_t j0 = 0; j0 < lk + 2; j0 += 2)
        for (int64_t nc = 1; nc <= 3; ++nc) {
          bool all = true;
          for (int64_t i = i0; i < i0 + nr; ++i)
            for (int64_t j = j0; j < j0 + nc; ++j) all = all && rule(i, j, lq, lk, wl, wr, br);
          CHECK(v.tile_all_visible(static_cast<I>(i0), static_cast<I>(nr), static_cast<I>(j0), static_cast<I>(nc)) ==
                all);
        }
}

void test_rule() {
  for (int64_t lq = 0; lq <= 6; ++lq)
    for (int64_t lk = 0; lk <= 6; ++lk)
      for (int64_t wl = -1; wl <= 7; ++wl)
        for (int64_t wr = -1; wr <= 7; ++wr)
          for (bool br : {false, true}) {
            check_shape<int64_t>(lq, lk, wl, wr, br);
            check_shape<int>(lq, lk, wl, wr, br);
          }
}

// A side wider than s_q + s_kv becomes -1 without changing any visible pair of a sequence that fits.
void test_clamp() {
  for (int64_t lq = 0; lq <= 5; ++lq)
    for (int64_t lk = 0; lk <= 5; ++lk)
      for (int64_t w = -1; w <= 14; ++w) {
        const int64_t reach = lq + lk;
        const int64_t c = clamp_window(w, reach);
        CHECK(c == (w > reach ? -1 : w));
        for (bool br : {false, true})
          for (int64_t i = 0; i < lq; ++i)
            for (int64_t j = 0; j < lk; ++j) {
              CHECK(rule(i, j, lq, lk, w, w, br) == rule(i, j, lq, lk, c, c, br));
              CHECK(rule(i, j, lq, lk, w, 0, br) == rule(i, j, lq, lk, c, 0, br));
            }
      }
  CHECK(clamp_window(int64_t{1} << 62, 100) == -1);
}

void test_alibi_distance() {
  const auto v = Visibility<int64_t>::make(-1, -1, true, 3, 7);  // diag 4
  CHECK(v.alibi_distance(0, 4) == 0 && v.alibi_distance(0, 0) == 4 && v.alibi_distance(2, 6) == 0 &&
        v.alibi_distance(2, 0) == 6);
}

}  // namespace

int main() {
  test_rule();
  test_clamp();
  test_alibi_distance();
  return fa_test::finish("test_visibility");
}
