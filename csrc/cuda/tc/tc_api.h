// Entry points of the tensor-core engine (FlashAttention-2-class kernels for
// fp16/bf16 on sm_80+), called by the CUDA dispatch (launch.cu) before the
// SIMT engine. The four hooks are declared in fusedattn/cuda_api.h, whose weak
// defaults (csrc/cuda/tc_default.cu) these strong definitions replace.
//
//   try_run_fwd / try_run_bwd: when the call is supported, launch it on
//     launch.stream, set *handled = true and return the launch status. When it
//     is not (dtype, head dim, strides, architecture, workspace...), set
//     *handled = false, launch nothing and return Ok: the caller then runs
//     the SIMT engine. fwd_support / bwd_support give the reason ("" when
//     supported), naming the value that is not taken.
//   fwd_workspace_bytes / bwd_workspace_bytes: the scratch the call needs in
//     launch.workspace (0 when unsupported).
// Nothing here synchronises the host; every launch goes to launch.stream.
#pragma once

#include <cstddef>
#include <string>

#include "fusedattn/params.h"

#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace tc {

Status try_run_fwd(const FwdParams& params, const CudaLaunch& launch, bool* handled);
Status try_run_bwd(const BwdParams& params, const CudaLaunch& launch, bool* handled);

size_t fwd_workspace_bytes(const FwdParams& params);
size_t bwd_workspace_bytes(const BwdParams& params);

std::string fwd_support(const FwdParams& params);
std::string bwd_support(const BwdParams& params);

}  // namespace tc
}  // namespace fusedattn
