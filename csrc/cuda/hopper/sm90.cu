// The Hopper path's entry points (hooks declared in fusedattn/cuda_api.h):
// which calls it takes, which kernel runs them, and the launches. Built only for
// sm_90a (cmake/cuda.cmake compiles this directory on its own, for that target
// alone); without it the weak defaults in csrc/cuda/tc_default.cu take no call.
// The kernels' host entries (kernels.h) are instantiated from kernels.list.
//
// Forward, on by default: four variants of fwd_kernel.cuh (one tile per CTA
// ("v2"), persistent, and at d = 64 three-consumer and persistent
// three-consumer), chosen per call by tuning.h;
// FUSEDATTN_HOPPER_FWD=v2|persistent|three_consumer|three_consumer_persistent
// forces one (the three-consumer ones only where d = 64) for A/B timing and for
// the tests, which run every variant on every shape.
// Taken: fp16/bf16 on a compute-capability 9.0 device, d_qk = d_v in {64, 128,
// 256}, bshd/sbhd/packed layouts (unit head-dim stride, 16-byte aligned rows
// and strides), no_mask or top-left causal (a bottom-right causal mask too
// when s_q = s_kv, where the diagonals coincide), vanilla softmax, no bias,
// ALiBi, dropout, padding, thd, sliding window, max_logit or KV cache. Every
// other call goes on to the sm80-class tensor-core kernels or the SIMT engine.
//
// Backward (bwd_common.cuh; dQ by TMA reduce-add), on by default
// (FUSEDATTN_HOPPER_BWD=0 turns it off): the forward's calls restricted to
// s_q = s_kv (d = 64, 128 and 256), contiguous bshd tensors (q, k, v, out, dout
// and the gradients), no dbias. Deterministic mode (torch.use_deterministic_
// algorithms) at d = 64 and 128 runs the variant whose dQ reduce-adds take turns
// in a fixed order (bwd_common.cuh, DET); at d = 256, whose dQ reduce-adds sum
// in an order that varies from run to run, it goes to the sm80-class backward,
// as does everything else.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "fusedattn/cat.h"
#include "fusedattn/cuda_api.h"
#include "hopper/kernels.h"
#include "hopper/tuning.h"

namespace fusedattn {
namespace hopper {
namespace {

// Whether the current device has compute capability 9.0; asked on every call,
// so the answer is kept per device index.
bool device_is_sm90() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev >= 0 && dev < kMaxDevices && cached[dev].load(std::memory_order_relaxed) != 0) {
    return cached[dev].load(std::memory_order_relaxed) == 1;
  }
  int major = 0, minor = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                  major == 9 && minor == 0;
  if (dev >= 0 && dev < kMaxDevices) cached[dev].store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

// FUSEDATTN_HOPPER_FWD: unset, "" or "auto" lets tuning.h choose; read once. An unknown value
// is an error at the first Hopper forward, not a silent fallback.
struct FwdOverride {
  bool set = false, valid = true;
  FwdVariant variant = FwdVariant::kOneTile;
  std::string raw;
};
const FwdOverride& fwd_override() {
  static const FwdOverride o = [] {
    FwdOverride r;
    const char* e = std::getenv("FUSEDATTN_HOPPER_FWD");
    r.raw = e == nullptr ? "" : e;
    if (r.raw.empty() || r.raw == "auto") return r;
    r.set = true;
    if (r.raw == "v2") r.variant = FwdVariant::kOneTile;
    else if (r.raw == "persistent") r.variant = FwdVariant::kPersistent;
    else if (r.raw == "three_consumer") r.variant = FwdVariant::kThreeConsumer;
    else if (r.raw == "three_consumer_persistent") r.variant = FwdVariant::kThreeConsumerPersistent;
    else r.valid = false;
    return r;
  }();
  return o;
}

// FUSEDATTN_HOPPER_CAUSAL_CHUNK=C: the causal tile order of the v2 and three-consumer forwards and
// of the backward deals its CTAs in chunks of C groups (tile_scheduler.cuh's chunked_tile); 1 is group by
// group, the order before the chunks; unset, "", "auto" or 0 lets tuning.h choose. For A/B timing;
// read once. Anything else is an error at the first Hopper call.
struct ChunkOverride {
  int chunk = 0;
  bool valid = true;
  std::string raw;
};
const ChunkOverride& chunk_override() {
  static const ChunkOverride o = [] {
    ChunkOverride r;
    const char* e = std::getenv("FUSEDATTN_HOPPER_CAUSAL_CHUNK");
    r.raw = e == nullptr ? "" : e;
    if (r.raw.empty() || r.raw == "auto") return r;
    char* end = nullptr;
    const long v = std::strtol(r.raw.c_str(), &end, 10);
    r.valid = end != r.raw.c_str() && *end == '\0' && v >= 0 && v <= 65535;
    r.chunk = r.valid ? static_cast<int>(v) : 0;
    return r;
  }();
  return o;
}
Status chunk_override_error() {
  return Status::Invalid(
      cat("FUSEDATTN_HOPPER_CAUSAL_CHUNK=", chunk_override().raw, " (expected auto or a group count 0-65535)"));
}

std::string check_rows(const SeqTensor& t, const char* name) {
  if (t.data == nullptr) return cat(name, " is null");
  if (t.stride_d != 1) return cat(name, " has head-dim stride ", t.stride_d);
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return cat(name, " is not 16-byte aligned");
  if (t.stride_b % 8 != 0 || t.stride_s % 8 != 0 || t.stride_h % 8 != 0) {
    return cat(name, " has strides that are not multiples of 16 bytes (the tensor-memory accelerator needs them)");
  }
  return "";
}

detail::MapDesc map_of(const SeqTensor& t, const Problem& pr, int64_t s, int64_t h, int64_t d) {
  return detail::MapDesc{t.data,     static_cast<int>(pr.b), static_cast<int>(s), static_cast<int>(h),
                         static_cast<int>(d), t.stride_b, t.stride_s, t.stride_h};
}

// sm_count: the device's multiprocessors (CudaLaunch::sm_count), the persistent kernel's grid.
template <typename T, int D>
Status run_kernel(const FwdParams& p, bool causal, int sm_count, cudaStream_t st) {
  const Problem& pr = p.prob;
  Sm90Args a{};
  a.q = map_of(p.q, pr, pr.s_q, pr.h_q, D);
  a.k = map_of(p.k, pr, pr.s_kv, pr.h_kv, D);
  a.v = map_of(p.v, pr, pr.s_kv, pr.h_kv, D);
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
  a.causal = causal;
  if (!chunk_override().valid) return chunk_override_error();
  a.causal_chunk = chunk_override().chunk;
  a.sm_count = sm_count;
  const FwdOverride& o = fwd_override();
  if (!o.valid) {
    return Status::Invalid(cat("FUSEDATTN_HOPPER_FWD=", o.raw,
                               " (expected auto, v2, persistent, three_consumer or three_consumer_persistent)"));
  }
  FwdVariant variant = o.set ? o.variant : choose_fwd_variant(D, causal, pr.s_kv);
  if ((variant == FwdVariant::kThreeConsumer || variant == FwdVariant::kThreeConsumerPersistent) && D != 64)
    variant = choose_fwd_variant(D, causal, pr.s_kv);
  // The persistent kernels need the SM count, and their tile indices (one round past the last) must
  // fit in int; a call without either takes the same tiles one per CTA (v2, three-consumer), which
  // covers every shape fwd_support admits.
  const int64_t tiles = (pr.s_q + 127) / 128 * pr.h_q * pr.b;
  if (variant == FwdVariant::kPersistent && (sm_count <= 0 || tiles + 2 * int64_t{sm_count} > 0x7fffffff)) {
    variant = FwdVariant::kOneTile;
  }
  const int64_t tiles192 = (pr.s_q + 191) / 192 * pr.h_q * pr.b;
  if (variant == FwdVariant::kThreeConsumerPersistent &&
      (sm_count <= 0 || tiles192 + 2 * int64_t{sm_count} > 0x7fffffff)) {
    variant = FwdVariant::kThreeConsumer;
  }
  cudaError_t e;
  if (variant == FwdVariant::kPersistent) {
    e = run_fwd_persistent<T, D>(a, sm_count, st);
  } else if (variant == FwdVariant::kThreeConsumerPersistent) {
    e = run_fwd_three_consumer_persistent<T>(a, sm_count, st);
  } else if (variant == FwdVariant::kThreeConsumer) {
    e = run_fwd_three_consumer<T>(a, st);
  } else {
    e = run_fwd_one_tile<T, D>(a, st);
  }
  if (e != cudaSuccess) return Status::Invalid(cat("Hopper forward launch failed: ", cudaGetErrorString(e)));
  return Status::Ok();
}

// Why a call is not taken ("" when it is), naming the setting.
std::string fwd_support(const FwdParams& p) {
  const Problem& pr = p.prob;
  if (pr.device != DeviceType::kCUDA) return "not a CUDA tensor";
  if (pr.dtype != DType::kFloat16 && pr.dtype != DType::kBFloat16) return cat("dtype ", dtype_name(pr.dtype));
  if (pr.d_qk != pr.d_v || (pr.d_qk != 64 && pr.d_qk != 128 && pr.d_qk != 256)) {
    return cat("head dims d_qk=", pr.d_qk, ", d_v=", pr.d_v, " (the Hopper kernels take d_qk = d_v = 64, 128 or 256)");
  }
  if (p.seqlens.q_is_thd || p.seqlens.kv_is_thd || p.seqlens.cu_seqlens_q != nullptr ||
      p.seqlens.cu_seqlens_kv != nullptr) {
    return "thd or padding (per-sequence lengths)";
  }
  if (p.paged.page_table != nullptr) return "KV cache";
  if (p.mask.mask.data != nullptr) return "explicit attention mask";
  if (p.bias.type != BiasType::kNoBias) return "bias or ALiBi";
  if (p.softmax.type != SoftmaxType::kVanilla) return "off-by-one or learnable softmax";
  if (p.dropout.p > 0.f) return "dropout";
  if (p.max_logit != nullptr) return "max_logit";
  const bool causal = p.mask.window_left < 0 && p.mask.window_right == 0;
  if (!(p.mask.window_left < 0 && p.mask.window_right < 0) && !causal) return "sliding window";
  if (causal && p.mask.bottom_right && pr.s_q != pr.s_kv) return "bottom-right causal with s_q != s_kv";
  if (pr.b > 65535 || pr.h_q > 65535 || pr.s_q >= (int64_t{1} << 30) || pr.s_kv >= (int64_t{1} << 30)) {
    return "batch, heads or sequence beyond the grid";
  }
  if (pr.b <= 0 || pr.s_q <= 0 || pr.s_kv <= 0 || pr.h_kv <= 0 || pr.h_q % pr.h_kv != 0) return "empty problem";
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}) {
    std::string r = check_rows(*t, name);
    if (!r.empty()) return r;
  }
  if (p.out.data == nullptr || p.out.stride_d != 1 || reinterpret_cast<uintptr_t>(p.out.data) % 4 != 0) {
    return "out needs a unit head-dim stride";
  }
  if (p.lse == nullptr) return "softmax_lse is null";
  if (!device_is_sm90()) return "not a compute-capability 9.0 device";
  if (!kernels_loadable()) return "this build has no sm_90a code (build with TORCH_CUDA_ARCH_LIST=9.0a)";
  return "";
}

// FUSEDATTN_HOPPER_BWD=0 sends every backward to the sm80-class kernels (A/B
// timing, triage); read once.
bool bwd_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("FUSEDATTN_HOPPER_BWD");
    return e == nullptr || *e == '\0' || std::atoi(e) != 0;
  }();
  return on;
}

bool contiguous_bshd(const SeqTensor& t, int64_t s, int64_t h, int64_t d) {
  return t.data != nullptr && t.stride_d == 1 && t.stride_h == d && t.stride_s == h * d && t.stride_b == s * h * d;
}

std::string bwd_support(const BwdParams& p) {
  if (!bwd_enabled()) return "the Hopper backward is off (FUSEDATTN_HOPPER_BWD=0)";
  const FwdParams& f = p.fwd;
  std::string r = fwd_support(f);
  if (!r.empty()) return r;
  const Problem& pr = f.prob;
  if (p.deterministic && pr.d_qk == 256) {
    return "deterministic mode at d = 256 (its dQ reduce-adds sum in an order that varies)";
  }
  if (p.dbias.data != nullptr) return "dbias";
  // q, k, v reach the kernel through tensor maps with their own strides (fwd_support checked
  // them); the pre/post kernels and the dK/dV stores address the rest as contiguous bshd.
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&f.out, "out"}, {&p.dout, "dout"},
                                {&p.dq, "dq"}}) {
    if (!contiguous_bshd(*t, pr.s_q, pr.h_q, pr.d_qk)) return cat(name, " is not contiguous bshd");
  }
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&p.dk, "dk"}, {&p.dv, "dv"}}) {
    if (!contiguous_bshd(*t, pr.s_kv, pr.h_kv, pr.d_qk)) return cat(name, " is not contiguous bshd");
  }
  // TMA (q, k, v, dout) and the preprocess's vector loads (out, dout) need 16-byte aligned bases;
  // a misaligned view goes to the sm80-class backward instead of failing the launch.
  for (const auto& [t, name] : {std::pair<const SeqTensor*, const char*>{&f.out, "out"}, {&p.dout, "dout"},
                                {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}}) {
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return cat(name, " is not 16-byte aligned");
  }
  if (f.lse_stride_s != 1 || f.lse_stride_h != pr.s_q || f.lse_stride_b != pr.h_q * pr.s_q) {
    return "softmax_lse is not contiguous [b, h, s_q]";
  }
  return "";
}

template <typename T, int D>
Status run_bwd_kernels(const BwdParams& p, void* ws, int sm_count, cudaStream_t st) {
  const FwdParams& f = p.fwd;
  const Problem& pr = f.prob;
  Sm90BwdArgs a{};
  a.q = f.q.data;
  a.k = f.k.data;
  a.v = f.v.data;
  a.q_strides = BshdStrides{f.q.stride_b, f.q.stride_s, f.q.stride_h};
  a.k_strides = BshdStrides{f.k.stride_b, f.k.stride_s, f.k.stride_h};
  a.v_strides = BshdStrides{f.v.stride_b, f.v.stride_s, f.v.stride_h};
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
  a.causal = f.mask.window_right == 0;
  if (!chunk_override().valid) return chunk_override_error();
  a.causal_chunk = chunk_override().chunk;
  a.sm_count = sm_count;
  cudaError_t e;
  if constexpr (D == 256) {
    e = run_bwd<T, D>(a, st);  // bwd_support declines deterministic calls at d = 256
  } else {
    e = p.deterministic ? run_bwd_deterministic<T, D>(a, st) : run_bwd<T, D>(a, st);
  }
  if (e != cudaSuccess) return Status::Invalid(cat("Hopper backward launch failed: ", cudaGetErrorString(e)));
  return Status::Ok();
}

}  // namespace

size_t bwd_workspace_bytes(const BwdParams& p) {
  if (!bwd_support(p).empty()) return 0;
  const Problem& pr = p.fwd.prob;
  const int b = static_cast<int>(pr.b), s = static_cast<int>(pr.s_q), h = static_cast<int>(pr.h_q);
  const int d = static_cast<int>(pr.d_qk);
  return p.deterministic ? bwd_sm90_det_workspace_bytes(b, s, h, d) : bwd_sm90_workspace_bytes(b, s, h, d);
}

Status try_run_bwd(const BwdParams& p, const CudaLaunch& launch, bool* handled) {
  *handled = false;
  const size_t need = hopper::bwd_workspace_bytes(p);  // qualified: ADL also finds fusedattn::bwd_workspace_bytes
  if (need == 0 || launch.workspace == nullptr || launch.workspace_bytes < need) return Status::Ok();
  *handled = true;
  auto st = static_cast<cudaStream_t>(launch.stream);
  const bool f16 = p.fwd.prob.dtype == DType::kFloat16;
  const int sms = launch.sm_count;
  switch (p.fwd.prob.d_qk) {
    case 64:
      return f16 ? run_bwd_kernels<__half, 64>(p, launch.workspace, sms, st)
                 : run_bwd_kernels<__nv_bfloat16, 64>(p, launch.workspace, sms, st);
    case 128:
      return f16 ? run_bwd_kernels<__half, 128>(p, launch.workspace, sms, st)
                 : run_bwd_kernels<__nv_bfloat16, 128>(p, launch.workspace, sms, st);
    default:  // 256: fwd_support admits no other head dim
      return f16 ? run_bwd_kernels<__half, 256>(p, launch.workspace, sms, st)
                 : run_bwd_kernels<__nv_bfloat16, 256>(p, launch.workspace, sms, st);
  }
}

Status try_run_fwd(const FwdParams& p, const CudaLaunch& launch, bool* handled) {
  *handled = false;
  if (!fwd_support(p).empty()) return Status::Ok();
  *handled = true;
  const bool causal = p.mask.window_right == 0;
  auto st = static_cast<cudaStream_t>(launch.stream);
  const bool f16 = p.prob.dtype == DType::kFloat16;
  const int sms = launch.sm_count;
  switch (p.prob.d_qk) {
    case 64:
      return f16 ? run_kernel<__half, 64>(p, causal, sms, st) : run_kernel<__nv_bfloat16, 64>(p, causal, sms, st);
    case 128:
      return f16 ? run_kernel<__half, 128>(p, causal, sms, st) : run_kernel<__nv_bfloat16, 128>(p, causal, sms, st);
    default:
      return f16 ? run_kernel<__half, 256>(p, causal, sms, st) : run_kernel<__nv_bfloat16, 256>(p, causal, sms, st);
  }
}

}  // namespace hopper
}  // namespace fusedattn
