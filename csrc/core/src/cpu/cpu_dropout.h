// Dropout of the CPU engine: the keep decision of element (b, h, i, j) is
// philox.h's counter-based draw, so backward regenerates the forward's mask
// and the CPU and CUDA engines agree. One Philox call serves four keys.
#pragma once

#include <cstdint>

#include "fusedattn/params.h"
#include "fusedattn/philox.h"

namespace fusedattn {
namespace cpu {

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

  // f[c] = keep(i, j0 + c) ? keep_scale : 0 for c in [0, ncols); j0 and ncols multiples of 4.
  void row_factors(int64_t bh, int64_t i, int64_t j0, int ncols, A* __restrict f) const {
    for (int c = 0; c < ncols; c += 4) {
      const Philox4 r = dropout_draws(seed, offset, bh, i, (j0 + c) >> 2);
      for (int k = 0; k < 4; ++k) f[c + k] = r.x[k] >= threshold ? keep_scale : static_cast<A>(0);
    }
  }

  // s[c] *= factor(i, j0 + c), same conditions.
  void apply_row(int64_t bh, int64_t i, int64_t j0, int ncols, A* __restrict s) const {
    for (int c = 0; c < ncols; c += 4) {
      const Philox4 r = dropout_draws(seed, offset, bh, i, (j0 + c) >> 2);
      for (int k = 0; k < 4; ++k) s[c + k] = r.x[k] >= threshold ? s[c + k] * keep_scale : static_cast<A>(0);
    }
  }
};

}  // namespace cpu
}  // namespace fusedattn
