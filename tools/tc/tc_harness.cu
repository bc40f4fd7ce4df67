// Self-contained GPU check of the tensor-core engine (csrc/cuda/tc): fills
// FwdParams/BwdParams through the core's check_* and make_*_params from hand-made
// tensors, plans and runs them with tc::plan_* / run_* on poisoned outputs, and
// compares with a float64 CPU reference of params.h's semantics written
// independently here.
// Then times the kernels with CUDA events.
//   tc_harness check        correctness cases
//   tc_harness bench        TFLOP/s table (bf16, b*s = 16k tokens, h*d = 2048)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/device.h"
#include "fusedattn/api.h"
#include "fusedattn/philox.h"
#include "tc/tc_api.h"

using namespace fusedattn;

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);           \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)

// The current device's attributes, which the engine plans with.
static const gpu::DeviceAttrs& device() {
  const gpu::DeviceAttrs* dev = nullptr;
  const Status st = gpu::current_device(&dev);
  if (!st.ok()) {
    printf("%s\n", st.message.c_str());
    exit(2);
  }
  return *dev;
}

static double bits_to_double(uint16_t v, DType t) {
  if (t == DType::kBFloat16) {
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = v;
  return __half2float(__half(r));
}
static uint16_t double_to_bits(double x, DType t) {
  if (t == DType::kBFloat16) {
    __nv_bfloat16 b = __float2bfloat16_rn(static_cast<float>(x));
    return static_cast<__nv_bfloat16_raw>(b).x;
  }
  __half h = __float2half_rn(static_cast<float>(x));
  return static_cast<__half_raw>(h).x;
}

// A device buffer with a host mirror.
struct Buf {
  void* d = nullptr;
  size_t bytes = 0;
  std::vector<uint8_t> h;
  void alloc(size_t n) {
    bytes = n;
    h.assign(n, 0);
    CK(cudaMalloc(&d, std::max<size_t>(n, 16)));
  }
  void up() { CK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice)); }
  void down() { CK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost)); }
  void poison() { CK(cudaMemset(d, 0xFF, bytes)); }  // NaN in every float format
  void free_() {
    if (d) cudaFree(d);
    d = nullptr;
  }
  uint16_t* u16() { return reinterpret_cast<uint16_t*>(h.data()); }
  float* f32() { return reinterpret_cast<float*>(h.data()); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(h.data()); }
};

static TensorRef tref(void* data, DType dt, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  TensorRef t;
  t.data = data;
  t.dtype = dt;
  t.device = DeviceType::kCUDA;
  t.device_index = 0;
  t.ndim = static_cast<int>(sizes.size());
  for (int i = 0; i < t.ndim; ++i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = strides[i];
  }
  return t;
}
static std::vector<int64_t> contig(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size());
  int64_t a = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = a;
    a *= s[i];
  }
  return st;
}

struct Case {
  std::string name;
  DType dtype = DType::kBFloat16;
  int b = 2, sq = 128, skv = 128, hq = 4, hkv = 4, dqk = 64, dv = 64;
  Format fmt = Format::kBSHD;
  MaskType mask = MaskType::kNoMask;
  int64_t wl = -1, wr = -1;
  int brd = -1;
  int bias = 0;  // 0 none, 1 [b,h,sq,skv], 2 [1,h,sq,skv], 3 [b,1,1,skv]
  bool alibi = false;
  SoftmaxType smx = SoftmaxType::kVanilla;
  double p = 0;
  bool max_logit = false;
  bool dbias = false;
  bool arb = false;
  bool gaps = false;       // thd with cu_seqlens_padded
  bool strided = false;    // q/k/v with padded head stride
  bool zero_len = false;   // one sequence of length 0
};

// Element (b, pos, h, d) of a q/k/v-like tensor.
struct Layout {
  Format f;
  int b, s, h, d, dpad;  // s: per-sequence extent (bshd) or tokens (thd)
  int64_t sb, ss, sh;
  std::vector<int64_t> sizes, strides;
  int64_t numel;
  void make(Format f_, int b_, int s_, int h_, int d_, int dpad_) {
    f = f_; b = b_; s = s_; h = h_; d = d_; dpad = dpad_;
    sh = dpad;
    if (f == Format::kBSHD) { ss = int64_t(h) * dpad; sb = ss * s; sizes = {b, s, h, d}; strides = {sb, ss, sh, 1}; numel = sb * b; }
    else if (f == Format::kSBHD) { sb = int64_t(h) * dpad; ss = sb * b; sizes = {s, b, h, d}; strides = {ss, sb, sh, 1}; numel = ss * s; }
    else { sb = 0; ss = int64_t(h) * dpad; sizes = {s, h, d}; strides = {ss, sh, 1}; numel = ss * s; }
  }
  int64_t at(int bi, int64_t tok, int hi, int di) const { return bi * sb + tok * ss + int64_t(hi) * sh + di; }
};

struct Result {
  bool ok = true;
  std::string msg;
  void fail(const std::string& m) { ok = false; msg += m + "; "; }
};

static double rel_err(const std::vector<double>& x, const std::vector<double>& r, int64_t* nonfinite) {
  double num = 0, den = 0;
  *nonfinite = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) { ++*nonfinite; continue; }
    num += (x[i] - r[i]) * (x[i] - r[i]);
    den += r[i] * r[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

static Result run_case(const Case& c, uint64_t seed, bool verbose) {
  Result res;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> U(-1.0, 1.0);
  const DType dt = c.dtype;
  const bool thd = c.fmt == Format::kTHD;
  const bool padding = c.mask == MaskType::kPadding || c.mask == MaskType::kPaddingCausal ||
                       c.mask == MaskType::kPaddingCausalBottomRight;

  // sequence lengths and token offsets
  std::vector<int> lq(c.b, c.sq), lk(c.b, c.skv);
  if (thd || padding) {
    for (int i = 0; i < c.b; ++i) {
      lq[i] = 1 + static_cast<int>(rng() % c.sq);
      lk[i] = 1 + static_cast<int>(rng() % c.skv);
    }
    lq[0] = c.sq;  // one full-length sequence so max_seqlen is exact
    lk[0] = c.skv;
    if (c.zero_len && c.b > 1) lq[1] = 0, lk[1] = 0;
  }
  std::vector<int> cuq(c.b + 1, 0), cuk(c.b + 1, 0), offq(c.b + 1, 0), offk(c.b + 1, 0);
  for (int i = 0; i < c.b; ++i) {
    cuq[i + 1] = cuq[i] + lq[i];
    cuk[i + 1] = cuk[i] + lk[i];
    const int gq = c.gaps ? static_cast<int>(rng() % 5) : 0, gk = c.gaps ? static_cast<int>(rng() % 5) : 0;
    offq[i + 1] = offq[i] + lq[i] + gq;
    offk[i + 1] = offk[i] + lk[i] + gk;
  }
  const int tq = thd ? offq[c.b] + (c.gaps ? 3 : 0) : 0, tk = thd ? offk[c.b] + (c.gaps ? 2 : 0) : 0;
  const int pad = c.strided ? 8 : 0;
  Layout Lq, Lk, Lv, Lo, Lk2;
  Lq.make(c.fmt, c.b, thd ? tq : c.sq, c.hq, c.dqk, c.dqk + pad);
  Lk.make(c.fmt, c.b, thd ? tk : c.skv, c.hkv, c.dqk, c.dqk + pad);
  Lv.make(c.fmt, c.b, thd ? tk : c.skv, c.hkv, c.dv, c.dv + pad);
  Lo.make(c.fmt, c.b, thd ? tq : c.sq, c.hq, c.dv, c.dv);
  Layout Ldq, Ldk, Ldv;
  Ldq.make(c.fmt, c.b, thd ? tq : c.sq, c.hq, c.dqk, c.dqk);
  Ldk.make(c.fmt, c.b, thd ? tk : c.skv, c.hkv, c.dqk, c.dqk);
  Ldv.make(c.fmt, c.b, thd ? tk : c.skv, c.hkv, c.dv, c.dv);

  auto fill = [&](Buf& B, const Layout& L) {
    B.alloc(L.numel * 2);
    for (int64_t i = 0; i < L.numel; ++i) B.u16()[i] = double_to_bits(U(rng), dt);
    B.up();
  };
  Buf q, k, v, dout;
  fill(q, Lq);
  fill(k, Lk);
  fill(v, Lv);
  fill(dout, Lo);
  auto tokq = [&](int bi, int i) -> int64_t { return thd ? offq[bi] + i : i; };
  auto tokk = [&](int bi, int j) -> int64_t { return thd ? offk[bi] + j : j; };

  FwdArgs args;
  args.q_format = args.kv_format = c.fmt;
  args.mask_type = c.arb ? MaskType::kArbitrary : c.mask;
  args.window_left = c.wl;
  args.window_right = c.wr;
  args.bottom_right_diagonal = c.brd;
  args.softmax_type = c.smx;
  args.scale = 1.0 / std::sqrt(static_cast<double>(c.dqk));
  args.dropout_p = c.p;
  args.return_max_logit = c.max_logit;
  if (thd) { args.max_seqlen_q = c.sq; args.max_seqlen_kv = c.skv; }

  FwdInputs in;
  in.q = tref(q.d, dt, Lq.sizes, Lq.strides);
  in.k = tref(k.d, dt, Lk.sizes, Lk.strides);
  in.v = tref(v.d, dt, Lv.sizes, Lv.strides);
  Buf cq, ck, oq, ok_, bias, sink, mask, slopes, rngb;
  if (thd || padding) {
    cq.alloc((c.b + 1) * 4); ck.alloc((c.b + 1) * 4);
    memcpy(cq.h.data(), cuq.data(), (c.b + 1) * 4); memcpy(ck.h.data(), cuk.data(), (c.b + 1) * 4);
    cq.up(); ck.up();
    in.cu_seqlens_q = tref(cq.d, DType::kInt32, {c.b + 1}, {1});
    in.cu_seqlens_kv = tref(ck.d, DType::kInt32, {c.b + 1}, {1});
    if (c.gaps) {
      oq.alloc((c.b + 1) * 4); ok_.alloc((c.b + 1) * 4);
      memcpy(oq.h.data(), offq.data(), (c.b + 1) * 4); memcpy(ok_.h.data(), offk.data(), (c.b + 1) * 4);
      oq.up(); ok_.up();
      in.cu_seqlens_q_padded = tref(oq.d, DType::kInt32, {c.b + 1}, {1});
      in.cu_seqlens_kv_padded = tref(ok_.d, DType::kInt32, {c.b + 1}, {1});
    }
  }
  if (!c.gaps) { offq = cuq; offk = cuk; }
  std::vector<int64_t> bsz;
  if (c.bias) {
    bsz = c.bias == 1 ? std::vector<int64_t>{c.b, c.hq, c.sq, c.skv}
          : c.bias == 2 ? std::vector<int64_t>{1, c.hq, c.sq, c.skv}
                        : std::vector<int64_t>{c.b, 1, 1, c.skv};
    bias.alloc(bsz[0] * bsz[1] * bsz[2] * bsz[3] * 2);
    for (size_t i = 0; i < bias.bytes / 2; ++i) bias.u16()[i] = double_to_bits(2 * U(rng), dt);
    bias.up();
    in.bias = tref(bias.d, dt, bsz, contig(bsz));
  }
  if (c.alibi) {
    slopes.alloc(c.hq * 4);
    for (int h = 0; h < c.hq; ++h) slopes.f32()[h] = std::pow(2.0, -8.0 * (h + 1) / c.hq);
    slopes.up();
    in.alibi_slopes = tref(slopes.d, DType::kFloat32, {c.hq}, {1});
  }
  if (c.smx == SoftmaxType::kLearnable) {
    sink.alloc(c.hq * 4);
    for (int h = 0; h < c.hq; ++h) sink.f32()[h] = static_cast<float>(2 * U(rng));
    sink.up();
    in.softmax_offset = tref(sink.d, DType::kFloat32, {c.hq}, {1});
  }
  if (c.arb) {
    std::vector<int64_t> ms = {c.b, 1, c.sq, c.skv};
    mask.alloc(c.b * c.sq * c.skv);
    for (size_t i = 0; i < mask.bytes; ++i) mask.h[i] = (rng() % 4) == 0;
    mask.up();
    in.attn_mask = tref(mask.d, DType::kBool, ms, contig(ms));
  }
  rngb.alloc(16);
  int64_t seedv = static_cast<int64_t>(rng() >> 2), offv = static_cast<int64_t>(rng() >> 2);
  memcpy(rngb.h.data(), &seedv, 8);
  memcpy(rngb.h.data() + 8, &offv, 8);
  rngb.up();
  in.rng_state = tref(rngb.d, DType::kInt64, {2}, {1});

  CheckedProblem prob;
  Status st = check_fwd(args, in, &prob);
  if (!st.ok()) { res.fail("check_fwd: " + st.message); return res; }
  FwdOutputShapes os = fwd_output_shapes(args, prob.get());
  Buf out, lse, mlog;
  out.alloc(Lo.numel * 2);
  const int64_t lse_n = thd ? int64_t(c.hq) * tq : int64_t(c.b) * c.hq * c.sq;
  lse.alloc(lse_n * 4);
  mlog.alloc(std::max(1, c.hq) * 4);
  FwdOutputs fo;
  fo.out = tref(out.d, dt, Lo.sizes, Lo.strides);
  std::vector<int64_t> lsz(os.lse.sizes, os.lse.sizes + os.lse.ndim);
  fo.lse = tref(lse.d, DType::kFloat32, lsz, contig(lsz));
  fo.max_logit = tref(mlog.d, DType::kFloat32, {c.max_logit ? c.hq : 0}, {1});
  FwdParams fp;
  st = make_fwd_params(args, in, prob, fo, &fp);
  if (!st.ok()) { res.fail("make_fwd_params: " + st.message); return res; }
  out.poison(); lse.poison(); mlog.poison();
  CudaPlan plan;
  std::string why = tc::plan_fwd(fp, device(), &plan);
  if (!why.empty()) { res.fail("fwd not taken: " + why); return res; }
  st = tc::run_fwd(fp, plan, CudaLaunch{});
  if (!st.ok()) { res.fail("fwd: " + st.message); return res; }
  CK(cudaDeviceSynchronize());
  out.down(); lse.down(); mlog.down();

  // ---- reference (float64) ----
  const MaskParams& mp = fp.mask;
  const double scale = args.scale;
  const int group = c.hq / c.hkv;
  auto qv = [&](int bi, int i, int h, int d) { return bits_to_double(q.u16()[Lq.at(bi, tokq(bi, i), h, d)], dt); };
  auto kv = [&](int bi, int j, int h, int d) { return bits_to_double(k.u16()[Lk.at(bi, tokk(bi, j), h, d)], dt); };
  auto vv = [&](int bi, int j, int h, int d) { return bits_to_double(v.u16()[Lv.at(bi, tokk(bi, j), h, d)], dt); };
  auto gv = [&](int bi, int i, int h, int d) { return bits_to_double(dout.u16()[Lo.at(bi, tokq(bi, i), h, d)], dt); };
  std::vector<double> ro(Lo.numel, 0.0), rlse(lse_n, -INFINITY), rdq(Ldq.numel, 0.0), rdk(Ldk.numel, 0.0),
      rdv(Ldv.numel, 0.0);
  std::vector<double> rdb(c.bias ? bias.bytes / 2 : 0, 0.0), rsink(c.hq, 0.0), rml(c.hq, -INFINITY);
  auto lse_idx = [&](int bi, int h, int i) -> int64_t {
    return thd ? int64_t(h) * tq + offq[bi] + i : (int64_t(bi) * c.hq + h) * c.sq + i;
  };
  const uint32_t thr = dropout_threshold(static_cast<float>(c.p));
  const double rp = c.p > 0 ? 1.0 / (1.0 - static_cast<float>(c.p)) : 1.0;
  auto worker = [&](int bi, int hk, std::vector<double>& db_local, std::vector<double>& sink_local,
                    std::vector<double>& ml_local) {
    const int Lqb = lq[bi], Lkb = lk[bi];
    const int64_t diag = mp.bottom_right ? Lkb - Lqb : 0;
    std::vector<double> x(Lkb), P(Lkb), Z(Lkb), dP(Lkb);
    std::vector<char> vis(Lkb);
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
      const double slope = c.alibi ? slopes.f32()[h] : 0;
      for (int i = 0; i < Lqb; ++i) {
        double m = -INFINITY;
        bool any = false;
        for (int j = 0; j < Lkb; ++j) {
          bool ok = true;
          if (mp.window_left >= 0 && j < i + diag - mp.window_left) ok = false;
          if (mp.window_right >= 0 && j > i + diag + mp.window_right) ok = false;
          if (c.arb && mask.h[(int64_t(bi) * c.sq + i) * c.skv + j]) ok = false;
          vis[j] = ok;
          if (!ok) continue;
          double s = 0;
          for (int d = 0; d < c.dqk; ++d) s += qv(bi, i, h, d) * kv(bi, j, hk, d);
          s *= scale;
          if (c.bias) {
            const int64_t bb = bsz[0] == 1 ? 0 : bi, hh = bsz[1] == 1 ? 0 : h, ii = bsz[2] == 1 ? 0 : i;
            s += bits_to_double(bias.u16()[((bb * bsz[1] + hh) * bsz[2] + ii) * bsz[3] + j], dt);
          }
          if (c.alibi) s -= slope * std::fabs(static_cast<double>(j - i - diag));
          x[j] = s;
          m = std::max(m, s);
          any = true;
        }
        if (!any) continue;  // out 0, lse -inf, no gradient
        ml_local[h] = std::max(ml_local[h], m);
        const bool has_sink = c.smx != SoftmaxType::kVanilla;
        const double sk = c.smx == SoftmaxType::kLearnable ? sink.f32()[h] : 0.0;
        const double mt = has_sink ? std::max(m, sk) : m;
        double zs = has_sink ? std::exp(sk - mt) : 0.0;
        for (int j = 0; j < Lkb; ++j) if (vis[j]) zs += std::exp(x[j] - mt);
        const double L = mt + std::log(zs);
        rlse[lse_idx(bi, h, i)] = L;
        for (int j = 0; j < Lkb; ++j) {
          P[j] = vis[j] ? std::exp(x[j] - L) : 0.0;
          Z[j] = 1.0;
          if (c.p > 0 && vis[j]) Z[j] = dropout_keep(seedv, offv, int64_t(bi) * c.hq + h, i, j, thr) ? rp : 0.0;
        }
        for (int d = 0; d < c.dv; ++d) {
          double o = 0;
          for (int j = 0; j < Lkb; ++j) if (vis[j]) o += P[j] * Z[j] * vv(bi, j, hk, d);
          ro[Lo.at(bi, tokq(bi, i), h, d)] = o;
        }
        // backward
        double D = 0;
        for (int j = 0; j < Lkb; ++j) {
          if (!vis[j]) { dP[j] = 0; continue; }
          double t = 0;
          for (int d = 0; d < c.dv; ++d) t += gv(bi, i, h, d) * vv(bi, j, hk, d);
          dP[j] = Z[j] * t;
          D += P[j] * dP[j];
        }
        if (c.smx == SoftmaxType::kLearnable) sink_local[h] += -std::exp(sk - L) * D;
        for (int j = 0; j < Lkb; ++j) {
          if (!vis[j]) continue;
          const double ds = P[j] * (dP[j] - D);
          for (int d = 0; d < c.dqk; ++d) {
            rdq[Ldq.at(bi, tokq(bi, i), h, d)] += scale * ds * kv(bi, j, hk, d);
            rdk[Ldk.at(bi, tokk(bi, j), hk, d)] += scale * ds * qv(bi, i, h, d);
          }
          for (int d = 0; d < c.dv; ++d) rdv[Ldv.at(bi, tokk(bi, j), hk, d)] += P[j] * Z[j] * gv(bi, i, h, d);
          if (c.bias) {
            const int64_t bb = bsz[0] == 1 ? 0 : bi, hh = bsz[1] == 1 ? 0 : h, ii = bsz[2] == 1 ? 0 : i;
            db_local[((bb * bsz[1] + hh) * bsz[2] + ii) * bsz[3] + j] += ds;
          }
        }
      }
    }
  };
  {
    const int nw = c.b * c.hkv;
    std::vector<std::vector<double>> dbl(nw, std::vector<double>(rdb.size(), 0.0)), skl(nw, std::vector<double>(c.hq, 0.0)),
        mll(nw, std::vector<double>(c.hq, -INFINITY));
    std::vector<std::thread> th;
    for (int w = 0; w < nw; ++w) th.emplace_back(worker, w / c.hkv, w % c.hkv, std::ref(dbl[w]), std::ref(skl[w]), std::ref(mll[w]));
    for (auto& t : th) t.join();
    for (int w = 0; w < nw; ++w) {
      for (size_t i = 0; i < rdb.size(); ++i) rdb[i] += dbl[w][i];
      for (int h = 0; h < c.hq; ++h) { rsink[h] += skl[w][h]; rml[h] = std::max(rml[h], mll[w][h]); }
    }
  }

  // ---- compare forward ----
  const bool bf = dt == DType::kBFloat16;
  const double tol_f = bf ? 1.5e-2 : 4e-3, tol_b = bf ? 3e-2 : 1e-2;
  auto to_d = [&](Buf& B, int64_t n) {
    std::vector<double> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = bits_to_double(B.u16()[i], dt);
    return r;
  };
  // padded strides only exist on inputs; outputs are dense, so compare all elements.
  int64_t nf = 0;
  std::vector<double> go = to_d(out, Lo.numel);
  const double eo = rel_err(go, ro, &nf);
  char buf[256];
  if (nf) res.fail("out has " + std::to_string(nf) + " non-finite");
  if (eo > tol_f) { snprintf(buf, sizeof buf, "out rel err %.3g", eo); res.fail(buf); }
  double lerr = 0;
  int64_t lbad = 0;
  for (int64_t i = 0; i < lse_n; ++i) {
    const double g = lse.f32()[i], r = rlse[i];
    if (std::isinf(r) || std::isinf(g)) { if (!(std::isinf(r) && std::isinf(g) && g < 0)) ++lbad; continue; }
    if (std::isnan(g)) { ++lbad; continue; }
    lerr = std::max(lerr, std::fabs(g - r));
  }
  if (lbad) res.fail("lse: " + std::to_string(lbad) + " wrong infinities/NaN");
  if (lerr > 5e-3) { snprintf(buf, sizeof buf, "lse max abs err %.3g", lerr); res.fail(buf); }
  double merr = 0;
  if (c.max_logit) {
    for (int h = 0; h < c.hq; ++h) {
      const double g = mlog.f32()[h], r = rml[h];
      if (std::isinf(r)) { if (!(std::isinf(g) && g < 0)) res.fail("max_logit inf mismatch"); continue; }
      merr = std::max(merr, std::fabs(g - r));
    }
    if (merr > 2e-2) { snprintf(buf, sizeof buf, "max_logit err %.3g", merr); res.fail(buf); }
  }
  snprintf(buf, sizeof buf, "out %.2e lse %.1e", eo, lerr);
  std::string summary = buf;

  // ---- backward ----
  Buf dq, dk, dvb, dbias, dsink, ws;
  dq.alloc(Ldq.numel * 2); dk.alloc(Ldk.numel * 2); dvb.alloc(Ldv.numel * 2);
  BwdArgs bargs;
  bargs.fwd = args;
  bargs.fwd.return_max_logit = false;
  bargs.need_dbias = c.dbias;
  BwdInputs bin;
  bin.fwd = in;
  bin.dout = tref(dout.d, dt, Lo.sizes, Lo.strides);
  bin.out = fo.out;
  bin.lse = fo.lse;
  BwdOutputs bo;
  bo.dq = tref(dq.d, dt, Ldq.sizes, Ldq.strides);
  bo.dk = tref(dk.d, dt, Ldk.sizes, Ldk.strides);
  bo.dv = tref(dvb.d, dt, Ldv.sizes, Ldv.strides);
  if (c.dbias) { dbias.alloc(bias.bytes); bo.dbias = tref(dbias.d, dt, bsz, contig(bsz)); }
  else bo.dbias = tref(nullptr, dt, {0}, {1});
  dsink.alloc(c.hq * 4);
  bo.d_softmax_offset = tref(dsink.d, DType::kFloat32, {c.smx == SoftmaxType::kLearnable ? c.hq : 0}, {1});
  CheckedProblem bprob;
  st = check_bwd(bargs, bin, &bprob);
  if (!st.ok()) { res.fail("check_bwd: " + st.message); return res; }
  BwdParams bp;
  st = make_bwd_params(bargs, bin, bprob, bo, &bp);
  if (!st.ok()) { res.fail("make_bwd_params: " + st.message); return res; }
  CudaPlan bplan;
  why = tc::plan_bwd(bp, device(), &bplan);
  if (!why.empty()) { res.fail("bwd not taken: " + why); return res; }
  ws.alloc(bplan.workspace_bytes);
  ws.poison();
  dq.poison(); dk.poison(); dvb.poison(); dsink.poison();
  if (c.dbias) dbias.poison();
  st = tc::run_bwd(bp, bplan, CudaLaunch{nullptr, ws.d, bplan.workspace_bytes});
  if (!st.ok()) { res.fail("bwd: " + st.message); return res; }
  CK(cudaDeviceSynchronize());
  dq.down(); dk.down(); dvb.down(); dsink.down();
  if (c.dbias) dbias.down();
  auto cmp = [&](const char* name, Buf& B, const std::vector<double>& r) {
    int64_t nf2 = 0;
    std::vector<double> g = to_d(B, static_cast<int64_t>(r.size()));
    const double e = rel_err(g, r, &nf2);
    if (nf2) res.fail(std::string(name) + " has " + std::to_string(nf2) + " non-finite");
    if (e > tol_b) { snprintf(buf, sizeof buf, "%s rel err %.3g", name, e); res.fail(buf); }
    snprintf(buf, sizeof buf, " %s %.2e", name, e);
    summary += buf;
  };
  cmp("dq", dq, rdq);
  cmp("dk", dk, rdk);
  cmp("dv", dvb, rdv);
  if (c.dbias) cmp("dbias", dbias, rdb);
  if (c.smx == SoftmaxType::kLearnable) {
    double e = 0, n = 0;
    for (int h = 0; h < c.hq; ++h) { e += std::pow(dsink.f32()[h] - rsink[h], 2); n += rsink[h] * rsink[h]; }
    e = std::sqrt(e / std::max(n, 1e-30));
    if (!(e < 2e-2)) { snprintf(buf, sizeof buf, "d_softmax_offset rel err %.3g", e); res.fail(buf); }
    snprintf(buf, sizeof buf, " dsink %.2e", e);
    summary += buf;
  }
  if (verbose || !res.ok) res.msg = summary + " | " + res.msg;
  for (Buf* B : {&q, &k, &v, &dout, &cq, &ck, &oq, &ok_, &bias, &sink, &mask, &slopes, &rngb, &out, &lse, &mlog, &dq,
                 &dk, &dvb, &dbias, &dsink, &ws})
    B->free_();
  return res;
}

static std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(c); };
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int d : {64, 128, 256}) {
      const char* dn = dt == DType::kBFloat16 ? "bf16" : "fp16";
      Case c; c.dtype = dt; c.dqk = c.dv = d; c.b = 2; c.sq = 200; c.skv = 260; c.hq = 4; c.hkv = 2;
      c.name = std::string(dn) + " d" + std::to_string(d) + " plain gqa"; add(c);
      Case cc = c; cc.mask = MaskType::kCausal; cc.name = std::string(dn) + " d" + std::to_string(d) + " causal"; add(cc);
      Case cb = c; cb.mask = MaskType::kCausalBottomRight; cb.sq = 130; cb.skv = 300; cb.name = std::string(dn) + " d" + std::to_string(d) + " causal_br"; add(cb);
    }
  }
  auto base = [](int d) { Case c; c.dqk = c.dv = d; c.b = 3; c.sq = 150; c.skv = 190; c.hq = 4; c.hkv = 1; return c; };
  { Case c = base(64); c.mask = MaskType::kCausal; c.sq = c.skv = 300; c.name = "bf16 d64 causal mqa square"; add(c); }
  { Case c = base(128); c.mask = MaskType::kPaddingCausal; c.name = "bf16 d128 padding_causal"; add(c); }
  { Case c = base(128); c.mask = MaskType::kPadding; c.zero_len = true; c.name = "bf16 d128 padding zero-len"; add(c); }
  { Case c = base(64); c.mask = MaskType::kPaddingCausalBottomRight; c.name = "bf16 d64 padding_causal_br"; add(c); }
  { Case c = base(128); c.fmt = Format::kTHD; c.mask = MaskType::kPaddingCausal; c.gaps = true; c.name = "bf16 d128 thd gaps causal"; add(c); }
  { Case c = base(256); c.fmt = Format::kTHD; c.mask = MaskType::kPadding; c.name = "bf16 d256 thd padding"; add(c); }
  { Case c = base(64); c.fmt = Format::kSBHD; c.mask = MaskType::kCausal; c.strided = true; c.name = "bf16 d64 sbhd strided causal"; add(c); }
  { Case c = base(128); c.mask = MaskType::kCausal; c.wl = 37; c.wr = 0; c.name = "bf16 d128 sliding window causal"; add(c); }
  { Case c = base(128); c.wl = 20; c.wr = 45; c.name = "bf16 d128 window both"; add(c); }
  { Case c = base(64); c.dqk = 96; c.dv = 40; c.mask = MaskType::kCausal; c.name = "bf16 dqk96 dv40 causal"; add(c); }
  { Case c = base(128); c.dqk = 192; c.dv = 128; c.name = "fp16 dqk192 dv128"; c.dtype = DType::kFloat16; add(c); }
  { Case c = base(64); c.bias = 1; c.dbias = true; c.name = "bf16 d64 bias full + dbias"; add(c); }
  { Case c = base(128); c.bias = 2; c.dbias = true; c.mask = MaskType::kCausal; c.name = "bf16 d128 bias [1,h] + dbias causal"; add(c); }
  { Case c = base(64); c.bias = 3; c.dbias = true; c.dtype = DType::kFloat16; c.name = "fp16 d64 bias [b,1,1,s] + dbias"; add(c); }
  { Case c = base(128); c.alibi = true; c.mask = MaskType::kCausal; c.name = "bf16 d128 alibi causal"; add(c); }
  { Case c = base(64); c.arb = true; c.name = "bf16 d64 arbitrary mask"; add(c); }
  { Case c = base(128); c.smx = SoftmaxType::kOffByOne; c.mask = MaskType::kCausal; c.name = "bf16 d128 off-by-one causal"; add(c); }
  { Case c = base(64); c.smx = SoftmaxType::kLearnable; c.name = "bf16 d64 learnable"; add(c); }
  { Case c = base(256); c.smx = SoftmaxType::kLearnable; c.mask = MaskType::kCausalBottomRight; c.dtype = DType::kFloat16; c.name = "fp16 d256 learnable causal_br"; add(c); }
  { Case c = base(128); c.p = 0.2; c.name = "bf16 d128 dropout"; add(c); }
  { Case c = base(64); c.p = 0.1; c.mask = MaskType::kCausal; c.fmt = Format::kTHD; c.gaps = true; c.name = "bf16 d64 dropout thd causal"; add(c); }
  { Case c = base(256); c.p = 0.15; c.bias = 1; c.dbias = true; c.name = "bf16 d256 dropout bias"; add(c); }
  { Case c = base(128); c.max_logit = true; c.mask = MaskType::kPaddingCausal; c.name = "bf16 d128 max_logit padding_causal"; add(c); }
  { Case c = base(64); c.max_logit = true; c.alibi = true; c.name = "bf16 d64 max_logit alibi"; add(c); }
  return v;
}

// ---------------------------------------------------------------- timing
static void bench_one(DType dt, int b, int s, int h, int d, bool causal, int iters) {
  const int64_t n = int64_t(b) * s * h * d;
  std::vector<uint16_t> host(n);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> U(-1, 1);
  for (int64_t i = 0; i < n; ++i) host[i] = double_to_bits(U(rng), dt);
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *lse, *rngs, *ws;
  for (void** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) {
    CK(cudaMalloc(p, n * 2));
    CK(cudaMemcpy(*p, host.data(), n * 2, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&lse, int64_t(b) * h * s * 4));
  CK(cudaMalloc(&rngs, 16));
  CK(cudaMemset(rngs, 0, 16));
  std::vector<int64_t> sz = {b, s, h, d}, stv = contig(sz);
  FwdArgs args;
  args.mask_type = causal ? MaskType::kCausal : MaskType::kNoMask;
  args.scale = 1.0 / std::sqrt(double(d));
  FwdInputs in;
  in.q = tref(q, dt, sz, stv); in.k = tref(k, dt, sz, stv); in.v = tref(v, dt, sz, stv);
  FwdOutputs fo;
  fo.out = tref(o, dt, sz, stv);
  fo.lse = tref(lse, DType::kFloat32, {b, h, s}, contig({b, h, s}));
  fo.max_logit = tref(nullptr, DType::kFloat32, {0}, {1});
  CheckedProblem prob;
  Status st = check_fwd(args, in, &prob);
  FwdParams fp;
  if (st.ok()) st = make_fwd_params(args, in, prob, fo, &fp);
  if (!st.ok()) { printf("bench params: %s\n", st.message.c_str()); return; }
  BwdArgs ba; ba.fwd = args;
  BwdInputs bi; bi.fwd = in; bi.fwd.rng_state = tref(rngs, DType::kInt64, {2}, {1});
  bi.dout = tref(dout, dt, sz, stv); bi.out = fo.out; bi.lse = fo.lse;
  BwdOutputs bo;
  bo.dq = tref(dq, dt, sz, stv); bo.dk = tref(dk, dt, sz, stv); bo.dv = tref(dv, dt, sz, stv);
  bo.dbias = tref(nullptr, dt, {0}, {1}); bo.d_softmax_offset = tref(nullptr, DType::kFloat32, {0}, {1});
  CheckedProblem bprob;
  st = check_bwd(ba, bi, &bprob);
  BwdParams bp;
  if (st.ok()) st = make_bwd_params(ba, bi, bprob, bo, &bp);
  if (!st.ok()) { printf("bench bwd params: %s\n", st.message.c_str()); return; }
  CudaPlan fplan, bplan;
  const std::string why = tc::plan_fwd(fp, device(), &fplan) + tc::plan_bwd(bp, device(), &bplan);
  if (!why.empty()) { printf("bench: not taken: %s\n", why.c_str()); return; }
  CK(cudaMalloc(&ws, std::max<size_t>(bplan.workspace_bytes, 16)));
  const CudaLaunch fl{}, bl{nullptr, ws, bplan.workspace_bytes};
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  auto time_it = [&](auto fn) {
    for (int i = 0; i < 2; ++i) fn();
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) {
      CK(cudaEventRecord(e0));
      fn();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float tf = time_it([&] { tc::run_fwd(fp, fplan, fl); });
  const float tb = time_it([&] { tc::run_bwd(bp, bplan, bl); });
  CK(cudaGetLastError());
  const double flops = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
  printf("BENCH %s d=%d s=%d b=%d h=%d causal=%d | fwd %.3f ms %.0f TF/s | bwd %.3f ms %.0f TF/s | fwd+bwd %.0f TF/s\n",
         dt == DType::kBFloat16 ? "bf16" : "fp16", d, s, b, h, causal, tf, flops / tf / 1e9, tb, 2.5 * flops / tb / 1e9,
         3.5 * flops / (tf + tb) / 1e9);
  fflush(stdout);
  for (void* p : {q, k, v, o, dout, dq, dk, dv, lse, rngs, ws}) cudaFree(p);
  cudaEventDestroy(e0); cudaEventDestroy(e1);
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (mode == "check") {
    const char* only = argc > 2 ? argv[2] : nullptr;
    int pass = 0, fail = 0;
    uint64_t seed = 12345;
    for (const Case& c : cases()) {
      if (only && c.name.find(only) == std::string::npos) continue;
      Result r = run_case(c, seed++, true);
      printf("%s %-40s %s\n", r.ok ? "PASS" : "FAIL", c.name.c_str(), r.msg.c_str());
      fflush(stdout);
      (r.ok ? pass : fail)++;
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) { printf("sticky CUDA error %s\n", cudaGetErrorString(e)); return 3; }
    }
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
  }
  if (mode == "bench") {
    const int iters = 10;
    struct B { int d, s; bool causal; };
    const B list[] = {{64, 512, false}, {64, 2048, false}, {64, 8192, true}, {64, 16384, false},
                      {128, 512, false}, {128, 2048, false}, {128, 2048, true}, {128, 8192, false},
                      {128, 8192, true}, {128, 16384, false}, {256, 2048, false}, {256, 8192, false},
                      {256, 16384, true}};
    for (const B& x : list) bench_one(DType::kBFloat16, 16384 / x.s, x.s, 2048 / x.d, x.d, x.causal, iters);
    return 0;
  }
  if (mode == "one" && argc > 4) {  // one timed config, e.g. for ncu: one D S CAUSAL
    const int d = atoi(argv[2]), s = atoi(argv[3]);
    bench_one(DType::kBFloat16, 16384 / s, s, 2048 / d, d, atoi(argv[4]) != 0, 1);
    return 0;
  }
  printf("usage: tc_harness check [filter] | bench | one D S CAUSAL\n");
  return 2;
}
