// Host entries of the d = 64 three-consumer forwards (one tile per CTA and persistent) and their
// instantiations; see kernels.h.
#include "fwd_kernel.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T>
cudaError_t run_fwd_three_consumer(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run_one_tile<T, 64, 3>(a, stream);
}

template <typename T>
cudaError_t run_fwd_three_consumer_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream) {
  Sm90Args b = a;
  b.sm_count = num_sms;
  return fwd_run_persistent<T, 64, 3>(b, stream);
}

template cudaError_t run_fwd_three_consumer<__half>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_three_consumer<__nv_bfloat16>(const Sm90Args&, cudaStream_t);
template cudaError_t run_fwd_three_consumer_persistent<__half>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_three_consumer_persistent<__nv_bfloat16>(const Sm90Args&, int, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
