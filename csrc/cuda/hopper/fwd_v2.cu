// Host entry of the v2 forward (fwd_sm90_v2.cuh) and its instantiations; see kernels.h.
#include "fwd_sm90_v2.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T, int D>
cudaError_t run_fwd_v2(const Sm90Args& a, cudaStream_t stream) {
  return fwd_sm90<T, D>(a, stream);
}

// An image the device cannot run makes the attribute query fail.
bool kernels_loadable() {
  static const bool ok = [] {
    cudaFuncAttributes attr{};
    using C = FwdV2Default<128>;
    return cudaFuncGetAttributes(&attr, fwd_sm90_v2_kernel<__nv_bfloat16, 128, false, C::BN, C::STAGES, C::PP>) ==
           cudaSuccess;
  }();
  return ok;
}

template cudaError_t run_fwd_v2<__half, 64>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_v2<__half, 128>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_v2<__half, 256>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_v2<__nv_bfloat16, 64>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_v2<__nv_bfloat16, 128>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_v2<__nv_bfloat16, 256>(const Sm90Args&, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
