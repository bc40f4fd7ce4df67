// Element conversion of the CPU engine: fp16 / bf16 <-> float by hand
// (round-to-nearest-even, no compiler or library half types), and per-dtype
// load/store to the accumulation type (float for fp32/fp16/bf16, double for
// fp64).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu_isa.h"
#include "fusedattn/types.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {

// Storage types of the 16-bit dtypes: raw bits, no arithmetic.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));  // inf, nan (payload kept)
  if (em >= 0x0400u) return bits_f32(sign | ((em << 13) + 0x38000000u));           // normal: rebias 15 -> 127
  // Zero or subnormal: em * 2^-24 is exact in float.
  return bits_f32(sign | f32_bits(static_cast<float>(em) * 5.9604644775390625e-08f));
}

// Rounds q = m >> shift to nearest, ties to even.
inline uint32_t shift_round_even(uint32_t m, uint32_t shift) {
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;   // nan -> quiet nan
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (the midpoint above 65504) -> inf
  if (ax < 0x38800000u) {                        // below 2^-14: half subnormal or zero
    const uint32_t e = ax >> 23;                 // float biased exponent, < 113
    if (e < 102) return sign;                    // below 2^-25: rounds to zero
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    return static_cast<uint16_t>(sign | shift_round_even(m, 126u - e));  // units of 2^-24
  }
  // Normal half: rebias the exponent, round the 13 dropped mantissa bits. A carry
  // out of the mantissa correctly bumps the exponent (up to inf).
  return static_cast<uint16_t>(sign | shift_round_even(ax - 0x38000000u, 13u));
}

inline float bf16_to_float(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Elem<T>: T's accumulation type and conversion to and from it.
template <class T>
struct Elem;

template <>
struct Elem<float> {
  using Acc = float;
  static float load(const float* p) { return *p; }
  static void store(float* p, float v) { *p = v; }
};
template <>
struct Elem<double> {
  using Acc = double;
  static double load(const double* p) { return *p; }
  static void store(double* p, double v) { *p = v; }
};
template <>
struct Elem<Half> {
  using Acc = float;
  static float load(const Half* p) { return half_to_float(p->bits); }
  static void store(Half* p, float v) { p->bits = float_to_half(v); }
};
template <>
struct Elem<BFloat16> {
  using Acc = float;
  static float load(const BFloat16* p) { return bf16_to_float(p->bits); }
  static void store(BFloat16* p, float v) { p->bits = float_to_bf16(v); }
};

// Calls fn(T{}) with the storage type of dtype; returns false for other dtypes.
template <class Fn>
bool dispatch_float_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kFloat16: fn(Half{}); return true;
    case DType::kBFloat16: fn(BFloat16{}); return true;
    default: return false;
  }
}

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
