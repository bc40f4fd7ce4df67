// CPU backward against the naive double reference (whose formulas are first
// checked against finite differences of the reference forward): dq, dk, dv,
// dbias over every broadcast shape, d_softmax_offset, GQA, varlen/thd gaps,
// windows, masks, ALiBi, dropout, dtypes, and bitwise determinism across
// thread counts.
#include "attn_test_util.h"

using namespace fa_test;

namespace {

// Runs the engine forward (to get out and lse like autograd would), then the
// engine backward, and compares with the reference gradients.
bool run_and_compare(const Config& cfg, const Executor& exec) {
  Case c = build_case(cfg);
  FwdParams fp = fwd_params(c);
  Status st = run_fwd_cpu(fp, exec);
  CHECK_MSG(st.ok(), "[%s] run_fwd_cpu: %s", cfg.name.c_str(), st.message.c_str());
  if (!st.ok()) return false;
  BwdParams bp = bwd_params(c, true);
  st = run_bwd_cpu(bp, exec);
  CHECK_MSG(st.ok(), "[%s] run_bwd_cpu: %s", cfg.name.c_str(), st.message.c_str());
  if (!st.ok()) return false;
  Ref r = ref_backward(c);
  Tol tol = tol_for(cfg.dt);
  if (cfg.dt == DType::kFloat32) tol = {5e-5, 5e-4};
  if (cfg.dt == DType::kFloat64) tol = {1e-6, 1e-5};  // the saved lse is fp32
  bool ok = compare_seq("dq", c.dq, r.dq, tol, cfg.name);
  ok &= compare_seq("dk", c.dk, r.dk, tol, cfg.name);
  ok &= compare_seq("dv", c.dv, r.dv, tol, cfg.name);
  if (cfg.bias == BiasType::kPostScaleBias) {
    std::vector<double> got(r.dbias.size());
    for (size_t k = 0; k < got.size(); ++k) got[k] = decode(cfg.dt, c.dbias.bytes.data() + k * elem_size(cfg.dt));
    ok &= compare_vec("dbias", got, r.dbias, tol, cfg.name);
  }
  if (cfg.softmax == SoftmaxType::kLearnable) {
    std::vector<double> got(c.d_offset.begin(), c.d_offset.end());
    ok &= compare_vec("d_softmax_offset", got, r.d_offset, {tol.atol * 10, tol.rtol * 10}, cfg.name);
  }
  return ok;
}

Config base(const char* name) {
  Config c;
  c.name = name;
  return c;
}

// The reference backward formulas against central differences of the
// reference forward (loss = sum(out * dout)), in fp64 on a tiny problem.
void test_reference_gradients() {
  for (int variant = 0; variant < 3; ++variant) {
    Config cfg = base("ref_fd");
    cfg.dt = DType::kFloat64;
    cfg.b = 2; cfg.sq = 5; cfg.skv = 6; cfg.hq = 2; cfg.hkv = 1; cfg.dqk = 3; cfg.dv = 2;
    cfg.bias = BiasType::kPostScaleBias; cfg.bias_b1 = true;
    cfg.softmax = SoftmaxType::kLearnable; cfg.wr = 1; cfg.bottom_right = true;
    cfg.lens_q = {5, 3}; cfg.lens_kv = {6, 2};
    if (variant == 1) { cfg.p_drop = 0.3f; cfg.softmax = SoftmaxType::kOffByOne; }
    if (variant == 2) { cfg.bias_i1 = true; cfg.bias_h1 = true; cfg.mask = true; }
    Case c = build_case(cfg);
    Ref f0 = ref_forward(c);
    // out := reference out (what D uses)
    for (int64_t b = 0; b < c.q.nb; ++b)
      for (int64_t s = 0; s < c.q.ns; ++s)
        for (int64_t h = 0; h < cfg.hq; ++h)
          for (int64_t d = 0; d < cfg.dv; ++d) c.out.set(b, s, h, d, f0.out[((b * c.q.ns + s) * cfg.hq + h) * cfg.dv + d]);
    Ref g = ref_backward(c);
    auto loss = [&]() {
      Ref f = ref_forward(c);
      double l = 0;
      for (int64_t b = 0; b < c.q.nb; ++b)
        for (int64_t s = 0; s < c.q.ns; ++s)
          for (int64_t h = 0; h < cfg.hq; ++h)
            for (int64_t d = 0; d < cfg.dv; ++d)
              l += f.out[((b * c.q.ns + s) * cfg.hq + h) * cfg.dv + d] * c.dout.get(b, s, h, d);
      return l;
    };
    const double eps = 1e-6;
    auto fd_seq = [&](HostSeq& t, const std::vector<double>& grad, const char* what) {
      double worst = 0;
      for (int64_t b = 0; b < t.nb; ++b)
        for (int64_t s = 0; s < t.ns; ++s)
          for (int64_t h = 0; h < t.nh; ++h)
            for (int64_t d = 0; d < t.nd; ++d) {
              const double x = t.get(b, s, h, d);
              t.set(b, s, h, d, x + eps);
              const double lp = loss();
              t.set(b, s, h, d, x - eps);
              const double lm = loss();
              t.set(b, s, h, d, x);
              worst = std::max(worst, std::fabs((lp - lm) / (2 * eps) - grad[((b * t.ns + s) * t.nh + h) * t.nd + d]));
            }
      CHECK_MSG(worst < 1e-6, "reference %s vs finite differences (variant %d): %.3g", what, variant, worst);
    };
    fd_seq(c.q, g.dq, "dq");
    fd_seq(c.k, g.dk, "dk");
    fd_seq(c.v, g.dv, "dv");
    double worst = 0;
    for (size_t k = 0; k < g.dbias.size(); ++k) {
      double* x = reinterpret_cast<double*>(c.bias.bytes.data()) + k;
      const double x0 = *x;
      *x = x0 + eps;
      const double lp = loss();
      *x = x0 - eps;
      const double lm = loss();
      *x = x0;
      worst = std::max(worst, std::fabs((lp - lm) / (2 * eps) - g.dbias[k]));
    }
    CHECK_MSG(worst < 1e-6, "reference dbias vs finite differences (variant %d): %.3g", variant, worst);
    if (cfg.softmax == SoftmaxType::kLearnable) {
      worst = 0;
      for (size_t h = 0; h < c.offset.size(); ++h) {
        // offsets are float: use a larger step, exactly representable
        const float x0 = c.offset[h];
        const double e2 = 1.0 / 1024;
        c.offset[h] = static_cast<float>(x0 + e2);
        const double lp = loss();
        c.offset[h] = static_cast<float>(x0 - e2);
        const double lm = loss();
        c.offset[h] = x0;
        worst = std::max(worst, std::fabs((lp - lm) / (2 * e2) - g.d_offset[h]));
      }
      CHECK_MSG(worst < 1e-5, "reference d_offset vs finite differences (variant %d): %.3g", variant, worst);
    }
  }
}

void test_matrix(const Executor& exec) {
  {
    Config c = base("basic");
    c.b = 2; c.sq = 37; c.skv = 53; c.hq = 4; c.hkv = 4; c.dqk = 64; c.dv = 64;
    run_and_compare(c, exec);
  }
  {
    Config c = base("gqa_dv");
    c.b = 2; c.sq = 70; c.skv = 130; c.hq = 6; c.hkv = 2; c.dqk = 32; c.dv = 48;
    run_and_compare(c, exec);
    c.name = "mqa_d8_d256"; c.hq = 3; c.hkv = 1; c.dqk = 8; c.dv = 256;
    run_and_compare(c, exec);
  }
  for (int br = 0; br < 2; ++br)
    for (auto sizes : {std::pair<int, int>{100, 100}, {50, 150}, {150, 50}}) {
      Config c = base(br ? "causal_bottom_right" : "causal_top_left");
      c.b = 2; c.sq = sizes.first; c.skv = sizes.second; c.hq = 2; c.hkv = 1; c.dqk = 32; c.dv = 32;
      c.wr = 0; c.bottom_right = br;
      run_and_compare(c, exec);
      c.name += "_learnable"; c.softmax = SoftmaxType::kLearnable;
      run_and_compare(c, exec);
    }
  {
    Config c = base("sliding_window_offbyone");
    c.b = 1; c.sq = 140; c.skv = 200; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 16;
    c.wl = 20; c.wr = 3; c.bottom_right = true; c.softmax = SoftmaxType::kOffByOne;
    run_and_compare(c, exec);
  }
  {
    Config c = base("padding_bshd");
    c.b = 4; c.sq = 80; c.skv = 90; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 24;
    c.lens_q = {80, 0, 33, 65}; c.lens_kv = {90, 10, 0, 64};
    run_and_compare(c, exec);
    c.name = "padding_causal_br_sbhd_learnable"; c.qf = c.kvf = Format::kSBHD; c.wr = 0; c.bottom_right = true;
    c.softmax = SoftmaxType::kLearnable;
    run_and_compare(c, exec);
  }
  {
    Config c = base("thd_padded_causal");
    c.b = 3; c.sq = 100; c.skv = 120; c.hq = 4; c.hkv = 2; c.dqk = 32; c.dv = 32;
    c.qf = c.kvf = Format::kTHD;
    c.lens_q = {100, 7, 64}; c.lens_kv = {120, 1, 64}; c.gap_q = {3, 0, 5}; c.gap_kv = {0, 4, 2}; c.wr = 0;
    run_and_compare(c, exec);
  }
  {
    Config c = base("explicit_mask");
    c.b = 2; c.sq = 70; c.skv = 75; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 16;
    c.mask = true; c.mask_h1 = false; c.mask_b1 = true;
    run_and_compare(c, exec);
  }
  for (int shape = 0; shape < 6; ++shape) {
    Config c = base("dbias");
    c.b = 2; c.sq = 66; c.skv = 67; c.hq = 4; c.hkv = 2; c.dqk = 16; c.dv = 16;
    c.bias = BiasType::kPostScaleBias;
    c.bias_b1 = shape == 1 || shape == 3 || shape == 4;
    c.bias_h1 = shape == 2 || shape == 3 || shape == 4 || shape == 5;
    c.bias_i1 = shape == 4 || shape == 5;
    c.name += std::to_string(shape);
    run_and_compare(c, exec);
    c.name += "_padding_causal"; c.lens_q = {66, 30}; c.lens_kv = {67, 41}; c.wr = 0; c.bottom_right = true;
    run_and_compare(c, exec);
  }
  {
    Config c = base("alibi");
    c.b = 2; c.sq = 50; c.skv = 90; c.hq = 3; c.hkv = 3; c.dqk = 16; c.dv = 16;
    c.bias = BiasType::kAlibi; c.wr = 0; c.bottom_right = true; c.alibi_2d = true;
    run_and_compare(c, exec);
  }
  {
    Config c = base("dropout");
    c.b = 2; c.sq = 70; c.skv = 90; c.hq = 2; c.hkv = 1; c.dqk = 16; c.dv = 16; c.p_drop = 0.3f;
    c.bias = BiasType::kPostScaleBias; c.bias_b1 = true;
    run_and_compare(c, exec);
    c.name = "dropout_thd_causal"; c.qf = c.kvf = Format::kTHD; c.lens_q = {70, 13}; c.lens_kv = {90, 13};
    c.wr = 0; c.bias = BiasType::kNoBias;
    run_and_compare(c, exec);
  }
  {
    Config c = base("strided_packed");
    c.b = 2; c.sq = 40; c.skv = 40; c.hq = 3; c.hkv = 3; c.dqk = 24; c.dv = 24; c.layout = 1;
    run_and_compare(c, exec);
    c.name = "strided_d"; c.layout = 2; c.qf = c.kvf = Format::kSBHD;
    run_and_compare(c, exec);
  }
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    Config c = base(dt == DType::kFloat16 ? "fp16" : dt == DType::kBFloat16 ? "bf16" : "fp64");
    c.dt = dt;
    c.b = 2; c.sq = 70; c.skv = 80; c.hq = 4; c.hkv = 2; c.dqk = 64; c.dv = 64; c.wr = 0;
    c.bias = BiasType::kPostScaleBias; c.bias_h1 = true;
    run_and_compare(c, exec);
    c.name += "_thd_dropout_learnable"; c.bias = BiasType::kNoBias;
    c.qf = c.kvf = Format::kTHD; c.lens_q = {70, 30}; c.lens_kv = {80, 31}; c.gap_q = {2, 2}; c.gap_kv = {1, 0};
    c.p_drop = 0.2f; c.softmax = SoftmaxType::kLearnable; c.layout = 1;
    run_and_compare(c, exec);
  }
}

// Two cases of one configuration with the same forward outputs (out, lse), so that two backward runs
// can be compared byte for byte.
void twin_cases(const Config& cfg, Case* a, Case* b) {
  *a = build_case(cfg);
  *b = build_case(cfg);
  FwdParams fa = fwd_params(*a);
  CHECK(run_fwd_cpu(fa, SerialExecutor{}).ok());
  b->out.bytes = a->out.bytes;
  b->lse = a->lse;
}

void test_determinism() {
  Config cfg = base("determinism");
  cfg.b = 2; cfg.sq = 200; cfg.skv = 233; cfg.hq = 4; cfg.hkv = 2; cfg.dqk = 32; cfg.dv = 32;
  cfg.wr = 0; cfg.p_drop = 0.1f; cfg.bias = BiasType::kPostScaleBias; cfg.bias_b1 = true; cfg.bias_h1 = true;
  cfg.softmax = SoftmaxType::kLearnable;
  Case a, b;
  twin_cases(cfg, &a, &b);
  BwdParams pa = bwd_params(a, true), pb = bwd_params(b, true);
  CHECK(run_bwd_cpu(pa, SerialExecutor{}).ok());
  CHECK(run_bwd_cpu(pb, ThreadExecutor(3)).ok());
  CHECK(a.dq.bytes == b.dq.bytes);
  CHECK(a.dk.bytes == b.dk.bytes);
  CHECK(a.dv.bytes == b.dv.bytes);
  CHECK(a.dbias.bytes == b.dbias.bytes);
  CHECK(a.d_offset == b.d_offset);

  // Without dbias, 4 (batch, kv head) pairs: serial runs the fused schedule,
  // 3 threads the two-pass one; both sum in the same order.
  cfg.bias = BiasType::kNoBias;
  Case x, y;
  twin_cases(cfg, &x, &y);
  BwdParams px = bwd_params(x, true), py = bwd_params(y, true);
  CHECK(run_bwd_cpu(px, SerialExecutor{}).ok());
  CHECK(run_bwd_cpu(py, ThreadExecutor(3)).ok());
  CHECK(x.dq.bytes == y.dq.bytes);
  CHECK(x.dk.bytes == y.dk.bytes);
  CHECK(x.dv.bytes == y.dv.bytes);
  CHECK(x.d_offset == y.d_offset);
}

// The backward's limit is four times the executor's serial_macs() (its phases each pay the fork and
// join): 16384 MACs run on the calling thread under 4097, on the threads under 4096; the same bytes.
void test_serial_small_calls() {
  Config cfg = base("serial_small");
  cfg.b = 1; cfg.sq = 16; cfg.skv = 16; cfg.hq = 2; cfg.hkv = 2; cfg.dqk = 16; cfg.dv = 16;  // 16384 MACs
  Case a, b;
  twin_cases(cfg, &a, &b);
  BwdParams pa = bwd_params(a, true), pb = bwd_params(b, true);
  const ThreadExecutor above(2, 4097), at(2, 4096);
  CHECK(run_bwd_cpu(pa, above).ok());
  CHECK(above.calls() == 0);
  CHECK(run_bwd_cpu(pb, at).ok());
  CHECK(at.calls() > 0);
  CHECK(a.dq.bytes == b.dq.bytes);
  CHECK(a.dk.bytes == b.dk.bytes);
  CHECK(a.dv.bytes == b.dv.bytes);
}

}  // namespace

int main() {
  test_reference_gradients();
  test_matrix(SerialExecutor{});
  test_matrix(ThreadExecutor(2));
  test_determinism();
  test_serial_small_calls();
  return finish("test_cpu_bwd");
}
