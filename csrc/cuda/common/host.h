// Host-side helpers of the kernels' launchers: CUDA errors as a Status, and the dynamic shared-memory
// opt-in of a kernel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/smem.h"
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

// Raises a kernel's dynamic shared-memory limit to `bytes` (once per device and kernel, smem.h), or
// says why the device cannot give that much.
template <class Kernel>
inline Status prepare_smem(Kernel kernel, size_t bytes, const char* what, std::atomic<uint64_t>* done) {
  const DeviceAttrs* dev = nullptr;
  FUSEDATTN_RETURN_IF_ERROR(current_device(&dev));
  if (bytes > static_cast<size_t>(dev->smem_optin)) {
    return Status::Unsupported(cat("fusedattn CUDA ", what, " needs ", bytes,
                                   " bytes of shared memory per block; this device allows ", dev->smem_optin));
  }
  return cuda_error(raise_smem_once(reinterpret_cast<const void*>(kernel), bytes, done), what);
}

}  // namespace gpu
}  // namespace fusedattn
