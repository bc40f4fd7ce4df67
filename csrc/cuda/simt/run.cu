// The SIMT engine's entry points: dtype dispatch and workspace sizes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "simt.h"
#include "workspace.h"

namespace fusedattn {
namespace simt {
namespace {

size_t acc_size(DType t) { return t == DType::kFloat64 ? sizeof(double) : sizeof(float); }

Status unsupported_dtype(DType t) {
  return Status::Unsupported(std::string("fusedattn CUDA engine: unsupported dtype ") + dtype_name(t));
}

}  // namespace

size_t fwd_workspace_bytes(const FwdParams&) { return 0; }

size_t bwd_workspace_bytes(const BwdParams& p) { return bwd_workspace(p, acc_size(p.fwd.prob.dtype)).bytes; }

Status run_fwd(const FwdParams& p, const CudaLaunch& launch) {
  switch (p.prob.dtype) {
    case DType::kFloat16: return launch_fwd<__half>(p, launch);
    case DType::kBFloat16: return launch_fwd<__nv_bfloat16>(p, launch);
    case DType::kFloat32: return launch_fwd<float>(p, launch);
    case DType::kFloat64: return launch_fwd<double>(p, launch);
    default: return unsupported_dtype(p.prob.dtype);
  }
}

Status run_bwd(const BwdParams& p, const CudaLaunch& launch) {
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
