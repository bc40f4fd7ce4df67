#include "common/device.h"

#include <cuda_runtime.h>

#include <mutex>

#include "fusedattn/cat.h"

namespace fusedattn {
namespace gpu {
namespace {

constexpr int kMaxDevices = 64;

Status query(int dev, DeviceAttrs* a) {
  a->index = dev;
  const struct {
    cudaDeviceAttr attr;
    int* out;
  } wanted[] = {{cudaDevAttrComputeCapabilityMajor, &a->major},
                {cudaDevAttrComputeCapabilityMinor, &a->minor},
                {cudaDevAttrMultiProcessorCount, &a->sm_count},
                {cudaDevAttrMaxSharedMemoryPerMultiprocessor, &a->smem_per_sm},
                {cudaDevAttrMaxSharedMemoryPerBlockOptin, &a->smem_optin}};
  for (const auto& w : wanted) {
    const cudaError_t e = cudaDeviceGetAttribute(w.out, w.attr, dev);
    if (e != cudaSuccess) return Status::Invalid(cat("CUDA device attribute query: ", cudaGetErrorString(e)));
  }
  return Status::Ok();
}

}  // namespace

Status current_device(const DeviceAttrs** out) {
  static DeviceAttrs attrs[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  static Status status[kMaxDevices];
  int dev = 0;
  const cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return Status::Invalid(cat("cudaGetDevice: ", cudaGetErrorString(e)));
  if (dev < 0 || dev >= kMaxDevices) return Status::Unsupported(cat("CUDA device index ", dev, " (at most 63)"));
  std::call_once(once[dev], [&] { status[dev] = query(dev, &attrs[dev]); });
  *out = &attrs[dev];
  return status[dev];
}

}  // namespace gpu
}  // namespace fusedattn
