// Building blocks of the CPU engine: fp16/bf16 conversions (exhaustive and
// against a brute-force nearest-even reference), the vector exp, and the
// micro-GEMM with every row/column tail.
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "attn_test_util.h"
#include "cpu/cpu_convert.h"
#include "cpu/cpu_dropout.h"
#include "cpu/cpu_gemm.h"
#include "cpu/cpu_simd.h"

using namespace fa_test;
namespace fc = fusedattn::cpu;

namespace {

float f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Nearest-even rounding by brute force over the sorted finite values of the format.
struct NearestEven {
  std::vector<std::pair<double, uint16_t>> pos;  // non-negative finite values, ascending
  double overflow;                               // values >= this round to inf
  NearestEven(DType dt) {
    for (uint32_t b = 0; b < 0x8000u; ++b) {
      const uint16_t h = static_cast<uint16_t>(b);
      const double v = decode(dt, &h);
      if (std::isfinite(v)) pos.push_back({v, h});
    }
    std::sort(pos.begin(), pos.end());
    const double top = pos.back().first, below = pos[pos.size() - 2].first;
    overflow = top + (top - below) / 2;  // the midpoint to the next (virtual) step
  }
  uint16_t round(float f) const {
    const double a = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (a >= overflow) return sign | (pos.back().second + 1);  // inf encoding follows max finite
    auto it = std::lower_bound(pos.begin(), pos.end(), std::make_pair(a, uint16_t{0}));
    if (it == pos.end()) return sign | pos.back().second;  // above max, below the overflow midpoint
    if (it->first == a || it == pos.begin()) return sign | it->second;
    auto lo = it - 1;
    const double dl = a - lo->first, dh = it->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | it->second;
    return sign | ((lo->second & 1) ? it->second : lo->second);
  }
};

void test_half() {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double want = decode(DType::kFloat16, &h);
    const float got = fc::half_to_float(h);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else {
      CHECK_MSG(static_cast<double>(got) == want && std::signbit(got) == std::signbit(want), "half %04x", b);
      CHECK_MSG(fc::float_to_half(got) == h, "half roundtrip %04x", b);  // exact values round to themselves
    }
  }
  NearestEven ref(DType::kFloat16);
  std::mt19937 rng(7);
  std::vector<float> probes;
  // Random bit patterns over the relevant exponent range, plus midpoints and edges.
  for (int k = 0; k < 300000; ++k) {
    const uint32_t e = 90 + rng() % 60, m = rng() & 0x7fffff;
    probes.push_back(f32((rng() & 1u) << 31 | e << 23 | m));
  }
  for (uint32_t b = 0; b < 0x7c00u; ++b) {  // exact midpoints between neighbours
    const uint16_t h = static_cast<uint16_t>(b), h1 = static_cast<uint16_t>(b + 1);
    const double mid = (decode(DType::kFloat16, &h) + decode(DType::kFloat16, &h1)) / 2;
    probes.push_back(static_cast<float>(mid));
    probes.push_back(std::nextafter(static_cast<float>(mid), 0.f));
    probes.push_back(std::nextafter(static_cast<float>(mid), 1e30f));
  }
  for (float f : {0.f, -0.f, 65504.f, 65519.99f, 65520.f, 1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-30f}) probes.push_back(f);
  int bad = 0;
  for (float f : probes) {
    const uint16_t got = fc::float_to_half(f), want = ref.round(f);
    if (got != want && bad++ < 5) std::fprintf(stderr, "float_to_half(%.9g = %08x): got %04x want %04x\n", f, bits(f), got, want);
  }
  CHECK_MSG(bad == 0, "float_to_half: %d mismatches", bad);
  CHECK(fc::float_to_half(INFINITY) == 0x7c00);
  CHECK(fc::float_to_half(-INFINITY) == 0xfc00);
  CHECK((fc::float_to_half(NAN) & 0x7c00) == 0x7c00 && (fc::float_to_half(NAN) & 0x3ff) != 0);
}

void test_bf16() {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double want = decode(DType::kBFloat16, &h);
    const float got = fc::bf16_to_float(h);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == want);
      CHECK(fc::float_to_bf16(got) == h);
    }
  }
  NearestEven ref(DType::kBFloat16);
  std::mt19937 rng(9);
  int bad = 0;
  for (int k = 0; k < 300000; ++k) {
    const float f = f32((rng() & 0x7f7fffffu) | (rng() & 1u) << 31);  // finite
    const uint16_t got = fc::float_to_bf16(f), want = ref.round(f);
    if (got != want && bad++ < 5) std::fprintf(stderr, "float_to_bf16(%.9g): got %04x want %04x\n", f, got, want);
  }
  for (uint32_t hi = 0; hi < 0x7f7f; hi += 7) {  // exact ties
    const float f = f32(hi << 16 | 0x8000u);
    if (fc::float_to_bf16(f) != ref.round(f) && bad++ < 5) std::fprintf(stderr, "bf16 tie %08x\n", bits(f));
  }
  CHECK_MSG(bad == 0, "float_to_bf16: %d mismatches", bad);
  CHECK(fc::float_to_bf16(3.4e38f) == 0x7f80);  // rounds up to inf
  CHECK(std::isnan(fc::bf16_to_float(fc::float_to_bf16(NAN))));
}

void test_exp() {
  using S = fc::Simd<float>;
  double worst_ulp = 0;
  std::vector<float> xs;
  for (double x = -87.0; x <= 0.0; x += 0.00123) xs.push_back(static_cast<float>(x));
  for (float x : {0.f, -0.f, -1e-8f, -87.33f, 1.f, 10.f, 80.f}) xs.push_back(x);
  for (size_t k = 0; k < xs.size(); k += S::N) {
    float in[S::N], out[S::N];
    for (int l = 0; l < S::N; ++l) in[l] = xs[std::min(k + l, xs.size() - 1)];
    fc::vstore(out, fc::vexp(fc::vload(in)));
    for (int l = 0; l < S::N; ++l) {
      const double want = std::exp(static_cast<double>(in[l]));
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      worst_ulp = std::max(worst_ulp, std::fabs(out[l] - want) / ulp);
    }
  }
  CHECK_MSG(worst_ulp <= 2.0, "vexp worst error %.2f ulp", worst_ulp);
  float in[S::N], out[S::N];
  for (int l = 0; l < S::N; ++l) in[l] = l % 2 ? -INFINITY : -100.f;
  fc::vstore(out, fc::vexp(fc::vload(in)));
  for (int l = 0; l < S::N; ++l) CHECK(out[l] == 0.f);
}

template <class A>
void test_gemm() {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  const int W = fc::Simd<A>::N;
  for (int M : {1, 2, 3, 5, 7, 8, 13, 64}) {
    for (int nv : {1, 2, 3, 4, 5, 7, 8, 9}) {
      const int N = nv * W, K = 1 + (M * 7 + nv) % 37;
      for (int transposed = 0; transposed < 2; ++transposed)
        for (int accumulate = 0; accumulate < 2; ++accumulate) {
          std::vector<A> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * (N + 3))),
              c(static_cast<size_t>(M * (N + 5)));
          for (auto& x : a) x = static_cast<A>(u(rng));
          for (auto& x : b) x = static_cast<A>(u(rng));
          for (auto& x : c) x = static_cast<A>(u(rng));
          std::vector<A> c0 = c;
          const int64_t ars = transposed ? 1 : K, acs = transposed ? M : 1;
          if (accumulate)
            fc::gemm<A, true>(M, N, K, a.data(), ars, acs, b.data(), N + 3, c.data(), N + 5);
          else
            fc::gemm<A, false>(M, N, K, a.data(), ars, acs, b.data(), N + 3, c.data(), N + 5);
          double worst = 0;
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < N + 5; ++j) {
              double want = j < N ? (accumulate ? c0[i * (N + 5) + j] : 0.0) : c0[i * (N + 5) + j];
              if (j < N)
                for (int k = 0; k < K; ++k) want += static_cast<double>(a[i * ars + k * acs]) * b[k * (N + 3) + j];
              worst = std::max(worst, std::fabs(want - c[i * (N + 5) + j]));
            }
          CHECK_MSG(worst < (sizeof(A) == 4 ? 1e-4 : 1e-12), "gemm M=%d N=%d K=%d t=%d acc=%d: %.3g", M, N, K,
                    transposed, accumulate, worst);
        }
    }
  }
}

void test_dropout_draws() {
  std::mt19937_64 rng(11);
  int bad = 0;
  for (int t = 0; t < 200; ++t) {
    const int64_t rs[2] = {static_cast<int64_t>(rng()), static_cast<int64_t>(rng() >> (t % 40))};
    DropoutParams dp;
    dp.p = 0.25f;
    dp.rng_state = rs;
    const fc::Dropout<float> d = fc::Dropout<float>::make(dp);
    const int64_t bh = rng() % 100000, i = rng() % 70000, j0 = 4 * static_cast<int64_t>(rng() % 30000);
    const int ncols = 4 * (1 + static_cast<int>(rng() % 130));
    std::vector<uint32_t> x(static_cast<size_t>(ncols));
    std::vector<float> f(static_cast<size_t>(ncols)), s(static_cast<size_t>(ncols), 2.f);
    d.row_draws(bh, i, j0, ncols, x.data());
    d.row_factors(bh, i, j0, ncols, f.data());
    d.apply_row(bh, i, j0, ncols, s.data());
    for (int c = 0; c < ncols; ++c) {
      const uint32_t want = dropout_draws(rs[0], rs[1], bh, i, (j0 + c) >> 2).x[(j0 + c) & 3];
      const bool keep = dropout_keep(rs[0], rs[1], bh, i, j0 + c, dropout_threshold(0.25f));
      const float fw = keep ? 1.f / 0.75f : 0.f;
      if ((x[c] != want || f[c] != fw || s[c] != 2.f * fw) && bad++ < 5)
        std::fprintf(stderr, "dropout draw t=%d c=%d: got %08x want %08x\n", t, c, x[c], want);
    }
  }
  CHECK_MSG(bad == 0, "vectorised Philox draws: %d mismatches", bad);
}

}  // namespace

int main() {
  test_dropout_draws();
  test_half();
  test_bf16();
  test_exp();
  test_gemm<float>();
  test_gemm<double>();
  return finish("test_cpu_kernels");
}
