// Element types of the CUDA-core arithmetic (the SIMT and decode kernels): the accumulation type of
// each dtype, conversions, the log2 constants, and a float atomic max.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

namespace fusedattn {
namespace gpu {

// Accumulation type: fp32 for the 16-bit dtypes and fp32, fp64 for fp64.
template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class T>
using AccT = typename AccOf<T>::type;

// max(a, b), NaN if either is (fmax drops a NaN): a NaN logit makes its row's maximum NaN, which
// the online softmax carries into the sum, lse and output (the rule of docs/robustness.md). For
// float, one sm_80 instruction (max.NaN), so finite rows pay nothing for it.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ double max_nan(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_acc(float x);
template <class T>
__device__ __forceinline__ T from_acc(double x);
template <>
__device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ double from_acc<double>(double x) { return x; }

template <class A>
struct Consts;
template <>
struct Consts<float> {
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kLn2 = 0.6931471805599453f;
};
template <>
struct Consts<double> {
  static constexpr double kLog2e = 1.4426950408889634074;
  static constexpr double kLn2 = 0.69314718055994530942;
};

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}
// Float max through its ordered integer images (negative values and -inf too). A NaN is stored as
// the largest positive image (0x7fffffff, a NaN), which every later max keeps: max_logit is NaN for
// a head with a NaN row (docs/robustness.md).
__device__ __forceinline__ void atomic_max_float(float* addr, float v) {
  if (v != v) {
    atomicMax(reinterpret_cast<int*>(addr), 0x7fffffff);
  } else if (v >= 0.f) {
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
  }
}

}  // namespace gpu
}  // namespace fusedattn
