// Shared by the Hopper harnesses (harness.cu, bwd_harness.cu): error checks, 16-bit
// conversions, a deterministic host RNG, random (never zero) device inputs and
// the forward's arguments for contiguous bshd tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
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

// HARNESS_SUSTAIN_S=<seconds>: a variant runs back to back for that long before it is timed, so that it
// is timed at the clock its own power draw settles at under the board's limit (a burst of 25 launches
// ends before the power controller reacts, and then leaves its state to whatever runs next).
static double sustain_seconds() {
  static const double s = [] {
    const char* e = std::getenv("HARNESS_SUSTAIN_S");
    return e == nullptr ? 0.0 : std::atof(e);
  }();
  return s;
}

// Calls launch() back to back for sustain_seconds() (at most 32 launches queued ahead of the GPU).
template <typename F>
static void sustain(F&& launch) {
  const double secs = sustain_seconds();
  if (secs <= 0.0) return;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
    for (int i = 0; i < 32; ++i) launch();
    CK(cudaDeviceSynchronize());
  }
}

// The SM clock (MHz) and board power (W) as nvidia-smi reports them now, " clk=... W=..." ("" without
// nvidia-smi): read right after a sustained variant's timed launches.
static std::string clock_power_now() {
  FILE* f = popen("nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits 2>/dev/null", "r");
  if (f == nullptr) return "";
  char buf[128] = {0};
  const bool got = std::fgets(buf, sizeof(buf), f) != nullptr;
  pclose(f);
  unsigned mhz = 0;
  double watts = 0.0;
  if (!got || std::sscanf(buf, "%u, %lf", &mhz, &watts) != 2) return "";
  char out[64];
  std::snprintf(out, sizeof(out), " clk=%u W=%.0f", mhz, watts);
  return out;
}
