// The SIMT engine: plain CUDA-core arithmetic for every dtype (fp16, bf16,
// fp32, fp64) and every feature of params.h. It is the engine of record for
// fp32/fp64 and the fallback for whatever the other engines decline.
#pragma once

#include <cstddef>
#include <string>

#include "common/device.h"
#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace simt {

// Why the engine cannot take the call ("" when it does: then *plan is filled). Its limits only: the
// core has validated the call.
std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan);
std::string plan_bwd(const BwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan);
Status run_fwd(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch);
Status run_bwd(const BwdParams& p, const CudaPlan& plan, const CudaLaunch& launch);

// Typed launchers, one translation unit per dtype and direction
// (fwd_<dtype>.cu, bwd_<dtype>.cu) so that the heavy kernels compile in parallel.
template <class T>
Status launch_fwd(const FwdParams& p, const CudaLaunch& launch);
template <class T>
Status launch_bwd(const BwdParams& p, const CudaLaunch& launch);

}  // namespace simt
}  // namespace fusedattn
