// A kernel's dynamic shared-memory limit raised once per device: the attribute is per device, so a
// process driving several GPUs sets it on each; `done` is the kernel's own bit set of devices already
// raised (atomic: launches may come from several host threads). Strictly the attribute belongs to the
// context: a process that drives one device through two contexts (PyTorch uses only the primary one)
// would need it per context. Header-only and torch-free: the Hopper harnesses (tools/hopper) use it
// without the library. Neither call synchronises, so graph capture is unaffected.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace fusedattn {
namespace gpu {

inline cudaError_t raise_smem_once(const void* kernel, size_t bytes, std::atomic<uint64_t>* done) {
  if (bytes <= 48 * 1024) return cudaSuccess;  // the default limit
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;  // devices past 64: set on every call
  if (bit != 0 && (done->load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) done->fetch_or(bit, std::memory_order_relaxed);
  return e;
}

}  // namespace gpu
}  // namespace fusedattn
