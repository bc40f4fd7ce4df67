// Standalone check + timer for the Hopper (sm_90a) backward (csrc/cuda/hopper/bwd_launch.cuh:
// bwd_kernel.cuh at d = 64, 128, bwd_kernel_d256.cuh at d = 256). No torch, no library build.
//   bwd_harness check            the library's kernels: gradients vs. a naive fp32 GPU reference
//   bwd_harness bench            TFLOP/s table (bf16, b*s = 16384, h*d = 2048)
//   bwd_harness one D S CAUSAL   one bench point (for ncu / nsys)
//   bwd_harness checkdet         the deterministic mode (d = 64/128): two runs, the second with half
//                                the SMs taken by another kernel at first (other CTA placement and
//                                timing), must give bitwise equal dq, dk, dv and fp32 dQ
//                                accumulators; vs. the reference as check; dk/dv bitwise equal to the
//                                default kernel (whose run-to-run dQ differences under the same two
//                                runs are printed, to show that the perturbation bites)
//   bwd_harness benchdet         per point (d = 64/128): HBWD (the default kernel) and HBWDDET (the
//                                deterministic one)
//   bwd_harness onedet D S CAUSAL  one benchdet point
// Build: tools/hopper/build_bwd.sh [OUT_BINARY]
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

#include "../../csrc/cuda/hopper/bwd_launch.cuh"
#include "../../csrc/cuda/hopper/fwd_kernel.cuh"  // bench: out / lse from the forward
#include "harness_common.h"

namespace hp = fusedattn::hopper;




// ------------------------------------------------------------ references
// All bshd contiguous; lse [b, h, s]. One thread per output row.
__device__ __forceinline__ size_t bshd(int bb, int i, int hh, int s, int h, int d) {
  return ((static_cast<size_t>(bb) * s + i) * h + hh) * d;
}

// Forward: O (written as T, the backward's `out` input) and lse (natural log).
template <typename T, int D>
__global__ void ref_fwd(const T* q, const T* k, const T* v, T* o, float* lse, int b, int s, int h, int h_kv,
                        float scale, int causal) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(b) * h * s) return;
  const int i = static_cast<int>(idx % s), hh = static_cast<int>((idx / s) % h), bb = static_cast<int>(idx / s / h);
  const int hk = hh / (h / h_kv);
  float qr[D], acc[D];
  for (int x = 0; x < D; ++x) {
    qr[x] = Conv<T>::to_f(q[bshd(bb, i, hh, s, h, D) + x]);
    acc[x] = 0.f;
  }
  const int kend = causal ? min(s, i + 1) : s;
  float mx = -INFINITY;
  for (int j = 0; j < kend; ++j) {
    const T* kp = k + bshd(bb, j, hk, s, h_kv, D);
    float dot = 0.f;
    for (int x = 0; x < D; ++x) dot += qr[x] * Conv<T>::to_f(kp[x]);
    mx = fmaxf(mx, dot * scale);
  }
  float l = 0.f;
  for (int j = 0; j < kend; ++j) {
    const T* kp = k + bshd(bb, j, hk, s, h_kv, D);
    const T* vp = v + bshd(bb, j, hk, s, h_kv, D);
    float dot = 0.f;
    for (int x = 0; x < D; ++x) dot += qr[x] * Conv<T>::to_f(kp[x]);
    const float pr = expf(dot * scale - mx);
    l += pr;
    for (int x = 0; x < D; ++x) acc[x] += pr * Conv<T>::to_f(vp[x]);
  }
  for (int x = 0; x < D; ++x) o[bshd(bb, i, hh, s, h, D) + x] = Conv<T>::from_f(l > 0.f ? acc[x] / l : 0.f);
  lse[(static_cast<size_t>(bb) * h + hh) * s + i] = l > 0.f ? mx + logf(l) : -INFINITY;
}

// Dsum = rowsum(dO * O) from the 16-bit O and dO.
template <typename T, int D>
__global__ void ref_dsum(const T* o, const T* dout, float* dsum, int b, int s, int h) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(b) * h * s) return;
  const int i = static_cast<int>(idx % s), hh = static_cast<int>((idx / s) % h), bb = static_cast<int>(idx / s / h);
  float a = 0.f;
  for (int x = 0; x < D; ++x) a += Conv<T>::to_f(o[bshd(bb, i, hh, s, h, D) + x]) * Conv<T>::to_f(dout[bshd(bb, i, hh, s, h, D) + x]);
  dsum[(static_cast<size_t>(bb) * h + hh) * s + i] = a;
}

// dq[i] = scale * sum_j dS_ij k_j ; P_ij = exp(scale q_i.k_j - lse_i), dS = P (dO_i.v_j - Dsum_i).
template <typename T, int D>
__global__ void ref_dq(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dsum,
                       float* dq, int b, int s, int h, int h_kv, float scale, int causal) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(b) * h * s) return;
  const int i = static_cast<int>(idx % s), hh = static_cast<int>((idx / s) % h), bb = static_cast<int>(idx / s / h);
  const int hk = hh / (h / h_kv);
  float qr[D], dr[D], acc[D];
  for (int x = 0; x < D; ++x) {
    qr[x] = Conv<T>::to_f(q[bshd(bb, i, hh, s, h, D) + x]);
    dr[x] = Conv<T>::to_f(dout[bshd(bb, i, hh, s, h, D) + x]);
    acc[x] = 0.f;
  }
  const size_t r = (static_cast<size_t>(bb) * h + hh) * s + i;
  const float L = lse[r], Dd = dsum[r];
  const int kend = causal ? min(s, i + 1) : s;
  for (int j = 0; j < kend; ++j) {
    const T* kp = k + bshd(bb, j, hk, s, h_kv, D);
    const T* vp = v + bshd(bb, j, hk, s, h_kv, D);
    float sc = 0.f, dp = 0.f;
    for (int x = 0; x < D; ++x) {
      sc += qr[x] * Conv<T>::to_f(kp[x]);
      dp += dr[x] * Conv<T>::to_f(vp[x]);
    }
    const float p = expf(sc * scale - L);
    const float ds = p * (dp - Dd);
    for (int x = 0; x < D; ++x) acc[x] += ds * Conv<T>::to_f(kp[x]);
  }
  for (int x = 0; x < D; ++x) dq[bshd(bb, i, hh, s, h, D) + x] = scale * acc[x];
}

// dk[j] = scale * sum_{g,i} dS_ij q_i ; dv[j] = sum_{g,i} P_ij dO_i (sum over the GQA group's heads g).
template <typename T, int D>
__global__ void ref_dkdv(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dsum,
                         float* dk, float* dv, int b, int s, int h, int h_kv, float scale, int causal) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(b) * h_kv * s) return;
  const int j = static_cast<int>(idx % s), hk = static_cast<int>((idx / s) % h_kv),
            bb = static_cast<int>(idx / s / h_kv);
  const int G = h / h_kv;
  float kr[D], vr[D], ak[D], av[D];
  for (int x = 0; x < D; ++x) {
    kr[x] = Conv<T>::to_f(k[bshd(bb, j, hk, s, h_kv, D) + x]);
    vr[x] = Conv<T>::to_f(v[bshd(bb, j, hk, s, h_kv, D) + x]);
    ak[x] = 0.f;
    av[x] = 0.f;
  }
  for (int g = 0; g < G; ++g) {
    const int hh = hk * G + g;
    for (int i = causal ? j : 0; i < s; ++i) {
      const T* qp = q + bshd(bb, i, hh, s, h, D);
      const T* dp_ = dout + bshd(bb, i, hh, s, h, D);
      float sc = 0.f, dp = 0.f;
      for (int x = 0; x < D; ++x) {
        sc += Conv<T>::to_f(qp[x]) * kr[x];
        dp += Conv<T>::to_f(dp_[x]) * vr[x];
      }
      const size_t r = (static_cast<size_t>(bb) * h + hh) * s + i;
      const float p = expf(sc * scale - lse[r]);
      const float ds = p * (dp - dsum[r]);
      for (int x = 0; x < D; ++x) {
        av[x] += p * Conv<T>::to_f(dp_[x]);
        ak[x] += ds * Conv<T>::to_f(qp[x]);
      }
    }
  }
  for (int x = 0; x < D; ++x) {
    dk[bshd(bb, j, hk, s, h_kv, D) + x] = scale * ak[x];
    dv[bshd(bb, j, hk, s, h_kv, D) + x] = av[x];
  }
}

static unsigned nblk(long long n, int t) { return static_cast<unsigned>((n + t - 1) / t); }

struct Err {
  double rel = 0, max_abs = 0;
  size_t bad = 0;
};

template <typename T>
static Err compare(const T* dev, const float* ref, size_t n) {
  std::vector<T> a(n);
  std::vector<float> r(n);
  CK(cudaMemcpy(a.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.data(), ref, n * sizeof(float), cudaMemcpyDeviceToHost));
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = Conv<T>::to_f(a[i]);
    if (!std::isfinite(x)) {
      ++e.bad;
      continue;
    }
    const double d = x - r[i];
    num += d * d;
    den += static_cast<double>(r[i]) * r[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  // Floor on the reference's mean square: with s = 1 the single visible key
  // gives dS = dP - D = 0 exactly in the reference, while any kernel's dP and
  // D differ by an ulp of their summation order; an rms error up to ~2e-5 on
  // such a zero gradient is rounding, not a bug (real cases have den/n >= ~1e-4).
  e.rel = std::sqrt(num / std::max(den, 1e-6 * static_cast<double>(n)));
  return e;
}

template <typename T, int D>
static hp::Sm90BwdArgs make_args(const T* q, const T* k, const T* v, const T* o, const T* dout, const float* lse, T* dq,
                             T* dk, T* dv, void* ws, int b, int s, int h, int h_kv, float scale, bool causal) {
  hp::Sm90BwdArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.dout = dout;
  a.lse = lse;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.ws = ws;
  a.b = b;
  a.s_q = s;
  a.s_kv = s;
  a.h = h;
  a.h_kv = h_kv;
  a.scale = scale;
  a.causal = causal;
  return a;
}

// One check case: random inputs, the naive fp32 reference's out, lse, Dsum and gradients, all on
// the device, freed with the case; Grads: one poisoned set of a kernel's dq, dk, dv.
template <typename T, int D>
struct RefCase {
  int b, s, h, h_kv;
  bool causal;
  float scale;
  size_t nq, nkv, nl;
  T *q, *k, *v, *dout, *o;
  float *lse, *dsum, *rdq, *rdk, *rdv;

  RefCase(int b_, int s_, int h_, int h_kv_, bool causal_, uint64_t seed)
      : b(b_), s(s_), h(h_), h_kv(h_kv_), causal(causal_), scale(1.f / std::sqrt(static_cast<float>(D))) {
    Rng rng(seed);
    nq = static_cast<size_t>(b) * s * h * D;
    nkv = static_cast<size_t>(b) * s * h_kv * D;
    nl = static_cast<size_t>(b) * h * s;
    q = upload_random<T>(nq, rng, -2.f, 2.f);
    k = upload_random<T>(nkv, rng, -2.f, 2.f);
    v = upload_random<T>(nkv, rng, -1.f, 1.f);
    dout = upload_random<T>(nq, rng, -1.f, 1.f);
    CK(cudaMalloc(&o, nq * sizeof(T)));
    CK(cudaMalloc(&lse, nl * sizeof(float)));
    CK(cudaMalloc(&dsum, nl * sizeof(float)));
    CK(cudaMalloc(&rdq, nq * sizeof(float)));
    CK(cudaMalloc(&rdk, nkv * sizeof(float)));
    CK(cudaMalloc(&rdv, nkv * sizeof(float)));
    const int c = causal ? 1 : 0;
    ref_fwd<T, D><<<nblk(nl, 128), 128>>>(q, k, v, o, lse, b, s, h, h_kv, scale, c);
    CK(cudaGetLastError());
    ref_dsum<T, D><<<nblk(nl, 128), 128>>>(o, dout, dsum, b, s, h);
    ref_dq<T, D><<<nblk(nl, 128), 128>>>(q, k, v, dout, lse, dsum, rdq, b, s, h, h_kv, scale, c);
    ref_dkdv<T, D><<<nblk(static_cast<long long>(b) * h_kv * s, 128), 128>>>(q, k, v, dout, lse, dsum, rdk, rdv, b,
                                                                               s, h, h_kv, scale, c);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
  }
  ~RefCase() {
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(dout),
                    static_cast<void*>(o), static_cast<void*>(lse), static_cast<void*>(dsum), static_cast<void*>(rdq),
                    static_cast<void*>(rdk), static_cast<void*>(rdv)})
      CK(cudaFree(p));
  }
  RefCase(const RefCase&) = delete;
  RefCase& operator=(const RefCase&) = delete;

  hp::Sm90BwdArgs args(T* dq, T* dk, T* dv, void* ws) const {
    return make_args<T, D>(q, k, v, o, dout, lse, dq, dk, dv, ws, b, s, h, h_kv, scale, causal);
  }
};

template <typename T>
struct Grads {
  T *dq, *dk, *dv;
  size_t nq, nkv;
  Grads(size_t nq_, size_t nkv_) : nq(nq_), nkv(nkv_) {
    CK(cudaMalloc(&dq, nq * sizeof(T)));
    CK(cudaMalloc(&dk, nkv * sizeof(T)));
    CK(cudaMalloc(&dv, nkv * sizeof(T)));
    // Poison: 0xFF.. is NaN in bf16 / fp16, so an element a kernel does not write fails.
    CK(cudaMemset(dq, 0xFF, nq * sizeof(T)));
    CK(cudaMemset(dk, 0xFF, nkv * sizeof(T)));
    CK(cudaMemset(dv, 0xFF, nkv * sizeof(T)));
  }
  ~Grads() {
    for (T* t : {dq, dk, dv}) CK(cudaFree(t));
  }
  Grads(const Grads&) = delete;
  Grads& operator=(const Grads&) = delete;
};

// ------------------------------------------------------------------- check
template <typename T, int D>
static bool check_case(int b, int s, int h, int h_kv, bool causal, uint64_t seed) {
  const RefCase<T, D> rc(b, s, h, h_kv, causal, seed);
  const Grads<T> g(rc.nq, rc.nkv);
  const size_t wsb = hp::bwd_sm90_workspace_bytes(b, s, h, D);
  void* ws = nullptr;
  CK(cudaMalloc(&ws, wsb));
  CK(cudaMemset(ws, 0xFF, wsb));
  const int c = causal ? 1 : 0;

  bool ok = true;
  cudaError_t le = hp::bwd_run<T, D, false>(rc.args(g.dq, g.dk, g.dv, ws), 0);
  if (le != cudaSuccess) {
    std::printf("FAIL %s d=%d s=%d causal=%d h=%d/%d launch error: %s\n", Conv<T>::name(), D, s, c, h, h_kv,
                cudaGetErrorString(le));
    ok = false;
  } else {
    const cudaError_t se = cudaDeviceSynchronize();
    if (se != cudaSuccess) {  // a watchdog trap lands here; the context is gone
      std::printf("FAIL %s d=%d s=%d causal=%d h=%d/%d kernel error: %s\n", Conv<T>::name(), D, s, c, h, h_kv,
                  cudaGetErrorString(se));
      std::exit(1);
    }
    const Err eq = compare(g.dq, rc.rdq, rc.nq), ek = compare(g.dk, rc.rdk, rc.nkv), ev = compare(g.dv, rc.rdv, rc.nkv);
    const size_t bad = eq.bad + ek.bad + ev.bad;
    ok = bad == 0 && eq.rel < 2e-2 && ek.rel < 2e-2 && ev.rel < 2e-2;
    std::printf(
        "%s %s d=%d s=%d causal=%d h=%d/%d  dq %.3e (max %.2e)  dk %.3e (max %.2e)  dv %.3e (max %.2e)  "
        "nonfinite dq/dk/dv=%zu/%zu/%zu\n",
        ok ? "PASS" : "FAIL", Conv<T>::name(), D, s, c, h, h_kv, eq.rel, eq.max_abs, ek.rel, ek.max_abs, ev.rel,
        ev.max_abs, eq.bad, ek.bad, ev.bad);
  }
  CK(cudaFree(ws));
  return ok;
}

template <typename T>
static bool check_d(int d, int b, int s, int h, int h_kv, bool causal, uint64_t seed) {
  if (d == 64) return check_case<T, 64>(b, s, h, h_kv, causal, seed);
  if (d == 128) return check_case<T, 128>(b, s, h, h_kv, causal, seed);
  return check_case<T, 256>(b, s, h, h_kv, causal, seed);
}

static int run_check() {
  int fails = 0, n = 0;
  uint64_t seed = 4321;
  const int ds[] = {64, 128};
  const int ss[] = {1, 17, 128, 200, 1024};
  const int hkvs[] = {4, 2};
  for (int d : ds)
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal)
        for (int hkv : hkvs) {
          ++n;
          if (!check_d<__nv_bfloat16>(d, 2, s, 4, hkv, causal != 0, seed++)) ++fails;
        }
  const int s16[] = {17, 200};
  for (int d : ds)
    for (int s : s16)
      for (int causal = 0; causal < 2; ++causal) {
        ++n;
        if (!check_d<__half>(d, 2, s, 4, 2, causal != 0, seed++)) ++fails;
      }
  // d = 256 (bwd_kernel_d256.cuh: 64 x 64 tiles, so 63 / 65 straddle one tile edge).
  const int ss256[] = {1, 63, 65, 200, 512, 1024};
  for (int s : ss256)
    for (int causal = 0; causal < 2; ++causal)
      for (int hkv : hkvs) {
        ++n;
        if (!check_d<__nv_bfloat16>(256, 2, s, 4, hkv, causal != 0, seed++)) ++fails;
      }
  const int s16_256[] = {65, 200};
  for (int s : s16_256)
    for (int causal = 0; causal < 2; ++causal) {
      ++n;
      if (!check_d<__half>(256, 2, s, 4, 2, causal != 0, seed++)) ++fails;
    }
  std::printf("check: %d/%d passed\n", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// ---------------------------------------------------------------- checkdet
// Bytes of two device buffers equal?
static bool same_bytes(const void* a, const void* b, size_t bytes) {
  std::vector<unsigned char> x(bytes), y(bytes);
  CK(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
  return x == y;
}

// Takes half the SMs for ~50 us (100 KB of shared memory each, so that no 195 KB backward CTA
// fits beside it): launched just before a backward on another stream, it changes which SMs the
// backward's CTAs get and when.
__global__ void occupy_sms(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
constexpr int kOccupySmem = 100 * 1024;

// One backward through L on stream st; perturb: with occupy_sms on stream so first. Returns the
// fp32 dQ accumulator (the workspace's first n_acc floats) after the run.
static std::vector<float> run_bwd_once(const hp::BwdLaunch& L, size_t n_acc, bool perturb, cudaStream_t st,
                                       cudaStream_t so, int n_sm) {
  if (perturb) occupy_sms<<<std::max(1, n_sm / 2), 32, kOccupySmem, so>>>(50000ull);
  CK(cudaGetLastError());
  CK(hp::bwd_launch(L, st));
  CK(cudaDeviceSynchronize());  // a watchdog trap lands here (the context is gone): CK exits
  std::vector<float> acc(n_acc);
  CK(cudaMemcpy(acc.data(), L.p.dq_acc, n_acc * sizeof(float), cudaMemcpyDeviceToHost));
  return acc;
}

static size_t count_diff(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

template <typename T, int D>
static bool checkdet_case(int b, int s, int h, int h_kv, bool causal, uint64_t seed) {
  const RefCase<T, D> rc(b, s, h, h_kv, causal, seed);
  const size_t nq = rc.nq, nkv = rc.nkv;
  // Outputs: [0] the default kernel, [1] the same perturbed, [2] DET, [3] DET perturbed.
  const Grads<T> g0(nq, nkv), g1(nq, nkv), g2(nq, nkv), g3(nq, nkv);
  const Grads<T>* g[4] = {&g0, &g1, &g2, &g3};
  const size_t wsb = hp::bwd_sm90_det_workspace_bytes(b, s, h, D);
  void* ws = nullptr;
  CK(cudaMalloc(&ws, wsb));
  const int c = causal ? 1 : 0;

  int dev = 0, n_sm = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaFuncSetAttribute(occupy_sms, cudaFuncAttributeMaxDynamicSharedMemorySize, kOccupySmem));
  cudaStream_t st, so;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&so, cudaStreamNonBlocking));
  const size_t n_acc = nq;  // the fp32 dQ accumulator [b, s, h, D] at the workspace's start
  std::vector<float> acc[4];
  for (int r = 0; r < 4; ++r) {
    // Poisoned workspace before every run: the counters must come from the preprocess kernel.
    // (Synchronised: the backward runs on a non-blocking stream.)
    CK(cudaMemset(ws, 0xFF, wsb));
    CK(cudaDeviceSynchronize());
    hp::BwdLaunch L;
    const hp::Sm90BwdArgs a = rc.args(g[r]->dq, g[r]->dk, g[r]->dv, ws);
    const cudaError_t pe =
        r < 2 ? hp::bwd_prepare<T, D, false>(&L, a) : hp::bwd_prepare<T, D, true>(&L, a);
    if (pe != cudaSuccess) {
      std::printf("FAILDET %s d=%d s=%d causal=%d h=%d/%d prepare error: %s\n", Conv<T>::name(), D, s, c, h, h_kv,
                  cudaGetErrorString(pe));
      std::exit(1);
    }
    acc[r] = run_bwd_once(L, n_acc, (r & 1) != 0, st, so, n_sm);
  }
  CK(cudaStreamDestroy(st));
  CK(cudaStreamDestroy(so));

  const Err eq = compare(g2.dq, rc.rdq, nq), ek = compare(g2.dk, rc.rdk, nkv), ev = compare(g2.dv, rc.rdv, nkv);
  const size_t bad = eq.bad + ek.bad + ev.bad;
  const bool det_same = same_bytes(g2.dq, g3.dq, nq * sizeof(T)) && same_bytes(g2.dk, g3.dk, nkv * sizeof(T)) &&
                        same_bytes(g2.dv, g3.dv, nkv * sizeof(T)) && count_diff(acc[2], acc[3]) == 0;
  const bool kv_same = same_bytes(g2.dk, g0.dk, nkv * sizeof(T)) && same_bytes(g2.dv, g0.dv, nkv * sizeof(T));
  const bool ok = bad == 0 && eq.rel < 2e-2 && ek.rel < 2e-2 && ev.rel < 2e-2 && det_same && kv_same;
  std::printf(
      "%s %s d=%d s=%d b=%d causal=%d h=%d/%d  dq %.3e (max %.2e)  dk %.3e  dv %.3e  nonfinite=%zu  "
      "DET run-to-run: %s  dk/dv vs default: %s  default run-to-run: %zu/%zu fp32 dQ differ\n",
      ok ? "PASSDET" : "FAILDET", Conv<T>::name(), D, s, b, c, h, h_kv, eq.rel, eq.max_abs, ek.rel, ev.rel, bad,
      det_same ? "bitwise equal" : "DIFFER", kv_same ? "bitwise equal" : "DIFFER", count_diff(acc[0], acc[1]), n_acc);
  CK(cudaFree(ws));
  return ok;
}

// d = 64 / 128 (bf16), causal or not, MHA and GQA, tails; then more CTAs than SMs (chains of
// turns across waves, and in the perturbed run across more of them); fp16 on two tails.
static int run_checkdet() {
  int fails = 0, n = 0;
  uint64_t seed = 9876;
  auto one = [&](bool f16, int d, int b, int s, int h, int h_kv, bool causal) {
    ++n;
    bool ok;
    if (f16)
      ok = d == 64 ? checkdet_case<__half, 64>(b, s, h, h_kv, causal, seed++)
                   : checkdet_case<__half, 128>(b, s, h, h_kv, causal, seed++);
    else
      ok = d == 64 ? checkdet_case<__nv_bfloat16, 64>(b, s, h, h_kv, causal, seed++)
                   : checkdet_case<__nv_bfloat16, 128>(b, s, h, h_kv, causal, seed++);
    if (!ok) ++fails;
  };
  for (int d : {64, 128})
    for (int s : {1, 17, 200, 1024})
      for (int causal = 0; causal < 2; ++causal)
        for (int hkv : {4, 2}) one(false, d, 2, s, 4, hkv, causal != 0);
  for (int d : {64, 128})
    for (int causal = 0; causal < 2; ++causal) one(false, d, 4, 2048, 8, 4, causal != 0);
  for (int d : {64, 128})
    for (int s : {17, 200})
      for (int causal = 0; causal < 2; ++causal) one(true, d, 2, s, 4, 2, causal != 0);
  std::printf("checkdet: %d/%d passed\n", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// ------------------------------------------------------------------- bench
// Median of 20 CUDA-event-timed launches (after 5 warm-up launches), ms; < 0 on a launch error.
static double time_bwd(const hp::BwdLaunch& L) {
  for (int i = 0; i < 5; ++i)
    if (hp::bwd_launch(L, 0) != cudaSuccess) return -1.0;
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(e0));
    CK(hp::bwd_launch(L, 0));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0.f;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[9] + ms[10]);
}

// bench: HBWD = the library's kernel. kBenchDet (d = 64/128): then an HBWDDET line for the
// deterministic one on the same inputs.
enum BenchMode { kBench, kBenchDet };

// bench's problem at one point: bf16, b*s = 16k tokens, h*d = 2048, h_kv = h, inputs drawn as in
// every bench mode (seeded by s and D), outputs and the workspace (det: the deterministic variant's)
// allocated; freed with the object.
template <int D>
struct BwdBenchInputs {
  using T = __nv_bfloat16;
  int s, b, h;
  size_t n;
  float scale;
  T *q, *k, *v, *dout, *o = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float* lse = nullptr;
  void* ws = nullptr;
  BwdBenchInputs(int s_, bool det)
      : s(s_), b(std::max(1, 16384 / s_)), h(2048 / D), n(static_cast<size_t>(b) * s * h * D),
        scale(1.f / std::sqrt(static_cast<float>(D))) {
    Rng rng(77 + s + D);
    q = upload_random<T>(n, rng, -2.f, 2.f);
    k = upload_random<T>(n, rng, -2.f, 2.f);
    v = upload_random<T>(n, rng, -1.f, 1.f);
    dout = upload_random<T>(n, rng, -1.f, 1.f);
    for (T** p : {&o, &dq, &dk, &dv}) CK(cudaMalloc(p, n * sizeof(T)));
    CK(cudaMalloc(&lse, static_cast<size_t>(b) * h * s * sizeof(float)));
    CK(cudaMalloc(&ws, det ? hp::bwd_sm90_det_workspace_bytes(b, s, h, D) : hp::bwd_sm90_workspace_bytes(b, s, h, D)));
  }
  BwdBenchInputs(const BwdBenchInputs&) = delete;
  BwdBenchInputs& operator=(const BwdBenchInputs&) = delete;
  ~BwdBenchInputs() {
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(dout),
                    static_cast<void*>(o), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                    static_cast<void*>(lse), ws})
      CK(cudaFree(p));
  }
  hp::Sm90Args fwd_args(bool causal) const { return bshd_args<D>(q, k, v, o, lse, b, s, h, h, scale, causal); }
  hp::Sm90BwdArgs args(bool causal) const {
    return make_args<T, D>(q, k, v, o, dout, lse, dq, dk, dv, ws, b, s, h, h, scale, causal);
  }
};
template <int D, BenchMode MODE = kBench>
static bool bench_point(int s, bool causal) {
  using T = __nv_bfloat16;
  const BwdBenchInputs<D> in(s, MODE == kBenchDet);
  const int b = in.b, h = in.h;
  const int c = causal ? 1 : 0;
  // out / lse from the Hopper forward (realistic values; the reference forward is too slow here).
  bool ok = true;
  cudaError_t fe = hp::fwd_run(hp::fwd_prepare_one_tile<T, D, 2>, in.fwd_args(causal), 0);
  if (fe == cudaSuccess) fe = cudaDeviceSynchronize();
  if (fe != cudaSuccess) {
    std::printf("HBWD d=%d s=%d causal=%d forward (for out/lse) error: %s\n", D, s, c, cudaGetErrorString(fe));
    ok = false;
  }
  hp::BwdLaunch L;
  if (ok) {
    const cudaError_t pe = hp::bwd_prepare<T, D, false>(&L, in.args(causal));
    if (pe != cudaSuccess) {
      std::printf("HBWD d=%d s=%d causal=%d prepare error: %s\n", D, s, c, cudaGetErrorString(pe));
      ok = false;
    }
  }
  const double flops = 2.5 * 4.0 * b * h * static_cast<double>(s) * s * D / (causal ? 2.0 : 1.0);
  const double med = ok ? time_bwd(L) : -1.0;
  if (ok && med < 0) {
    std::printf("HBWD d=%d s=%d causal=%d launch error: %s\n", D, s, c, cudaGetErrorString(cudaGetLastError()));
    ok = false;
  }
  if (ok) {
    std::printf("HBWD d=%d s=%d causal=%d bwd %.3f ms %.1f TF/s\n", D, s, c, med, flops / (med * 1e-3) / 1e12);
    // benchdet's second kernel on the same inputs, with its ratio to the HBWD line.
    const auto second = [&](const char* tag, cudaError_t pe, const hp::BwdLaunch& L2, const char* vs) {
      const double med2 = pe == cudaSuccess ? time_bwd(L2) : -1.0;
      if (med2 < 0) {
        std::printf("%s d=%d s=%d causal=%d prepare/launch error: %s\n", tag, D, s, c,
                    cudaGetErrorString(pe != cudaSuccess ? pe : cudaGetLastError()));
        ok = false;
        return;
      }
      std::printf("%s d=%d s=%d causal=%d bwd %.3f ms %.1f TF/s (%.3fx %s)\n", tag, D, s, c, med2,
                  flops / (med2 * 1e-3) / 1e12, med / med2, vs);
    };
    if constexpr (MODE == kBenchDet && D != 256) {
      hp::BwdLaunch L2;
      const cudaError_t pe = hp::bwd_prepare<T, D, true>(&L2, in.args(causal));
      second("HBWDDET", pe, L2, "default");
    }
  }
  return ok;
}

static bool bench_d(int d, int s, bool causal) {
  if (d == 64) return bench_point<64>(s, causal);
  if (d == 128) return bench_point<128>(s, causal);
  if (d == 256) return bench_point<256>(s, causal);
  std::printf("unsupported d=%d\n", d);
  return false;
}

static bool benchdet_d(int d, int s, bool causal) {
  if (d == 64) return bench_point<64, kBenchDet>(s, causal);
  if (d == 128) return bench_point<128, kBenchDet>(s, causal);
  std::printf("benchdet: unsupported d=%d (64, 128)\n", d);
  return false;
}

static int run_benchdet() {
  bool ok = true;
  const int ss[] = {512, 1024, 2048, 4096, 8192, 16384};
  for (int d : {64, 128})
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal) ok = benchdet_d(d, s, causal != 0) && ok;
  return ok ? 0 : 1;
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
  if (mode == "checkdet") return run_checkdet();
  if (mode == "benchdet") return run_benchdet();
  if (mode == "onedet") {
    if (argc < 5) {
      std::fprintf(stderr, "usage: %s onedet D S CAUSAL\n", argv[0]);
      return 2;
    }
    return benchdet_d(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0) ? 0 : 1;
  }
  if (mode == "one") {
    if (argc < 5) {
      std::fprintf(stderr, "usage: %s one D S CAUSAL\n", argv[0]);
      return 2;
    }
    return bench_d(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0) ? 0 : 1;
  }
  std::fprintf(stderr,
               "usage: %s check | bench | one D S CAUSAL | checkdet | benchdet | onedet D S CAUSAL\n",
               argv[0]);
  return 2;
}
