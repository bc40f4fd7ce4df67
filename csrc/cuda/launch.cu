// Dispatch of the CUDA engine. A forward over a paged KV cache
// (params.paged.page_table set) goes to the decode engine (csrc/cuda/decode)
// when it applies, else to the SIMT engine; the tensor-core kernels never see
// it (they do not read pages). Every other call: the tensor-core engine
// (csrc/cuda/tc) is asked first and takes the calls it supports; the rest runs
// on the SIMT engine (csrc/cuda/simt), which covers every dtype and feature.
#include <algorithm>

#include <cuda_runtime.h>

#include "decode/decode.h"
#include "fusedattn/cat.h"
#include "fusedattn/cuda_api.h"
#include "fusedattn/overrides.h"
#include "simt/simt.h"

namespace fusedattn {
namespace {

// FUSEDATTN_CUDA_ENGINE (fusedattn/overrides.h): simt sends every call to the SIMT engine, sm80
// skips the Hopper path.
CudaEngineChoice engine_choice() { return process_overrides().values.cuda_engine; }

bool tc_enabled() { return engine_choice() != CudaEngineChoice::kSimt; }

bool hopper_enabled() { return engine_choice() == CudaEngineChoice::kAuto; }

}  // namespace

size_t fwd_workspace_bytes(const FwdParams& params) {
  if (params.paged.page_table != nullptr) {
    const size_t decode_bytes = tc_enabled() ? decode::fwd_workspace_bytes(params) : 0;
    return std::max(decode_bytes, simt::fwd_workspace_bytes(params));
  }
  const size_t tc_bytes = tc_enabled() ? tc::fwd_workspace_bytes(params) : 0;
  return std::max(tc_bytes, simt::fwd_workspace_bytes(params));
}

size_t bwd_workspace_bytes(const BwdParams& params) {
  const size_t hopper_bytes = hopper_enabled() ? hopper::bwd_workspace_bytes(params) : 0;
  const size_t tc_bytes = tc_enabled() ? tc::bwd_workspace_bytes(params) : 0;
  return std::max({hopper_bytes, tc_bytes, simt::bwd_workspace_bytes(params)});
}

// The tensor-core backward always needs scratch (its dQ accumulator), and its
// workspace size is 0 exactly when it does not take the call. The Hopper
// backward's deterministic calls (d = 64/128) are a subset of the ones it takes.
bool bwd_deterministic_available(const BwdParams& params) {
  return tc_enabled() && tc::bwd_workspace_bytes(params) > 0;
}

namespace {

// The engines' forward; *zeroed: whether the engine that ran wrote rng_out_zero (the decode kernel).
Status dispatch_fwd(const FwdParams& params, const CudaLaunch& launch, bool* zeroed) {
  bool handled = false;
  if (params.paged.page_table != nullptr) {
    if (tc_enabled()) FUSEDATTN_RETURN_IF_ERROR(decode::try_run_fwd(params, launch, &handled));
    *zeroed = handled;
    if (handled) return Status::Ok();
    return simt::run_fwd(params, launch);
  }
  if (hopper_enabled()) FUSEDATTN_RETURN_IF_ERROR(hopper::try_run_fwd(params, launch, &handled));
  if (handled) return Status::Ok();
  if (tc_enabled()) FUSEDATTN_RETURN_IF_ERROR(tc::try_run_fwd(params, launch, &handled));
  if (handled) return Status::Ok();
  return simt::run_fwd(params, launch);
}

}  // namespace

Status run_fwd_cuda(const FwdParams& params, const CudaLaunch& launch) {
  if (params.prob.device != DeviceType::kCUDA) return Status::Invalid("run_fwd_cuda: tensors are not on a CUDA device");
  bool zeroed = false;
  FUSEDATTN_RETURN_IF_ERROR(dispatch_fwd(params, launch, &zeroed));
  if (params.rng_out_zero != nullptr && !zeroed) {
    // After the attention kernels, so that they do not wait behind it.
    const cudaError_t e = cudaMemsetAsync(params.rng_out_zero, 0, 2 * sizeof(int64_t),
                                          static_cast<cudaStream_t>(launch.stream));
    if (e != cudaSuccess) return Status::Invalid(cat("rng_state fill: ", cudaGetErrorString(e)));
  }
  return Status::Ok();
}

Status run_bwd_cuda(const BwdParams& params, const CudaLaunch& launch) {
  if (params.fwd.prob.device != DeviceType::kCUDA) {
    return Status::Invalid("run_bwd_cuda: tensors are not on a CUDA device");
  }
  bool handled = false;
  if (hopper_enabled()) FUSEDATTN_RETURN_IF_ERROR(hopper::try_run_bwd(params, launch, &handled));
  if (handled) return Status::Ok();
  if (tc_enabled()) FUSEDATTN_RETURN_IF_ERROR(tc::try_run_bwd(params, launch, &handled));
  if (handled) return Status::Ok();
  return simt::run_bwd(params, launch);
}

}  // namespace fusedattn
