// Host entry of the persistent forward (fwd_sm90_v3.cuh) and its instantiations; see kernels.h.
#include "fwd_sm90_v3.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream) {
  FwdLaunch L;
  const cudaError_t e = fwd_sm90_v3_prepare<T, D>(&L, a, num_sms);
  if (e != cudaSuccess) return e;
  return fwd_sm90_launch(L, stream);
}

template cudaError_t run_fwd_persistent<__half, 64>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__half, 128>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__half, 256>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 64>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 128>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 256>(const Sm90Args&, int, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
