// Division by a divisor fixed for a whole launch (the GQA group, the KV head count, the split
// count, the page size), as a multiply-high, an add and a shift: the decode kernel's prologue
// takes about a dozen such quotients and remainders, and as integer divisions by a runtime value
// each cost ~20 dependent instructions ahead of the first copy. Round-up method of Granlund and
// Montgomery ("Division by invariant integers using multiplication", 1994): with l = ceil(log2 d)
// and m = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(n, m) + n) >> l for every 32-bit n (the
// sum is taken in 64 bits). Host- and device-callable; tests/cpp/test_decode_fastdiv.cc checks it
// against plain division.
#pragma once

#include <cstdint>

#include "fusedattn/host_device.h"

namespace fusedattn {
namespace decode {

struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;

  FastDiv() = default;
  // divisor >= 1 (the plan rules out zero group, head count, split count and page size).
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < divisor) ++shift;
    mul = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor) / divisor + 1);
  }

  FUSEDATTN_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * mul) >> 32);
#endif
    return static_cast<uint32_t>((uint64_t{hi} + n) >> shift);
  }
  FUSEDATTN_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

}  // namespace decode
}  // namespace fusedattn
