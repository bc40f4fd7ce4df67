// The Hopper kernels' host entry points, defined in fwd_kernel.cuh and bwd_launch.cuh and
// instantiated by the generated files of kernels.list; sm90.cu, which decides what runs, includes
// only this. Each returns cudaErrorInvalidValue on arguments its kernel does not take (the support
// checks in sm90.cu are meant to rule those out first).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "params.h"  // Sm90Args, Sm90BwdArgs, the backward workspace sizes

namespace fusedattn {
namespace hopper {

// T = __half or __nv_bfloat16; D = 64, 128 or 256.
template <typename T, int D>
cudaError_t run_fwd_one_tile(const Sm90Args& a, cudaStream_t stream);
template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream);
template <typename T>
cudaError_t run_fwd_three_consumer(const Sm90Args& a, cudaStream_t stream);  // D = 64
template <typename T>
cudaError_t run_fwd_three_consumer_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream);  // D = 64
template <typename T, int D>
cudaError_t run_bwd(const Sm90BwdArgs& a, cudaStream_t stream);
// dQ, dK, dV bitwise reproducible (bwd_common.cuh's deterministic mode); D = 64, 128; a.ws of
// bwd_sm90_det_workspace_bytes().
template <typename T, int D>
cudaError_t run_bwd_deterministic(const Sm90BwdArgs& a, cudaStream_t stream);

// Whether this build holds sm_90a machine code the current device can run.
bool kernels_loadable();

}  // namespace hopper
}  // namespace fusedattn
