// Whether this build holds sm_90a machine code the current device can run (kernels.h): the
// attribute query of a kernel of this object library fails when the device cannot load its image.
#include <cuda_runtime.h>

#include "kernels.h"

namespace fusedattn {
namespace hopper {
namespace {
__global__ void hopper_image_probe() {}
}  // namespace

bool kernels_loadable() {
  static const bool ok = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, hopper_image_probe) == cudaSuccess;
  }();
  return ok;
}

}  // namespace hopper
}  // namespace fusedattn
