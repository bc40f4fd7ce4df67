// Host entry of the one-tile two-consumer forward and its instantiations; see kernels.h.
#include "fwd_kernel.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T, int D>
cudaError_t run_fwd_v2(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run_one_tile<T, D, 2>(a, stream);
}

// An image the device cannot run makes the attribute query fail.
bool kernels_loadable() {
  static const bool ok = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, fwd_sm90_kernel<FwdConfigFor<__nv_bfloat16, 128, 2, false>,
                                                         OneTileScheduler<false>>) == cudaSuccess;
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
