// Shared by the Hopper harnesses (harness.cu, bwd_harness.cu): error checks, 16-bit
// conversions, a deterministic host RNG, random (never zero) device inputs and
// the forward's arguments for contiguous bshd tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../csrc/cuda/hopper/params.h"
#include "../../csrc/cuda/hopper/ptx_sm90.cuh"
#include "../../csrc/cuda/hopper/tma_host.h"

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

// Element i is a uniform draw in [lo, hi) (never exactly zero) times scale(i), as T.
template <typename T, typename Scale>
static T* upload_random(size_t n, Rng& rng, float lo, float hi, Scale scale) {
  std::vector<T> hbuf(n);
  for (size_t i = 0; i < n; ++i) {
    float x = rng.uniform(lo, hi);
    if (x == 0.f) x = 0.015625f;
    hbuf[i] = Conv<T>::from_f(x * scale(i));
  }
  T* d = nullptr;
  CK(cudaMalloc(&d, n * sizeof(T)));
  CK(cudaMemcpy(d, hbuf.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
static T* upload_random(size_t n, Rng& rng, float lo, float hi) {
  return upload_random<T>(n, rng, lo, hi, [](size_t) { return 1.f; });
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

// Calls launch() back to back for `secs` seconds (at most 32 launches queued ahead of the GPU); returns
// the launches made and stores the seconds they took in *took.
template <typename F>
static long long launch_for(double secs, F&& launch, double* took = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  long long launches = 0;
  double elapsed = 0.0;
  while (elapsed < secs) {
    for (int i = 0; i < 32; ++i) launch();
    launches += 32;
    CK(cudaDeviceSynchronize());
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (took != nullptr) *took = elapsed;
  return launches;
}

// Calls launch() back to back for sustain_seconds().
template <typename F>
static void sustain(F&& launch) {
  launch_for(sustain_seconds(), launch);
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

// HARNESS_ENERGY_S=<seconds>: after its timed launches a variant runs back to back for that long more,
// with NVML's board energy counter read around those launches (energy_per_launch). Under the board's
// power limit a kernel's sustained speed follows its energy per FLOP, which bursts do not show
// (docs/perf-notes.md); this compares variants on it without the library.
static double energy_seconds() {
  static const double s = [] {
    const char* e = std::getenv("HARNESS_ENERGY_S");
    return e == nullptr ? 0.0 : std::atof(e);
  }();
  return s;
}

// NVML's total energy counter of GPU 0 in millijoules, through dlopen (the harness links no NVML); < 0
// where the library or the counter is missing.
static long long nvml_millijoules() {
  using InitFn = int (*)();
  using HandleFn = int (*)(unsigned, void**);
  using EnergyFn = int (*)(void*, unsigned long long*);
  static void* handle = nullptr;
  static EnergyFn energy = nullptr;
  static bool tried = false;
  if (!tried) {
    tried = true;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib != nullptr) {
      auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
      auto get = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
      energy = reinterpret_cast<EnergyFn>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
      if (init == nullptr || get == nullptr || energy == nullptr || init() != 0 || get(0, &handle) != 0) energy = nullptr;
    }
  }
  unsigned long long mj = 0;
  if (energy == nullptr || energy(handle, &mj) != 0) return -1;
  return static_cast<long long>(mj);
}

// Launches back to back for energy_seconds() (32 at a time) and returns " J=<per launch> W=<mean>
// pJ/FLOP=<...> TF/s=<sustained>" for `flops` per launch, or " energy=unavailable" without NVML.
template <typename F>
static std::string energy_per_launch(F&& launch, double flops) {
  const long long e0 = nvml_millijoules();
  if (e0 < 0) return " energy=unavailable";
  double secs = 0.0;
  const long long launches = launch_for(energy_seconds(), launch, &secs);
  const double joules = (nvml_millijoules() - e0) * 1e-3;
  char out[128];
  std::snprintf(out, sizeof(out), " J=%.4f W=%.0f pJ/FLOP=%.3f TF/s=%.1f", joules / launches, joules / secs,
                joules / launches / flops * 1e12, launches * flops / secs / 1e12);
  return out;
}

