// Standalone check + timer for the Hopper (sm_90a) forward (csrc/cuda/hopper/fwd_kernel.cuh) in the
// variants the library runs: v2 (one CTA per 128-row query tile), v3 (persistent, the library's
// causal tile order or a forced one), w3 (d = 64, three consumer warpgroups, one tile per CTA) and
// w3p (its persistent form). No torch, no library build.
//   harness check2             v2 vs a naive fp32 GPU reference: the basic grid, longer sequences,
//                              a 4-byte aligned output, rising score maxima
//   harness bench2             TFLOP/s table of v2 (bf16, b*s = 16384, h*d = 2048)
//   harness one2 D S CAUSAL    one v2 bench point (for ncu)
//   harness check3             v3 (library order, snake, snake head-major) vs the reference and bit
//                              for bit vs v2, on check2's grid and forced small grids (1..16 CTAs,
//                              so each CTA loops over many tiles)
//   harness bench3             bench2's table, v2 and v3 (tuned, snake, snake head-major) on the same
//                              inputs, HDIFF3: v3 vs v2
//   harness one3 D S CAUSAL    one v3 bench point (for ncu)
//   harness checkw3            w3 (and a few other ring depths / no rotation) bit for bit vs v2
//   harness benchw3            bench2's d = 64 rows: v2, w3 and w3 without rotation
//   harness onew3 S CAUSAL     one w3 d = 64 bench point (for ncu)
//   harness checkw3s           checkw3's cases with SKIP flipped; benchw3s: the A/B of SKIP
//   harness checkw3p           w3p vs v2 bit for bit, forced small grids, both causal orders
//   harness benchw3p           w3, w3p, w3, w3p per point (and v3 at s <= 1k)
// HARNESS_SUSTAIN_S / HARNESS_ENERGY_S (harness_common.h) apply to every timed mode.
// Build: tools/hopper/build.sh [OUT_BINARY]
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

#include "../../csrc/cuda/hopper/fwd_kernel.cuh"
#include "harness_common.h"

namespace hp = fusedattn::hopper;
using hp::FwdLaunch;
using hp::Sm90Args;
typedef cudaError_t (*PrepFn)(FwdLaunch*, const Sm90Args&);

// A kernel variant under test: its prepare function and a label.
struct Variant {
  PrepFn prep;
  std::string name;
};
// The SM count the persistent variants get (the device's; check3 / checkw3p force small grids).
static int g_v3_sms = 0;
static Sm90Args with_sms(const Sm90Args& a) {
  Sm90Args b = a;
  b.sm_count = g_v3_sms;
  return b;
}

template <typename T, int D>
static Variant v2_variant() {
  return {hp::fwd_prepare_one_tile<T, D, 2>, "v2"};
}
template <typename T, int D>
static cudaError_t v3_prep(FwdLaunch* L, const Sm90Args& a) {
  return hp::fwd_prepare_persistent<T, D, 2>(L, with_sms(a));
}
// A forced causal tile order (non-causal calls have one).
template <typename T, int D, int NCONS, int ORDER>
static cudaError_t persistent_order_prep(FwdLaunch* L, const Sm90Args& a) {
  if (!a.causal)
    return hp::fwd_prepare<hp::FwdConfigFor<T, D, NCONS, false>, hp::PersistentScheduler<false, hp::kTilesPlain>>(
        L, with_sms(a));
  return hp::fwd_prepare<hp::FwdConfigFor<T, D, NCONS, true>, hp::PersistentScheduler<true, ORDER>>(L, with_sms(a));
}
template <typename T, int D>
static Variant v3_variant() {
  return {v3_prep<T, D>, "v3:tuned"};
}
template <typename T, int D, int ORDER>
static Variant v3_sched_variant() {
  return {persistent_order_prep<T, D, 2, ORDER>, ORDER == hp::kTilesSnake ? "v3:snake" : "v3:snakehm"};
}

// w3 (d = 64): a configuration of key tiles, ring depth, rotation and SKIP.
template <typename T, int BN, int ST, bool PP, bool SKIP>
static cudaError_t w3_cfg_prep(FwdLaunch* L, const Sm90Args& a) {
  using Cfg = hp::FwdConfig<T, 64, 3, BN, ST, PP, SKIP>;
  if (a.causal) return hp::fwd_prepare<Cfg, hp::OneTileScheduler<true>>(L, a);
  return hp::fwd_prepare<Cfg, hp::OneTileScheduler<false>>(L, a);
}
template <typename T, int BN, int ST, bool PP, bool SKIP = true>
static Variant w3_cfg_variant() {
  return {w3_cfg_prep<T, BN, ST, PP, SKIP>, "w3:bn" + std::to_string(BN) + "/st" + std::to_string(ST) +
                                                (PP ? "/pp" : "/nopp") + (SKIP ? "/skip" : "")};
}
// The library's configuration; flip_skip: the same with SKIP flipped (the A/B of SKIP).
template <typename T>
static Variant w3_variant(bool flip_skip = false) {
  using C = hp::FwdTileConfig<64, 3, true>;
  if (flip_skip) return w3_cfg_variant<T, C::BN, C::STAGES, C::PP, !C::SKIP>();
  return {hp::fwd_prepare_one_tile<T, 64, 3>, "w3"};
}
template <typename T>
static cudaError_t w3p_prep(FwdLaunch* L, const Sm90Args& a) {
  return hp::fwd_prepare_persistent<T, 64, 3>(L, with_sms(a));
}
template <typename T>
static Variant w3p_variant() {
  return {w3p_prep<T>, "w3p:tuned"};
}
template <typename T, int ORDER>
static Variant w3p_sched_variant() {
  return {persistent_order_prep<T, 64, 3, ORDER>, ORDER == hp::kTilesSnakeHeadMajor ? "w3p:snakehm" : "w3p:snake"};
}

// ------------------------------------------------------------------ helpers

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


template <typename T, int D>
static cudaError_t launch_fast(const Variant& var, const T* q, const T* k, const T* v, T* o, float* lse, int b, int s,
                               int h, int h_kv, float scale, bool causal) {
  FwdLaunch L;
  cudaError_t e = var.prep(&L, bshd_args<D>(q, k, v, o, lse, b, s, h, h_kv, scale, causal));
  if (e != cudaSuccess) return e;
  return hp::fwd_launch(L, 0);
}

// ------------------------------------------------------------------- check
// How a check case departs from the default inputs. o_offset: the output starts that many elements
// into its allocation (2: 4-byte aligned only, so the epilogue takes store_frag_row's 4-byte path
// instead of its 16-byte one). key_ramp > 0: key j is scaled by 1 + key_ramp * j / s and the softmax
// scale by score_gain, so a row's maximum rises across its key tiles, several times by more than the
// kernels' kept-reference slack (the tiles that move the reference, and any path taken only when
// scores leave the expected range).
struct CaseInputs {
  int o_offset = 0;
  float key_ramp = 0.f;
  float score_gain = 1.f;
};

// Keys, rows of row_elems elements, s rows per batch: scaled by the ramp of CaseInputs.
template <typename T>
static T* upload_keys(size_t n, Rng& rng, int s, int row_elems, const CaseInputs& in) {
  return upload_random<T>(n, rng, -2.f, 2.f, [&](size_t i) {
    const int j = static_cast<int>((i / row_elems) % s);
    return 1.f + in.key_ramp * static_cast<float>(j) / static_cast<float>(s);
  });
}

static const char* inputs_tag(const CaseInputs& in) {
  if (in.key_ramp > 0.f) return in.o_offset != 0 ? " ramp o+2" : " ramp";
  return in.o_offset != 0 ? " o+2" : "";
}

template <typename T, int D>
static bool check_case(const Variant& var, int b, int s, int h, int h_kv, bool causal, uint64_t seed,
                       const CaseInputs& in = {}) {
  Rng rng(seed);
  const size_t nq = static_cast<size_t>(b) * s * h * D;
  const size_t nkv = static_cast<size_t>(b) * s * h_kv * D;
  const size_t nl = static_cast<size_t>(b) * h * s;
  const int o_offset = in.o_offset;
  T* q = upload_random<T>(nq, rng, -2.f, 2.f);
  T* k = upload_keys<T>(nkv, rng, s, h_kv * D, in);
  T* v = upload_random<T>(nkv, rng, -1.f, 1.f);
  T* o_buf = nullptr;
  float *lse = nullptr, *o_ref = nullptr, *lse_ref = nullptr;
  CK(cudaMalloc(&o_buf, (nq + o_offset) * sizeof(T)));
  T* o = o_buf + o_offset;
  CK(cudaMalloc(&lse, nl * sizeof(float)));
  CK(cudaMalloc(&o_ref, nq * sizeof(float)));
  CK(cudaMalloc(&lse_ref, nl * sizeof(float)));
  // Poison: 0xFF.. is NaN for bf16, fp16 and fp32.
  CK(cudaMemset(o_buf, 0xFF, (nq + o_offset) * sizeof(T)));
  CK(cudaMemset(lse, 0xFF, nl * sizeof(float)));
  const float scale = in.score_gain / std::sqrt(static_cast<float>(D));

  const long long total = static_cast<long long>(b) * h * s;
  ref_attn_kernel<T, D><<<static_cast<unsigned>((total + 127) / 128), 128>>>(q, k, v, o_ref, lse_ref, b, s, s, h,
                                                                              h_kv, scale, causal ? 1 : 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  cudaError_t le = launch_fast<T, D>(var, q, k, v, o, lse, b, s, h, h_kv, scale, causal);
  bool ok = true;
  if (le != cudaSuccess) {
    std::printf("FAIL %s %s d=%d s=%d causal=%d h=%d/%d launch error: %s\n", var.name.c_str(), Conv<T>::name(), D, s,
                causal ? 1 : 0, h, h_kv, cudaGetErrorString(le));
    ok = false;
  } else {
    // A kernel fault (watchdog trap, bad address) is sticky: report and stop.
    const cudaError_t se = cudaDeviceSynchronize();
    if (se != cudaSuccess) {
      std::printf("FAIL %s %s d=%d s=%d causal=%d h=%d/%d kernel error: %s\n", var.name.c_str(), Conv<T>::name(), D, s,
                  causal ? 1 : 0, h, h_kv, cudaGetErrorString(se));
      std::exit(1);
    }
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
    // max_abs too: |O| <= 1 (v in [-1, 1]) and its rounding is ~4e-3, while a bug confined to a
    // few tiles of a large case (a stale V slot, one wrong rescale) can stay under rel 1e-2.
    ok = nan_count == 0 && rel < 1e-2 && lse_err < 1e-2 && max_abs < 5e-2;
    std::printf("%s %s %s d=%d s=%d causal=%d h=%d/%d%s err=%.3e max_abs=%.3e lse_err=%.3e nan=%zu\n",
                ok ? "PASS" : "FAIL", var.name.c_str(), Conv<T>::name(), D, s, causal ? 1 : 0, h, h_kv, inputs_tag(in),
                rel, max_abs, lse_err, nan_count);
  }
  CK(cudaFree(q));
  CK(cudaFree(k));
  CK(cudaFree(v));
  CK(cudaFree(o_buf));
  CK(cudaFree(lse));
  CK(cudaFree(o_ref));
  CK(cudaFree(lse_ref));
  return ok;
}

template <typename T>
static bool check_d(int d, int b, int s, int h, int h_kv, bool causal, uint64_t seed) {
  switch (d) {
    case 64: return check_case<T, 64>(v2_variant<T, 64>(), b, s, h, h_kv, causal, seed);
    case 128: return check_case<T, 128>(v2_variant<T, 128>(), b, s, h, h_kv, causal, seed);
    case 256: return check_case<T, 256>(v2_variant<T, 256>(), b, s, h, h_kv, causal, seed);
  }
  return false;
}

// The basic case grid (d, s, causal, h_kv; bf16, plus a few fp16 cases).
static void check_grid(int* n, int* fails, uint64_t* seed) {
  const int ds[] = {64, 128, 256};
  const int ss[] = {1, 17, 128, 200, 1024};
  const int hkvs[] = {2, 4};
  for (int d : ds)
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal)
        for (int hkv : hkvs) {
          ++*n;
          if (!check_d<__nv_bfloat16>(d, 2, s, 4, hkv, causal != 0, (*seed)++)) ++*fails;
        }
  const int s16[] = {17, 200};
  for (int d : ds)
    for (int s : s16)
      for (int causal = 0; causal < 2; ++causal) {
        ++*n;
        if (!check_d<__half>(d, 2, s, 4, 2, causal != 0, (*seed)++)) ++*fails;
      }
}

// v2: the basic grid, then longer sequences (the ring wraps many times).
static int run_check2() {
  int fails = 0, n = 0;
  uint64_t seed = 1234;
  check_grid(&n, &fails, &seed);
  const int ds[] = {64, 128, 256};
  const int slong[] = {2000, 2048};
  for (int d : ds)
    for (int s : slong)
      for (int causal = 0; causal < 2; ++causal) {
        ++n;
        if (!check_d<__nv_bfloat16>(d, 1, s, 2, 1, causal != 0, seed++)) ++fails;
      }
  // An output that is only 4-byte aligned: the epilogue's 4-byte store path.
  using T = __nv_bfloat16;
  for (int causal = 0; causal < 2; ++causal) {
    n += 3;
    if (!check_case<T, 64>(v2_variant<T, 64>(), 2, 200, 4, 2, causal != 0, seed++, CaseInputs{2})) ++fails;
    if (!check_case<T, 128>(v2_variant<T, 128>(), 2, 200, 4, 2, causal != 0, seed++, CaseInputs{2})) ++fails;
    if (!check_case<T, 256>(v2_variant<T, 256>(), 2, 200, 4, 2, causal != 0, seed++, CaseInputs{2})) ++fails;
  }
  // Rising score maxima (key ramp 1 -> 7, scores 4x): the reference moves in most key tiles.
  const CaseInputs ramp{0, 6.f, 4.f};
  for (int causal = 0; causal < 2; ++causal)
    for (int sr : {1024, 2000}) {
      n += 4;
      if (!check_case<T, 64>(v2_variant<T, 64>(), 1, sr, 2, 1, causal != 0, seed++, ramp)) ++fails;
      if (!check_case<T, 128>(v2_variant<T, 128>(), 1, sr, 2, 1, causal != 0, seed++, ramp)) ++fails;
      if (!check_case<T, 256>(v2_variant<T, 256>(), 1, sr, 2, 1, causal != 0, seed++, ramp)) ++fails;
      using H = __half;
      if (!check_case<H, 128>(v2_variant<H, 128>(), 1, sr, 2, 1, causal != 0, seed++, ramp)) ++fails;
    }
  std::printf("check2: %d/%d passed\n", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// A variant's outputs (o3, l3) against the naive reference (o_ref, lse_ref: relative error, largest
// difference, lse error, non-finite count) and against v2's (o2, l2: bit for bit, largest
// differences), with the pass rule of check3 / checkw3.
struct VsV2 {
  double rel = 0.0, max_abs = 0.0, lse_err = 0.0, d_o = 0.0, d_l = 0.0;
  size_t nan_count = 0;
  bool bitwise = false, ok = false;
};
template <typename T>
static VsV2 compare_vs_ref_and_v2(const T* o2, const float* l2, const T* o3, const float* l3, const float* o_ref,
                                  const float* lse_ref, size_t nq, size_t nl) {
  VsV2 r;
  std::vector<T> h2(nq), h3(nq);
  std::vector<float> hor(nq), hl2(nl), hl3(nl), hlr(nl);
  CK(cudaMemcpy(h2.data(), o2, nq * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h3.data(), o3, nq * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hor.data(), o_ref, nq * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl2.data(), l2, nl * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl3.data(), l3, nl * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hlr.data(), lse_ref, nl * sizeof(float), cudaMemcpyDeviceToHost));
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < nq; ++i) {
    const double a = Conv<T>::to_f(h3[i]);
    const double ref = hor[i];
    if (!std::isfinite(a)) {
      ++r.nan_count;
      continue;
    }
    r.max_abs = std::max(r.max_abs, std::fabs(a - ref));
    num += (a - ref) * (a - ref);
    den += ref * ref;
  }
  for (size_t i = 0; i < nl; ++i) {
    if (!std::isfinite(hl3[i])) {
      ++r.nan_count;
      continue;
    }
    r.lse_err = std::max(r.lse_err, static_cast<double>(std::fabs(hl3[i] - hlr[i])));
  }
  r.rel = std::sqrt(num / std::max(den, 1e-30));
  // Bit for bit vs v2 (o as 16-bit patterns, lse as 32-bit patterns), and the largest difference.
  r.bitwise = std::memcmp(h2.data(), h3.data(), nq * sizeof(T)) == 0 &&
              std::memcmp(hl2.data(), hl3.data(), nl * sizeof(float)) == 0;
  for (size_t i = 0; i < nq; ++i)
    r.d_o = std::max(r.d_o, static_cast<double>(std::fabs(Conv<T>::to_f(h3[i]) - Conv<T>::to_f(h2[i]))));
  for (size_t i = 0; i < nl; ++i) r.d_l = std::max(r.d_l, static_cast<double>(std::fabs(hl3[i] - hl2[i])));
  r.ok = r.nan_count == 0 && r.rel < 1e-2 && r.lse_err < 1e-2 && r.max_abs < 5e-2 && r.bitwise;
  return r;
}

// ------------------------------------------------------------------ check3
// A variant of v2 (v3 or w3) vs the naive reference (same criteria as
// check_case) and bit for bit vs v2 (default config) on the same inputs; sms > 0
// sets the persistent kernel's grid (min(#tiles, sms)). Line: PASS|FAIL cfg
// dtype d s causal h [sms=..] err max_abs lse_err nan v2diff: bitwise=0|1
// max_abs_o max_abs_lse.
template <typename T, int D>
static bool check_vs_v2_case(const Variant& var, int b, int s, int h, int h_kv, bool causal, int sms, uint64_t seed,
                             const CaseInputs& in = {}) {
  const Variant v2 = v2_variant<T, D>();
  Rng rng(seed);
  const size_t nq = static_cast<size_t>(b) * s * h * D;
  const size_t nkv = static_cast<size_t>(b) * s * h_kv * D;
  const size_t nl = static_cast<size_t>(b) * h * s;
  T* q = upload_random<T>(nq, rng, -2.f, 2.f);
  T* k = upload_keys<T>(nkv, rng, s, h_kv * D, in);
  T* v = upload_random<T>(nkv, rng, -1.f, 1.f);
  T *o2 = nullptr, *o3 = nullptr;
  float *l2 = nullptr, *l3 = nullptr, *o_ref = nullptr, *lse_ref = nullptr;
  CK(cudaMalloc(&o2, nq * sizeof(T)));
  CK(cudaMalloc(&o3, nq * sizeof(T)));
  CK(cudaMalloc(&l2, nl * sizeof(float)));
  CK(cudaMalloc(&l3, nl * sizeof(float)));
  CK(cudaMalloc(&o_ref, nq * sizeof(float)));
  CK(cudaMalloc(&lse_ref, nl * sizeof(float)));
  CK(cudaMemset(o2, 0xFF, nq * sizeof(T)));
  CK(cudaMemset(o3, 0xFF, nq * sizeof(T)));
  CK(cudaMemset(l2, 0xFF, nl * sizeof(float)));
  CK(cudaMemset(l3, 0xFF, nl * sizeof(float)));
  const float scale = in.score_gain / std::sqrt(static_cast<float>(D));
  const long long total = static_cast<long long>(b) * h * s;
  ref_attn_kernel<T, D><<<static_cast<unsigned>((total + 127) / 128), 128>>>(q, k, v, o_ref, lse_ref, b, s, s, h,
                                                                              h_kv, scale, causal ? 1 : 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const int saved_sms = g_v3_sms;
  if (sms > 0) g_v3_sms = sms;
  const cudaError_t e2 = launch_fast<T, D>(v2, q, k, v, o2, l2, b, s, h, h_kv, scale, causal);
  const cudaError_t e3 = launch_fast<T, D>(var, q, k, v, o3, l3, b, s, h, h_kv, scale, causal);
  g_v3_sms = saved_sms;
  // The line's case: the persistent kernel's grid (sms=) where it matters.
  char where[160];
  const int wn = std::snprintf(where, sizeof(where), "%s %s d=%d s=%d causal=%d h=%d/%d%s", var.name.c_str(),
                               Conv<T>::name(), D, s, causal ? 1 : 0, h, h_kv, inputs_tag(in));
  if (sms > 0) std::snprintf(where + wn, sizeof(where) - wn, " sms=%d", sms);
  bool ok = true;
  if (e2 != cudaSuccess || e3 != cudaSuccess) {
    std::printf("FAIL %s launch error: v2 %s, variant %s\n", where, cudaGetErrorString(e2), cudaGetErrorString(e3));
    ok = false;
  } else {
    const cudaError_t se = cudaDeviceSynchronize();
    if (se != cudaSuccess) {
      std::printf("FAIL %s kernel error: %s\n", where, cudaGetErrorString(se));
      std::exit(1);
    }
    const VsV2 r = compare_vs_ref_and_v2<T>(o2, l2, o3, l3, o_ref, lse_ref, nq, nl);
    ok = r.ok;
    std::printf("%s %s err=%.3e max_abs=%.3e lse_err=%.3e nan=%zu v2diff: bitwise=%d max_abs_o=%.3e max_abs_lse=%.3e\n",
                ok ? "PASS" : "FAIL", where, r.rel, r.max_abs, r.lse_err, r.nan_count, r.bitwise ? 1 : 0, r.d_o, r.d_l);
  }
  for (void* ptr : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o2),
                    static_cast<void*>(o3), static_cast<void*>(l2), static_cast<void*>(l3), static_cast<void*>(o_ref),
                    static_cast<void*>(lse_ref)})
    CK(cudaFree(ptr));
  return ok;
}

// check3's order: 0 the library's choice, else that tile order.
static int g_v3_sched = 0;
template <typename T, int D>
static Variant v3_check_variant() {
  if (g_v3_sched == hp::kTilesSnake) return v3_sched_variant<T, D, hp::kTilesSnake>();
  if (g_v3_sched == hp::kTilesSnakeHeadMajor) return v3_sched_variant<T, D, hp::kTilesSnakeHeadMajor>();
  return v3_variant<T, D>();
}
template <typename T, int D>
static bool check3_case(int b, int s, int h, int h_kv, bool causal, int sms, uint64_t seed) {
  return check_vs_v2_case<T, D>(v3_check_variant<T, D>(), b, s, h, h_kv, causal, sms, seed);
}

template <typename T>
static bool check3_d(int d, int b, int s, int h, int h_kv, bool causal, int sms, uint64_t seed) {
  switch (d) {
    case 64: return check3_case<T, 64>(b, s, h, h_kv, causal, sms, seed);
    case 128: return check3_case<T, 128>(b, s, h, h_kv, causal, sms, seed);
    case 256: return check3_case<T, 256>(b, s, h, h_kv, causal, sms, seed);
  }
  return false;
}

// check2's basic grid and long sequences with the device's SM count (most of
// these have fewer tiles than SMs: one tile per CTA), then forced small grids
// so that CTAs loop over many tiles (ring wrap across tiles, Q slot reuse,
// ping-pong across tile boundaries, causal tiles of different lengths,
// 1-kv-block tiles, uneven tile counts per CTA).
static void check3_pass(int& fails, int& n) {
  uint64_t seed = 1234;
  const int sms = g_v3_sms;
  const int ds[] = {64, 128, 256};
  const int ss[] = {1, 17, 128, 200, 1024};
  const int hkvs[] = {2, 4};
  for (int d : ds)
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal)
        for (int hkv : hkvs) {
          ++n;
          if (!check3_d<__nv_bfloat16>(d, 2, s, 4, hkv, causal != 0, sms, seed++)) ++fails;
        }
  const int s16[] = {17, 200};
  for (int d : ds)
    for (int s : s16)
      for (int causal = 0; causal < 2; ++causal) {
        ++n;
        if (!check3_d<__half>(d, 2, s, 4, 2, causal != 0, sms, seed++)) ++fails;
      }
  const int slong[] = {2000, 2048};
  for (int d : ds)
    for (int s : slong)
      for (int causal = 0; causal < 2; ++causal) {
        ++n;
        if (!check3_d<__nv_bfloat16>(d, 1, s, 2, 1, causal != 0, sms, seed++)) ++fails;
      }
  // Persistent loops: (b, s, h, h_kv) x forced grid sizes.
  struct PCase {
    int b, s, h, hkv;
  };
  const PCase pcs[] = {{2, 200, 4, 2}, {3, 333, 4, 4}, {2, 1024, 4, 2}, {8, 128, 2, 1}, {1, 17, 3, 3}};
  const int grids[] = {1, 3, 7, 16};
  for (int d : ds)
    for (const PCase& pc : pcs)
      for (int g : grids)
        for (int causal = 0; causal < 2; ++causal) {
          ++n;
          if (!check3_d<__nv_bfloat16>(d, pc.b, pc.s, pc.h, pc.hkv, causal != 0, g, seed++)) ++fails;
        }
  // Short-sequence bench shape (many tiles per CTA at the real SM count).
  for (int d : ds)
    for (int causal = 0; causal < 2; ++causal) {
      ++n;
      if (!check3_d<__nv_bfloat16>(d, 32, 512, 2048 / d / 4, 2048 / d / 4, causal != 0, sms, seed++)) ++fails;
    }
}

// Every causal tile order: the library's choice, snake, snake head-major.
static int run_check3() {
  int fails = 0, n = 0;
  for (int sched : {0, hp::kTilesSnake, hp::kTilesSnakeHeadMajor}) {
    g_v3_sched = sched;
    check3_pass(fails, n);
  }
  g_v3_sched = 0;
  // Rising score maxima (check2's ramp cases), the library order and snake, at each head dim.
  const CaseInputs ramp{0, 6.f, 4.f};
  uint64_t seed = 9876;
  for (int sched : {0, hp::kTilesSnake}) {
    g_v3_sched = sched;
    for (int causal = 0; causal < 2; ++causal) {
      n += 3;
      using T = __nv_bfloat16;
      if (!check_vs_v2_case<T, 64>(v3_check_variant<T, 64>(), 1, 1024, 2, 1, causal != 0, 0, seed++, ramp)) ++fails;
      if (!check_vs_v2_case<T, 128>(v3_check_variant<T, 128>(), 1, 1024, 2, 1, causal != 0, 0, seed++, ramp)) ++fails;
      if (!check_vs_v2_case<T, 256>(v3_check_variant<T, 256>(), 1, 2000, 2, 1, causal != 0, 0, seed++, ramp)) ++fails;
    }
  }
  g_v3_sched = 0;
  std::printf("check3: %d/%d passed\n", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// ----------------------------------------------------------------- checkw3
// w3 (d = 64, three consumers) through check_vs_v2_case: bit for bit vs v2's
// default config (same BN = 128).
template <typename T>
static bool checkw3_case(const Variant& w3, int b, int s, int h, int h_kv, bool causal, uint64_t seed,
                         const CaseInputs& in = {}) {
  return check_vs_v2_case<T, 64>(w3, b, s, h, h_kv, causal, 0, seed, in);
}

// check2's d = 64 grid (tails: s = 17, 200 are < 192 or not a multiple of
// it), its long sequences, longer ones (ring wraps, many causal tile lengths),
// and a few cases with the no-rotation config and other ring depths. skip
// (checkw3s): the same cases with the default's SKIP flipped (the other configs
// as they are); the tails and long causal sequences are the cases where
// warpgroups skip tiles.
static int run_checkw3(bool skip = false) {
  int fails = 0, n = 0;
  uint64_t seed = 1234;
  const Variant def16 = w3_variant<__half>(skip);
  const Variant def = w3_variant<__nv_bfloat16>(skip);
  const int ss[] = {1, 17, 128, 200, 1024};
  const int hkvs[] = {2, 4};
  for (int s : ss)
    for (int causal = 0; causal < 2; ++causal)
      for (int hkv : hkvs) {
        ++n;
        if (!checkw3_case<__nv_bfloat16>(def, 2, s, 4, hkv, causal != 0, seed++)) ++fails;
      }
  const int s16[] = {17, 200};
  for (int s : s16)
    for (int causal = 0; causal < 2; ++causal) {
      ++n;
      if (!checkw3_case<__half>(def16, 2, s, 4, 2, causal != 0, seed++)) ++fails;
    }
  const int slong[] = {192, 383, 384, 577, 2000, 2048, 4096, 8000};
  for (int s : slong)
    for (int causal = 0; causal < 2; ++causal) {
      ++n;
      if (!checkw3_case<__nv_bfloat16>(def, 1, s, 2, 1, causal != 0, seed++)) ++fails;
    }
  const Variant others[] = {w3_cfg_variant<__nv_bfloat16, 128, 4, false>(),
                            w3_cfg_variant<__nv_bfloat16, 128, 2, true>(),
                            w3_cfg_variant<__nv_bfloat16, 128, 6, true>()};
  const int sx[] = {17, 333, 2048};
  for (const Variant& var : others)
    for (int s : sx)
      for (int causal = 0; causal < 2; ++causal) {
        ++n;
        if (!checkw3_case<__nv_bfloat16>(var, 2, s, 4, 2, causal != 0, seed++)) ++fails;
      }
  // Rising score maxima (check2's ramp cases).
  const CaseInputs ramp{0, 6.f, 4.f};
  for (int s : {1024, 4096})
    for (int causal = 0; causal < 2; ++causal) {
      n += 2;
      if (!checkw3_case<__nv_bfloat16>(def, 1, s, 2, 1, causal != 0, seed++, ramp)) ++fails;
      if (!checkw3_case<__half>(def16, 1, s, 2, 1, causal != 0, seed++, ramp)) ++fails;
    }
  std::printf("checkw3%s: %d/%d passed\n", skip ? "s" : "", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// ------------------------------------------------------------------- bench
// Median of 20 timed launches (after 5 warm-ups); < 0 on a launch error.
static double time_launch(const FwdLaunch& L) {
  const auto launch = hp::fwd_launch;
  for (int i = 0; i < 5; ++i)
    if (launch(L, 0) != cudaSuccess) return -1.0;
  CK(cudaDeviceSynchronize());
  sustain([&] { CK(launch(L, 0)); });
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(e0));
    CK(launch(L, 0));
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

// bench's problem at one point: bf16, b*s = 16k tokens, h*d = 2048, h_kv = h, inputs drawn as
// everywhere in this harness (seeded by s and D), outputs allocated; freed with the object.
template <int D>
struct BenchInputs {
  using T = __nv_bfloat16;
  int s, b, h;
  size_t n, nl;
  T *q, *k, *v, *o = nullptr;
  float* lse = nullptr;
  float scale;
  explicit BenchInputs(int s_)
      : s(s_), b(std::max(1, 16384 / s_)), h(2048 / D), n(static_cast<size_t>(b) * s * h * D),
        nl(static_cast<size_t>(b) * h * s), scale(1.f / std::sqrt(static_cast<float>(D))) {
    Rng rng(42 + s + D);
    q = upload_random<T>(n, rng, -2.f, 2.f);
    k = upload_random<T>(n, rng, -2.f, 2.f);
    v = upload_random<T>(n, rng, -1.f, 1.f);
    CK(cudaMalloc(&o, n * sizeof(T)));
    CK(cudaMalloc(&lse, nl * sizeof(float)));
  }
  BenchInputs(const BenchInputs&) = delete;
  BenchInputs& operator=(const BenchInputs&) = delete;
  ~BenchInputs() {
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                    static_cast<void*>(lse)})
      CK(cudaFree(p));
  }
  Sm90Args args(bool causal) const { return bshd_args<D>(q, k, v, o, lse, b, s, h, h, scale, causal); }
};

// vars[0] is the reference for HDIFF. Line tag: HBENCH2 for v2 (with cfg= when show_cfg), HBENCH3 for v3
// (its diff line is HDIFF3, with bitwise=0|1 against vars[0]).
template <int D>
static bool bench_point(int s, bool causal, const std::vector<Variant>& vars, bool show_cfg) {
  using T = __nv_bfloat16;
  const BenchInputs<D> in(s);
  const int b = in.b, h = in.h;
  const size_t n = in.n, nl = in.nl;
  T* o = in.o;
  float* lse = in.lse;
  const double flops = 4.0 * b * h * static_cast<double>(s) * s * D / (causal ? 2.0 : 1.0);
  bool ok = true;
  std::vector<T> ref_o, cur_o;
  std::vector<float> ref_l, cur_l;
  for (size_t vi = 0; vi < vars.size(); ++vi) {
    const Variant& var = vars[vi];
    const bool is_v3 = var.name.compare(0, 2, "v3") == 0;
    const bool is_w3 = var.name.compare(0, 2, "w3") == 0;
    const char* tag = is_v3 ? "HBENCH3" : (is_w3 ? "HBENCHW3" : "HBENCH2");
    std::string cfg = show_cfg ? " cfg=" + var.name : "";
    CK(cudaMemset(o, 0xFF, n * sizeof(T)));
    CK(cudaMemset(lse, 0xFF, nl * sizeof(float)));
    FwdLaunch L;
    cudaError_t pe = var.prep(&L, in.args(causal));
    if (pe != cudaSuccess) {
      std::printf("%s d=%d s=%d causal=%d%s prepare error: %s\n", tag, D, s, causal ? 1 : 0, cfg.c_str(),
                  cudaGetErrorString(pe));
      ok = false;
      continue;
    }
    const double med = time_launch(L);
    if (med < 0.0) {
      std::printf("%s d=%d s=%d causal=%d%s launch error: %s\n", tag, D, s, causal ? 1 : 0, cfg.c_str(),
                  cudaGetErrorString(cudaGetLastError()));
      ok = false;
      continue;
    }
    const std::string clk = sustain_seconds() > 0.0 ? clock_power_now() : "";
    const std::string joules =
        energy_seconds() > 0.0 ? energy_per_launch([&] { CK(hp::fwd_launch(L, 0)); }, flops) : "";
    std::printf("%s d=%d s=%d causal=%d fwd %.3f ms %.1f TF/s%s%s%s\n", tag, D, s, causal ? 1 : 0, med,
                flops / (med * 1e-3) / 1e12, cfg.c_str(), clk.c_str(), joules.c_str());
    // Outputs of this variant (all launches wrote the same values) vs vars[0].
    std::vector<T>& dst_o = vi == 0 ? ref_o : cur_o;
    std::vector<float>& dst_l = vi == 0 ? ref_l : cur_l;
    dst_o.resize(n);
    dst_l.resize(nl);
    CK(cudaMemcpy(dst_o.data(), o, n * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dst_l.data(), lse, nl * sizeof(float), cudaMemcpyDeviceToHost));
    if (vi > 0 && !ref_o.empty()) {
      double max_o = 0.0, max_l = 0.0;
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const float a = Conv<T>::to_f(cur_o[i]), r = Conv<T>::to_f(ref_o[i]);
        if (!std::isfinite(a) || !std::isfinite(r)) {
          ++bad;
          continue;
        }
        max_o = std::max(max_o, static_cast<double>(std::fabs(a - r)));
      }
      for (size_t i = 0; i < nl; ++i) {
        if (!std::isfinite(cur_l[i]) || !std::isfinite(ref_l[i])) {
          ++bad;
          continue;
        }
        max_l = std::max(max_l, static_cast<double>(std::fabs(cur_l[i] - ref_l[i])));
      }
      // bf16 outputs in [-1, 1]: a few ulps (~1e-2) are rounding-order noise.
      const bool same = bad == 0 && max_o < 3e-2 && max_l < 1e-3;
      if (is_v3 || is_w3) {
        const bool bitwise = std::memcmp(cur_o.data(), ref_o.data(), n * sizeof(T)) == 0 &&
                             std::memcmp(cur_l.data(), ref_l.data(), nl * sizeof(float)) == 0;
        std::printf("%s d=%d s=%d causal=%d %s vs %s: %s bitwise=%d max_abs_o=%.3e max_abs_lse=%.3e nonfinite=%zu\n",
                    is_w3 ? "HDIFFW3" : "HDIFF3", D, s, causal ? 1 : 0, var.name.c_str(), vars[0].name.c_str(), same ? "OK" : "MISMATCH",
                    bitwise ? 1 : 0, max_o, max_l, bad);
        if (!same) ok = false;
        continue;
      }
      std::printf("HDIFF d=%d s=%d causal=%d %s vs %s: %s max_abs_o=%.3e max_abs_lse=%.3e nonfinite=%zu\n", D, s,
                  causal ? 1 : 0, var.name.c_str(), vars[0].name.c_str(), same ? "OK" : "MISMATCH", max_o, max_l, bad);
      if (!same) ok = false;
    }
  }
  return ok;
}

// which: 1 = v2; 4 = v2 + v3 (tuned, snake, snake head-major); 5 = v3 (tuned).
template <int D>
static std::vector<Variant> bench_variants(int which) {
  using T = __nv_bfloat16;
  if (which == 1) return {v2_variant<T, D>()};
  if (which == 5) return {v3_variant<T, D>()};
  return {v2_variant<T, D>(), v3_variant<T, D>(), v3_sched_variant<T, D, hp::kTilesSnake>(),
          v3_sched_variant<T, D, hp::kTilesSnakeHeadMajor>()};
}

static bool bench_d(int d, int s, bool causal, int which) {
  switch (d) {
    case 64: return bench_point<64>(s, causal, bench_variants<64>(which), which == 4);
    case 128: return bench_point<128>(s, causal, bench_variants<128>(which), which == 4);
    case 256: return bench_point<256>(s, causal, bench_variants<256>(which), which == 4);
  }
  std::printf("unsupported d=%d\n", d);
  return false;
}

static int run_bench(int which) {
  bool ok = true;
  const int ds[] = {64, 128, 256};
  const int ss[] = {512, 1024, 2048, 4096, 8192, 16384};
  for (int d : ds)
    for (int s : ss)
      for (int causal = 0; causal < 2; ++causal) ok = bench_d(d, s, causal != 0, which) && ok;
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------- checkw3p
// The persistent three-consumer forward, bit for bit vs v2 (same BN = 128): checkw3's shapes at the
// device's SM count (mostly one tile per CTA), then forced small grids (sms = 1 / 3 / 7 / 16) so that
// CTAs loop over many tiles: the Q ring (two slots, released after each warpgroup's last S, SKIP's
// n_eff = 1 included), the K / V rings and the rotation across tile boundaries, causal tiles of
// different lengths and 1-block tiles, uneven tile counts per CTA; both causal schedules; rising score
// maxima (the softmax's slow path, whose S reissue reads Q before the slot's release) on small grids.
static int run_checkw3p() {
  int fails = 0, n = 0;
  uint64_t seed = 4242;
  const Variant tuned = w3p_variant<__nv_bfloat16>(), tuned16 = w3p_variant<__half>();
  const Variant scheds[] = {w3p_sched_variant<__nv_bfloat16, hp::kTilesSnake>(),
                            w3p_sched_variant<__nv_bfloat16, hp::kTilesSnakeHeadMajor>()};
  auto one = [&](const Variant& var, bool f16, int b, int s, int h, int hkv, bool causal, int sms,
                 const CaseInputs& in = {}) {
    ++n;
    const bool ok = f16 ? check_vs_v2_case<__half, 64>(var, b, s, h, hkv, causal, sms, seed++, in)
                        : check_vs_v2_case<__nv_bfloat16, 64>(var, b, s, h, hkv, causal, sms, seed++, in);
    if (!ok) ++fails;
  };
  for (int s : {1, 17, 128, 200, 1024})
    for (int causal = 0; causal < 2; ++causal)
      for (int hkv : {2, 4}) one(tuned, false, 2, s, 4, hkv, causal != 0, 0);
  for (int s : {17, 200})
    for (int causal = 0; causal < 2; ++causal) one(tuned16, true, 2, s, 4, 2, causal != 0, 0);
  for (int s : {192, 383, 577, 2048, 4096})
    for (int causal = 0; causal < 2; ++causal) one(tuned, false, 1, s, 2, 1, causal != 0, 0);
  struct PCase {
    int b, s, h, hkv;
  };
  const PCase pcs[] = {{2, 200, 4, 2}, {3, 333, 4, 4}, {2, 1024, 4, 2}, {8, 128, 2, 1}, {1, 17, 3, 3}, {1, 2048, 4, 2}};
  for (const Variant& var : scheds)
    for (const PCase& pc : pcs)
      for (int g : {1, 3, 7, 16})
        for (int causal = 0; causal < 2; ++causal) one(var, false, pc.b, pc.s, pc.h, pc.hkv, causal != 0, g);
  const CaseInputs ramp{0, 6.f, 4.f};
  for (int causal = 0; causal < 2; ++causal) {
    one(tuned, false, 1, 1024, 2, 1, causal != 0, 3, ramp);
    one(tuned16, true, 1, 1024, 2, 1, causal != 0, 3, ramp);
    one(tuned, false, 2, 4096, 2, 1, causal != 0, 0, ramp);
  }
  // The bench shape at s = 512 (b = 32, 32 heads: 3 query tiles a head, ~23 tiles per CTA).
  for (int causal = 0; causal < 2; ++causal) one(tuned, false, 32, 512, 32, 32, causal != 0, 0);
  std::printf("checkw3p: %d/%d passed\n", n - fails, n);
  return fails == 0 ? 0 : 1;
}

// benchw3p: per point the three-consumer default, the persistent one, then both again (A B A B:
// the drift between the two default lines bounds one ratio; pair means cancel a linear drift); at
// s <= 1k, where the library runs the persistent two-consumer kernel (v3, its tuned schedule), that
// one too, last.
// HDIFFW3 / HDIFF3 against the first line: bitwise equal expected.
static int run_benchw3p() {
  using T = __nv_bfloat16;
  bool ok = true;
  for (int s : {512, 1024, 2048, 4096, 8192, 16384})
    for (int causal = 1; causal >= 0; --causal) {
      std::vector<Variant> vars{w3_variant<T>(), w3p_variant<T>(), w3_variant<T>(), w3p_variant<T>()};
      if (s <= 1024) vars.push_back(v3_variant<T, 64>());
      ok = bench_point<64>(s, causal != 0, vars, true) && ok;
    }
  return ok ? 0 : 1;
}

// d = 64 rows of bench's table: v2 default (HBENCH2), w3 default (rotation)
// and w3 without rotation (HBENCHW3, with HDIFFW3 vs v2). With only_s >= 0
// (onew3): that one point, w3 default alone. skip (benchw3s): v2, w3 default,
// w3 with SKIP flipped, w3 default again (the drift between the two default
// lines bounds what the flipped line can show), s >= 1k.
static int run_benchw3(int only_s = -1, int only_causal = -1, bool skip = false) {
  using T = __nv_bfloat16;
  bool ok = true;
  const int ss[] = {512, 1024, 2048, 4096, 8192, 16384};
  if (only_s >= 0) return bench_point<64>(only_s, only_causal != 0, {w3_variant<T>(skip)}, true) ? 0 : 1;
  for (int s : ss)
    for (int causal = 0; causal < 2; ++causal) {
      if (skip && s < 1024) continue;
      const std::vector<Variant> vars =
          skip ? std::vector<Variant>{v2_variant<T, 64>(), w3_variant<T>(), w3_variant<T>(true), w3_variant<T>()}
               : std::vector<Variant>{v2_variant<T, 64>(), w3_variant<T>(), w3_cfg_variant<T, 128, 4, false>()};
      ok = bench_point<64>(s, causal != 0, vars, true) && ok;
    }
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check2";
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("this harness needs an sm_90 (Hopper) GPU; built for sm_90a only\n");
    return 1;
  }
  g_v3_sms = prop.multiProcessorCount;
  if (mode == "check2") return run_check2();
  if (mode == "bench2") return run_bench(1);
  if (mode == "checkw3p") return run_checkw3p();
  if (mode == "benchw3p") return run_benchw3p();
  if (mode == "check3") return run_check3();
  if (mode == "bench3") return run_bench(4);
  if (mode == "checkw3") return run_checkw3();
  if (mode == "benchw3") return run_benchw3();
  if (mode == "checkw3s") return run_checkw3(true);
  if (mode == "benchw3s") return run_benchw3(-1, -1, true);
  if (mode == "onew3") {
    if (argc < 4) {
      std::fprintf(stderr, "usage: %s onew3 S CAUSAL\n", argv[0]);
      return 2;
    }
    return run_benchw3(std::atoi(argv[2]), std::atoi(argv[3]) != 0 ? 1 : 0);
  }
  if (mode == "one2" || mode == "one3") {
    if (argc < 5) {
      std::fprintf(stderr, "usage: %s %s D S CAUSAL\n", argv[0], mode.c_str());
      return 2;
    }
    const int which = mode == "one2" ? 1 : 5;
    return bench_d(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0, which) ? 0 : 1;
  }
  std::fprintf(stderr,
               "usage: %s check2 | bench2 | one2 D S CAUSAL | check3 | bench3 | one3 D S CAUSAL | checkw3 | benchw3 | "
               "onew3 S CAUSAL | checkw3s | benchw3s | checkw3p | benchw3p\n",
               argv[0]);
  return 2;
}
