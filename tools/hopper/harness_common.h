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

#include "../../csrc/cuda/hopper/fwd_sm90.cuh"

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
// (docs/perf-notes.md, eighteenth session); this compares variants on it without the library.
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

#ifdef FUSEDATTN_HOPPER_STAMPS
// The phase stamps of one launch of `ctas` CTAs (launch() enqueues it), after 10 unstamped warm-up
// launches: kStampTiles x kStampSlots words per CTA, zero where nothing was stamped.
template <typename F>
static std::vector<unsigned long long> collect_stamps(size_t ctas, F&& launch) {
  using fusedattn::hopper::kStampSlots;
  using fusedattn::hopper::kStampTiles;
  const size_t words = ctas * kStampTiles * kStampSlots;
  unsigned long long* st = nullptr;
  CK(cudaMalloc(&st, words * sizeof(unsigned long long)));
  CK(cudaMemset(st, 0, words * sizeof(unsigned long long)));
  for (int i = 0; i < 10; ++i) launch();
  CK(cudaMemcpyToSymbol(fusedattn::hopper::g_phase_stamps, &st, sizeof(st)));
  launch();
  CK(cudaDeviceSynchronize());
  unsigned long long* none = nullptr;
  CK(cudaMemcpyToSymbol(fusedattn::hopper::g_phase_stamps, &none, sizeof(none)));
  std::vector<unsigned long long> hs(words);
  CK(cudaMemcpy(hs.data(), st, words * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  CK(cudaFree(st));
  return hs;
}

// The `stamps` modes' report, from the phase stamps (fwd_sm90.cuh) of one launch of `ctas` CTAs: per
// phase (names[i]: stamp i to i + 1) the median and mean over work tiles, a CTA's first tile apart from
// its later ones (multi_tile: the persistent kernel, whose kStampCount slot holds each CTA's tile count), the
// steady loop (phase 2) per iteration when every first tile has per_tile + 1 of them, the boundary
// from one tile's loop end to the next tile's first GEMM done, the gap from one CTA's end to the next
// one's start on an SM (single-tile kernels), and the span. Phases are SM cycles, converted at the
// median ns-per-cycle of the tiles that last 20 us or more by the global timer.
static void report_stamps(const std::vector<unsigned long long>& hs, size_t ctas, const char* const names[5],
                          bool multi_tile, int per_tile, const char* head) {
  using fusedattn::hopper::kStampCount;
  using fusedattn::hopper::kStampSlots;
  using fusedattn::hopper::kStampSm;
  using fusedattn::hopper::kStampTiles;
  using fusedattn::hopper::kStampTimerEnd;
  using fusedattn::hopper::kStampTimerStart;
  auto at = [&](size_t cta, size_t tile, int i) { return hs[(cta * kStampTiles + tile) * kStampSlots + i]; };
  auto diff = [](unsigned long long a, unsigned long long b) { return static_cast<double>(b) - static_cast<double>(a); };
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x.empty() ? 0.0 : x[x.size() / 2];
  };
  auto mean = [](const std::vector<double>& x) {
    double a = 0.0;
    for (double y : x) a += y;
    return x.empty() ? 0.0 : a / x.size();
  };
  auto tiles_of = [&](size_t c) { return multi_tile ? std::min<size_t>(at(c, 0, kStampCount), kStampTiles) : size_t{1}; };
  std::vector<double> ns_per_cycle;
  for (size_t c = 0; c < ctas; ++c)
    for (size_t j = 0; j < tiles_of(c); ++j) {
      const double ns = diff(at(c, j, kStampTimerStart), at(c, j, kStampTimerEnd)), cyc = diff(at(c, j, 0), at(c, j, 5));
      if (ns >= 20000.0 && cyc > 0.0) ns_per_cycle.push_back(ns / cyc);
    }
  const double npc = median(ns_per_cycle);
  if (npc <= 0.0) {
    std::printf("%s: no tile lasted 20 us, so cycles cannot be converted to time\n", head);
    return;
  }
  const double us_per_cycle = 1e-3 * npc;
  std::vector<double> ph[2][5], per_iter, boundary, cta_gap;
  unsigned long long t_min = ~0ull, t_max = 0;
  std::vector<std::vector<size_t>> per_sm;
  for (size_t c = 0; c < ctas; ++c) {
    const size_t tiles = tiles_of(c);
    for (size_t j = 0; j < tiles; ++j) {
      for (int i = 0; i < 5; ++i) ph[j > 0][i].push_back(us_per_cycle * diff(at(c, j, i), at(c, j, i + 1)));
      if (j > 0) boundary.push_back(us_per_cycle * diff(at(c, j - 1, 3), at(c, j, 2)));
      t_min = std::min(t_min, at(c, j, kStampTimerStart));
      t_max = std::max(t_max, at(c, j, kStampTimerEnd));
    }
    if (per_tile > 0) per_iter.push_back(us_per_cycle * diff(at(c, 0, 2), at(c, 0, 3)) / per_tile);
    const size_t sm = static_cast<size_t>(at(c, 0, kStampSm));
    if (sm >= per_sm.size()) per_sm.resize(sm + 1);
    per_sm[sm].push_back(c);
  }
  std::printf("%s ctas=%zu span %.1f us (SM clock %.0f MHz by the stamps)\n", head, ctas, 1e-3 * diff(t_min, t_max),
              1e3 / npc);
  for (int later = 0; later < 2; ++later) {
    if (ph[later][0].empty()) continue;
    for (int i = 0; i < 5; ++i)
      std::printf("HSTAMP   %s %-24s median %7.2f us  mean %7.2f us\n", later ? "later tiles" : "first tile ", names[i],
                  median(ph[later][i]), mean(ph[later][i]));
  }
  if (!per_iter.empty()) std::printf("HSTAMP   steady loop per iteration (first tiles) median %.3f us\n", median(per_iter));
  if (!boundary.empty())
    std::printf("HSTAMP   tile boundary (loop done -> next tile's first GEMM done) median %.2f us mean %.2f us\n",
                median(boundary), mean(boundary));
  if (!multi_tile) {
    // Consecutive CTAs on one SM, by that SM's cycle counter.
    for (auto& list : per_sm) {
      std::sort(list.begin(), list.end(), [&](size_t a, size_t b) { return at(a, 0, 0) < at(b, 0, 0); });
      for (size_t i = 1; i < list.size(); ++i)
        cta_gap.push_back(us_per_cycle * diff(at(list[i - 1], 0, 5), at(list[i], 0, 0)));
    }
    std::printf("HSTAMP   gap between consecutive CTAs on an SM median %.2f us mean %.2f us\n", median(cta_gap),
                mean(cta_gap));
  }
}
#endif
