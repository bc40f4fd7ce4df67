// The SIMT engine's entry points: dtype dispatch and workspace sizes.
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

Status unsupported_dtype(DType t) {
  return Status::Unsupported(std::string("fusedattn CUDA engine: unsupported dtype ") + dtype_name(t));
}

// The kernels compute positions and the visibility rule in int (fusedattn/visibility.h).
Status check_positions(const Problem& pr) {
  if (pr.s_q + pr.s_kv < kMaxPositionSum32) return Status::Ok();
  return Status::Unsupported(cat("fusedattn CUDA engine: s_q + s_kv = ", pr.s_q + pr.s_kv,
                                 " (sequence positions are 32-bit: at most 2^30 - 1)"));
}

}  // namespace

size_t fwd_workspace_bytes(const FwdParams&) { return 0; }

size_t bwd_workspace_bytes(const BwdParams& p) { return bwd_workspace(p, acc_size(p.fwd.prob.dtype)).bytes; }

Status run_fwd(const FwdParams& p, const CudaLaunch& launch) {
  FUSEDATTN_RETURN_IF_ERROR(check_positions(p.prob));
  switch (p.prob.dtype) {
    case DType::kFloat16: return launch_fwd<__half>(p, launch);
    case DType::kBFloat16: return launch_fwd<__nv_bfloat16>(p, launch);
    case DType::kFloat32: return launch_fwd<float>(p, launch);
    case DType::kFloat64: return launch_fwd<double>(p, launch);
    default: return unsupported_dtype(p.prob.dtype);
  }
}

Status run_bwd(const BwdParams& p, const CudaLaunch& launch) {
  FUSEDATTN_RETURN_IF_ERROR(check_positions(p.fwd.prob));
  switch (p.fwd.prob.dtype) {
    case DType::kFloat16: return launch_bwd<__half>(p, launch);
    case DType::kBFloat16: return launch_bwd<__nv_bfloat16>(p, launch);
    case DType::kFloat32: return launch_bwd<float>(p, launch);
    case DType::kFloat64: return launch_bwd<double>(p, launch);
    default: return unsupported_dtype(p.fwd.prob.dtype);
  }
}

}  // namespace simt
}  // namespace fusedattn
