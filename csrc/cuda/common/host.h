// Host-side helpers of the kernels' launchers: CUDA errors as a Status, and the dynamic shared-memory
// opt-in of a kernel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "common/device.h"
#include "fusedattn/cat.h"

namespace fusedattn {
namespace gpu {

inline Status cuda_error(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(cat("CUDA error in fusedattn ", what, ": ", cudaGetErrorString(e)));
}

// The error of the launch just made (configuration errors surface here;
// asynchronous faults surface at a later synchronising call, as in PyTorch).
inline Status check_launch(const char* what) { return cuda_error(cudaGetLastError(), what); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A grid with a zero dimension has nothing to run, and launching it is a CUDA error: its launch is
// skipped (empty problems: no batch entry, no key, no query row of a sequence dim).
inline bool empty_grid(const dim3& g) { return g.x == 0 || g.y == 0 || g.z == 0; }

// Raises a kernel's dynamic shared-memory limit to `bytes` (once per device
// and kernel; `done` is the kernel's own flag word), or says why the device
// cannot give that much. None of these calls synchronises, and after a call's
// first (eager) run none is a driver call at all, so capture is unaffected.
template <class Kernel>
inline Status prepare_smem(Kernel kernel, size_t bytes, const char* what, std::atomic<uint64_t>* done) {
  const DeviceAttrs* dev = nullptr;
  FUSEDATTN_RETURN_IF_ERROR(current_device(&dev));
  const uint64_t bit = uint64_t(1) << dev->index;  // current_device admits indices below 64
  if (done->load(std::memory_order_relaxed) & bit) return Status::Ok();
  if (bytes > static_cast<size_t>(dev->smem_optin)) {
    return Status::Unsupported(cat("fusedattn CUDA ", what, " needs ", bytes,
                                   " bytes of shared memory per block; this device allows ", dev->smem_optin));
  }
  if (bytes > 48 * 1024) {
    FUSEDATTN_RETURN_IF_ERROR(cuda_error(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what));
  }
  done->fetch_or(bit, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace gpu
}  // namespace fusedattn
