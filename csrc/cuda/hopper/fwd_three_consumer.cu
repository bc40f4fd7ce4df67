// Host entries of the d = 64 three-consumer forwards (fwd_sm90_v2w3.cuh, and its persistent
// form fwd_sm90_w3p.cuh) and their instantiations; see kernels.h.
#include "fwd_sm90_v2w3.cuh"
#include "fwd_sm90_w3p.cuh"
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

template <typename T>
cudaError_t run_fwd_three_consumer_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream) {
  FwdLaunch L;
  const cudaError_t e = fwd_sm90_w3p_prepare<T>(&L, a, num_sms);
  if (e != cudaSuccess) return e;
  return fwd_sm90_v2w3_launch(L, stream);
}

template cudaError_t run_fwd_three_consumer<__half>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_three_consumer<__nv_bfloat16>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_three_consumer_persistent<__half>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_three_consumer_persistent<__nv_bfloat16>(const Sm90Args&, int, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
