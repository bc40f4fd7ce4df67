// Default hooks of the tensor-core engine and the Hopper path: take no call,
// need no workspace.
// Weak, so that the tensor-core engine's strong definitions (csrc/cuda/tc/)
// replace them at link time; the kernels are linked as object files (see
// cmake/cuda.cmake), which is what makes the strong definitions win. The tc
// engine may also simply replace this file.
#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace tc {

__attribute__((weak)) Status try_run_fwd(const FwdParams&, const CudaLaunch&, bool* handled) {
  *handled = false;
  return Status::Ok();
}

__attribute__((weak)) Status try_run_bwd(const BwdParams&, const CudaLaunch&, bool* handled) {
  *handled = false;
  return Status::Ok();
}

__attribute__((weak)) size_t fwd_workspace_bytes(const FwdParams&) { return 0; }

__attribute__((weak)) size_t bwd_workspace_bytes(const BwdParams&) { return 0; }

}  // namespace tc

namespace hopper {

// Replaced by csrc/cuda/hopper/sm90.cu when the build includes sm_90a.
__attribute__((weak)) Status try_run_fwd(const FwdParams&, const CudaLaunch&, bool* handled) {
  *handled = false;
  return Status::Ok();
}

__attribute__((weak)) Status try_run_bwd(const BwdParams&, const CudaLaunch&, bool* handled) {
  *handled = false;
  return Status::Ok();
}

__attribute__((weak)) size_t bwd_workspace_bytes(const BwdParams&) { return 0; }

}  // namespace hopper
}  // namespace fusedattn
