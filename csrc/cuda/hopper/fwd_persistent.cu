// Host entry of the persistent two-consumer forward and its instantiations; see kernels.h.
#include "fwd_kernel.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream) {
  Sm90Args b = a;
  b.sm_count = num_sms;
  return fwd_run_persistent<T, D, 2>(b, stream);
}

template cudaError_t run_fwd_persistent<__half, 64>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__half, 128>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__half, 256>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 64>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 128>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 256>(const Sm90Args&, int, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
