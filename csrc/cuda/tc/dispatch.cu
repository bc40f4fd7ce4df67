// Host side of the tensor-core engine: the support rules, the one function
// that turns FwdParams / BwdParams into kernel arguments, the workspace
// layout, and the launch sequence around the main kernels. The main kernels
// are reached through generated/table.inc (from kernels.list), so what is
// compiled and what is dispatched cannot drift apart.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "aux_kernels.h"
#include "common/aux_kernels.cuh"
#include "common/rows.h"
#include "fusedattn/cat.h"
#include "fusedattn/philox.h"
#include "launch.h"
#include "tc_api.h"

namespace fusedattn {
namespace tc {
namespace {

enum class Dir { kFwd, kBwd };

struct TableEntry {
  Dir dir;
  DType dtype;
  int head_dim;
  Variant variant;
  KernelFn fn;
};

// The launchers are explicitly instantiated in generated/*.cu; here they are
// only declared (launch.h), so taking their addresses links to those.
const TableEntry kTable[] = {
#include "generated/table.inc"
};

constexpr int kBuckets[] = {64, 128, 256};
constexpr int64_t kMaxSeq = int64_t{1} << 29;  // s_q + s_kv < kMaxPositionSum32: visibility in int32

int head_dim_bucket(const Problem& p) {
  const int64_t d = std::max(p.d_qk, p.d_v);
  for (int b : kBuckets) {
    if (d <= b) return b;
  }
  return 0;
}

bool needs_general(const FwdParams& p) {
  return p.bias.type != BiasType::kNoBias || p.mask.mask.data != nullptr || p.dropout.p > 0.f;
}

// The kernel variant a call needs; a backward that writes dbias needs the general one.
Variant variant_of(const FwdParams& p, bool dbias) {
  if (dbias || needs_general(p)) return Variant::kGeneral;
  return p.softcap > 0 ? Variant::kSoftcap : Variant::kFast;
}

const char* variant_name(Variant v) {
  return v == Variant::kGeneral ? "general" : v == Variant::kSoftcap ? "softcap" : "fast";
}

const TableEntry* find_kernel(Dir dir, DType dtype, int head_dim, Variant variant) {
  for (const TableEntry& e : kTable) {
    if (e.dir == dir && e.dtype == dtype && e.head_dim == head_dim && e.variant == variant) return &e;
  }
  return nullptr;
}

// The softcap's factors in the kernels' float (KArgs): scale / softcap and softcap * log2(e). The
// core admits any cap that is a positive float; these two must be finite floats too.
struct CapFactors {
  float scale = 0.f, log2 = 0.f;
};
CapFactors cap_factors(const FwdParams& p) {
  CapFactors c;
  if (p.softcap > 0) {
    c.scale = static_cast<float>(p.scale / p.softcap);
    c.log2 = static_cast<float>(p.softcap * 1.4426950408889634);
  }
  return c;
}

// The engine's own limits (the core has validated the call).
std::string common_support(const FwdParams& p, const gpu::DeviceAttrs& dev, Dir dir) {
  const Problem& pr = p.prob;
  if (pr.dtype != DType::kFloat16 && pr.dtype != DType::kBFloat16) {
    return cat("dtype ", dtype_name(pr.dtype), " (tensor-core kernels take float16 and bfloat16)");
  }
  if (p.softcap > 0) {
    const CapFactors c = cap_factors(p);
    if (!std::isfinite(c.scale) || !std::isfinite(c.log2)) {
      return cat("softcap ", p.softcap, " with softmax_scale ", p.scale,
                 " (scale / softcap and softcap * log2(e) must be finite in float32)");
    }
  }
  if (dev.major < 8) return cat("compute capability ", dev.major, ".x (tensor-core kernels need sm_80 or newer)");
  const int bucket = head_dim_bucket(pr);
  if (bucket == 0) return cat("head dims d_qk=", pr.d_qk, ", d_v=", pr.d_v, " (at most 256)");
  if (pr.d_qk == 0 || pr.d_v == 0) return "an empty head dim";
  const Variant variant = variant_of(p, false);
  if (find_kernel(dir, pr.dtype, bucket, variant) == nullptr) {
    return cat("no ", dir == Dir::kFwd ? "forward" : "backward", " kernel for dtype ", dtype_name(pr.dtype),
               ", head-dim bucket ", bucket, ", variant ", variant_name(variant), " in kernels.list");
  }
  if (pr.b > 65535 || pr.h_q > 65535 || pr.h_kv > 65535) return cat("batch ", pr.b, " or heads ", pr.h_q, " > 65535");
  if (pr.s_q >= kMaxSeq || pr.s_kv >= kMaxSeq || pr.t_q >= kMaxSeq || pr.t_kv >= kMaxSeq) {
    return cat("sequence/token extent >= 2^29 (s_q=", pr.s_q, ", s_kv=", pr.s_kv, ")");
  }
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"},
                                {&p.out, "out"}}) {
    std::string r = gpu::rows16_problem(*t, name);
    if (!r.empty()) return r;
  }
  return "";
}

KArgs make_fwd_kargs(const FwdParams& p) {
  KArgs a{};
  const Problem& pr = p.prob;
  a.q = p.q.data;
  a.k = p.k.data;
  a.v = p.v.data;
  a.o = p.out.data;
  a.q_sb = p.q.stride_b; a.q_ss = p.q.stride_s; a.q_sh = p.q.stride_h;
  a.k_sb = p.k.stride_b; a.k_ss = p.k.stride_s; a.k_sh = p.k.stride_h;
  a.v_sb = p.v.stride_b; a.v_ss = p.v.stride_s; a.v_sh = p.v.stride_h;
  a.o_sb = p.out.stride_b; a.o_ss = p.out.stride_s; a.o_sh = p.out.stride_h;
  a.lse = p.lse;
  a.lse_sb = p.lse_stride_b; a.lse_sh = p.lse_stride_h; a.lse_ss = p.lse_stride_s;
  a.max_logit = p.max_logit;
  a.cu_q = p.seqlens.cu_seqlens_q;
  a.cu_kv = p.seqlens.cu_seqlens_kv;
  a.q_thd = p.seqlens.q_is_thd;
  a.kv_thd = p.seqlens.kv_is_thd;
  a.off_q = a.q_thd ? p.seqlens.offsets_q : nullptr;
  a.off_kv = a.kv_thd ? p.seqlens.offsets_kv : nullptr;
  a.t_q = pr.t_q;
  a.t_kv = pr.t_kv;
  a.b = static_cast<int>(pr.b);
  a.h_q = static_cast<int>(pr.h_q);
  a.h_kv = static_cast<int>(pr.h_kv);
  a.group = a.h_q / a.h_kv;
  a.s_q = static_cast<int>(pr.s_q);
  a.s_kv = static_cast<int>(pr.s_kv);
  a.d_qk = static_cast<int>(pr.d_qk);
  a.d_v = static_cast<int>(pr.d_v);
  a.wl = static_cast<int>(p.mask.window_left);  // clamped to s_q + s_kv < 2^30 (make_fwd_params)
  a.wr = static_cast<int>(p.mask.window_right);
  a.bottom_right = p.mask.bottom_right;
  const PairTensor& m = p.mask.mask;
  a.mask = static_cast<const uint8_t*>(m.data);
  a.mk_sb = m.stride_b; a.mk_sh = m.stride_h; a.mk_si = m.stride_i; a.mk_sj = m.stride_j;
  a.bias_type = p.bias.type == BiasType::kPostScaleBias ? 1 : p.bias.type == BiasType::kAlibi ? 2 : 0;
  const PairTensor& bt = p.bias.bias;
  a.bias = bt.data;
  a.bs_sb = bt.stride_b; a.bs_sh = bt.stride_h; a.bs_si = bt.stride_i; a.bs_sj = bt.stride_j;
  a.alibi = p.bias.alibi_slopes;
  a.al_sb = p.bias.alibi_stride_b;
  a.al_sh = p.bias.alibi_stride_h;
  a.softmax_type = p.softmax.type == SoftmaxType::kVanilla ? 0 : p.softmax.type == SoftmaxType::kOffByOne ? 1 : 2;
  a.sink = p.softmax.offset;
  a.dropout = p.dropout.p > 0.f;
  a.drop_thr = dropout_threshold(p.dropout.p);
  a.rp_drop = a.dropout ? 1.f / (1.f - p.dropout.p) : 1.f;
  a.rng = p.dropout.rng_state;
  a.scale = p.scale;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  const CapFactors cap = cap_factors(p);
  a.softcap = static_cast<float>(p.softcap);
  a.softcap_scale = cap.scale;
  a.softcap_log2 = cap.log2;
  a.acc_d = head_dim_bucket(pr);
  return a;
}

int64_t rows_q(const Problem& pr, bool q_thd) { return q_thd ? pr.t_q : pr.b * pr.s_q; }

bool dbias_full(const BwdParams& p) {
  const Problem& pr = p.fwd.prob;
  const int64_t* s = p.dbias.sizes;
  return s[0] == pr.b && s[1] == pr.h_q && s[2] == pr.s_q && s[3] == pr.s_kv;
}

int64_t dbias_numel(const BwdParams& p) {
  return p.dbias.sizes[0] * p.dbias.sizes[1] * p.dbias.sizes[2] * p.dbias.sizes[3];
}

struct BwdWorkspace {
  size_t dq_acc = 0, lse2 = 0, dsum = 0, dbias = 0, dq_lock = 0, dsink_part = 0, total = 0;
};

// Deterministic mode: query tiles per (b, h_q) row of the dQ counters (the
// smallest kBlockM of any instantiation is 16, so this covers them all), and
// the preprocess kernel's blocks per (h_q, b) (8 rows each).
int64_t dq_lock_tiles(const Problem& pr) { return (pr.s_q + 15) / 16; }
int64_t preprocess_blocks(const Problem& pr) { return (pr.s_q + 7) / 8; }
bool dbias_reduced_in_order(const BwdParams& p) { return p.deterministic && p.dbias.data != nullptr && !dbias_full(p); }

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

BwdWorkspace bwd_layout(const BwdParams& p) {
  const Problem& pr = p.fwd.prob;
  const int64_t rows = rows_q(pr, p.fwd.seqlens.q_is_thd);
  BwdWorkspace w;
  size_t off = 0;
  w.dq_acc = off;
  off += align256(static_cast<size_t>(rows) * pr.h_q * head_dim_bucket(pr) * 4);
  w.lse2 = off;
  off += align256(static_cast<size_t>(rows) * pr.h_q * 4);
  w.dsum = off;
  off += align256(static_cast<size_t>(rows) * pr.h_q * 4);
  w.dbias = off;
  if (dbias_reduced_in_order(p)) {
    // Every (b, h_q, i, j) term once, summed over the broadcast dims afterwards.
    off += align256(static_cast<size_t>(pr.b * pr.h_q * pr.s_q * pr.s_kv) * 4);
  } else if (p.dbias.data != nullptr && !dbias_full(p)) {
    off += align256(static_cast<size_t>(dbias_numel(p)) * 4);
  }
  w.dq_lock = off;
  if (p.deterministic) off += align256(static_cast<size_t>(pr.b * pr.h_q * dq_lock_tiles(pr) + 1) * 4);
  w.dsink_part = off;
  if (p.deterministic && p.fwd.softmax.type == SoftmaxType::kLearnable) {
    off += align256(static_cast<size_t>(pr.h_q * pr.b * preprocess_blocks(pr)) * 4);
  }
  w.total = off;
  return w;
}

template <typename Elem>
Status launch_fwd_aux_pre(const KArgs& a, cudaStream_t st) {
  if (a.max_logit != nullptr) {
    gpu::fill_kernel<<<gpu::aux_blocks(a.h_q), gpu::kAuxThreads, 0, st>>>(a.max_logit, int64_t{a.h_q}, -INFINITY);
  }
  return launch_status("max_logit init");
}

template <typename Elem>
void launch_fill_gaps(void* base, int64_t ss, int64_t sh, int heads, int d, int64_t tokens, const int32_t* off,
                      const int32_t* cu, int nseq, int s_max, float* lse, int64_t lse_sh, int64_t lse_ss,
                      cudaStream_t st) {
  if (tokens <= 0) return;
  const int64_t blocks = (tokens + 7) / 8;
  thd_fill_gaps_kernel<Elem><<<static_cast<unsigned>(blocks), 256, 0, st>>>(
      static_cast<Elem*>(base), ss, sh, heads, d, tokens, off, cu, nseq, s_max, lse, lse_sh, lse_ss);
}

template <typename Elem>
Status run_fwd_all(const FwdParams& p, const KArgs& a, KernelFn main, cudaStream_t st) {
  FUSEDATTN_RETURN_IF_ERROR(launch_fwd_aux_pre<Elem>(a, st));
  FUSEDATTN_RETURN_IF_ERROR(main(a, st));
  if (a.q_thd) {
    launch_fill_gaps<Elem>(a.o, a.o_ss, a.o_sh, a.h_q, a.d_v, p.prob.t_q, a.off_q, a.cu_q, a.b, a.s_q, a.lse,
                           a.lse_sh, a.lse_ss, st);
  }
  return launch_status("forward gap fill");
}

template <typename Elem>
Status run_bwd_all(const BwdParams& p, KArgs& a, KernelFn main, cudaStream_t st) {
  const Problem& pr = p.fwd.prob;
  cudaMemsetAsync(a.dq_acc, 0, static_cast<size_t>(a.rows_q) * a.h_q * a.acc_d * 4, st);
  if (a.dq_lock != nullptr) {
    cudaMemsetAsync(a.dq_lock, 0, (static_cast<size_t>(a.b) * a.h_q * a.dq_lock_mt + 1) * 4, st);
  }
  if (a.softmax_type == 2 && a.d_sink != nullptr) cudaMemsetAsync(a.d_sink, 0, static_cast<size_t>(a.h_q) * 4, st);
  if (a.dbias != nullptr) {
    if (dbias_reduced_in_order(p)) {
      cudaMemsetAsync(a.dbias_acc, 0, static_cast<size_t>(pr.b * pr.h_q * pr.s_q * pr.s_kv) * 4, st);
    } else if (a.dbias_direct) {
      cudaMemsetAsync(a.dbias, 0, static_cast<size_t>(dbias_numel(p)) * sizeof(Elem), st);
    } else {
      cudaMemsetAsync(a.dbias_acc, 0, static_cast<size_t>(dbias_numel(p)) * 4, st);
    }
  }
  FUSEDATTN_RETURN_IF_ERROR(launch_status("backward memset"));
  const dim3 pre_grid(static_cast<unsigned>(preprocess_blocks(pr)), a.h_q, a.b);
  if (!gpu::empty_grid(pre_grid)) bwd_preprocess_kernel<Elem><<<pre_grid, 256, 0, st>>>(a);
  FUSEDATTN_RETURN_IF_ERROR(launch_status("backward preprocess"));
  if (a.dsink_part != nullptr) {
    dsink_reduce_kernel<<<a.h_q, 32, 0, st>>>(a.dsink_part, a.d_sink, a.h_q, pr.b * preprocess_blocks(pr));
  }
  FUSEDATTN_RETURN_IF_ERROR(main(a, st));
  const int64_t conv_blocks = (a.rows_q * a.h_q + 7) / 8;
  if (conv_blocks > 0) dq_convert_kernel<Elem><<<static_cast<unsigned>(conv_blocks), 256, 0, st>>>(a);
  if (a.dbias != nullptr && !a.dbias_direct && dbias_numel(p) > 0) {
    const int64_t n = dbias_numel(p);
    const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536));
    if (dbias_reduced_in_order(p)) {
      dbias_reduce_kernel<Elem><<<blocks, 256, 0, st>>>(a.dbias_acc, static_cast<Elem*>(a.dbias), pr.b, pr.h_q,
                                                        pr.s_q, pr.s_kv, a.db_sizes[0], a.db_sizes[1],
                                                        a.db_sizes[2]);
    } else {
      dbias_convert_kernel<Elem><<<blocks, 256, 0, st>>>(a.dbias_acc, static_cast<Elem*>(a.dbias), n);
    }
  }
  if (a.kv_thd) {
    const int64_t t_kv = p.fwd.prob.t_kv;
    launch_fill_gaps<Elem>(a.dk, a.dk_ss, a.dk_sh, a.h_kv, a.d_qk, t_kv, a.off_kv, a.cu_kv, a.b, a.s_kv, nullptr, 0,
                           0, st);
    launch_fill_gaps<Elem>(a.dv, a.dv_ss, a.dv_sh, a.h_kv, a.d_v, t_kv, a.off_kv, a.cu_kv, a.b, a.s_kv, nullptr, 0,
                           0, st);
  }
  return launch_status("backward epilogue");
}

}  // namespace

std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  std::string why = common_support(p, dev, Dir::kFwd);
  if (!why.empty()) return why;
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kTensorCore;
  plan->kernel = static_cast<int>(find_kernel(Dir::kFwd, p.prob.dtype, head_dim_bucket(p.prob), variant_of(p, false)) -
                                  kTable);
  plan->sm_count = dev.sm_count;
  return "";
}

std::string plan_bwd(const BwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  std::string why = common_support(p.fwd, dev, Dir::kBwd);
  if (!why.empty()) return why;
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&p.dout, "dout"}, {&p.dq, "dq"},
                                {&p.dk, "dk"}, {&p.dv, "dv"}}) {
    why = gpu::rows16_problem(*t, name);
    if (!why.empty()) return why;
  }
  const Variant variant = variant_of(p.fwd, p.dbias.data != nullptr);
  const TableEntry* e = find_kernel(Dir::kBwd, p.fwd.prob.dtype, head_dim_bucket(p.fwd.prob), variant);
  if (e == nullptr) return "no general backward kernel for a dbias in kernels.list";
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kTensorCore;
  plan->kernel = static_cast<int>(e - kTable);
  plan->sm_count = dev.sm_count;
  plan->workspace_bytes = bwd_layout(p).total;
  plan->deterministic = p.deterministic;  // the turn-taking dQ, the ordered dbias and d_softmax_offset sums
  return "";
}

Status run_fwd(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  const KArgs a = make_fwd_kargs(p);
  auto st = static_cast<cudaStream_t>(launch.stream);
  const KernelFn fn = kTable[plan.kernel].fn;
  if (p.prob.dtype == DType::kFloat16) return run_fwd_all<__half>(p, a, fn, st);
  return run_fwd_all<__nv_bfloat16>(p, a, fn, st);
}

Status run_bwd(const BwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  const BwdWorkspace w = bwd_layout(p);
  KArgs a = make_fwd_kargs(p.fwd);
  a.dout = p.dout.data;
  a.do_sb = p.dout.stride_b; a.do_ss = p.dout.stride_s; a.do_sh = p.dout.stride_h;
  a.dq = p.dq.data;
  a.dq_sb = p.dq.stride_b; a.dq_ss = p.dq.stride_s; a.dq_sh = p.dq.stride_h;
  a.dk = p.dk.data;
  a.dk_sb = p.dk.stride_b; a.dk_ss = p.dk.stride_s; a.dk_sh = p.dk.stride_h;
  a.dv = p.dv.data;
  a.dv_sb = p.dv.stride_b; a.dv_ss = p.dv.stride_s; a.dv_sh = p.dv.stride_h;
  a.max_logit = nullptr;
  if (p.dbias.data != nullptr) {
    const PairTensor& d = p.dbias;
    a.dbias = d.data;
    for (int i = 0; i < 4; ++i) a.db_sizes[i] = d.sizes[i];
    // Broadcast dims accumulate: they are indexed with stride 0.
    a.db_sb = d.sizes[0] == 1 ? 0 : d.stride_b;
    a.db_sh = d.sizes[1] == 1 ? 0 : d.stride_h;
    a.db_si = d.sizes[2] == 1 ? 0 : d.stride_i;
    a.db_sj = d.stride_j;
    a.dbias_direct = dbias_full(p);
  }
  a.d_sink = p.d_softmax_offset;
  char* ws = static_cast<char*>(launch.workspace);
  a.dq_acc = reinterpret_cast<float*>(ws + w.dq_acc);
  a.lse2 = reinterpret_cast<float*>(ws + w.lse2);
  a.dsum = reinterpret_cast<float*>(ws + w.dsum);
  a.dbias_acc = a.dbias != nullptr && !a.dbias_direct ? reinterpret_cast<float*>(ws + w.dbias) : nullptr;
  if (dbias_reduced_in_order(p)) {
    // The main kernel indexes the full fp32 buffer: one write per element.
    const Problem& pr = p.fwd.prob;
    a.db_sb = pr.h_q * pr.s_q * pr.s_kv;
    a.db_sh = pr.s_q * pr.s_kv;
    a.db_si = pr.s_kv;
    a.db_sj = 1;
  }
  if (p.deterministic) {
    a.dq_lock = reinterpret_cast<int*>(ws + w.dq_lock);
    a.dq_lock_mt = static_cast<int>(dq_lock_tiles(p.fwd.prob));
    if (a.softmax_type == 2 && a.d_sink != nullptr) a.dsink_part = reinterpret_cast<float*>(ws + w.dsink_part);
  }
  a.rows_q = rows_q(p.fwd.prob, a.q_thd);
  auto st = static_cast<cudaStream_t>(launch.stream);
  const KernelFn fn = kTable[plan.kernel].fn;
  if (p.fwd.prob.dtype == DType::kFloat16) return run_bwd_all<__half>(p, a, fn, st);
  return run_bwd_all<__nv_bfloat16>(p, a, fn, st);
}

}  // namespace tc
}  // namespace fusedattn
