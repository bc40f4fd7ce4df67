// Shared by the Hopper harnesses (harness.cu, bwd_harness.cu): error checks, 16-bit
// conversions, a deterministic host RNG, random (never zero) device inputs and
// the forward's arguments for contiguous bshd tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../../csrc/cuda/hopper/fwd_sm90.cuh"

#define CK(...)                                                                              \
  do {                                                                                       \
    cudaError_t e_ = (__VA_ARGS__);                                                          \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, \
                   __LINE__, #__VA_ARGS__);                                                  \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

template <typename T>
struct Conv;
template <>
struct Conv<__nv_bfloat16> {
  static __host__ __device__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __host__ __device__ __nv_bfloat16 from_f(float x) { return __float2bfloat16(x); }
  static const char* name() { return "bf16"; }
};
template <>
struct Conv<__half> {
  static __host__ __device__ float to_f(__half x) { return __half2float(x); }
  static __host__ __device__ __half from_f(float x) { return __float2half(x); }
  static const char* name() { return "fp16"; }
};

struct Rng {  // splitmix64, deterministic
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }
};

template <typename T>
static T* upload_random(size_t n, Rng& rng, float lo, float hi) {
  std::vector<T> hbuf(n);
  for (size_t i = 0; i < n; ++i) {
    float x = rng.uniform(lo, hi);
    if (x == 0.f) x = 0.015625f;  // never exactly zero
    hbuf[i] = Conv<T>::from_f(x);
  }
  T* d = nullptr;
  CK(cudaMalloc(&d, n * sizeof(T)));
  CK(cudaMemcpy(d, hbuf.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Contiguous bshd tensors (the library passes its own strides).
template <int D>
static fusedattn::hopper::Sm90Args bshd_args(const void* q, const void* k, const void* v, void* o, float* lse, int b,
                                             int s, int h, int h_kv, float scale, bool causal) {
  fusedattn::hopper::Sm90Args a{};
  a.q = {q, b, s, h, D, int64_t{s} * h * D, int64_t{h} * D, D};
  a.k = {k, b, s, h_kv, D, int64_t{s} * h_kv * D, int64_t{h_kv} * D, D};
  a.v = {v, b, s, h_kv, D, int64_t{s} * h_kv * D, int64_t{h_kv} * D, D};
  a.out.o = o;
  a.out.o_sb = int64_t{s} * h * D;
  a.out.o_ss = int64_t{h} * D;
  a.out.o_sh = D;
  a.out.lse = lse;
  a.out.lse_sb = int64_t{h} * s;
  a.out.lse_sh = s;
  a.out.lse_ss = 1;
  a.out.b = b;
  a.out.s_q = s;
  a.out.s_kv = s;
  a.out.h = h;
  a.out.h_kv = h_kv;
  a.out.scale_log2 = scale * 1.4426950408889634f;
  a.causal = causal;
  return a;
}
