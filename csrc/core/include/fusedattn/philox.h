// Counter-based dropout shared by every engine: whether element (b, h, i, j)
// is kept is a pure function of (seed, offset, b, h, i, j), so backward
// regenerates the forward's mask and the CPU and CUDA engines drop exactly the
// same elements. b is the sequence index, h the query head, i and j the query
// and key positions inside the sequence (not token indices), so a problem
// drops the same elements whether it is given as bshd, sbhd or thd.
#pragma once

#include <cstdint>

#include "fusedattn/host_device.h"

namespace fusedattn {

struct Philox4 {
  uint32_t x[4];
};

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
FUSEDATTN_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Elements are dropped when their 32-bit draw is below this threshold, so the
// keep rate is 1 - threshold / 2^32 (p rounded to a multiple of 2^-32).
FUSEDATTN_HD uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// One Philox call yields the draws of four consecutive key positions
// 4*(j/4) .. 4*(j/4)+3 of a row; engines may use all four at once.
FUSEDATTN_HD Philox4 dropout_draws(int64_t seed, int64_t offset, int64_t bh, int64_t i, int64_t j_group) {
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  return philox4x32_10(static_cast<uint32_t>(j_group), static_cast<uint32_t>(i), static_cast<uint32_t>(bh),
                       static_cast<uint32_t>(o), static_cast<uint32_t>(s),
                       static_cast<uint32_t>(s >> 32) ^ static_cast<uint32_t>(o >> 32));
}

// bh = b * h_q + h.
FUSEDATTN_HD bool dropout_keep(int64_t seed, int64_t offset, int64_t bh, int64_t i, int64_t j, uint32_t threshold) {
  return dropout_draws(seed, offset, bh, i, j >> 2).x[j & 3] >= threshold;
}

}  // namespace fusedattn
