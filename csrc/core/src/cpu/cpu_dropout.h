// Dropout of the CPU engine: the keep decision of element (b, h, i, j) is
// philox.h's counter-based draw, so backward regenerates the forward's mask
// and the CPU and CUDA engines agree. One Philox call serves four keys; the
// calls of a row run side by side in the lanes of a vector (the counters
// differ only in the key group), which is about 4x cheaper than one by one.
#pragma once

#include <cstdint>

#include "cpu_isa.h"
#include "cpu_simd.h"
#include "fusedattn/params.h"
#include "fusedattn/philox.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {

template <class A>
struct Dropout {
  bool on = false;
  int64_t seed = 0, offset = 0;
  uint32_t threshold = 0;
  A keep_scale = 1;  // 1 / (1 - p)

  static Dropout make(const DropoutParams& d) {
    Dropout r;
    if (!(d.p > 0.f) || d.rng_state == nullptr) return r;
    r.on = true;
    r.seed = d.rng_state[0];
    r.offset = d.rng_state[1];
    r.threshold = dropout_threshold(d.p);
    r.keep_scale = d.p < 1.f ? static_cast<A>(1) / (static_cast<A>(1) - static_cast<A>(d.p)) : static_cast<A>(0);
    return r;
  }

  // x[c] = the 32-bit draw of key j0 + c of row i, for c in [0, ncols); j0 and
  // ncols multiples of 4. Same values as dropout_draws (philox.h), computed
  // for kLanes key groups at a time in 64-bit vector lanes.
  void row_draws(int64_t bh, int64_t i, int64_t j0, int ncols, uint32_t* __restrict x) const {
    typedef uint64_t U __attribute__((vector_size(kVecBytes)));
    constexpr int kLanes = kVecBytes / 8;
    const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
    const uint32_t key0 = static_cast<uint32_t>(s);
    const uint32_t key1 = static_cast<uint32_t>(s >> 32) ^ static_cast<uint32_t>(o >> 32);
    const U lo32 = U{} + 0xffffffffull;
    const int groups = ncols / 4;
    const uint32_t g0 = static_cast<uint32_t>(j0 >> 2);
    for (int gb = 0; gb < groups; gb += kLanes) {
      U c0, c1 = U{} + static_cast<uint64_t>(static_cast<uint32_t>(i)),
            c2 = U{} + static_cast<uint64_t>(static_cast<uint32_t>(bh)), c3 = U{} + (o & 0xffffffffull);
      for (int l = 0; l < kLanes; ++l) c0[l] = static_cast<uint32_t>(g0 + gb + l);
      uint32_t k0 = key0, k1 = key1;
      for (int round = 0; round < 10; ++round) {
        const U p0 = c0 * 0xD2511F53ull;  // operands < 2^32: exact 64-bit products
        const U p1 = c2 * 0xCD9E8D57ull;
        const U n0 = (p1 >> 32) ^ c1 ^ static_cast<uint64_t>(k0);
        const U n2 = (p0 >> 32) ^ c3 ^ static_cast<uint64_t>(k1);
        c1 = p1 & lo32;
        c3 = p0 & lo32;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      const int n = groups - gb < kLanes ? groups - gb : kLanes;
      uint32_t* dst = x + 4 * gb;
      for (int l = 0; l < n; ++l) {
        dst[4 * l + 0] = static_cast<uint32_t>(c0[l]);
        dst[4 * l + 1] = static_cast<uint32_t>(c1[l]);
        dst[4 * l + 2] = static_cast<uint32_t>(c2[l]);
        dst[4 * l + 3] = static_cast<uint32_t>(c3[l]);
      }
    }
  }

  // f[c] = keep(i, j0 + c) ? keep_scale : 0, same conditions as row_draws.
  void row_factors(int64_t bh, int64_t i, int64_t j0, int ncols, A* __restrict f) const {
    uint32_t x[kMaxCols];
    for (int c0 = 0; c0 < ncols; c0 += kMaxCols) {
      const int n = ncols - c0 < kMaxCols ? ncols - c0 : kMaxCols;
      row_draws(bh, i, j0 + c0, n, x);
      for (int c = 0; c < n; ++c) f[c0 + c] = x[c] >= threshold ? keep_scale : static_cast<A>(0);
    }
  }

  // s[c] *= factor(i, j0 + c), same conditions.
  void apply_row(int64_t bh, int64_t i, int64_t j0, int ncols, A* __restrict s) const {
    uint32_t x[kMaxCols];
    for (int c0 = 0; c0 < ncols; c0 += kMaxCols) {
      const int n = ncols - c0 < kMaxCols ? ncols - c0 : kMaxCols;
      row_draws(bh, i, j0 + c0, n, x);
      for (int c = 0; c < n; ++c) s[c0 + c] = x[c] >= threshold ? s[c0 + c] * keep_scale : static_cast<A>(0);
    }
  }

  static constexpr int kMaxCols = 256;
};

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
