// Entry points of the Hopper path (sm_90a), asked by the CUDA dispatch (csrc/cuda/dispatch) before
// the tensor-core engine; the same contract as tc/tc_api.h. Built only when the architectures
// include 9.0 (cmake/cuda.cmake defines FUSEDATTN_HAS_HOPPER for the dispatch then).
#pragma once

#include <string>

#include "common/device.h"
#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace hopper {

std::string plan_fwd(const FwdParams& params, const gpu::DeviceAttrs& dev, CudaPlan* plan);
std::string plan_bwd(const BwdParams& params, const gpu::DeviceAttrs& dev, CudaPlan* plan);
Status run_fwd(const FwdParams& params, const CudaPlan& plan, const CudaLaunch& launch);
Status run_bwd(const BwdParams& params, const CudaPlan& plan, const CudaLaunch& launch);

}  // namespace hopper
}  // namespace fusedattn
