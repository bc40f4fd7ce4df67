// A CUDA call's device and stream, through the stable ABI. The device guard is the stable ABI's
// own (torch_cpu, any accelerator). torch's current-stream accessor exists only in its CUDA
// library (libtorch_cuda.so), which a CPU-only torch does not have: linking it would keep the
// library from loading there, so it is resolved at run time, on the first CUDA call.
#pragma once

#include <dlfcn.h>

#include <optional>
#include <stdexcept>

#include "bridge.h"

namespace fusedattn::binding {

// Holds q's device current for the whole call. q may sit elsewhere when another argument brought
// the call here; the core then reports the device mismatch.
struct CudaScope {
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  explicit CudaScope(const Placement& where) {
    if (where.is_cuda) guard.emplace(where.device_index);
  }
};

// The current stream of `device_index` (torch.cuda.current_stream), as the engine's void* stream.
inline void* current_cuda_stream(int32_t device_index) {
  using GetStream = AOTITorchError (*)(int32_t, void**);
  static const GetStream get_stream = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return reinterpret_cast<GetStream>(dlsym(lib != nullptr ? lib : RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream"));
  }();
  if (get_stream == nullptr) {
    throw std::runtime_error(
        "fusedattn: torch's CUDA library (libtorch_cuda.so, aoti_torch_get_current_cuda_stream) is not loaded");
  }
  void* stream = nullptr;
  check_shim(get_stream(device_index, &stream), "current CUDA stream");
  return stream;
}

}  // namespace fusedattn::binding
