// A kernel launch as a programmatic dependent of the work before it on the stream (sm_90+): the
// grid may start before that work completes, and its griddepcontrol.wait holds it until then.
// Stream capture records the edge as a programmatic graph edge. The decode kernel and the combine
// launch this way (KernelArgs::pdl_main, KernelArgs::pdl).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace fusedattn {
namespace decode {

// Whether `kernel`, as loaded on the current device, was compiled from sm_90+ code and so holds its
// griddepcontrol.wait (which the kernels compile only for __CUDA_ARCH__ >= 900). A build for older
// architectures that the driver JIT-compiles from their PTX on a Hopper GPU does not: launched as a
// programmatic dependent it could read before the work it depends on is done, so it is launched
// plainly. Cached per process and device (devices 0-31) in *cache: bit 2d known, bit 2d+1 capable.
template <class Kernel>
bool waits_for_dependency(Kernel kernel, std::atomic<uint64_t>* cache) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const uint64_t known = dev < 32 ? uint64_t(1) << (2 * dev) : 0, capable = known << 1;
  const uint64_t c = cache->load(std::memory_order_relaxed);
  if (known != 0 && (c & known)) return (c & capable) != 0;
  cudaFuncAttributes attr{};
  const bool ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.ptxVersion >= 90;
  if (known != 0) cache->fetch_or(known | (ok ? capable : 0), std::memory_order_relaxed);
  return ok;
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
