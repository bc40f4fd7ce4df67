// Entry points of the tensor-core engine (FlashAttention-2-class kernels for fp16/bf16 on sm_80+),
// asked by the CUDA dispatch (csrc/cuda/dispatch) before the SIMT engine.
//
//   plan_fwd / plan_bwd: "" and a filled plan (kernel, workspace) when the engine takes the call,
//     else why not (dtype, head dim, strides, architecture, ...), naming the value not taken.
//   run_fwd / run_bwd: launch a call planned here on launch.stream, with launch.workspace of at
//     least plan.workspace_bytes.
// Nothing here synchronises the host.
#pragma once

#include <string>

#include "common/device.h"
#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace tc {

std::string plan_fwd(const FwdParams& params, const gpu::DeviceAttrs& dev, CudaPlan* plan);
std::string plan_bwd(const BwdParams& params, const gpu::DeviceAttrs& dev, CudaPlan* plan);
Status run_fwd(const FwdParams& params, const CudaPlan& plan, const CudaLaunch& launch);
Status run_bwd(const BwdParams& params, const CudaPlan& plan, const CudaLaunch& launch);

}  // namespace tc
}  // namespace fusedattn
