// Standalone check + timer for the Hopper (sm_90a) forward prototype in
// csrc/cuda/hopper/fwd_sm90.cuh. No torch, no library build.
//   harness check              correctness vs. a naive fp32 GPU reference
//   harness bench              TFLOP/s table (bf16, b*s = 16384, h*d = 2048)
//   harness one D S CAUSAL     one bench point (for ncu)
// Build: tests/gpu/hopper/build.sh [OUT_BINARY]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../../csrc/cuda/hopper/fwd_sm90.cuh"

using fusedattn::hopper::fwd_sm90;

#define CK(...)                                                                              \
  do {                                                                                       \
    cudaError_t e_ = (__VA_ARGS__);                                                          \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, \
                   __LINE__, #__VA_ARGS__);                                                  \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// ------------------------------------------------------------------ helpers
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

// Naive reference: one thread per (b, h, query row); two passes over keys.
// Reads the same 16-bit inputs; accumulates in fp32. O fp32 [b,s,h,d], lse [b,h,s].
template <typename T, int D>
__global__ void ref_attn_kernel(const T* q, const T* k, const T* v, float* o, float* lse, int b, int s_q, int s_kv,
                                int h, int h_kv, float scale, int causal) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long total = static_cast<long long>(b) * h * s_q;
  if (idx >= total) return;
  const int row = static_cast<int>(idx % s_q);
  const int hh = static_cast<int>((idx / s_q) % h);
  const int bb = static_cast<int>(idx / (static_cast<long long>(s_q) * h));
  const int hk = hh / (h / h_kv);
  float qr[D];
  const T* qp = q + ((static_cast<size_t>(bb) * s_q + row) * h + hh) * D;
#pragma unroll 1
  for (int d = 0; d < D; ++d) qr[d] = Conv<T>::to_f(qp[d]);
  const int kend = causal ? min(s_kv, row + 1) : s_kv;
  float mx = -INFINITY;
  for (int j = 0; j < kend; ++j) {
    const T* kp = k + ((static_cast<size_t>(bb) * s_kv + j) * h_kv + hk) * D;
    float dot = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) dot += qr[d] * Conv<T>::to_f(kp[d]);
    mx = fmaxf(mx, dot * scale);
  }
  float acc[D];
#pragma unroll 1
  for (int d = 0; d < D; ++d) acc[d] = 0.f;
  float l = 0.f;
  for (int j = 0; j < kend; ++j) {
    const T* kp = k + ((static_cast<size_t>(bb) * s_kv + j) * h_kv + hk) * D;
    const T* vp = v + ((static_cast<size_t>(bb) * s_kv + j) * h_kv + hk) * D;
    float dot = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) dot += qr[d] * Conv<T>::to_f(kp[d]);
    const float pr = expf(dot * scale - mx);
    l += pr;
#pragma unroll 8
    for (int d = 0; d < D; ++d) acc[d] += pr * Conv<T>::to_f(vp[d]);
  }
  float* op = o + ((static_cast<size_t>(bb) * s_q + row) * h + hh) * D;
#pragma unroll 1
  for (int d = 0; d < D; ++d) op[d] = (l > 0.f) ? acc[d] / l : 0.f;
  lse[(static_cast<size_t>(bb) * h + hh) * s_q + row] = (l > 0.f) ? mx + logf(l) : -INFINITY;
}

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

template <typename T, int D>
static cudaError_t launch_fast(const T* q, const T* k, const T* v, T* o, float* lse, int b, int s, int h, int h_kv,
                               float scale, bool causal) {
  return fwd_sm90<T, D>(bshd_args<D>(q, k, v, o, lse, b, s, h, h_kv, scale, causal), 0);
}

// ------------------------------------------------------------------- check
template <typename T, int D>
static bool check_case(int b, int s, int h, int h_kv, bool causal, uint64_t seed) {
  Rng rng(seed);
  const size_t nq = static_cast<size_t>(b) * s * h * D;
  const size_t nkv = static_cast<size_t>(b) * s * h_kv * D;
  const size_t nl = static_cast<size_t>(b) * h * s;
  T* q = upload_random<T>(nq, rng, -2.f, 2.f);
  T* k = upload_random<T>(nkv, rng, -2.f, 2.f);
  T* v = upload_random<T>(nkv, rng, -1.f, 1.f);
  T* o = nullptr;
  float *lse = nullptr, *o_ref = nullptr, *lse_ref = nullptr;
  CK(cudaMalloc(&o, nq * sizeof(T)));
  CK(cudaMalloc(&lse, nl * sizeof(float)));
  CK(cudaMalloc(&o_ref, nq * sizeof(float)));
  CK(cudaMalloc(&lse_ref, nl * sizeof(float)));
  // Poison: 0xFF.. is NaN for bf16, fp16 and fp32.
  CK(cudaMemset(o, 0xFF, nq * sizeof(T)));
  CK(cudaMemset(lse, 0xFF, nl * sizeof(float)));
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  const long long total = static_cast<long long>(b) * h * s;
  ref_attn_kernel<T, D><<<static_cast<unsigned>((total + 127) / 128), 128>>>(q, k, v, o_ref, lse_ref, b, s, s, h,
                                                                              h_kv, scale, causal ? 1 : 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  cudaError_t le = launch_fast<T, D>(q, k, v, o, lse, b, s, h, h_kv, scale, causal);
  bool ok = true;
  if (le != cudaSuccess) {
    std::printf("FAIL %s d=%d s=%d causal=%d h=%d/%d launch error: %s\n", Conv<T>::name(), D, s, causal ? 1 : 0, h,
                h_kv, cudaGetErrorString(le));
    ok = false;
  } else {
    CK(cudaDeviceSynchronize());
    std::vector<T> ho(nq);
    std::vector<float> hor(nq), hl(nl), hlr(nl);
    CK(cudaMemcpy(ho.data(), o, nq * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hor.data(), o_ref, nq * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), lse, nl * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hlr.data(), lse_ref, nl * sizeof(float), cudaMemcpyDeviceToHost));
    double max_abs = 0.0, num = 0.0, den = 0.0, lse_err = 0.0;
    size_t nan_count = 0;
    for (size_t i = 0; i < nq; ++i) {
      const double a = Conv<T>::to_f(ho[i]);
      const double r = hor[i];
      if (!std::isfinite(a)) {
        ++nan_count;
        continue;
      }
      max_abs = std::max(max_abs, std::fabs(a - r));
      num += (a - r) * (a - r);
      den += r * r;
    }
    for (size_t i = 0; i < nl; ++i) {
      if (!std::isfinite(hl[i])) {
        ++nan_count;
        continue;
      }
      lse_err = std::max(lse_err, static_cast<double>(std::fabs(hl[i] - hlr[i])));
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    ok = nan_count == 0 && rel < 1e-2 && lse_err < 1e-2;
    std::printf("%s %s d=%d s=%d causal=%d h=%d/%d err=%.3e max_abs=%.3e lse_err=%.3e nan=%zu\n", ok ? "PASS" : "FAIL",
                Conv<T>::name(), D, s, causal ? 1 : 0, h, h_kv, rel, max_abs, lse_err, nan_count);
  }
  CK(cudaFree(q));
  CK(cudaFree(k));
  CK(cudaFree(v));
  CK(cudaFree(o));
  CK(cudaFree(lse));
  CK(cudaFree(o_ref));
  CK(cudaFree(lse_ref));
  return ok;
}

template <typename T>
static bool check_d(int d, int b, int s, int h, int h_kv, bool causal, uint64_t seed) {
  switch (d) {
    case 64: return check_case<T, 64>(b, s, h, h_kv, causal, seed);
    case 128: return check_case<T, 128>(b, s, h, h_kv, causal, seed);
    case 256: return check_case<T, 256>(b, s, h, h_kv, causal, seed);
  }
  return false;
}

static int run_check() {
  int fails = 0, n = 0;
  uint64_t seed = 1234;
  const int ds[] = {64, 128, 256};
  const int ss[] = {1, 17, 128, 200, 1024};
  const int hkvs[] = {2, 4};
  for (int d : ds)
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal)
        for (int hkv : hkvs) {
          ++n;
          if (!check_d<__nv_bfloat16>(d, 2, s, 4, hkv, causal != 0, seed++)) ++fails;
        }
  // fp16 instantiation: a few cases.
  const int s16[] = {17, 200};
  for (int d : ds)
    for (int s : s16)
      for (int causal = 0; causal < 2; ++causal) {
        ++n;
        if (!check_d<__half>(d, 2, s, 4, 2, causal != 0, seed++)) ++fails;
      }
  std::printf("check: %d/%d passed\n", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// ------------------------------------------------------------------- bench
template <int D>
static bool bench_point(int s, bool causal) {
  using T = __nv_bfloat16;
  const int tokens = 16384;
  const int b = std::max(1, tokens / s);
  const int h = 2048 / D, h_kv = h;
  const size_t n = static_cast<size_t>(b) * s * h * D;
  Rng rng(42 + s + D);
  T* q = upload_random<T>(n, rng, -2.f, 2.f);
  T* k = upload_random<T>(n, rng, -2.f, 2.f);
  T* v = upload_random<T>(n, rng, -1.f, 1.f);
  T* o = nullptr;
  float* lse = nullptr;
  CK(cudaMalloc(&o, n * sizeof(T)));
  CK(cudaMalloc(&lse, static_cast<size_t>(b) * h * s * sizeof(float)));
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  bool ok = true;
  fusedattn::hopper::FwdLaunch L;
  cudaError_t pe = fusedattn::hopper::fwd_sm90_prepare<T, D>(&L, bshd_args<D>(q, k, v, o, lse, b, s, h, h_kv, scale,
                                                                                causal));
  if (pe != cudaSuccess) {
    std::printf("HBENCH d=%d s=%d causal=%d prepare error: %s\n", D, s, causal ? 1 : 0, cudaGetErrorString(pe));
    ok = false;
  }
  for (int i = 0; ok && i < 5; ++i) {
    cudaError_t e = fusedattn::hopper::fwd_sm90_launch(L);
    if (e != cudaSuccess) {
      std::printf("HBENCH d=%d s=%d causal=%d launch error: %s\n", D, s, causal ? 1 : 0, cudaGetErrorString(e));
      ok = false;
      break;
    }
  }
  if (ok) {
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      CK(cudaEventRecord(e0));
      CK(fusedattn::hopper::fwd_sm90_launch(L));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t = 0.f;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = 0.5 * (ms[9] + ms[10]);
    const double flops = 4.0 * b * h * static_cast<double>(s) * s * D / (causal ? 2.0 : 1.0);
    std::printf("HBENCH d=%d s=%d causal=%d fwd %.3f ms %.1f TF/s\n", D, s, causal ? 1 : 0, med,
                flops / (med * 1e-3) / 1e12);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
  }
  CK(cudaFree(q));
  CK(cudaFree(k));
  CK(cudaFree(v));
  CK(cudaFree(o));
  CK(cudaFree(lse));
  return ok;
}

static bool bench_d(int d, int s, bool causal) {
  switch (d) {
    case 64: return bench_point<64>(s, causal);
    case 128: return bench_point<128>(s, causal);
    case 256: return bench_point<256>(s, causal);
  }
  std::printf("unsupported d=%d\n", d);
  return false;
}

static int run_bench() {
  bool ok = true;
  const int ds[] = {64, 128, 256};
  const int ss[] = {512, 1024, 2048, 4096, 8192, 16384};
  for (int d : ds)
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal) ok = bench_d(d, s, causal != 0) && ok;
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("this harness needs an sm_90 (Hopper) GPU; built for sm_90a only\n");
    return 1;
  }
  if (mode == "check") return run_check();
  if (mode == "bench") return run_bench();
  if (mode == "one") {
    if (argc < 5) {
      std::fprintf(stderr, "usage: %s one D S CAUSAL\n", argv[0]);
      return 2;
    }
    return bench_d(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0) ? 0 : 1;
  }
  std::fprintf(stderr, "usage: %s check | bench | one D S CAUSAL\n", argv[0]);
  return 2;
}
