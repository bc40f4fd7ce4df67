// CPU forward against the naive double reference: layouts, strides, GQA,
// varlen/thd, windows, masks, bias/ALiBi, softmax variants, dropout, dtypes,
// determinism across thread counts, and argument errors.
#include "attn_test_util.h"

using namespace fa_test;

namespace {

bool run_and_compare(const Config& cfg, const Executor& exec) {
  Case c = build_case(cfg);
  FwdParams p = fwd_params(c);
  Status st = run_fwd_cpu(p, exec);
  CHECK_MSG(st.ok(), "[%s] run_fwd_cpu: %s", cfg.name.c_str(), st.message.c_str());
  if (!st.ok()) return false;
  Ref r = ref_forward(c);
  const Tol tol = tol_for(cfg.dt);
  bool ok = compare_seq("out", c.out, r.out, tol, cfg.name);
  ok &= compare_vec("lse", lse_as_ref_order(c), r.lse, {2e-5, 2e-5}, cfg.name);
  if (cfg.max_logit) {
    std::vector<double> ml(c.max_logit.begin(), c.max_logit.end());
    ok &= compare_vec("max_logit", ml, r.max_logit, {2e-5, 2e-5}, cfg.name);
  }
  return ok;
}

Config base(const char* name) {
  Config c;
  c.name = name;
  return c;
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
  }
  {
    Config c = base("mqa_d8_d256");
    c.b = 1; c.sq = 65; c.skv = 66; c.hq = 3; c.hkv = 1; c.dqk = 8; c.dv = 256;
    run_and_compare(c, exec);
    c.name = "d256_d8"; c.dqk = 256; c.dv = 8;
    run_and_compare(c, exec);
  }
  for (int br = 0; br < 2; ++br)
    for (auto sizes : {std::pair<int, int>{100, 100}, {50, 150}, {150, 50}}) {
      Config c = base(br ? "causal_bottom_right" : "causal_top_left");
      c.b = 2; c.sq = sizes.first; c.skv = sizes.second; c.hq = 2; c.hkv = 1; c.dqk = 32; c.dv = 32;
      c.wr = 0; c.bottom_right = br;
      run_and_compare(c, exec);
      c.name += "_offbyone"; c.softmax = SoftmaxType::kOffByOne;
      run_and_compare(c, exec);
      c.name += "_learnable"; c.softmax = SoftmaxType::kLearnable;
      run_and_compare(c, exec);
    }
  {
    Config c = base("negative_scale");
    c.b = 1; c.sq = 70; c.skv = 70; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 16; c.scale = -0.3; c.wr = 0;
    run_and_compare(c, exec);
    c.name = "zero_scale"; c.scale = 0;
    run_and_compare(c, exec);
  }
  {
    Config c = base("sliding_window");
    c.b = 1; c.sq = 140; c.skv = 200; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 16;
    c.wl = 20; c.wr = 3; c.bottom_right = true;
    run_and_compare(c, exec);
    c.name = "sliding_window_top_left"; c.bottom_right = false; c.wl = 70; c.wr = 65;
    run_and_compare(c, exec);
    c.name = "left_only"; c.wl = 0; c.wr = -1;
    run_and_compare(c, exec);
  }
  {
    Config c = base("padding_bshd");
    c.b = 4; c.sq = 80; c.skv = 90; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 24;
    c.lens_q = {80, 0, 33, 65}; c.lens_kv = {90, 10, 0, 64};
    run_and_compare(c, exec);
    c.name = "padding_causal_br_sbhd"; c.qf = c.kvf = Format::kSBHD; c.wr = 0; c.bottom_right = true;
    run_and_compare(c, exec);
    c.name = "padding_sbhd_learnable"; c.softmax = SoftmaxType::kLearnable;
    run_and_compare(c, exec);
  }
  {
    Config c = base("thd");
    c.b = 3; c.sq = 100; c.skv = 120; c.hq = 4; c.hkv = 2; c.dqk = 32; c.dv = 32;
    c.qf = c.kvf = Format::kTHD;
    c.lens_q = {100, 7, 64}; c.lens_kv = {120, 1, 64};
    run_and_compare(c, exec);
    c.name = "thd_padded_causal"; c.gap_q = {3, 0, 5}; c.gap_kv = {0, 4, 2}; c.wr = 0;
    run_and_compare(c, exec);
    c.name = "thd_q_bshd_kv"; c.kvf = Format::kBSHD; c.lens_kv = {120, 1, 64}; c.gap_kv.clear(); c.wr = -1;
    run_and_compare(c, exec);
  }
  {
    Config c = base("explicit_mask");
    c.b = 2; c.sq = 70; c.skv = 75; c.hq = 2; c.hkv = 2; c.dqk = 16; c.dv = 16;
    c.mask = true; c.mask_h1 = true;
    run_and_compare(c, exec);
    c.name = "explicit_mask_full_b1"; c.mask_h1 = false; c.mask_b1 = true;
    run_and_compare(c, exec);
    c.name = "explicit_mask_causal_offbyone"; c.wr = 0; c.softmax = SoftmaxType::kOffByOne;
    run_and_compare(c, exec);
  }
  for (int shape = 0; shape < 5; ++shape) {
    Config c = base("bias");
    c.b = 2; c.sq = 66; c.skv = 67; c.hq = 2; c.hkv = 1; c.dqk = 16; c.dv = 16;
    c.bias = BiasType::kPostScaleBias;
    c.bias_b1 = shape == 1 || shape == 3 || shape == 4;
    c.bias_h1 = shape == 2 || shape == 3 || shape == 4;
    c.bias_i1 = shape == 4;
    c.name += std::to_string(shape);
    run_and_compare(c, exec);
  }
  {
    Config c = base("alibi");
    c.b = 2; c.sq = 50; c.skv = 90; c.hq = 3; c.hkv = 3; c.dqk = 16; c.dv = 16;
    c.bias = BiasType::kAlibi; c.wr = 0; c.bottom_right = true;
    run_and_compare(c, exec);
    c.name = "alibi_2d_nomask"; c.alibi_2d = true; c.wr = -1; c.bottom_right = false;
    run_and_compare(c, exec);
  }
  {
    Config c = base("dropout");
    c.b = 2; c.sq = 70; c.skv = 90; c.hq = 2; c.hkv = 1; c.dqk = 16; c.dv = 16; c.p_drop = 0.3f;
    run_and_compare(c, exec);
    c.name = "dropout_thd_causal"; c.qf = c.kvf = Format::kTHD; c.lens_q = {70, 13}; c.lens_kv = {90, 13};
    c.wr = 0;
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
    c.bias = BiasType::kPostScaleBias; c.bias_b1 = true;
    run_and_compare(c, exec);
    c.name += "_thd_dropout_learnable"; c.bias = BiasType::kNoBias;
    c.qf = c.kvf = Format::kTHD; c.lens_q = {70, 30}; c.lens_kv = {80, 31}; c.gap_q = {2, 2}; c.gap_kv = {1, 0};
    c.p_drop = 0.2f; c.softmax = SoftmaxType::kLearnable; c.layout = 1;
    run_and_compare(c, exec);
  }
}

// Paged KV cache: k/v live in a shuffled page pool; the result must equal
// the unpaged reference on the same logical keys and values.
void test_paged(const Executor& exec) {
  for (int variant = 0; variant < 3; ++variant) {
    Config cfg = base("paged");
    cfg.b = 3; cfg.sq = variant == 2 ? 1 : 40; cfg.skv = 96; cfg.hq = 4; cfg.hkv = 2; cfg.dqk = 32; cfg.dv = 16;
    cfg.lens_kv = {96, 17, 50};
    if (variant == 1) { cfg.dt = DType::kBFloat16; cfg.wr = 0; cfg.bottom_right = true; cfg.softmax = SoftmaxType::kLearnable; }
    if (variant == 2) { cfg.qf = Format::kTHD; cfg.lens_q = {1, 1, 1}; cfg.sq = 1; cfg.bias = BiasType::kAlibi; cfg.wr = 0; cfg.bottom_right = true; }
    cfg.name += std::to_string(variant);
    Case c = build_case(cfg);
    const int64_t page = 16, max_pages = 6, num_pages = 20;
    HostSeq pk = make_seq(cfg.dt, Format::kBSHD, num_pages, page, cfg.hkv, cfg.dqk, 1);
    HostSeq pv = make_seq(cfg.dt, Format::kBSHD, num_pages, page, cfg.hkv, cfg.dv, 0);
    std::vector<int32_t> table(static_cast<size_t>(cfg.b * max_pages));
    std::vector<int32_t> perm(num_pages);
    for (int k = 0; k < num_pages; ++k) perm[k] = (k * 7 + 3) % num_pages;  // 7 is coprime to 20
    for (size_t k = 0; k < table.size(); ++k) table[k] = perm[k % num_pages];
    for (int64_t b = 0; b < cfg.b; ++b)
      for (int64_t t = 0; t < c.len_kv(b); ++t) {
        const int64_t pg = table[b * max_pages + t / page];
        for (int64_t h = 0; h < cfg.hkv; ++h) {
          for (int64_t d = 0; d < cfg.dqk; ++d) pk.set(pg, t % page, h, d, c.k.get(b, t, h, d));
          for (int64_t d = 0; d < cfg.dv; ++d) pv.set(pg, t % page, h, d, c.v.get(b, t, h, d));
        }
      }
    FwdParams p = fwd_params(c);
    p.k = pk.view;
    p.v = pv.view;
    p.prob.s_kv = max_pages * page;
    p.paged.page_table = table.data();
    p.paged.stride_b = max_pages;
    p.paged.page_size = page;
    p.paged.max_pages = max_pages;
    p.paged.num_pages = num_pages;
    Status st = run_fwd_cpu(p, exec);
    CHECK_MSG(st.ok(), "[%s] %s", cfg.name.c_str(), st.message.c_str());
    Ref r = ref_forward(c);
    compare_seq("out", c.out, r.out, tol_for(cfg.dt), cfg.name);
    compare_vec("lse", lse_as_ref_order(c), r.lse, {2e-5, 2e-5}, cfg.name);
    table[1] = num_pages;  // out of the pool
    st = run_fwd_cpu(p, exec);
    CHECK(st.code == StatusCode::kInvalidArgument && st.message.find("page_table[0, 1]") != std::string::npos);
  }
}

void test_large_values() {
  // Logits around 1e3: online softmax must rescale without overflow.
  Config c = base("large_logits");
  c.b = 1; c.sq = 130; c.skv = 300; c.hq = 1; c.hkv = 1; c.dqk = 64; c.dv = 64;
  c.value_range = 8.0; c.scale = 2.0;
  Config c32 = c;
  c32.dt = DType::kFloat64;
  run_and_compare(c32, SerialExecutor{});
}

void test_determinism() {
  Config cfg = base("determinism");
  cfg.b = 2; cfg.sq = 300; cfg.skv = 333; cfg.hq = 4; cfg.hkv = 2; cfg.dqk = 64; cfg.dv = 64;
  cfg.wr = 0; cfg.p_drop = 0.1f;
  Case a = build_case(cfg), b = build_case(cfg);
  FwdParams pa = fwd_params(a), pb = fwd_params(b);
  CHECK(run_fwd_cpu(pa, SerialExecutor{}).ok());
  CHECK(run_fwd_cpu(pb, ThreadExecutor(3)).ok());
  CHECK(a.out.bytes == b.out.bytes);
  CHECK(a.lse == b.lse);
  CHECK(a.max_logit == b.max_logit);
}

// A call below the executor's serial_macs() (b h s_q s_kv (d_qk + d_v) multiply-adds, one phase) runs
// on the calling thread, one at it on the executor's threads; the bytes are the same.
void test_serial_small_calls() {
  Config cfg = base("serial_small");
  cfg.b = 1; cfg.sq = 16; cfg.skv = 16; cfg.hq = 2; cfg.hkv = 2; cfg.dqk = 16; cfg.dv = 16;  // 16384 MACs
  Case a = build_case(cfg), b = build_case(cfg);
  FwdParams pa = fwd_params(a), pb = fwd_params(b);
  const ThreadExecutor above(2, 16385), at(2, 16384);
  CHECK(run_fwd_cpu(pa, above).ok());
  CHECK(above.calls() == 0);
  CHECK(run_fwd_cpu(pb, at).ok());
  CHECK(at.calls() > 0);
  CHECK(a.out.bytes == b.out.bytes);
  CHECK(a.lse == b.lse);
}

void test_errors() {
  Config cfg = base("errors");
  cfg.b = 3; cfg.sq = 8; cfg.skv = 8; cfg.lens_q = {4, 2, 3}; cfg.lens_kv = {4, 4, 4};
  {
    Case c = build_case(cfg);
    c.cu_q = {0, 4, 3, 6};  // decreasing
    FwdParams p = fwd_params(c);
    Status st = run_fwd_cpu(p, SerialExecutor{});
    CHECK(st.code == StatusCode::kInvalidArgument);
    CHECK_MSG(st.message.find("cu_seqlens_q must be non-decreasing") != std::string::npos, "%s", st.message.c_str());
  }
  {
    Case c = build_case(cfg);
    c.cu_kv = {0, 4, 8, 20};  // a length beyond s_kv
    FwdParams p = fwd_params(c);
    Status st = run_fwd_cpu(p, SerialExecutor{});
    CHECK(st.code == StatusCode::kInvalidArgument);
    CHECK_MSG(st.message.find("cu_seqlens_kv") != std::string::npos, "%s", st.message.c_str());
  }
  {
    Config t = cfg;
    t.qf = t.kvf = Format::kTHD;
    Case c = build_case(t);
    FwdParams p = fwd_params(c);
    p.prob.t_q = 5;  // tokens beyond the token dim
    Status st = run_fwd_cpu(p, SerialExecutor{});
    CHECK(st.code == StatusCode::kInvalidArgument);
    CHECK_MSG(st.message.find("token dim") != std::string::npos, "%s", st.message.c_str());
  }
  {
    Case c = build_case(cfg);
    FwdParams p = fwd_params(c);
    p.prob.dtype = DType::kInt32;
    CHECK(run_fwd_cpu(p, SerialExecutor{}).code == StatusCode::kUnsupported);
  }
}

}  // namespace

int main() {
  test_matrix(SerialExecutor{});
  test_matrix(ThreadExecutor(2));
  test_paged(SerialExecutor{});
  test_paged(ThreadExecutor(2));
  test_large_values();
  test_determinism();
  test_serial_small_calls();
  test_errors();
  return finish("test_cpu_fwd");
}
