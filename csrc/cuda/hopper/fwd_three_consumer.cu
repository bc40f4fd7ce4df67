// Host entry of the d = 64 three-consumer forward (fwd_sm90_v2w3.cuh) and its instantiations;
// see kernels.h.
#include "fwd_sm90_v2w3.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T>
cudaError_t run_fwd_three_consumer(const Sm90Args& a, cudaStream_t stream) {
  FwdLaunch L;
  const cudaError_t e = fwd_sm90_v2w3_prepare<T>(&L, a);
  if (e != cudaSuccess) return e;
  return fwd_sm90_v2w3_launch(L, stream);
}

template cudaError_t run_fwd_three_consumer<__half>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_three_consumer<__nv_bfloat16>(const Sm90Args&, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
