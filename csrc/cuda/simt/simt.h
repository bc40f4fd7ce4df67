// The SIMT engine: plain CUDA-core arithmetic for every dtype (fp16, bf16,
// fp32, fp64) and every feature of params.h. It is the engine of record for
// fp32/fp64 and the fallback for whatever the tensor-core kernels decline.
#pragma once

#include <cstddef>

#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace simt {

size_t fwd_workspace_bytes(const FwdParams& p);
size_t bwd_workspace_bytes(const BwdParams& p);
Status run_fwd(const FwdParams& p, const CudaLaunch& launch);
Status run_bwd(const BwdParams& p, const CudaLaunch& launch);

// Typed launchers, one translation unit per dtype and direction
// (fwd_<dtype>.cu, bwd_<dtype>.cu) so that the heavy kernels compile in parallel.
template <class T>
Status launch_fwd(const FwdParams& p, const CudaLaunch& launch);
template <class T>
Status launch_bwd(const BwdParams& p, const CudaLaunch& launch);

}  // namespace simt
}  // namespace fusedattn
