// The Hopper path's entry points (hopper.h): which calls it takes, which kernel
// runs them, and the launches. Built only for sm_90a (cmake/cuda.cmake compiles
// this directory on its own, for that target alone); without it the dispatch
// never asks. The kernels are found in the table generated from kernels.list
// (kernels.h's kKernelRows): a call is taken only where its kernel is listed.
// fwd_support and bwd_support state, with a reason, every call the path refuses.
#include <cuda_runtime.h>

#include <string>
#include <tuple>

#include "common/rows.h"
#include "common/seq.cuh"
#include "fusedattn/cat.h"
#include "fusedattn/overrides.h"
#include "fusedattn/visibility.h"
#include "hopper/features.h"
#include "hopper/hopper.h"
#include "hopper/kernels.h"
#include "hopper/tuning.h"

namespace fusedattn {
namespace hopper {
namespace {

// FUSEDATTN_HOPPER_FWD and FUSEDATTN_HOPPER_CAUSAL_CHUNK (fusedattn/overrides.h): a forced forward
// variant and the causal tile order's chunk (0: tuning.h's choice), for A/B timing and the tests.
const Overrides& overrides() { return process_overrides().values; }

detail::MapDesc map_of(const SeqTensor& t, const Problem& pr, int64_t s, int64_t h, int64_t d) {
  return detail::MapDesc{t.data,     static_cast<int>(pr.b), static_cast<int>(s), static_cast<int>(h),
                         static_cast<int>(d), t.stride_b, t.stride_s, t.stride_h};
}

// The plain variant a forward call runs: tuning.h's choice or FUSEDATTN_HOPPER_FWD's, on the tiles it
// can take. The persistent kernels need the SM count, and their tile indices (one round past the
// last) must fit in int; a call without either takes the same tiles one per CTA (v2,
// three-consumer), which covers every shape plan_fwd admits.
FwdVariant fwd_variant(const Problem& pr, bool causal, int sm_count) {
  const int d = static_cast<int>(pr.d_qk);
  FwdVariant variant = choose_fwd_variant(d, causal, pr.s_kv);
  switch (overrides().hopper_fwd) {
    case HopperFwdChoice::kAuto: break;
    case HopperFwdChoice::kV2: variant = FwdVariant::kOneTile; break;
    case HopperFwdChoice::kPersistent: variant = FwdVariant::kPersistent; break;
    case HopperFwdChoice::kThreeConsumer: variant = FwdVariant::kThreeConsumer; break;
    case HopperFwdChoice::kThreeConsumerPersistent: variant = FwdVariant::kThreeConsumerPersistent; break;
  }
  if ((variant == FwdVariant::kThreeConsumer || variant == FwdVariant::kThreeConsumerPersistent) && d != 64) {
    variant = choose_fwd_variant(d, causal, pr.s_kv);
  }
  const int64_t tiles = (pr.s_q + 127) / 128 * pr.h_q * pr.b;
  if (variant == FwdVariant::kPersistent && (sm_count <= 0 || tiles + 2 * int64_t{sm_count} > 0x7fffffff)) {
    variant = FwdVariant::kOneTile;
  }
  const int64_t tiles192 = (pr.s_q + 191) / 192 * pr.h_q * pr.b;
  if (variant == FwdVariant::kThreeConsumerPersistent &&
      (sm_count <= 0 || tiles192 + 2 * int64_t{sm_count} > 0x7fffffff)) {
    variant = FwdVariant::kThreeConsumer;
  }
  return variant;
}

bool is_causal(const MaskParams& m) { return m.window_left < 0 && m.window_right == 0; }

// Per-sequence lengths: thd on either side, or cu_seqlens with a padding mask.
bool is_varlen(const FwdParams& p) {
  const SeqlenParams& sl = p.seqlens;
  return sl.q_is_thd || sl.kv_is_thd || sl.cu_seqlens_q != nullptr || sl.cu_seqlens_kv != nullptr;
}

// The sequences as the varlen kernels read them (varlen.cuh).
gpu::SeqExtents seq_extents(const FwdParams& p) {
  const Problem& pr = p.prob;
  return gpu::SeqExtents{p.seqlens, pr.s_q, pr.s_kv, pr.t_q, pr.t_kv};
}

// The instantiation of kernels.list for an entry and a call's dtype, head dims and softcap; null if
// none.
const KernelRow* find_kernel(KernelEntry entry, const FwdParams& p) {
  const Problem& pr = p.prob;
  const bool f16 = pr.dtype == DType::kFloat16;
  for (int i = 0; i < kKernelRowCount; ++i) {
    const KernelRow& r = kKernelRows[i];
    if (r.entry == entry && r.f16 == f16 && r.d_qk == pr.d_qk && r.d_v == pr.d_v && r.softcap == (p.softcap > 0)) {
      return &r;
    }
  }
  return nullptr;
}

// Whether a call needs the general kernels (features.h): a sliding window, a bottom-right diagonal
// that differs from the top-left one (s_q != s_kv), off-by-one or learnable softmax, or head dims
// the plain kernels do not have (80, 96, 192, 192 / 128 on the tiles of 128 and 256), softcap,
// per-sequence lengths (their varlen form).
bool needs_general(const FwdParams& p) {
  if (p.softmax.type != SoftmaxType::kVanilla || is_varlen(p)) return true;
  if (find_kernel(KernelEntry::kFwdOneTile, p) == nullptr) return true;
  const MaskParams& m = p.mask;
  if (m.window_left < 0 && m.window_right < 0) return false;
  return !(is_causal(m) && (!m.bottom_right || p.prob.s_q == p.prob.s_kv));
}

KernelEntry entry_of(FwdVariant v) {
  switch (v) {
    case FwdVariant::kPersistent: return KernelEntry::kFwdPersistent;
    case FwdVariant::kThreeConsumer: return KernelEntry::kFwdThreeConsumer;
    case FwdVariant::kThreeConsumerPersistent: return KernelEntry::kFwdThreeConsumerPersistent;
    default: return KernelEntry::kFwdOneTile;
  }
}

// The forward kernel of a call: the varlen or the general one, or the plain variant fwd_variant picks.
KernelEntry fwd_entry(const FwdParams& p, int sm_count) {
  if (is_varlen(p)) return KernelEntry::kFwdVarlen;
  if (needs_general(p)) return KernelEntry::kFwdGeneral;
  return entry_of(fwd_variant(p.prob, is_causal(p.mask), sm_count));
}

Status run_kernel(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  const Problem& pr = p.prob;
  const bool causal = is_causal(p.mask);
  const int sm_count = plan.sm_count;
  // thd tensors: the token dim as the sequence dim (varlen.cuh rebases the maps per sequence).
  const SeqlenParams& sl = p.seqlens;
  Sm90Args a{};
  a.q = map_of(p.q, pr, sl.q_is_thd ? pr.t_q : pr.s_q, pr.h_q, pr.d_qk);
  a.k = map_of(p.k, pr, sl.kv_is_thd ? pr.t_kv : pr.s_kv, pr.h_kv, pr.d_qk);
  a.v = map_of(p.v, pr, sl.kv_is_thd ? pr.t_kv : pr.s_kv, pr.h_kv, pr.d_v);
  a.ws = launch.workspace;
  KParams& k = a.out;
  k.o = p.out.data;
  k.o_sb = p.out.stride_b;
  k.o_ss = p.out.stride_s;
  k.o_sh = p.out.stride_h;
  k.lse = p.lse;
  k.lse_sb = p.lse_stride_b;
  k.lse_sh = p.lse_stride_h;
  k.lse_ss = p.lse_stride_s;
  k.b = static_cast<int>(pr.b);
  k.s_q = static_cast<int>(pr.s_q);
  k.s_kv = static_cast<int>(pr.s_kv);
  k.h = static_cast<int>(pr.h_q);
  k.h_kv = static_cast<int>(pr.h_kv);
  k.scale_log2 = p.scale * 1.4426950408889634f;
  k.window_left = static_cast<int>(p.mask.window_left);
  k.window_right = static_cast<int>(p.mask.window_right);
  k.bottom_right = p.mask.bottom_right ? 1 : 0;
  k.softmax_type = static_cast<int>(p.softmax.type);
  k.softmax_offset = p.softmax.offset;
  k.softcap_log2 = static_cast<float>(p.softcap * 1.4426950408889634);
  k.softcap_k2 = p.softcap > 0 ? static_cast<float>(2 * 1.4426950408889634 * p.scale / p.softcap) : 0.f;
  k.seq = seq_extents(p);
  a.causal = causal;
  a.causal_chunk = overrides().hopper_causal_chunk;
  a.sm_count = sm_count;
  const KernelRow* row = find_kernel(static_cast<KernelEntry>(plan.kernel), p);  // plan_fwd found it
  const cudaError_t e =
      row != nullptr ? row->fwd(a, static_cast<cudaStream_t>(launch.stream)) : cudaErrorInvalidValue;
  if (e != cudaSuccess) return Status::Invalid(cat("Hopper forward launch failed: ", cudaGetErrorString(e)));
  return Status::Ok();
}

// Why a call is not taken ("" when it is), naming the setting: the path's own limits (the core has
// validated the call).
//
// Forward, on by default. Plain calls (no mask, or top-left causal; a
// bottom-right causal mask too when s_q = s_kv, where the diagonals coincide)
// run one of four variants of fwd_kernel.cuh (one tile per CTA ("v2"),
// persistent, and at d = 64 three-consumer and persistent three-consumer),
// chosen per call by tuning.h; FUSEDATTN_HOPPER_FWD (fusedattn/overrides.h)
// forces one (the three-consumer ones only where d = 64) for A/B timing and for
// the tests. Calls with a sliding window, a bottom-right diagonal with
// s_q != s_kv, or off-by-one / learnable softmax run the general kernel
// (features.h), as do head dims and softcap the plain kernels do not have;
// calls with per-sequence lengths (thd on either side, or cu_seqlens with a
// padding mask) its varlen form (varlen.cuh), with any of those settings but a
// window or a bottom-right diagonal (below). All
// take fp16 / bf16 on a compute-capability 9.0 device, the listed head dims,
// bshd / sbhd / thd / packed layouts (unit head-dim stride, 16-byte aligned rows
// and strides), and no bias, ALiBi, dropout, explicit mask, max_logit or KV
// cache. Every other call goes on to the sm80-class tensor-core kernels or the
// SIMT engine.
std::string fwd_support(const FwdParams& p, const gpu::DeviceAttrs& dev) {
  const Problem& pr = p.prob;
  if (pr.dtype != DType::kFloat16 && pr.dtype != DType::kBFloat16) return cat("dtype ", dtype_name(pr.dtype));
  // The row maximum is taken over unscaled scores: with scale <= 0 it would be the minimum, and P
  // could overflow fp16.
  if (!(p.scale > 0)) return "a scale <= 0";
  const bool varlen = is_varlen(p), general = needs_general(p);
  const KernelEntry entry =
      varlen ? KernelEntry::kFwdVarlen : general ? KernelEntry::kFwdGeneral : KernelEntry::kFwdOneTile;
  if (find_kernel(entry, p) == nullptr) {
    return cat("head dims d_qk=", pr.d_qk, ", d_v=", pr.d_v, " with ", dtype_name(pr.dtype),
               p.softcap > 0 ? " and softcap" : "",
               varlen ? " on the varlen kernels" : general ? " on the general kernels" : "",
               " (no kernel in hopper/kernels.list)");
  }
  if (general && (dev.sm_count <= 0 || (pr.s_q + 127) / 128 * pr.h_q * pr.b + 2 * int64_t{dev.sm_count} > 0x7fffffff)) {
    return "a window, bottom-right diagonal, softmax sink or per-sequence lengths with a grid beyond the persistent "
           "kernel's tile indices";
  }
  // The tensor maps' rows are int: a thd token dim, and the int32 tile coordinates, stay below 2^31.
  // An empty sequence's map is its tensor's first row (varlen.cuh), which must exist.
  if (pr.t_q > 0x7fffffff - 512 || pr.t_kv > 0x7fffffff - 512) return "a thd token dim of 2^31 or more";
  if ((p.seqlens.q_is_thd && pr.t_q == 0) || (p.seqlens.kv_is_thd && pr.t_kv == 0)) return "an empty thd token dim";
  // The varlen prologue zero-fills out's unowned rows with 16-byte stores.
  if (varlen && !gpu::rows16(p.out)) return "per-sequence lengths with out not in 16-byte rows";
  // The general kernels hang on the H200 with a window and fail the float64 check with a bottom-right
  // diagonal (kernels.list lists none of them); their varlen form, listed, keeps off both.
  const MaskParams& m = p.mask;
  if (varlen && (m.window_left >= 0 || m.window_right > 0 || (m.bottom_right && m.window_right == 0))) {
    return "per-sequence lengths with a sliding window or a bottom-right diagonal (the general kernels' "
           "windows and bottom-right diagonals fail on the H200)";
  }
  if (p.paged.page_table != nullptr) return "KV cache";
  if (p.mask.mask.data != nullptr) return "explicit attention mask";
  if (p.bias.type != BiasType::kNoBias) return "bias or ALiBi";
  if (p.dropout.p > 0.f) return "dropout";
  if (p.max_logit != nullptr) return "max_logit";
  if (pr.b > 65535 || pr.h_q > 65535 || pr.s_q + pr.s_kv >= kMaxPositionSum32) {
    return "batch, heads or sequence beyond the grid";
  }
  if (pr.b <= 0 || pr.s_q <= 0 || pr.s_kv <= 0) return "no sequence, or an empty sequence dim";
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}) {
    std::string r = gpu::rows16_problem(*t, name);  // the tensor-memory accelerator's layout
    if (!r.empty()) return r;
  }
  if (p.out.stride_d != 1 || reinterpret_cast<uintptr_t>(p.out.data) % 4 != 0) return "out needs a unit head-dim stride";
  if (!(dev.major == 9 && dev.minor == 0)) return "not a compute-capability 9.0 device";
  if (!kernels_loadable()) return "this build has no sm_90a code (build with TORCH_CUDA_ARCH_LIST=9.0a)";
  return "";
}

// The backward kernel of a call.
KernelEntry bwd_entry(const BwdParams& p) {
  if (is_varlen(p.fwd)) return p.deterministic ? KernelEntry::kBwdVarlenDeterministic : KernelEntry::kBwdVarlen;
  if (needs_general(p.fwd)) return p.deterministic ? KernelEntry::kBwdGeneralDeterministic : KernelEntry::kBwdGeneral;
  return p.deterministic ? KernelEntry::kBwdDeterministic : KernelEntry::kBwd;
}

// Contiguous bshd, or thd ([t, h, d]: stride_b 0) when `thd`.
bool contiguous_rows(const SeqTensor& t, bool thd, int64_t s, int64_t h, int64_t d) {
  return t.data != nullptr && t.stride_d == 1 && t.stride_h == d && t.stride_s == h * d &&
         t.stride_b == (thd ? 0 : s * h * d);
}

// Backward (bwd_common.cuh; dQ by TMA reduce-add), on by default
// (FUSEDATTN_HOPPER_BWD=off turns it off): the forward's calls with out and the
// gradients contiguous in their format's bshd or thd (q, k, v and dout keep
// their strides) and no dbias, on the plain, general or varlen kernel as the forward.
// Deterministic mode (torch.use_deterministic_algorithms) runs the listed
// deterministic kernels (d = 64 and 128: dQ reduce-adds take turns in a fixed
// order); at d = 256, whose dQ reduce-adds sum in an order that varies from run
// to run, it goes to the sm80-class backward, as does everything else.
std::string bwd_support(const BwdParams& p, const gpu::DeviceAttrs& dev) {
  if (!overrides().hopper_bwd) return "the Hopper backward is off (FUSEDATTN_HOPPER_BWD=off)";
  const FwdParams& f = p.fwd;
  std::string r = fwd_support(f, dev);
  if (!r.empty()) return r;
  const Problem& pr = f.prob;
  if (find_kernel(bwd_entry(p), f) == nullptr) {
    return cat(p.deterministic ? "deterministic mode" : "the backward", " at d_qk=", pr.d_qk, ", d_v=", pr.d_v,
               is_varlen(f) ? " on the varlen kernels" : needs_general(f) ? " on the general kernels" : "",
               " (no kernel in hopper/kernels.list)");
  }
  if (p.dbias.data != nullptr) return "dbias";
  // q, k, v and dout reach the kernels through tensor maps and 16-byte loads with their own strides
  // (fwd_support checked q, k, v); the pre/post kernels and the dK/dV stores address the rest as
  // contiguous bshd (thd).
  std::string why = gpu::rows16_problem(p.dout, "dout");
  if (!why.empty()) return why;
  const bool q_thd = f.seqlens.q_is_thd, kv_thd = f.seqlens.kv_is_thd;
  for (const auto& [t, name, d] : {std::tuple<const SeqTensor*, const char*, int64_t>{&f.out, "out", pr.d_v},
                                   {&p.dq, "dq", pr.d_qk}}) {
    if (!contiguous_rows(*t, q_thd, pr.s_q, pr.h_q, d)) return cat(name, " is not contiguous bshd or thd");
  }
  for (const auto& [t, name, d] :
       {std::tuple<const SeqTensor*, const char*, int64_t>{&p.dk, "dk", pr.d_qk}, {&p.dv, "dv", pr.d_v}}) {
    if (!contiguous_rows(*t, kv_thd, pr.s_kv, pr.h_kv, d)) return cat(name, " is not contiguous bshd or thd");
  }
  // The preprocess's vector loads (out) and the stores need 16-byte aligned bases; a misaligned view
  // goes to the sm80-class backward instead of failing the launch.
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&f.out, "out"}, {&p.dq, "dq"},
                                {&p.dk, "dk"}, {&p.dv, "dv"}}) {
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return cat(name, " is not 16-byte aligned");
  }
  if (q_thd ? (f.lse_stride_s != 1 || f.lse_stride_h != pr.t_q)
            : (f.lse_stride_s != 1 || f.lse_stride_h != pr.s_q || f.lse_stride_b != pr.h_q * pr.s_q)) {
    return "softmax_lse is not contiguous [b, h, s_q] (thd: [h, t_q])";
  }
  return "";
}

Status run_bwd_kernels(const BwdParams& p, void* ws, int sm_count, cudaStream_t st) {
  const FwdParams& f = p.fwd;
  const Problem& pr = f.prob;
  Sm90BwdArgs a{};
  a.q = f.q.data;
  a.k = f.k.data;
  a.v = f.v.data;
  a.q_strides = BshdStrides{f.q.stride_b, f.q.stride_s, f.q.stride_h};  // (thd: stride_b 0)
  a.k_strides = BshdStrides{f.k.stride_b, f.k.stride_s, f.k.stride_h};
  a.v_strides = BshdStrides{f.v.stride_b, f.v.stride_s, f.v.stride_h};
  a.do_strides = BshdStrides{p.dout.stride_b, p.dout.stride_s, p.dout.stride_h};
  a.o = f.out.data;
  a.dout = p.dout.data;
  a.lse = f.lse;
  a.dq = p.dq.data;
  a.dk = p.dk.data;
  a.dv = p.dv.data;
  a.ws = ws;
  a.b = static_cast<int>(pr.b);
  a.s_q = static_cast<int>(pr.s_q);
  a.s_kv = static_cast<int>(pr.s_kv);
  a.h = static_cast<int>(pr.h_q);
  a.h_kv = static_cast<int>(pr.h_kv);
  a.scale = f.scale;
  a.causal = is_causal(f.mask);
  a.causal_chunk = overrides().hopper_causal_chunk;
  a.sm_count = sm_count;
  a.window_left = static_cast<int>(f.mask.window_left);
  a.window_right = static_cast<int>(f.mask.window_right);
  a.bottom_right = f.mask.bottom_right;
  a.softmax_type = static_cast<int>(f.softmax.type);
  a.softmax_offset = f.softmax.offset;
  a.d_softmax_offset = p.d_softmax_offset;
  a.softcap = f.softcap;
  a.seq = seq_extents(f);
  const KernelRow* row = find_kernel(bwd_entry(p), f);  // bwd_support found it
  const cudaError_t e = row != nullptr ? row->bwd(a, st) : cudaErrorInvalidValue;
  if (e != cudaSuccess) return Status::Invalid(cat("Hopper backward launch failed: ", cudaGetErrorString(e)));
  return Status::Ok();
}

}  // namespace

std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  std::string why = fwd_support(p, dev);
  if (!why.empty()) return why;
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kHopper;
  plan->sm_count = dev.sm_count;
  plan->kernel = static_cast<int>(fwd_entry(p, dev.sm_count));
  if (is_varlen(p)) plan->workspace_bytes = fwd_sm90_varlen_workspace_bytes(static_cast<int>(p.prob.b));
  return "";
}

std::string plan_bwd(const BwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  std::string why = bwd_support(p, dev);
  if (!why.empty()) return why;
  const Problem& pr = p.fwd.prob;
  const int b = static_cast<int>(pr.b), s = static_cast<int>(pr.s_q), h = static_cast<int>(pr.h_q);
  const int d = tile_head_dim(static_cast<int>(pr.d_qk), static_cast<int>(pr.d_v));
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kHopper;
  plan->sm_count = dev.sm_count;
  if (is_varlen(p.fwd)) {
    plan->workspace_bytes =
        bwd_sm90_varlen_workspace(bwd_sm90_varlen_rows(b, s, pr.t_q, p.fwd.seqlens.q_is_thd), b, s, h, d).bytes;
  } else {
    plan->workspace_bytes =
        p.deterministic ? bwd_sm90_det_workspace_bytes(b, s, h, d) : bwd_sm90_workspace_bytes(b, s, h, d);
    if (p.fwd.softmax.type == SoftmaxType::kLearnable && p.d_softmax_offset != nullptr) {
      plan->workspace_bytes += static_cast<size_t>(bwd_sm90_dsink_partials(b, s, h, d)) * sizeof(float);
    }
  }
  plan->deterministic = p.deterministic;  // bwd_support declines deterministic calls it cannot order
  return "";
}

Status run_bwd(const BwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  return run_bwd_kernels(p, launch.workspace, plan.sm_count, static_cast<cudaStream_t>(launch.stream));
}

Status run_fwd(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  return run_kernel(p, plan, launch);
}

}  // namespace hopper
}  // namespace fusedattn
