// Portable SIMD for the CPU engine: GCC/Clang vector extensions sized to the
// widest vector unit the compiler targets (-march=native picks AVX-512 or
// AVX2; without it the code is still vectorised, on SSE2/NEON width). No
// intrinsics, so the same source builds on any architecture.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace fusedattn {
namespace cpu {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

template <class A>
struct Simd;

template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(kVecBytes)));
  // Same vector with element alignment: dereferencing it is an unaligned load/store.
  typedef float Vu __attribute__((vector_size(kVecBytes), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(kVecBytes)));
  static constexpr int N = kVecBytes / 4;
};

template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(kVecBytes)));
  typedef double Vu __attribute__((vector_size(kVecBytes), aligned(8), may_alias));
  typedef int64_t I __attribute__((vector_size(kVecBytes)));
  static constexpr int N = kVecBytes / 8;
};

// Scratch rows are padded to this many elements of any accumulation type, so
// every row is a whole number of vectors of float and of double.
constexpr int kPadElems = kVecBytes / 4;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <class A>
inline typename Simd<A>::V vload(const A* p) {
  return *reinterpret_cast<const typename Simd<A>::Vu*>(p);
}
template <class A>
inline void vstore(A* p, typename Simd<A>::V v) {
  *reinterpret_cast<typename Simd<A>::Vu*>(p) = v;
}
template <class A, size_t... I>
inline typename Simd<A>::V vsplat_impl(A x, std::index_sequence<I...>) {
  return typename Simd<A>::V{((void)I, x)...};
}
// One broadcast (v + x would add 0 first: -0 + 0 is not -0).
template <class A>
inline typename Simd<A>::V vsplat(A x) {
  return vsplat_impl<A>(x, std::make_index_sequence<Simd<A>::N>{});
}
// Horizontal reductions by halving (log2(N) vector ops, not N scalar ones).
template <class A, int Bytes>
struct VecOf {
  typedef A T __attribute__((vector_size(Bytes)));
};
template <class A, int Bytes, size_t... I>
inline typename VecOf<A, Bytes / 2>::T vhalf(typename VecOf<A, Bytes>::T v, bool upper, std::index_sequence<I...>) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
  constexpr int kHalf = static_cast<int>(sizeof...(I));
  return upper ? __builtin_shufflevector(v, v, (kHalf + static_cast<int>(I))...)
               : __builtin_shufflevector(v, v, static_cast<int>(I)...);
#else
  typename VecOf<A, Bytes / 2>::T h;
  std::memcpy(&h, reinterpret_cast<const char*>(&v) + (upper ? Bytes / 2 : 0), Bytes / 2);
  return h;
#endif
}
template <class A, int Bytes, class Op>
inline A hreduce(typename VecOf<A, Bytes>::T v, Op op) {
  if constexpr (Bytes == 2 * static_cast<int>(sizeof(A))) {
    return op(v[0], v[1]);
  } else {
    // Register shuffles, not a store and two narrower reloads (which stall store forwarding).
    constexpr size_t kHalf = Bytes / 2 / sizeof(A);
    const auto lo = vhalf<A, Bytes>(v, false, std::make_index_sequence<kHalf>{});
    const auto hi = vhalf<A, Bytes>(v, true, std::make_index_sequence<kHalf>{});
    return hreduce<A, Bytes / 2>(op(lo, hi), op);
  }
}
template <class A>
inline A hsum(typename Simd<A>::V v) {
  return hreduce<A, kVecBytes>(v, [](auto x, auto y) { return x + y; });
}
// The largest lane, NaN if any lane is NaN (x != x only for NaN).
template <class A>
inline A hmax(typename Simd<A>::V v) {
  return hreduce<A, kVecBytes>(v, [](auto x, auto y) { return (x > y) | (x != x) ? x : y; });
}

// exp for float vectors (Cephes expf: range reduction by ln2 in two parts and
// a degree-7 polynomial, about 1 ulp). Inputs below ln(FLT_MIN) (also -inf)
// give exactly 0; inputs above 88 are clamped (the engine only takes exp of
// non-positive differences); NaN stays NaN (the clamps compare so that NaN
// passes them).
inline Simd<float>::V vexp(Simd<float>::V x) {
  using V = Simd<float>::V;
  using I = Simd<float>::I;
  const I underflow = x < vsplat(-87.33654475f);
  x = x > vsplat(88.0f) ? vsplat(88.0f) : x;
  x = x < vsplat(-87.33654475f) ? vsplat(-87.33654475f) : x;
  // n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |n| < 2^22).
  const V magic = vsplat(12582912.0f);
  const V t = x * vsplat(1.44269504088896341f) + magic;
  const V n = t - magic;
  V r = x - n * vsplat(0.693359375f);
  r = r - n * vsplat(-2.12194440e-4f);
  const V z = r * r;
  V y = vsplat(1.9875691500e-4f);
  y = y * r + vsplat(1.3981999507e-3f);
  y = y * r + vsplat(8.3334519073e-3f);
  y = y * r + vsplat(4.1665795894e-2f);
  y = y * r + vsplat(1.6666665459e-1f);
  y = y * r + vsplat(5.0000001201e-1f);
  y = y * z + r + vsplat(1.0f);
  // 2^n from the exponent bits: n lies in [-126, 127] after the clamps.
  const I ni = (I)t - (I)magic;  // vector casts reinterpret the bits
  const I pow2 = (ni + 127) << 23;
  y = y * (V)pow2;
  return (V)((I)y & ~underflow);
}

// Scalar exp in the accumulation type (per-row rescaling factors).
inline float exp_acc(float x) { return std::exp(x); }
inline double exp_acc(double x) { return std::exp(x); }

template <class A>
constexpr A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// The softmax takes exp(f * s - m) in one FMA, with m = f * max(s) rounded:
// the row maximum's term is exp(e), e the rounding error of m, at most half an
// ulp of m. Above this |m| that could leave exp's range (a sum of 0 or inf), so
// rows with such logits are scaled first (s = f * s rounded, m one of them: e =
// 0). Below it e is the logit's own rounding, which torch's math has too.
template <class A>
constexpr A huge_logit() {
  return static_cast<A>(uint64_t{1} << (std::numeric_limits<A>::digits - 2));
}

// max(a, b), NaN if either is: a NaN logit makes its row's maximum NaN, and the
// online softmax then carries NaN into the row's sum, lse and output.
template <class A>
inline A max_nan(A a, A b) {
  return (a > b) | (a != a) ? a : b;
}

// Row helpers over n elements (n a multiple of Simd<A>::N).
// The row maximum, NaN if any element is NaN.
template <class A>
inline A row_max(const A* __restrict s, int n) {
  using S = Simd<A>;
  typename S::V m = vsplat<A>(neg_inf<A>());
  for (int j = 0; j < n; j += S::N) {
    const typename S::V x = vload(s + j);
    m = (x > m) | (x != x) ? x : m;
  }
  return hmax<A>(m);
}

// Whether any of s[0..n) is NaN (any n).
template <class A>
inline bool any_nan(const A* __restrict s, int64_t n) {
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) nan |= s[j] != s[j];
  return nan;
}

// s[j] = exp(f * s[j] - m) (one FMA before the exp), returns the sum. m must be finite.
inline float row_exp_sum(float* __restrict s, int n, float f, float m) {
  using S = Simd<float>;
  const S::V fv = vsplat(f), mv = vsplat(m);
  S::V acc0 = {}, acc1 = {};
  int j = 0;
  for (; j + 2 * S::N <= n; j += 2 * S::N) {
    const S::V e0 = vexp(vload(s + j) * fv - mv);
    const S::V e1 = vexp(vload(s + j + S::N) * fv - mv);
    vstore(s + j, e0);
    vstore(s + j + S::N, e1);
    acc0 += e0;
    acc1 += e1;
  }
  for (; j < n; j += S::N) {
    const S::V e = vexp(vload(s + j) * fv - mv);
    vstore(s + j, e);
    acc0 += e;
  }
  return hsum<float>(acc0 + acc1);
}

inline double row_exp_sum(double* __restrict s, int n, double f, double m) {
  double sum = 0;
  for (int j = 0; j < n; ++j) {
    s[j] = std::exp(f * s[j] - m);
    sum += s[j];
  }
  return sum;
}

// s[j] = exp(f * s[j] - m) without the sum.
inline void row_exp(float* __restrict s, int n, float f, float m) {
  using S = Simd<float>;
  const S::V fv = vsplat(f), mv = vsplat(m);
  for (int j = 0; j < n; j += S::N) vstore(s + j, vexp(vload(s + j) * fv - mv));
}
inline void row_exp(double* __restrict s, int n, double f, double m) {
  for (int j = 0; j < n; ++j) s[j] = std::exp(f * s[j] - m);
}

template <class A>
inline void row_scale(A* __restrict s, int n, A f) {
  using S = Simd<A>;
  const typename S::V fv = vsplat(f);
  for (int j = 0; j < n; j += S::N) vstore(s + j, vload(s + j) * fv);
}

template <class A>
inline void row_fill(A* __restrict s, int n, A v) {
  for (int j = 0; j < n; ++j) s[j] = v;
}

}  // namespace cpu
}  // namespace fusedattn
