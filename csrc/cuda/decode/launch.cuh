// A kernel launch as a programmatic dependent of the work before it on the stream (sm_90+): the
// grid may start before that work completes, and its griddepcontrol.wait holds it until then.
// Stream capture records the edge as a programmatic graph edge. The decode kernel and the combine
// launch this way (KernelArgs::pdl_main, KernelArgs::pdl).
#pragma once

#include <cuda_runtime.h>

namespace fusedattn {
namespace decode {

// Whether this translation unit's kernels hold their griddepcontrol.wait on a Hopper (or newer)
// GPU: they compile it only for __CUDA_ARCH__ >= 900. A build whose architectures all precede 9.0
// runs there from its PTX, JIT-compiled without the wait: launched as a programmatic dependent it
// could read before the work it depends on is done, so it must be launched plainly. With any
// architecture >= 9.0 in the build, a 9.x device runs that code (older SASS does not run on 9.x),
// and a newer device JIT-compiles the newest PTX, which has the wait.
constexpr int kBuiltArchs[] = {__CUDA_ARCH_LIST__};
constexpr bool built_with_dependency_wait() {
  for (int a : kBuiltArchs)
    if (a >= 900) return true;
  return false;
}

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
