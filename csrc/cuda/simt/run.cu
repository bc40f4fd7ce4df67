// The SIMT engine's entry points: its limits, workspace and dtype dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "fusedattn/cat.h"
#include "fusedattn/visibility.h"
#include "simt.h"
#include "workspace.h"

namespace fusedattn {
namespace simt {
namespace {

size_t acc_size(DType t) { return t == DType::kFloat64 ? sizeof(double) : sizeof(float); }

// The grids put heads on y and the batch on z; the kernels compute positions and the visibility
// rule in int (fusedattn/visibility.h).
std::string limits(const Problem& pr, int64_t heads) {
  if (pr.dtype != DType::kFloat16 && pr.dtype != DType::kBFloat16 && pr.dtype != DType::kFloat32 &&
      pr.dtype != DType::kFloat64) {
    return cat("dtype ", dtype_name(pr.dtype));
  }
  if (heads > 65535 || pr.b > 65535) return cat("heads (", heads, ") and batch (", pr.b, ") must each be <= 65535");
  if (pr.s_q + pr.s_kv >= kMaxPositionSum32) {
    return cat("s_q + s_kv = ", pr.s_q + pr.s_kv, " (sequence positions are 32-bit: at most 2^30 - 1)");
  }
  return "";
}

}  // namespace

std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  std::string why = limits(p.prob, p.prob.h_q);
  if (!why.empty()) return why;
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kSimt;
  plan->sm_count = dev.sm_count;
  return "";
}

std::string plan_bwd(const BwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  std::string why = limits(p.fwd.prob, p.fwd.prob.h_q);
  if (!why.empty()) return why;
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kSimt;
  plan->sm_count = dev.sm_count;
  plan->workspace_bytes = bwd_workspace(p, acc_size(p.fwd.prob.dtype)).bytes;
  plan->deterministic = false;  // dQ and dbias are summed with atomics
  return "";
}

Status run_fwd(const FwdParams& p, const CudaPlan&, const CudaLaunch& launch) {
  switch (p.prob.dtype) {
    case DType::kFloat16: return launch_fwd<__half>(p, launch);
    case DType::kBFloat16: return launch_fwd<__nv_bfloat16>(p, launch);
    case DType::kFloat32: return launch_fwd<float>(p, launch);
    default: return launch_fwd<double>(p, launch);  // plan_fwd admits no other dtype
  }
}

Status run_bwd(const BwdParams& p, const CudaPlan&, const CudaLaunch& launch) {
  switch (p.fwd.prob.dtype) {
    case DType::kFloat16: return launch_bwd<__half>(p, launch);
    case DType::kBFloat16: return launch_bwd<__nv_bfloat16>(p, launch);
    case DType::kFloat32: return launch_bwd<float>(p, launch);
    default: return launch_bwd<double>(p, launch);
  }
}

}  // namespace simt
}  // namespace fusedattn
