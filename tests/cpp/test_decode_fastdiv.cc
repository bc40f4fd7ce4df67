// The decode kernels' division by a launch-wide divisor (csrc/cuda/decode/fastdiv.h) against plain
// integer division: every divisor up to 4096 with the numerators around each multiple and at the
// ends of the 31-bit range the kernels use, and random pairs over the full 32-bit range.
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <random>

#include "../../csrc/cuda/decode/fastdiv.h"
#include "attn_test_util.h"

namespace {

using fusedattn::decode::FastDiv;

bool agrees(const FastDiv& f, uint32_t n) { return f.div(n) == n / f.d && f.mod(n) == n % f.d; }

void test_small_divisors() {
  int bad = 0;
  for (uint32_t d = 1; d <= 4096; ++d) {
    const FastDiv f(d);
    for (uint32_t n = 0; n < 4 * d + 8; ++n) bad += !agrees(f, n);
    for (uint32_t k : {1u, 2u, 1000u, (0x7fffffffu / d)}) {
      for (uint32_t n : {k * d - 1, k * d, k * d + 1}) bad += !agrees(f, n);
    }
    for (uint32_t n : {0x7ffffffeu, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu}) bad += !agrees(f, n);
  }
  CHECK_MSG(bad == 0, "%d mismatches for divisors 1..4096", bad);
}

void test_random() {
  std::mt19937_64 rng(7);
  int bad = 0;
  for (int t = 0; t < 2000000; ++t) {
    const uint32_t d = static_cast<uint32_t>(rng() >> 33) + 1;  // 1 .. 2^31
    const uint32_t n = static_cast<uint32_t>(rng());
    bad += !agrees(FastDiv(d), n);
  }
  CHECK_MSG(bad == 0, "%d mismatches over random pairs", bad);
}

}  // namespace

int main() {
  test_small_divisors();
  test_random();
  return fa_test::finish("test_decode_fastdiv");
}
