// Host entries of the Hopper backward (bwd_launch.cuh) and their instantiations; see kernels.h.
#include "bwd_launch.cuh"
#include "kernels.h"

namespace fusedattn {
namespace hopper {

template <typename T, int D>
cudaError_t run_bwd(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, D, false>(a, stream);
}

template <typename T, int D>
cudaError_t run_bwd_deterministic(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, D, true>(a, stream);
}

template cudaError_t run_bwd<__half, 64>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd<__half, 128>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd<__half, 256>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd<__nv_bfloat16, 64>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd<__nv_bfloat16, 128>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd<__nv_bfloat16, 256>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_deterministic<__half, 64>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_deterministic<__half, 128>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_deterministic<__nv_bfloat16, 64>(const Sm90BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_deterministic<__nv_bfloat16, 128>(const Sm90BwdArgs&, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
