// Test support for the CPU attention engine: a tiny check framework, a
// std::thread executor, host tensors of any dtype and strides, and a naive
// double-precision reference of the forward and backward semantics.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fusedattn/api.h"
#include "fusedattn/philox.h"

namespace fa_test {

using namespace fusedattn;

// ---- check framework ----------------------------------------------------------
inline int& failures() {
  static int n = 0;
  return n;
}
inline int& checks() {
  static int n = 0;
  return n;
}
#define CHECK(cond)                                                          \
  do {                                                                       \
    ++::fa_test::checks();                                                   \
    if (!(cond)) {                                                           \
      ++::fa_test::failures();                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                        \
  } while (0)
#define CHECK_MSG(cond, ...)                                                 \
  do {                                                                       \
    ++::fa_test::checks();                                                   \
    if (!(cond)) {                                                           \
      ++::fa_test::failures();                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
    }                                                                        \
  } while (0)

inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks(), failures());
  return failures() == 0 ? 0 : 1;
}

// ---- executor ---------------------------------------------------------------------
// n threads; `serial_macs` as Executor's (0: every call is handed over); calls() counts parallel_for.
class ThreadExecutor final : public Executor {
 public:
  explicit ThreadExecutor(int n, int64_t serial_macs = 0) : n_(n), serial_macs_(serial_macs) {}
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const override {
    ++calls_;
    if (n <= 0) return;
    const int64_t t = std::min<int64_t>(n_, n);
    std::vector<std::thread> th;
    for (int64_t k = 1; k < t; ++k) th.emplace_back([&, k] { fn(n * k / t, n * (k + 1) / t); });
    fn(0, n / t);
    for (auto& x : th) x.join();
  }
  int num_threads() const override { return n_; }
  int64_t serial_macs() const override { return serial_macs_; }
  int calls() const { return calls_; }

 private:
  int n_;
  int64_t serial_macs_;
  mutable int calls_ = 0;
};

// ---- element encode/decode (independent of the engine's) -------------------------
inline size_t elem_size(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 8;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kBool: return 1;
    default: return 4;
  }
}

inline double decode(DType dt, const void* p) {
  switch (dt) {
    case DType::kFloat32: return *static_cast<const float*>(p);
    case DType::kFloat64: return *static_cast<const double*>(p);
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const int sign = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
      double v;
      if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
      else if (e == 0) v = std::ldexp(static_cast<double>(m), -24);
      else v = std::ldexp(1024.0 + m, e - 25);
      return sign ? -v : v;
    }
    default: return 0;
  }
}

// Encodes by truncation (inputs only; the reference reads the decoded values back).
inline void encode_trunc(DType dt, double v, void* p) {
  switch (dt) {
    case DType::kFloat32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::kFloat64: std::memcpy(p, &v, 8); break;
    case DType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t b = static_cast<uint16_t>(u >> 16);
      std::memcpy(p, &b, 2);
      break;
    }
    case DType::kFloat16: {
      // |v| < 2 and exact grid of 2^-10 relative: take sign, exponent, 10 bits.
      uint16_t h = 0;
      double a = std::fabs(v);
      if (a >= std::ldexp(1.0, -14)) {
        int e;
        double fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
        int m = static_cast<int>(std::floor((fr * 2 - 1) * 1024));
        h = static_cast<uint16_t>(((e - 1 + 15) << 10) | m);
      } else {
        h = static_cast<uint16_t>(std::floor(a * std::ldexp(1.0, 24)));
      }
      if (v < 0) h |= 0x8000;
      std::memcpy(p, &h, 2);
      break;
    }
    default: break;
  }
}

// ---- host tensors ---------------------------------------------------------------------
// A [b, s, h, d]-like tensor (thd: [t, h, d]) in some dtype with arbitrary strides.
struct HostSeq {
  DType dt = DType::kFloat32;
  int64_t nb = 1, ns = 1, nh = 1, nd = 1;  // logical sizes (nb = 1 for thd)
  std::vector<uint8_t> bytes;
  SeqTensor view;

  double get(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return decode(dt, ptr(b, s, h, d));
  }
  void set(int64_t b, int64_t s, int64_t h, int64_t d, double v) { encode_trunc(dt, v, ptr(b, s, h, d)); }
  uint8_t* ptr(int64_t b, int64_t s, int64_t h, int64_t d) const {
    const int64_t off = b * view.stride_b + s * view.stride_s + h * view.stride_h + d * view.stride_d;
    return static_cast<uint8_t*>(view.data) + off * static_cast<int64_t>(elem_size(dt));
  }
};

// layout: 0 contiguous; 1 padded rows like a view into a packed qkv buffer
// (stride_s = 3*h*d + 8); 2 stride_d = 2 (interleaved).
inline HostSeq make_seq(DType dt, Format f, int64_t b, int64_t s, int64_t h, int64_t d, int layout) {
  HostSeq t;
  t.dt = dt;
  t.nb = f == Format::kTHD ? 1 : b;
  t.ns = s;
  t.nh = h;
  t.nd = d;
  const int64_t sd = layout == 2 ? 2 : 1;
  const int64_t sh = d * sd;
  const int64_t row = layout == 1 ? 3 * h * d + 8 : h * sh;  // one token of one batch entry
  int64_t total;
  if (f == Format::kBSHD) {
    t.view.stride_s = row;
    t.view.stride_b = row * s;
    total = row * s * b;
  } else if (f == Format::kSBHD) {
    t.view.stride_b = row;
    t.view.stride_s = row * b;
    total = row * s * b;
  } else {
    t.view.stride_b = 0;
    t.view.stride_s = row;
    total = row * s;
  }
  t.view.stride_h = sh;
  t.view.stride_d = sd;
  t.bytes.assign(static_cast<size_t>(total) * elem_size(dt) + 64, 0xFF);  // NaN-ish garbage where unused
  t.view.data = t.bytes.data();
  return t;
}

struct HostPair {
  DType dt = DType::kFloat32;
  int64_t sz[4] = {1, 1, 1, 1};
  std::vector<uint8_t> bytes;
  PairTensor view;
  uint8_t* ptr(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t off = (sz[0] == 1 ? 0 : b) * view.stride_b + (sz[1] == 1 ? 0 : h) * view.stride_h +
                        (sz[2] == 1 ? 0 : i) * view.stride_i + (sz[3] == 1 ? 0 : j) * view.stride_j;
    return static_cast<uint8_t*>(view.data) + off * static_cast<int64_t>(elem_size(dt));
  }
};

// Contiguous [s0, s1, s2, s3]; broadcast dims read with stride 0 like params.cc.
inline HostPair make_pair(DType dt, int64_t s0, int64_t s1, int64_t s2, int64_t s3, size_t esize) {
  HostPair t;
  t.dt = dt;
  t.sz[0] = s0; t.sz[1] = s1; t.sz[2] = s2; t.sz[3] = s3;
  t.bytes.assign(static_cast<size_t>(s0 * s1 * s2 * s3) * esize + 64, 0);
  t.view.data = t.bytes.data();
  for (int k = 0; k < 4; ++k) t.view.sizes[k] = t.sz[k];
  t.view.stride_j = s3 == 1 ? 0 : 1;
  t.view.stride_i = s2 == 1 ? 0 : s3;
  t.view.stride_h = s1 == 1 ? 0 : s2 * s3;
  t.view.stride_b = s0 == 1 ? 0 : s1 * s2 * s3;
  return t;
}

// ---- a test case -------------------------------------------------------------------------
struct Config {
  DType dt = DType::kFloat32;
  int64_t b = 1, sq = 16, skv = 16, hq = 2, hkv = 2, dqk = 16, dv = 16;
  Format qf = Format::kBSHD, kvf = Format::kBSHD;
  std::vector<int> lens_q, lens_kv;  // per batch entry; empty: full lengths (no cu_seqlens)
  std::vector<int> gap_q, gap_kv;    // thd: free tokens after each sequence (padded offsets); empty: none
  int64_t wl = -1, wr = -1;
  bool bottom_right = false;
  bool mask = false;
  bool mask_b1 = false, mask_h1 = true, mask_i1 = false;
  BiasType bias = BiasType::kNoBias;
  bool bias_b1 = false, bias_h1 = false, bias_i1 = false;
  bool alibi_2d = false;
  SoftmaxType softmax = SoftmaxType::kVanilla;
  float p_drop = 0.f;
  double scale = 0.25;
  int layout = 0;
  bool max_logit = true;
  uint32_t seed = 1;
  double value_range = 1.0;
  std::string name;
};

struct Case {
  Config cfg;
  int64_t tq = 0, tkv = 0;
  std::vector<int32_t> cu_q, cu_kv, off_q, off_kv;
  HostSeq q, k, v, out, dout, dq, dk, dv;
  HostPair bias, mask, dbias;
  std::vector<float> offset, slopes, d_offset, max_logit;
  std::vector<int64_t> rng{123456789, 4242};
  std::vector<float> lse;
  int64_t lse_sb = 0, lse_sh = 0, lse_ss = 0;

  int64_t len_q(int64_t b) const { return cu_q.empty() ? cfg.sq : cu_q[b + 1] - cu_q[b]; }
  int64_t len_kv(int64_t b) const { return cu_kv.empty() ? cfg.skv : cu_kv[b + 1] - cu_kv[b]; }
  int64_t start_q(int64_t b) const { return cfg.qf == Format::kTHD ? off_q[b] : 0; }
  int64_t start_kv(int64_t b) const { return cfg.kvf == Format::kTHD ? off_kv[b] : 0; }
  int64_t qb(int64_t b) const { return cfg.qf == Format::kTHD ? 0 : b; }
  int64_t kb(int64_t b) const { return cfg.kvf == Format::kTHD ? 0 : b; }
};

inline void fill_random(HostSeq& t, std::mt19937& rng, double range) {
  std::uniform_real_distribution<double> u(-range, range);
  for (int64_t b = 0; b < t.nb; ++b)
    for (int64_t s = 0; s < t.ns; ++s)
      for (int64_t h = 0; h < t.nh; ++h)
        for (int64_t d = 0; d < t.nd; ++d) t.set(b, s, h, d, u(rng));
}

inline void make_cu(const std::vector<int>& lens, const std::vector<int>& gaps, std::vector<int32_t>* cu,
                    std::vector<int32_t>* off, int64_t* total) {
  cu->assign(1, 0);
  off->assign(1, 0);
  for (size_t b = 0; b < lens.size(); ++b) {
    cu->push_back(cu->back() + lens[b]);
    off->push_back(off->back() + lens[b] + (gaps.empty() ? 0 : gaps[b]));
  }
  *total = off->back();
}

inline Case build_case(const Config& cfg) {
  Case c;
  c.cfg = cfg;
  std::mt19937 rng(cfg.seed);
  const bool qthd = cfg.qf == Format::kTHD, kvthd = cfg.kvf == Format::kTHD;
  if (!cfg.lens_q.empty()) make_cu(cfg.lens_q, cfg.gap_q, &c.cu_q, &c.off_q, &c.tq);
  if (!cfg.lens_kv.empty()) make_cu(cfg.lens_kv, cfg.gap_kv, &c.cu_kv, &c.off_kv, &c.tkv);
  const int64_t sq_dim = qthd ? c.tq : cfg.sq, skv_dim = kvthd ? c.tkv : cfg.skv;
  c.q = make_seq(cfg.dt, cfg.qf, cfg.b, sq_dim, cfg.hq, cfg.dqk, cfg.layout);
  c.k = make_seq(cfg.dt, cfg.kvf, cfg.b, skv_dim, cfg.hkv, cfg.dqk, cfg.layout);
  c.v = make_seq(cfg.dt, cfg.kvf, cfg.b, skv_dim, cfg.hkv, cfg.dv, cfg.layout);
  c.dout = make_seq(cfg.dt, cfg.qf, cfg.b, sq_dim, cfg.hq, cfg.dv, cfg.layout == 2 ? 2 : 0);
  c.out = make_seq(cfg.dt, cfg.qf, cfg.b, sq_dim, cfg.hq, cfg.dv, 0);
  c.dq = make_seq(cfg.dt, cfg.qf, cfg.b, sq_dim, cfg.hq, cfg.dqk, 0);
  c.dk = make_seq(cfg.dt, cfg.kvf, cfg.b, skv_dim, cfg.hkv, cfg.dqk, 0);
  c.dv = make_seq(cfg.dt, cfg.kvf, cfg.b, skv_dim, cfg.hkv, cfg.dv, 0);
  fill_random(c.q, rng, cfg.value_range);
  fill_random(c.k, rng, cfg.value_range);
  fill_random(c.v, rng, 1.0);
  fill_random(c.dout, rng, 1.0);
  if (cfg.mask) {
    c.mask = make_pair(DType::kBool, cfg.mask_b1 ? 1 : cfg.b, cfg.mask_h1 ? 1 : cfg.hq, cfg.mask_i1 ? 1 : cfg.sq,
                       cfg.skv, 1);
    std::bernoulli_distribution bern(0.3);
    for (auto& x : c.mask.bytes) x = bern(rng) ? 1 : 0;
  }
  if (cfg.bias == BiasType::kPostScaleBias) {
    c.bias = make_pair(cfg.dt, cfg.bias_b1 ? 1 : cfg.b, cfg.bias_h1 ? 1 : cfg.hq, cfg.bias_i1 ? 1 : cfg.sq, cfg.skv,
                       elem_size(cfg.dt));
    std::uniform_real_distribution<double> u(-2, 2);
    const int64_t n = c.bias.sz[0] * c.bias.sz[1] * c.bias.sz[2] * c.bias.sz[3];
    for (int64_t k = 0; k < n; ++k) encode_trunc(cfg.dt, u(rng), c.bias.bytes.data() + k * elem_size(cfg.dt));
    c.dbias = make_pair(cfg.dt, c.bias.sz[0], c.bias.sz[1], c.bias.sz[2], c.bias.sz[3], elem_size(cfg.dt));
    // dbias is contiguous with its own strides (engine writes every element).
    c.dbias.view.stride_j = 1;
    c.dbias.view.stride_i = c.bias.sz[3];
    c.dbias.view.stride_h = c.bias.sz[2] * c.bias.sz[3];
    c.dbias.view.stride_b = c.bias.sz[1] * c.bias.sz[2] * c.bias.sz[3];
    std::fill(c.dbias.bytes.begin(), c.dbias.bytes.end(), 0xFF);
  }
  if (cfg.bias == BiasType::kAlibi) {
    c.slopes.resize(static_cast<size_t>((cfg.alibi_2d ? cfg.b : 1) * cfg.hq));
    std::uniform_real_distribution<float> u(0.01f, 0.5f);
    for (auto& x : c.slopes) x = u(rng);
  }
  if (cfg.softmax == SoftmaxType::kLearnable) {
    c.offset.resize(static_cast<size_t>(cfg.hq));
    std::uniform_real_distribution<float> u(-1.5f, 1.5f);
    for (auto& x : c.offset) x = u(rng);
  }
  c.d_offset.assign(static_cast<size_t>(cfg.hq), 12345.f);
  c.max_logit.assign(static_cast<size_t>(cfg.hq), 12345.f);
  if (qthd) {
    c.lse.assign(static_cast<size_t>(cfg.hq * c.tq), 777.f);
    c.lse_sb = 0;
    c.lse_sh = c.tq;
    c.lse_ss = 1;
  } else {
    c.lse.assign(static_cast<size_t>(cfg.b * cfg.hq * cfg.sq), 777.f);
    c.lse_sb = cfg.hq * cfg.sq;
    c.lse_sh = cfg.sq;
    c.lse_ss = 1;
  }
  // Outputs start as garbage (NaN bytes) so unwritten elements show.
  for (HostSeq* t : {&c.out, &c.dq, &c.dk, &c.dv}) std::fill(t->bytes.begin(), t->bytes.end(), 0xFF);
  return c;
}

inline FwdParams fwd_params(Case& c) {
  const Config& cfg = c.cfg;
  FwdParams p;
  p.prob.b = cfg.b;
  p.prob.s_q = cfg.sq;
  p.prob.s_kv = cfg.skv;
  p.prob.h_q = cfg.hq;
  p.prob.h_kv = cfg.hkv;
  p.prob.d_qk = cfg.dqk;
  p.prob.d_v = cfg.dv;
  p.prob.t_q = cfg.qf == Format::kTHD ? c.tq : 0;
  p.prob.t_kv = cfg.kvf == Format::kTHD ? c.tkv : 0;
  p.prob.dtype = cfg.dt;
  p.prob.bias_type = cfg.bias;
  p.q_format = cfg.qf;
  p.kv_format = cfg.kvf;
  p.q = c.q.view;
  p.k = c.k.view;
  p.v = c.v.view;
  p.out = c.out.view;
  p.lse = c.lse.data();
  p.lse_stride_b = c.lse_sb;
  p.lse_stride_h = c.lse_sh;
  p.lse_stride_s = c.lse_ss;
  p.max_logit = cfg.max_logit ? c.max_logit.data() : nullptr;
  p.seqlens.cu_seqlens_q = c.cu_q.empty() ? nullptr : c.cu_q.data();
  p.seqlens.cu_seqlens_kv = c.cu_kv.empty() ? nullptr : c.cu_kv.data();
  p.seqlens.q_is_thd = cfg.qf == Format::kTHD;
  p.seqlens.kv_is_thd = cfg.kvf == Format::kTHD;
  if (p.seqlens.q_is_thd) p.seqlens.offsets_q = cfg.gap_q.empty() ? c.cu_q.data() : c.off_q.data();
  if (p.seqlens.kv_is_thd) p.seqlens.offsets_kv = cfg.gap_kv.empty() ? c.cu_kv.data() : c.off_kv.data();
  p.mask.window_left = cfg.wl;
  p.mask.window_right = cfg.wr;
  p.mask.bottom_right = cfg.bottom_right;
  if (cfg.mask) p.mask.mask = c.mask.view;
  p.bias.type = cfg.bias;
  if (cfg.bias == BiasType::kPostScaleBias) p.bias.bias = c.bias.view;
  if (cfg.bias == BiasType::kAlibi) {
    p.bias.alibi_slopes = c.slopes.data();
    p.bias.alibi_stride_b = cfg.alibi_2d ? cfg.hq : 0;
    p.bias.alibi_stride_h = 1;
  }
  p.softmax.type = cfg.softmax;
  p.softmax.offset = cfg.softmax == SoftmaxType::kLearnable ? c.offset.data() : nullptr;
  p.dropout.p = cfg.p_drop;
  p.dropout.rng_state = c.rng.data();
  p.scale = static_cast<float>(cfg.scale);
  return p;
}

inline BwdParams bwd_params(Case& c, bool need_dbias) {
  BwdParams p;
  p.fwd = fwd_params(c);
  p.fwd.max_logit = nullptr;
  p.dout = c.dout.view;
  p.dq = c.dq.view;
  p.dk = c.dk.view;
  p.dv = c.dv.view;
  if (need_dbias && c.cfg.bias == BiasType::kPostScaleBias) p.dbias = c.dbias.view;
  if (c.cfg.softmax == SoftmaxType::kLearnable) p.d_softmax_offset = c.d_offset.data();
  return p;
}

// ---- the naive double reference -------------------------------------------------------------
struct Ref {
  // indexed like the case's tensors: [b][token][h][d] flattened via idx()
  std::vector<double> out, lse, dq, dk, dv, dbias, d_offset, max_logit;
  std::vector<char> out_written;
};

struct RefIndex {
  int64_t nb, ns, nh, nd;
  int64_t operator()(int64_t b, int64_t s, int64_t h, int64_t d) const { return ((b * ns + s) * nh + h) * nd + d; }
};

inline bool ref_visible(const Case& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Config& cfg = c.cfg;
  const int64_t lq = c.len_q(b), lk = c.len_kv(b);
  if (i >= lq || j >= lk) return false;
  const int64_t diag = cfg.bottom_right ? lk - lq : 0;
  if (cfg.wl >= 0 && j < i + diag - cfg.wl) return false;
  if (cfg.wr >= 0 && j > i + diag + cfg.wr) return false;
  if (cfg.mask && *c.mask.ptr(b, h, i, j)) return false;
  return true;
}

inline double ref_logit(const Case& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Config& cfg = c.cfg;
  const int64_t hk = h / (cfg.hq / cfg.hkv);
  double dot = 0;
  for (int64_t d = 0; d < cfg.dqk; ++d)
    dot += c.q.get(c.qb(b), c.start_q(b) + i, h, d) * c.k.get(c.kb(b), c.start_kv(b) + j, hk, d);
  double s = static_cast<double>(static_cast<float>(cfg.scale)) * dot;
  if (cfg.bias == BiasType::kPostScaleBias) s += decode(cfg.dt, c.bias.ptr(b, h, i, j));
  if (cfg.bias == BiasType::kAlibi) {
    const int64_t diag = cfg.bottom_right ? c.len_kv(b) - c.len_q(b) : 0;
    const double slope = c.slopes[(cfg.alibi_2d ? b * cfg.hq : 0) + h];
    s -= slope * std::fabs(static_cast<double>(j - i - diag));
  }
  return s;
}

inline double ref_keep(const Case& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!(c.cfg.p_drop > 0)) return 1.0;
  const bool keep = dropout_keep(c.rng[0], c.rng[1], b * c.cfg.hq + h, i, j, dropout_threshold(c.cfg.p_drop));
  return keep ? 1.0 / (1.0 - static_cast<double>(c.cfg.p_drop)) : 0.0;
}

// Probabilities of one row (0 where invisible), the sink probability and lse.
inline void ref_row(const Case& c, int64_t b, int64_t h, int64_t i, std::vector<double>* P, double* p_sink,
                    double* lse, double* row_max) {
  const Config& cfg = c.cfg;
  const int64_t lk = c.len_kv(b);
  std::vector<double> s(static_cast<size_t>(lk), -INFINITY);
  double m = -INFINITY;
  for (int64_t j = 0; j < lk; ++j) {
    if (!ref_visible(c, b, h, i, j)) continue;
    s[j] = ref_logit(c, b, h, i, j);
    m = std::max(m, s[j]);
  }
  *row_max = m;
  const bool sink = cfg.softmax != SoftmaxType::kVanilla;
  const double sink_v = cfg.softmax == SoftmaxType::kLearnable ? c.offset[h] : 0.0;
  double top = sink ? std::max(m, sink_v) : m;
  P->assign(static_cast<size_t>(lk), 0.0);
  *p_sink = 0;
  if (top == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  double sum = sink ? std::exp(sink_v - top) : 0.0;
  for (int64_t j = 0; j < lk; ++j)
    if (s[j] > -INFINITY) sum += std::exp(s[j] - top);
  *lse = top + std::log(sum);
  for (int64_t j = 0; j < lk; ++j)
    if (s[j] > -INFINITY) (*P)[j] = std::exp(s[j] - *lse);
  if (sink) *p_sink = std::exp(sink_v - *lse);
}

// Forward reference. Rows are indexed by (b, token, h) of the case's q layout.
inline Ref ref_forward(const Case& c) {
  const Config& cfg = c.cfg;
  Ref r;
  const RefIndex io{c.q.nb, c.q.ns, cfg.hq, cfg.dv}, il{c.q.nb, c.q.ns, cfg.hq, 1};
  r.out.assign(static_cast<size_t>(c.q.nb * c.q.ns * cfg.hq * cfg.dv), 0.0);
  r.lse.assign(static_cast<size_t>(c.q.nb * c.q.ns * cfg.hq), -INFINITY);
  r.max_logit.assign(static_cast<size_t>(cfg.hq), -INFINITY);
  const int64_t group = cfg.hq / cfg.hkv;
  std::vector<double> P;
  for (int64_t b = 0; b < cfg.b; ++b)
    for (int64_t h = 0; h < cfg.hq; ++h)
      for (int64_t i = 0; i < c.len_q(b); ++i) {
        double ps, lse, mx;
        ref_row(c, b, h, i, &P, &ps, &lse, &mx);
        const int64_t tb = c.qb(b), tok = c.start_q(b) + i;
        r.max_logit[h] = std::max(r.max_logit[h], mx);
        if (cfg.softmax != SoftmaxType::kVanilla && mx == -INFINITY)
          lse = cfg.softmax == SoftmaxType::kLearnable ? c.offset[h] : 0.0;
        r.lse[il(tb, tok, h, 0)] = lse;
        for (int64_t j = 0; j < c.len_kv(b); ++j) {
          if (P[j] == 0) continue;
          const double w = P[j] * ref_keep(c, b, h, i, j);
          for (int64_t d = 0; d < cfg.dv; ++d)
            r.out[io(tb, tok, h, d)] += w * c.v.get(c.kb(b), c.start_kv(b) + j, h / group, d);
        }
      }
  return r;
}

// Backward reference; D_i from the `out` tensor of the case (what the engine reads).
inline Ref ref_backward(const Case& c) {
  const Config& cfg = c.cfg;
  Ref r;
  const int64_t group = cfg.hq / cfg.hkv;
  const RefIndex iq{c.q.nb, c.q.ns, cfg.hq, cfg.dqk}, ik{c.k.nb, c.k.ns, cfg.hkv, cfg.dqk},
      iv{c.k.nb, c.k.ns, cfg.hkv, cfg.dv};
  r.dq.assign(static_cast<size_t>(c.q.nb * c.q.ns * cfg.hq * cfg.dqk), 0.0);
  r.dk.assign(static_cast<size_t>(c.k.nb * c.k.ns * cfg.hkv * cfg.dqk), 0.0);
  r.dv.assign(static_cast<size_t>(c.k.nb * c.k.ns * cfg.hkv * cfg.dv), 0.0);
  r.d_offset.assign(static_cast<size_t>(cfg.hq), 0.0);
  const int64_t* bs = c.bias.sz;
  if (cfg.bias == BiasType::kPostScaleBias) r.dbias.assign(static_cast<size_t>(bs[0] * bs[1] * bs[2] * bs[3]), 0.0);
  const double scale = static_cast<float>(cfg.scale);
  std::vector<double> P;
  for (int64_t b = 0; b < cfg.b; ++b)
    for (int64_t h = 0; h < cfg.hq; ++h)
      for (int64_t i = 0; i < c.len_q(b); ++i) {
        double ps, lse, mx;
        ref_row(c, b, h, i, &P, &ps, &lse, &mx);
        const int64_t qb = c.qb(b), qt = c.start_q(b) + i, kb = c.kb(b), hk = h / group;
        double D = 0;
        for (int64_t d = 0; d < cfg.dv; ++d) D += c.dout.get(qb, qt, h, d) * c.out.get(qb, qt, h, d);
        r.d_offset[h] -= ps * D;
        for (int64_t j = 0; j < c.len_kv(b); ++j) {
          if (P[j] == 0) continue;
          const int64_t kt = c.start_kv(b) + j;
          const double keep = ref_keep(c, b, h, i, j);
          double dP = 0;
          for (int64_t d = 0; d < cfg.dv; ++d) dP += c.dout.get(qb, qt, h, d) * c.v.get(kb, kt, hk, d);
          dP *= keep;
          const double dS = P[j] * (dP - D);
          for (int64_t d = 0; d < cfg.dqk; ++d) {
            r.dq[iq(qb, qt, h, d)] += scale * dS * c.k.get(kb, kt, hk, d);
            r.dk[ik(kb, kt, hk, d)] += scale * dS * c.q.get(qb, qt, h, d);
          }
          for (int64_t d = 0; d < cfg.dv; ++d) r.dv[iv(kb, kt, hk, d)] += P[j] * keep * c.dout.get(qb, qt, h, d);
          if (!r.dbias.empty()) {
            const int64_t bi = bs[0] == 1 ? 0 : b, hi = bs[1] == 1 ? 0 : h, ii = bs[2] == 1 ? 0 : i;
            r.dbias[((bi * bs[1] + hi) * bs[2] + ii) * bs[3] + j] += dS;
          }
        }
      }
  return r;
}

// ---- comparison -------------------------------------------------------------------------------
struct Tol {
  double atol, rtol;
};

inline Tol tol_for(DType dt) {
  switch (dt) {
    case DType::kFloat64: return {1e-10, 1e-9};
    case DType::kFloat32: return {2e-5, 2e-4};
    case DType::kFloat16: return {2e-3, 4e-3};
    case DType::kBFloat16: return {1.6e-2, 1.6e-2};
    default: return {0, 0};
  }
}

// Compares a sequence tensor to a reference in [b][s][h][d] order; every element.
inline bool compare_seq(const char* what, const HostSeq& t, const std::vector<double>& ref, Tol tol,
                        const std::string& name) {
  double worst = 0;
  int bad = 0;
  for (int64_t b = 0; b < t.nb; ++b)
    for (int64_t s = 0; s < t.ns; ++s)
      for (int64_t h = 0; h < t.nh; ++h)
        for (int64_t d = 0; d < t.nd; ++d) {
          const double got = t.get(b, s, h, d);
          const double want = ref[((b * t.ns + s) * t.nh + h) * t.nd + d];
          const double err = std::fabs(got - want);
          const bool ok = std::isfinite(got) && err <= tol.atol + tol.rtol * std::fabs(want);
          worst = std::max(worst, std::isfinite(got) ? err : INFINITY);
          if (!ok && bad++ < 3)
            std::fprintf(stderr, "  [%s] %s(b=%lld s=%lld h=%lld d=%lld): got %.9g want %.9g\n", name.c_str(), what,
                         (long long)b, (long long)s, (long long)h, (long long)d, got, want);
        }
  CHECK_MSG(bad == 0, "[%s] %s: %d mismatches, worst abs err %.3g", name.c_str(), what, bad, worst);
  return bad == 0;
}

inline bool compare_vec(const char* what, const std::vector<double>& got, const std::vector<double>& want, Tol tol,
                        const std::string& name) {
  int bad = 0;
  double worst = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    const bool both_ninf = got[k] == -INFINITY && want[k] == -INFINITY;
    const double err = both_ninf ? 0 : std::fabs(got[k] - want[k]);
    const bool ok = both_ninf || (std::isfinite(got[k]) && err <= tol.atol + tol.rtol * std::fabs(want[k]));
    if (!both_ninf) worst = std::max(worst, std::isfinite(err) ? err : INFINITY);
    if (!ok && bad++ < 3)
      std::fprintf(stderr, "  [%s] %s[%zu]: got %.9g want %.9g\n", name.c_str(), what, k, got[k], want[k]);
  }
  CHECK_MSG(bad == 0, "[%s] %s: %d mismatches, worst abs err %.3g", name.c_str(), what, bad, worst);
  return bad == 0;
}

inline std::vector<double> lse_as_ref_order(const Case& c) {
  // engine lse -> [b][token][h] like Ref::lse
  const Config& cfg = c.cfg;
  std::vector<double> r(static_cast<size_t>(c.q.nb * c.q.ns * cfg.hq));
  for (int64_t b = 0; b < c.q.nb; ++b)
    for (int64_t s = 0; s < c.q.ns; ++s)
      for (int64_t h = 0; h < cfg.hq; ++h)
        r[(b * c.q.ns + s) * cfg.hq + h] = c.lse[b * c.lse_sb + h * c.lse_sh + s * c.lse_ss];
  return r;
}

}  // namespace fa_test
