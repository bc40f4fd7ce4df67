// A kernel launch as a programmatic dependent of the work before it on the stream (sm_90+): the
// grid may start before that work completes, and its griddepcontrol.wait holds it until then.
// Stream capture records the edge as a programmatic graph edge. The decode kernel and the combine
// launch this way (KernelArgs::pdl_main, KernelArgs::pdl).
#pragma once

#include <cuda_runtime.h>

namespace fusedattn {
namespace decode {

template <class Kernel, class... Args>
void launch_programmatic(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, args...);  // a refused launch sets the error check_launch reports
}

}  // namespace decode
}  // namespace fusedattn
